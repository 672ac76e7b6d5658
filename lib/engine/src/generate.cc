// Engine::Generate as its steps: validate, set up structured output, restore
// the longest prefix the session or a checkpoint holds, prefill the tail in
// windows, then sample and feed one token at a time until a stop rule, and
// close the turn with its usage and stats (docs/engine.md).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>

#include "engine_impl.h"
#include "k3/core/error.h"
#include "k3/core/sys.h"
#include "k3/engine/output.h"
#include "k3/engine/structured.h"

namespace k3::engine {
namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 1024;

// A tail of at most this many tokens (or of K3_CHUNK when forced) gets no
// checkpoint before its last id (the retry point): refeeding it is cheap.
constexpr int64_t kRetryPointMin = 32;

// A structured step whose draw the decoder refuses is masked and drawn again
// this many times, then steered (StructuredDecoder::Fallback).
constexpr int kStructuredRedraws = 8;

model::ExpertStoreStats Minus(const model::ExpertStoreStats& a, const model::ExpertStoreStats& b) {
  model::ExpertStoreStats d;
  d.bytes_read = a.bytes_read - b.bytes_read;
  d.hits = a.hits - b.hits;
  d.misses = a.misses - b.misses;
  d.blocked_seconds = a.blocked_seconds - b.blocked_seconds;
  d.distinct_routed = a.distinct_routed - b.distinct_routed;
  d.pass_experts = a.pass_experts - b.pass_experts;
  return d;
}

// FNV-1a over the prompt and seed: tool-call ids that are the same for the same
// request (streamed or not) and differ between conversations.
std::string CallIdTag(const std::vector<int32_t>& ids, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (int32_t id : ids) {
    h ^= static_cast<uint32_t>(id);
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void ValidateOrThrow(const GenerateRequest& r, const ModelConfig& c, bool has_head,
                     bool has_tokenizer, int64_t limit) {
  auto bad = [](const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); };
  if (r.prompt_ids.empty()) bad("empty prompt");
  for (int32_t id : r.prompt_ids) {
    if (id < 0 || id >= c.vocab_size) {
      bad("token id " + std::to_string(id) + " outside the vocabulary [0, " +
          std::to_string(c.vocab_size) + ")");
    }
  }
  const int64_t n = static_cast<int64_t>(r.prompt_ids.size());
  if (r.prefill_only ? n > limit : n >= limit) {
    bad("the prompt has " + std::to_string(n) + " tokens; the context limit is " +
        std::to_string(limit) + " (max_position_embeddings or K3_MAXT)" +
        (r.prefill_only ? "" : ", and at least one token must fit after the prompt"));
  }
  if (r.max_tokens < 0) bad("max_tokens must be >= 0 (0: up to the context limit)");
  if (!r.prefill_only && !has_head) {
    throw Error(ErrorCode::kUnsupported,
                "model has no head (model.norm.weight missing): it can only be traced");
  }
  if (r.chat_start && !has_tokenizer) {
    throw Error(ErrorCode::kNotFound, "chat mode needs tiktoken.model in the model directory");
  }
  if (r.stop.size() > kMaxStopStrings) bad("at most 16 stop strings");
  for (const std::string& s : r.stop) {
    if (s.empty() || s.size() > kMaxStopBytes || !tok::IsValidUtf8(s)) {
      bad("a stop string must be 1 to 1024 bytes of valid UTF-8");
    }
  }
  if (r.ignore_eos && r.structured && r.structured->active()) {
    bad(kIgnoreEosWithStructured);
  }
  const SamplingParams& p = r.sampling;
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    bad("temperature must be a finite number >= 0 (0: greedy)");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) bad("top_p must be in (0, 1]");
}

// Where the prefill of `tail` from `start` checkpoints, inside its windows:
// every multiple of `every` positions, the position just before a long tail's
// last id (a retry of the same prompt resumes there) and `also_at`
// (GenerateRequest::checkpoint_at); all before the tail's end, ascending.
std::vector<int64_t> CheckpointPositions(int64_t start, int64_t n, int64_t every, int64_t also_at,
                                         int64_t retry_min) {
  const int64_t end = start + n;
  std::vector<int64_t> at;
  if (every > 0) {
    for (int64_t p = (start / every + 1) * every; p < end; p += every) at.push_back(p);
  }
  if (n > retry_min && end - 1 > start) at.push_back(end - 1);
  if (also_at > start && also_at < end) at.push_back(also_at);
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  return at;
}

}  // namespace

