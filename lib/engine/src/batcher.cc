#include "batcher.h"

#include <algorithm>
#include <chrono>

#include "k3/core/error.h"

namespace k3::engine {

StepBatcher::StepBatcher(int64_t step_tokens, std::function<void()> after_step)
    : step_tokens_(std::max<int64_t>(1, step_tokens)), after_step_(std::move(after_step)) {
  stats_.rows_hist.assign(12, 0);
}

bool StepBatcher::Run(const Feed& feed,
                      const std::function<bool(int64_t done, int64_t slice)>& poll) {
  if (feed.ids.empty()) return true;
  Job job;
  job.feed = &feed;
  std::unique_lock lock(mu_);
  jobs_.push_back(&job);
  auto leave = [&] { jobs_.erase(std::find(jobs_.begin(), jobs_.end(), &job)); };
  int64_t seen = -1;
  for (;;) {
    if (job.error) {
      leave();
      std::rethrow_exception(job.error);
    }
    if (job.finished) {
      leave();
      return true;
    }
    if (job.cancel && !job.in_step) {
      leave();
      return false;
    }
    if (!job.cancel && poll && job.done != seen) {
      seen = job.done;
      const int64_t done = job.done, slice = job.last_slice;
      lock.unlock();
      const bool stop = poll(done, slice);
      lock.lock();
      if (stop) job.cancel = true;
      continue;
    }
    if (!stepping_ && !job.cancel) {
      // Nobody is stepping: this thread runs the next step, for everyone.
      stepping_ = true;
      StepOnce(lock);
      stepping_ = false;
      done_cv_.notify_all();
      continue;
    }
    done_cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (poll && !job.cancel) seen = -1;  // ask again after a quiet 200 ms too
  }
}

void StepBatcher::Exclusive(const std::function<void()>& fn) {
  std::lock_guard lock(model_mu_);
  fn();
}

StepBatcher::Stats StepBatcher::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void StepBatcher::StepOnce(std::unique_lock<std::mutex>& lock) {
  // The step: every one-token feed (a decoding sequence), then slices of the
  // longer feeds in arrival order while the budget lasts. A slice ends at
  // its feed's next checkpoint position.
  std::vector<Job*> in;
  std::vector<model::Session::StepSlice> slices;
  int64_t budget = step_tokens_;
  uint64_t decode_rows = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (Job* j : jobs_) {
      if (j->cancel || j->finished || j->error) continue;
      const Feed& f = *j->feed;
      const int64_t left = static_cast<int64_t>(f.ids.size()) - j->done;
      const bool single = f.ids.size() == 1;
      if ((pass == 0) != single) continue;
      if (budget <= 0 && !slices.empty()) break;
      int64_t n = std::min(left, std::max<int64_t>(budget, 1));
      if (j->next_ckpt < f.checkpoint_at.size()) {
        n = std::min(n, f.checkpoint_at[j->next_ckpt] - f.session->position());
      }
      model::Session::StepSlice s;
      s.session = f.session;
      s.ids = f.ids.subspan(static_cast<size_t>(j->done), static_cast<size_t>(n));
      s.logits_last = j->done + n == static_cast<int64_t>(f.ids.size()) ? f.logits_last : nullptr;
      slices.push_back(s);
      in.push_back(j);
      j->in_step = true;
      j->last_slice = n;
      budget -= n;
      decode_rows += single ? 1 : 0;
    }
  }
  if (slices.empty()) return;
  lock.unlock();
  std::exception_ptr error;
  try {
    std::lock_guard model_lock(model_mu_);
    model::Session::Step(slices);
    // Checkpoints at the slices' ends, before anything else moves them.
    for (Job* j : in) {
      const Feed& f = *j->feed;
      if (j->next_ckpt < f.checkpoint_at.size() &&
          f.session->position() == f.checkpoint_at[j->next_ckpt]) {
        auto ck = f.session->SaveCheckpoint();
        if (f.on_checkpoint) f.on_checkpoint(std::move(ck));
        ++j->next_ckpt;
      }
    }
    if (after_step_) after_step_();
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  int64_t rows = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    Job& j = *in[i];
    j.in_step = false;
    rows += static_cast<int64_t>(slices[i].ids.size());
    if (error) {
      j.error = error;
      continue;
    }
    j.done += static_cast<int64_t>(slices[i].ids.size());
    if (j.done == static_cast<int64_t>(j.feed->ids.size())) j.finished = true;
  }
  ++stats_.steps;
  stats_.rows += static_cast<uint64_t>(rows);
  stats_.decode_rows += decode_rows;
  stats_.max_sequences = std::max<uint64_t>(stats_.max_sequences, in.size());
  size_t b = 0;
  while (b + 1 < stats_.rows_hist.size() && (int64_t{1} << b) < rows) ++b;
  ++stats_.rows_hist[b];
}

}  // namespace k3::engine
