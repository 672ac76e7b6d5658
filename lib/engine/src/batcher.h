// StepBatcher: continuous batching for an engine's sequences (docs/engine.md
// "Steps"). Each running request feeds its session from its own thread (Run
// blocks) and gathers, whenever no step is running, what every running
// request wants fed into one step of at most `step_tokens` rows: every
// decoding sequence's one token first, then slices of waiting prompts in
// arrival order, run as one model::Session::Step on that thread. A long
// prompt so advances a slice per step between the others' tokens instead of
// freezing them, and every sequence gets the bits it would get alone (Step's
// guarantee). No thread of its own: a request alone steps itself, with no
// hand-off between threads per token.
//
// Thread-safe. Checkpoints: a slice ends at every checkpoint position its
// feed asks for, and the checkpoint is saved there and handed to the feed's
// sink (on the thread that ran the step).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "k3/model/model.h"

namespace k3::engine {

class StepBatcher {
 public:
  // `after_step` runs after every step, on the thread that ran it, with the
  // model still held (the engine publishes its stats and trims the
  // streaming store's step records there).
  StepBatcher(int64_t step_tokens, std::function<void()> after_step);
  StepBatcher(const StepBatcher&) = delete;
  StepBatcher& operator=(const StepBatcher&) = delete;

  struct Feed {
    model::Session* session = nullptr;
    std::span<const int32_t> ids;  // fed from session->position()
    float* logits_last = nullptr;  // logits after the last id; null: not wanted
    // Ascending positions in (position, position + ids.size()]: a slice ends
    // at each, the session is checkpointed there and the checkpoint handed
    // to `on_checkpoint` (on the thread that runs the step).
    std::vector<int64_t> checkpoint_at;
    model::Session::CheckpointSink on_checkpoint;
  };
  // Blocks until every id of `feed` is fed: true. Between steps (and at
  // least every 200 ms) `poll(done, last_slice)` is asked; true stops the feed
  // after whole slices (the session holds position() - start of them):
  // false is returned. A failed step rethrows here (the session is then
  // unspecified: the caller resets it).
  bool Run(const Feed& feed, const std::function<bool(int64_t done, int64_t slice)>& poll);

  // Runs `fn` with no step in flight (a request that needs the whole model,
  // e.g. a prefill with every position's logits).
  void Exclusive(const std::function<void()>& fn);

  struct Stats {
    uint64_t steps = 0;
    uint64_t rows = 0;                // summed over steps
    uint64_t decode_rows = 0;         // rows that were one-token feeds
    uint64_t max_sequences = 0;       // most sequences in one step
    std::vector<uint64_t> rows_hist;  // steps by rows: buckets <=1, <=2, <=4, ... <=2^k, more
  };
  Stats stats() const;

 private:
  struct Job {
    const Feed* feed = nullptr;
    int64_t done = 0;
    int64_t last_slice = 0;
    size_t next_ckpt = 0;
    bool in_step = false, cancel = false, finished = false;
    std::exception_ptr error;
  };
  // Runs one step over the waiting feeds; `lock` (on mu_) is held on entry
  // and on return, released while the step runs.
  void StepOnce(std::unique_lock<std::mutex>& lock);

  const int64_t step_tokens_;
  std::function<void()> after_step_;
  mutable std::mutex mu_;
  std::condition_variable done_cv_;  // a step ended
  std::deque<Job*> jobs_;  // arrival order
  bool stepping_ = false;  // a thread is running a step
  std::mutex model_mu_;  // held by a step or by Exclusive
  Stats stats_;
};

}  // namespace k3::engine