// One request over the engine's state. The steps run in this order and each
// leaves the session consistent (whole windows or whole tokens fed), so a
// throw or a cancel between them leaves an engine the next request can use.
class Engine::Impl::GenerateRun {
  using Sequence = Engine::Impl::Sequence;

 public:
  GenerateRun(Impl& im, Sequence& seq, const GenerateRequest& req, const Callbacks& cb,
              int64_t limit, double t_start)
      : im_(im),
        seq_(seq),
        req_(req),
        cb_(cb),
        c_(im.model->config()),
        limit_(limit),
        t_start_(t_start),
        has_head_(im.model->weights().has_head),
        batched_(im.batcher != nullptr) {}

  GenerateResult Run() {
    SetUpStructured();
    stats0_ = Stats();
    // This request's steps only (bounded memory in a server); with several
    // requests at once the batcher drops them after every step.
    if (!batched_) im_.streaming->ClearSteps();
    const size_t common = RestorePrefix();
    if (common < req_.prompt_ids.size() && !Prefill(common)) {
      // The session holds whole windows only (or was reset); every checkpoint
      // of a finished window is cached: a later prompt resumes from there, and
      // the logits are not those of its end.
      return Finish(FinishReason::kCancelled);
    }
    if (req_.prefill_only) return Finish(FinishReason::kStop);
    return Finish(Decode());
  }

 private:
  bool Cancelled() const { return cb_.cancel && cb_.cancel->load(std::memory_order_relaxed); }

  // Structured output: set up (and refused) before any prefill work.
  void SetUpStructured() {
    if (!req_.structured || !req_.structured->active() || req_.prefill_only) return;
    if (!req_.chat_start || !im_.tokenizer) {
      throw Error(ErrorCode::kInvalidArgument, "structured output needs chat mode and tiktoken.model");
    }
    {
      std::lock_guard lock(im_.vocab_mu);
      if (!im_.vocab) im_.vocab.emplace(constrain::Vocabulary::FromTokenizer(*im_.tokenizer));
    }
    const int64_t room = limit_ - static_cast<int64_t>(req_.prompt_ids.size());
    const int64_t budget = req_.max_tokens > 0 ? std::min(req_.max_tokens, room) : room;
    structured_.emplace(*req_.structured, *im_.tokenizer, *im_.vocab, c_.eos_token_ids,
                        *req_.chat_start, budget);
  }

  // How much of the prompt the session holds after this step: what it held
  // already when the prompt extends it, else nothing; then the deepest
  // checkpoint that is a prefix of the prompt and deeper than that (at least
  // the last id is always fed). Sets usage.prompt_tokens and cached_tokens.
  size_t RestorePrefix() {
    const std::vector<int32_t>& prompt = req_.prompt_ids;
    const std::vector<int32_t>& held = seq_.session->history();
    size_t common = 0;
    while (common < held.size() && common < prompt.size() && held[common] == prompt[common]) {
      ++common;
    }
    const bool reuse = req_.prefill_outputs == nullptr && common == held.size() &&
                       (common < prompt.size() || seq_.logits_valid);
    if (!reuse) {
      seq_.Reset();
      common = 0;
    }
    if (CheckpointsOn() && prompt.size() > 1) {
      std::lock_guard lock(im_.ckpt_mu);
      const int64_t got = im_.checkpoints->RestoreDeepest(*seq_.session, prompt,
                                                          static_cast<int64_t>(prompt.size()) - 1,
                                                          static_cast<int64_t>(common));
      if (got > 0) {
        common = static_cast<size_t>(got);
        seq_.logits_valid = false;
      }
    }
    res_.usage.prompt_tokens = static_cast<int64_t>(prompt.size());
    res_.usage.cached_tokens = static_cast<int64_t>(common);
    return common;
  }

  // A request that asks for the prefill's outputs gets them computed, not
  // restored, so it neither restores nor saves checkpoints.
  bool CheckpointsOn() const {
    return im_.checkpoints->enabled() && req_.prefill_outputs == nullptr;
  }

  // Feeds the prompt after `common` in windows, saving checkpoints inside
  // them; cancel and progress are polled between layers and between experts.
  // Returns false when a poll stopped it.
  bool Prefill(size_t common) {
    const std::vector<int32_t>& prompt = req_.prompt_ids;
    const std::span<const int32_t> tail(prompt.data() + common, prompt.size() - common);
    const int64_t total = static_cast<int64_t>(tail.size());
    const double t0 = NowSeconds();
    const uint64_t bytes0 = Stats().bytes_read;
    progress_ = PrefillProgress{};
    progress_.prompt_tokens = static_cast<int64_t>(prompt.size());
    progress_.cached_tokens = static_cast<int64_t>(common);
    progress_.total = total;
    progress_.layers = c_.num_hidden_layers;
    progress_.units_total = total * progress_.layers;
    model::ForwardOutputs out = req_.prefill_outputs ? *req_.prefill_outputs : model::ForwardOutputs{};
    out.logits_last = has_head_ ? seq_.logits.data() : nullptr;
    seq_.logits_valid = false;
    std::vector<int64_t> at;
    if (CheckpointsOn()) {
      at = CheckpointPositions(static_cast<int64_t>(common), total, im_.options.checkpoint_every,
                               req_.checkpoint_at,
                               im_.options.run.chunk > 0 ? im_.options.run.chunk : kRetryPointMin);
    }
    const model::Session::CheckpointSink sink =
        [&](std::shared_ptr<const model::SessionCheckpoint> ck) {
          std::lock_guard lock(im_.ckpt_mu);
          im_.checkpoints->Put(std::move(ck));
        };
    bool stopped = false;
    if (batched_ && req_.prefill_outputs == nullptr) {
      // Slices in steps beside the other requests (docs/engine.md "Steps"):
      // cancel and progress between steps.
      StepBatcher::Feed feed;
      feed.session = seq_.session.get();
      feed.ids = tail;
      feed.logits_last = out.logits_last;
      feed.checkpoint_at = std::move(at);
      feed.on_checkpoint = sink;
      try {
        stopped = !im_.batcher->Run(feed, [&](int64_t done, int64_t slice) {
          model::PrefillPoint pt;
          pt.tokens_done = done;
          pt.window_begin = done;
          pt.window_tokens = slice;
          pt.layers = c_.num_hidden_layers;
          return StopPrefillAt(pt, t0, bytes0);
        });
      } catch (...) {
        seq_.Reset();
        throw;
      }
    } else {
      seq_.session->SetInterrupt([this, t0, bytes0](const model::PrefillPoint& pt) {
        return StopPrefillAt(pt, t0, bytes0);
      });
      const model::PhaseTimes phases0 = seq_.session->phase_times();
      auto forward = [&] { seq_.session->Forward(tail, out, at, sink); };
      try {
        if (batched_) {
          im_.batcher->Exclusive(forward);  // every position's outputs: the model alone
        } else {
          forward();
        }
      } catch (...) {
        seq_.session->SetInterrupt({});
        seq_.Reset();
        throw;
      }
      seq_.session->SetInterrupt({});
      stopped = seq_.session->interrupted();
      res_.timings.prefill_window = seq_.session->last_window();
      res_.timings.prefill_windows = seq_.session->last_windows();
      if (!batched_) {
        res_.timings.prefill_phases = seq_.session->phase_times() - phases0;
        res_.prefill_steps = static_cast<int64_t>(im_.streaming->stream_stats().steps.size());
      }
    }
    if (!batched_) im_.PublishStats();
    res_.timings.prefill_s = NowSeconds() - t0;
    res_.timings.prefill_expert_bytes = Stats().bytes_read - bytes0;
    if (stopped) return false;
    seq_.logits_valid = has_head_;
    if (res_.timings.prefill_s > 0) {
      res_.timings.prefill_tok_per_s = static_cast<double>(total) / res_.timings.prefill_s;
    }
    return true;
  }

  // The prefill's poll: true stops it (a cancel, or a callback that says so).
  bool StopPrefillAt(const model::PrefillPoint& at, double t0, uint64_t bytes0) {
    if (Cancelled()) return true;
    PrefillProgress& pp = progress_;
    pp.done = at.tokens_done;
    pp.window_tokens = at.window_tokens;
    pp.units_done = ProgressUnits(at);
    pp.expert_bytes_read = Stats().bytes_read - bytes0;
    pp.elapsed_s = NowSeconds() - t0;
    // ETA: the token-layers left at the mean rate so far (units done over
    // elapsed time), once a tenth of a second and some units have passed.
    pp.eta_s = pp.units_done > 0 && pp.elapsed_s > 0.1
                   ? static_cast<double>(pp.units_total - pp.units_done) * pp.elapsed_s /
                         static_cast<double>(pp.units_done)
                   : -1;
    if (cb_.on_prefill && !cb_.on_prefill(pp)) return true;
    // on_prefill_progress: between layers only, tokens through the whole stack.
    return at.experts_total == 0 && cb_.on_prefill_progress &&
           !cb_.on_prefill_progress(at.tokens_done, progress_.total);
  }

  // The answer: tokens until a stop rule, then the turn's end checkpointed
  // and the output stream closed. Returns why it stopped.
  FinishReason Decode() {
    OutputStream::Options oo;
    oo.chat_start = req_.chat_start;
    oo.stop = req_.stop;
    oo.eos_ids = c_.eos_token_ids;
    oo.call_id_tag =
        req_.call_id_tag.empty() ? CallIdTag(req_.prompt_ids, req_.sampling.seed) : req_.call_id_tag;
    OutputStream output(im_.tokenizer ? &*im_.tokenizer : nullptr, std::move(oo));
    model::Sampler own_sampler(req_.sampling.temperature, req_.sampling.top_p, req_.sampling.seed);
    model::Sampler& sampler = req_.sampler ? *req_.sampler : own_sampler;
    const FinishReason reason = DecodeLoop(output, sampler);
    // The turn's end: a follow-up turn that extends it restores from here.
    if (im_.checkpoints->enabled()) {
      std::lock_guard lock(im_.ckpt_mu);
      im_.checkpoints->Save(*seq_.session);
    }
    CloseOutput(output);
    return reason;
  }

  // Sample, deliver, check the stop rules, feed the token; again.
  FinishReason DecodeLoop(OutputStream& output, model::Sampler& sampler) {
    const int64_t prompt_n = static_cast<int64_t>(req_.prompt_ids.size());
    const int64_t max_new = req_.max_tokens > 0 ? req_.max_tokens : limit_;
    double t_first = 0;
    model::ForwardOutputs step;
    step.logits_last = seq_.logits.data();
    for (;;) {
      if (Cancelled()) return FinishReason::kCancelled;
      if (prompt_n + static_cast<int64_t>(res_.ids.size()) >= limit_) {
        res_.context_limited = true;
        return FinishReason::kLength;
      }
      const int32_t id = SampleNext(sampler, max_new);
      res_.ids.push_back(id);
      if (res_.ids.size() == 1) {
        t_first = NowSeconds();
        res_.timings.ttft_s = t_first - t_start_;
      } else {
        res_.timings.decode_s = NowSeconds() - t_first;
      }
      if (!Deliver(output.Push(id))) return FinishReason::kCancelled;
      if (output.done()) return output.finish();
      if (static_cast<int64_t>(res_.ids.size()) >= max_new) return FinishReason::kLength;
      if (Cancelled()) return FinishReason::kCancelled;
      FeedToken(id, step);
    }
  }

  // Decode steps are not interrupted inside: the token is fed whole, so the
  // session keeps everything (a cancel is seen before the next step).
  void FeedToken(int32_t id, const model::ForwardOutputs& step) {
    seq_.logits_valid = false;
    try {
      if (batched_) {
        StepBatcher::Feed feed;
        feed.session = seq_.session.get();
        feed.ids = std::span<const int32_t>(&id, 1);
        feed.logits_last = step.logits_last;
        im_.batcher->Run(feed, {});
      } else {
        seq_.session->Forward(std::span<const int32_t>(&id, 1), step);
      }
    } catch (...) {
      seq_.Reset();
      throw;
    }
    seq_.logits_valid = true;
    if (!batched_) im_.PublishStats();
  }

  // The expert store's counters: read directly when this request is the only
  // one on the model, else the copy the batcher publishes after every step.
  model::ExpertStoreStats Stats() const {
    if (!batched_) return im_.model->experts().stats();
    std::lock_guard lock(im_.stats_mu);
    return im_.stats_published;
  }

  // The next id from the logits of the last fed position: constrained, with
  // the EOS ids masked, or as they are.
  int32_t SampleNext(model::Sampler& sampler, int64_t max_new) {
    if (structured_) return SampleStructured(sampler, max_new);
    if (req_.ignore_eos) {
      seq_.masked.assign(seq_.logits.begin(), seq_.logits.end());
      for (int64_t e : c_.eos_token_ids) {
        if (e >= 0 && e < static_cast<int64_t>(seq_.masked.size())) {
          seq_.masked[static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
        }
      }
      return sampler.Sample(seq_.masked);
    }
    return sampler.Sample(seq_.logits);
  }

  // A step under structured output: the decoder's mask, its forced id when
  // only one is allowed, its acceptance of the id chosen. The decoder's work
  // counts as constraint time, the draws do not.
  int32_t SampleStructured(model::Sampler& sampler, int64_t max_new) {
    const int64_t prompt_n = static_cast<int64_t>(req_.prompt_ids.size());
    const double t0 = NowSeconds();
    const int64_t done = static_cast<int64_t>(res_.ids.size());
    const int64_t left = std::min(max_new - done, limit_ - prompt_n - done);
    seq_.masked.assign(seq_.logits.begin(), seq_.logits.end());
    const int32_t forced = structured_->Prepare(seq_.masked, left);
    res_.timings.constrain_s += NowSeconds() - t0;
    int32_t id;
    if (forced >= 0) {
      id = forced;
    } else {
      // Masked logits are -inf, so never drawn. Near the end of max_tokens
      // the decoder may still refuse a draw that leaves no room to close the
      // answer: it is masked and drawn again, a few times, then steered.
      for (int tries = 0;; ++tries) {
        id = sampler.Sample(seq_.masked);
        const double tc = NowSeconds();
        const bool allowed = structured_->Allowed(id);
        if (!allowed) {
          seq_.masked[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
          if (tries == kStructuredRedraws) {
            const int32_t f = structured_->Fallback();
            id = f >= 0 ? f : model::Sampler::Argmax(seq_.masked);
          }
        }
        res_.timings.constrain_s += NowSeconds() - tc;
        if (allowed || tries == kStructuredRedraws) break;
      }
    }
    const double t1 = NowSeconds();
    structured_->Accept(id);
    res_.timings.constrain_s += NowSeconds() - t1;
    return id;
  }

  // Hands a non-empty delta to on_delta; false once the client is gone.
  bool Deliver(const Delta& d) { return d.empty() || !cb_.on_delta || cb_.on_delta(d); }

  // Flushes what the stream held back and copies the turn's text into the result.
  void CloseOutput(OutputStream& output) {
    Deliver(output.Finish());
    res_.content = output.content();
    res_.reasoning = output.reasoning();
    res_.tool_calls = output.tool_calls();
    res_.warnings = output.warnings();
    res_.stop_matched = output.stop_matched();
    res_.usage.reasoning_tokens = output.reasoning_tokens();
  }

  // The result's reason, this request's expert stats, the completion count
  // and the decode rate.
  GenerateResult Finish(FinishReason reason) {
    res_.finish = reason;
    if (!batched_) im_.PublishStats();
    res_.experts = Minus(Stats(), stats0_);
    res_.usage.completion_tokens = static_cast<int64_t>(res_.ids.size());
    if (res_.usage.completion_tokens > 0 && res_.timings.decode_s > 0) {
      res_.timings.decode_tok_per_s =
          static_cast<double>(res_.usage.completion_tokens - 1) / res_.timings.decode_s;
    }
    return std::move(res_);
  }

  Impl& im_;
  Sequence& seq_;
  const GenerateRequest& req_;
  const Callbacks& cb_;
  const ModelConfig& c_;
  const int64_t limit_;
  const double t_start_;
  const bool has_head_;
  const bool batched_;  // --parallel > 1: every feed goes through the batcher
  std::optional<StructuredDecoder> structured_;
  model::ExpertStoreStats stats0_;
  PrefillProgress progress_;
  GenerateResult res_;
};

GenerateResult Engine::Generate(const GenerateRequest& req, const Callbacks& cb) {
  const double t_start = NowSeconds();
  const int64_t limit = context_limit();
  ValidateOrThrow(req, config(), impl_->model->weights().has_head, impl_->tokenizer.has_value(),
                  limit);
  Impl& im = *impl_;
  using Sequence = Impl::Sequence;
  // OpenMP's thread count is a per-thread setting: a caller's thread (a
  // server worker) takes the engine's, as the loading thread did.
  if (im.options.threads > 0 && omp_get_max_threads() != im.options.threads) {
    omp_set_num_threads(im.options.threads);
  }
  if (!im.batcher) return Impl::GenerateRun(im, im.seqs[0], req, cb, limit, t_start).Run();

  // Several at once: a free sequence and room for this request's state.
  const uint64_t need = RequestBytes(static_cast<int64_t>(req.prompt_ids.size()), req.max_tokens);
  if (need > im.sequence_budget) {
    throw Error(ErrorCode::kNoSpace,
                "the request needs " + FormatBytes(need) + " of sequence state (prompt " +
                    std::to_string(req.prompt_ids.size()) + " + max_tokens " +
                    std::to_string(req.max_tokens) + " positions) but running requests may hold " +
                    FormatBytes(im.sequence_budget) + " in all (--parallel, --prefill-mem-gb)");
  }
  Sequence* seq = nullptr;
  {
    std::unique_lock lock(im.seq_mu);
    bool counted = false;
    for (;;) {
      // The free sequence whose ids are the longest prefix of this prompt
      // (prefix reuse), else the least recently used.
      size_t best_common = 0;
      for (Sequence& s : im.seqs) {
        if (s.busy) continue;
        const std::vector<int32_t>& h = s.session->history();
        size_t common = 0;
        if (h.size() <= req.prompt_ids.size() &&
            std::equal(h.begin(), h.end(), req.prompt_ids.begin())) {
          common = h.size();
        }
        if (seq == nullptr || common > best_common ||
            (common == best_common && s.last_used < seq->last_used)) {
          seq = &s;
          best_common = common;
        }
      }
      if (seq != nullptr && im.reserved_total + need <= im.sequence_budget) break;
      seq = nullptr;
      if (!counted) {
        ++im.admission_waits;
        counted = true;
      }
      if (cb.cancel && cb.cancel->load()) {
        GenerateResult r;
        r.finish = FinishReason::kCancelled;
        r.usage.prompt_tokens = static_cast<int64_t>(req.prompt_ids.size());
        return r;
      }
      im.seq_cv.wait_for(lock, std::chrono::milliseconds(100));
    }
    seq->busy = true;
    seq->last_used = ++im.requests;
    seq->reserved = need;
    im.reserved_total += need;
  }
  struct Release {
    Impl& im;
    Sequence& s;
    ~Release() {
      std::lock_guard lock(im.seq_mu);
      im.reserved_total -= s.reserved;
      s.reserved = 0;
      s.busy = false;
      im.seq_cv.notify_all();
    }
  } release{im, *seq};
  return Impl::GenerateRun(im, *seq, req, cb, limit, t_start).Run();
}

}  // namespace k3::engine
