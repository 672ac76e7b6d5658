#include "k3/engine/engine.h"

#include <omp.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/engine/output.h"
#include "k3/engine/structured.h"

namespace k3::engine {
namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 1024;

// generation_config.json: temperature and top_p, when present (K3 ships 1.0 / 1.0).
SamplingParams ReadGenerationConfig(const std::string& dir) {
  SamplingParams p;
  const std::string path = JoinPath(dir, "generation_config.json");
  if (!PathExists(path)) return p;
  const std::string text = ReadFileOrThrow(path, 1 << 20);
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(simdjson::padded_string(text)).get(root); err || !root.is_object()) {
    throw Error(ErrorCode::kCorrupt, "not a JSON object", path);
  }
  auto number = [&](const char* key, float& out, double lo, double hi) {
    simdjson::dom::element e;
    if (root[key].get(e)) return;  // absent: the default
    double v;
    if (e.get_double().get(v) || !std::isfinite(v) || v < lo || v > hi) {
      throw Error(ErrorCode::kCorrupt,
                  "expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                  path, Error::kNoOffset, key);
    }
    out = static_cast<float>(v);
  };
  number("temperature", p.temperature, 0.0, 100.0);
  number("top_p", p.top_p, 1e-9, 1.0);
  return p;
}

model::ExpertStoreStats Minus(const model::ExpertStoreStats& a, const model::ExpertStoreStats& b) {
  model::ExpertStoreStats d;
  d.bytes_read = a.bytes_read - b.bytes_read;
  d.hits = a.hits - b.hits;
  d.misses = a.misses - b.misses;
  d.blocked_seconds = a.blocked_seconds - b.blocked_seconds;
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

}  // namespace

int64_t ProgressUnits(const model::PrefillPoint& at) {
  int64_t units = at.tokens_done * at.layers + at.window_tokens * at.layer;
  if (at.experts_total > 0) {
    // Inside a layer's expert pass: the experts done as a share of the
    // layer's routed work (the attention before it counts as nothing).
    units += at.window_tokens * at.experts_done / at.experts_total;
  }
  return units;
}

double PrefillBudgetFor(const stream::StreamOptions& stream, uint64_t available_bytes,
                        uint64_t cache_bytes) {
  constexpr double kActivationShare = 1.2e9;  // of StreamOptions::reserve_bytes (spec §8.2)
  const double left = 0.88 * static_cast<double>(available_bytes) -
                      (stream.reserve_bytes - kActivationShare) - static_cast<double>(cache_bytes);
  return std::max(kActivationShare, left);
}

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kToolCalls: return "tool_calls";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "stop";
}

tok::ChatStreamParser::Start ChatStartFor(const tok::RenderedChat& chat) {
  return chat.resolved.thinking ? tok::ChatStreamParser::Start::kThink
                                : tok::ChatStreamParser::Start::kResponse;
}

struct Engine::Impl {
  EngineOptions options;
  std::unique_ptr<model::Model> model;
  std::optional<tok::Tokenizer> tokenizer;
  stream::StreamingExpertStore* streaming = nullptr;  // owned by model
  std::unique_ptr<model::Session> session;
  std::unique_ptr<CheckpointCache> checkpoints;  // issue 13
  SamplingParams defaults;
  std::vector<float> logits;  // at the session's last fed position, when valid
  bool logits_valid = false;
  // Structured output (issue 16): the vocabulary prepared for masking, built
  // on the first request that needs it (~0.4 s at 163,840 ranks), and the
  // masked copy of the logits a constrained step samples from.
  std::optional<constrain::Vocabulary> vocab;
  std::vector<float> masked;

  void Reset() {
    session->Reset();
    logits_valid = false;
  }

  // expert_stats() may be called from another thread (a server's /metrics)
  // while Generate runs: it reads this copy, refreshed after every step.
  mutable std::mutex stats_mu;
  model::ExpertStoreStats stats_published;
  void PublishStats() {
    const model::ExpertStoreStats s = model->experts().stats();
    std::lock_guard<std::mutex> lock(stats_mu);
    stats_published = s;
  }
};

Engine::Engine() : impl_(std::make_unique<Impl>()) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::LoadOrThrow(const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  Impl& im = *e->impl_;
  im.options = options;
  im.options.load.progress = options.progress && options.load.progress;
  im.options.stream.log_projection = options.progress && options.stream.log_projection;
  if (options.threads < 0) throw Error(ErrorCode::kInvalidArgument, "threads must be >= 0");
  if (options.threads > 0) omp_set_num_threads(options.threads);
  // Refuse a bad generation_config.json before the (slow) weight load.
  im.defaults = ReadGenerationConfig(options.model_dir);
  if (PathExists(JoinPath(options.model_dir, "tiktoken.model"))) {
    im.tokenizer.emplace(tok::Tokenizer::LoadDirOrThrow(options.model_dir));
  }
  im.model = model::Model::LoadOrThrow(options.model_dir, im.options.load, im.options.snapshot);
  im.streaming = &stream::InstallStreamingStore(*im.model, im.options.stream);
  if (im.options.prefill_budget_bytes < 0) {
    const stream::CachePlan& plan = im.streaming->plan();
    im.options.run.prefill_budget_bytes =
        PrefillBudgetFor(im.options.stream, MemAvailableBytes(), plan.cache_bytes);
  } else {
    im.options.run.prefill_budget_bytes = im.options.prefill_budget_bytes;
  }
  if (im.options.progress) {
    K3_LOG_INFO(
        "prefill windows: %s (%s)",
        im.options.run.chunk > 0
            ? ("K3_CHUNK " + std::to_string(im.options.run.chunk) + " tokens").c_str()
            : "sized per prompt",
        ("budget " + FormatBytes(static_cast<uint64_t>(im.options.run.prefill_budget_bytes)) +
         (im.options.prefill_budget_bytes < 0 ? " from MemAvailable" : " given"))
            .c_str());
  }
  if (im.options.on_model_loaded) im.options.on_model_loaded(*im.model);
  // The MLA cache grows on demand (doubling), so nothing is reserved for the
  // whole context up front.
  im.session = std::make_unique<model::Session>(*im.model, im.options.run, 0);
  im.checkpoints = std::make_unique<CheckpointCache>(
      im.options.checkpoints, im.session->Fingerprint(), model::StateLayout::For(im.model->config()));
  if (im.options.progress) K3_LOG_INFO("%s", im.checkpoints->Describe().c_str());
  im.logits.resize(static_cast<size_t>(im.model->config().vocab_size));
  im.PublishStats();
  return e;
}

const EngineOptions& Engine::options() const { return impl_->options; }
const ModelConfig& Engine::config() const { return impl_->model->config(); }
const tok::Tokenizer* Engine::tokenizer() const {
  return impl_->tokenizer ? &*impl_->tokenizer : nullptr;
}
model::Model& Engine::model() { return *impl_->model; }
SamplingParams Engine::default_sampling() const { return impl_->defaults; }
model::ExpertStoreStats Engine::expert_stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->stats_published;
}
CheckpointCacheStats Engine::checkpoint_stats() const { return impl_->checkpoints->stats(); }
std::string Engine::DescribeCheckpoints() const { return impl_->checkpoints->Describe(); }
int64_t Engine::ParkCheckpoints() { return impl_->checkpoints->ParkAll(); }
const stream::StreamingExpertStore& Engine::streaming() const { return *impl_->streaming; }
const std::vector<int32_t>& Engine::session_ids() const { return impl_->session->history(); }
void Engine::ResetSession() { impl_->Reset(); }

int64_t Engine::context_limit() const {
  if (impl_->options.max_context > 0) return impl_->options.max_context;
  const int64_t mpe = config().max_position_embeddings;
  return mpe > 0 ? mpe : int64_t{1} << 32;
}

std::vector<int32_t> Engine::ChatPromptIds(const tok::RenderedChat& chat) const {
  if (!impl_->tokenizer) {
    throw Error(ErrorCode::kNotFound, "chat needs tiktoken.model in the model directory",
                impl_->options.model_dir);
  }
  std::vector<int32_t> ids;
  if (config().bos_token_id >= 0) ids.push_back(static_cast<int32_t>(config().bos_token_id));
  for (tok::TokenId id : tok::EncodeChatSegments(*impl_->tokenizer, chat.segments)) {
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

namespace {

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

}  // namespace

namespace {

// A tail of at most this many tokens (or of K3_CHUNK when forced) gets no
// checkpoint before its last id (the retry point): refeeding it is cheap.
constexpr int64_t kRetryPointMin = 32;

// Where the prefill of `tail` from `start` checkpoints (issue 13, now inside
// windows, issue 25): every multiple of `every` positions, the position just
// before a long tail's last id (a retry of the same prompt resumes there) and
// `also_at` (GenerateRequest::checkpoint_at); all before the tail's end,
// ascending.
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

GenerateResult Engine::Generate(const GenerateRequest& req, const Callbacks& cb) {
  Impl& im = *impl_;
  const ModelConfig& c = config();
  const double t_start = NowSeconds();
  const bool has_head = im.model->weights().has_head;
  const int64_t limit = context_limit();
  ValidateOrThrow(req, c, has_head, im.tokenizer.has_value(), limit);

  // Structured output: set up (and refused) before any prefill work.
  std::optional<StructuredDecoder> structured;
  if (req.structured && req.structured->active() && !req.prefill_only) {
    if (!req.chat_start || !im.tokenizer) {
      throw Error(ErrorCode::kInvalidArgument, "structured output needs chat mode and tiktoken.model");
    }
    if (!im.vocab) im.vocab.emplace(constrain::Vocabulary::FromTokenizer(*im.tokenizer));
    const int64_t room = limit - static_cast<int64_t>(req.prompt_ids.size());
    const int64_t budget = req.max_tokens > 0 ? std::min(req.max_tokens, room) : room;
    structured.emplace(*req.structured, *im.tokenizer, *im.vocab, c.eos_token_ids, *req.chat_start, budget);
  }

  GenerateResult res;
  const model::ExpertStoreStats stats0 = im.model->experts().stats();
  im.streaming->ClearSteps();  // this request's steps only (bounded memory in a server)
  auto cancelled = [&] { return cb.cancel && cb.cancel->load(std::memory_order_relaxed); };
  auto finish = [&](FinishReason reason) {
    res.finish = reason;
    im.PublishStats();
    res.experts = Minus(im.model->experts().stats(), stats0);
    res.usage.completion_tokens = static_cast<int64_t>(res.ids.size());
    if (res.usage.completion_tokens > 0 && res.timings.decode_s > 0) {
      res.timings.decode_tok_per_s =
          static_cast<double>(res.usage.completion_tokens - 1) / res.timings.decode_s;
    }
    return res;
  };

  // Prefix reuse: keep the session when the prompt starts with all it holds.
  const std::vector<int32_t>& prompt = req.prompt_ids;
  const std::vector<int32_t>& held = im.session->history();
  size_t common = 0;
  while (common < held.size() && common < prompt.size() && held[common] == prompt[common]) {
    ++common;
  }
  const bool reuse = req.prefill_outputs == nullptr && common == held.size() &&
                     (common < prompt.size() || im.logits_valid);
  if (!reuse) {
    im.Reset();
    common = 0;
  }
  // Checkpoints: the deepest one that is a prefix of the prompt and deeper
  // than what the session holds (at least the last id is always fed).
  const bool ckpt_on = im.checkpoints->enabled() && req.prefill_outputs == nullptr;
  if (ckpt_on && prompt.size() > 1) {
    const int64_t got = im.checkpoints->RestoreDeepest(
        *im.session, prompt, static_cast<int64_t>(prompt.size()) - 1, static_cast<int64_t>(common));
    if (got > 0) {
      common = static_cast<size_t>(got);
      im.logits_valid = false;
    }
  }
  res.usage.prompt_tokens = static_cast<int64_t>(prompt.size());
  res.usage.cached_tokens = static_cast<int64_t>(common);

  // Prefill of the tail in windows; cancel and progress are polled between
  // layers and between experts.
  const std::span<const int32_t> tail(prompt.data() + common, prompt.size() - common);
  if (!tail.empty()) {
    const int64_t total = static_cast<int64_t>(tail.size());
    const double t0 = NowSeconds();
    const uint64_t bytes0 = im.model->experts().stats().bytes_read;
    PrefillProgress pp;
    pp.prompt_tokens = static_cast<int64_t>(prompt.size());
    pp.cached_tokens = static_cast<int64_t>(common);
    pp.total = total;
    pp.layers = c.num_hidden_layers;
    pp.units_total = total * pp.layers;
    im.session->SetInterrupt([&](const model::PrefillPoint& at) {
      if (cancelled()) return true;
      pp.done = at.tokens_done;
      pp.window_tokens = at.window_tokens;
      pp.units_done = ProgressUnits(at);
      pp.expert_bytes_read = im.model->experts().stats().bytes_read - bytes0;
      pp.elapsed_s = NowSeconds() - t0;
      // ETA: the token-layers left at the mean rate so far (units done over
      // elapsed time), once a tenth of a second and some units have passed.
      pp.eta_s = pp.units_done > 0 && pp.elapsed_s > 0.1
                     ? static_cast<double>(pp.units_total - pp.units_done) * pp.elapsed_s /
                           static_cast<double>(pp.units_done)
                     : -1;
      if (cb.on_prefill && !cb.on_prefill(pp)) return true;
      // The old hook: between layers only, tokens through the whole stack.
      return at.experts_total == 0 && cb.on_prefill_progress &&
             !cb.on_prefill_progress(at.tokens_done, total);
    });
    model::ForwardOutputs out = req.prefill_outputs ? *req.prefill_outputs : model::ForwardOutputs{};
    out.logits_last = has_head ? im.logits.data() : nullptr;
    im.logits_valid = false;
    const model::PhaseTimes phases0 = im.session->phase_times();
    try {
      std::vector<int64_t> at;
      if (ckpt_on) {
        at = CheckpointPositions(static_cast<int64_t>(common), total, im.options.checkpoint_every,
                                 req.checkpoint_at,
                                 im.options.run.chunk > 0 ? im.options.run.chunk : kRetryPointMin);
      }
      im.session->Forward(tail, out, at, [&](std::shared_ptr<const model::SessionCheckpoint> ck) {
        im.checkpoints->Put(std::move(ck));
      });
    } catch (...) {
      im.session->SetInterrupt({});
      im.Reset();
      throw;
    }
    im.session->SetInterrupt({});
    im.PublishStats();
    res.timings.prefill_s = NowSeconds() - t0;
    res.timings.prefill_window = im.session->last_window();
    res.timings.prefill_windows = im.session->last_windows();
    res.timings.prefill_expert_bytes = im.model->experts().stats().bytes_read - bytes0;
    res.timings.prefill_phases = im.session->phase_times() - phases0;
    res.prefill_steps = static_cast<int64_t>(im.streaming->stream_stats().steps.size());
    if (im.session->interrupted()) {
      // The session holds whole windows only (or was reset); every checkpoint
      // of a finished window is cached: a later prompt resumes from there, and
      // the logits are not those of its end.
      return finish(FinishReason::kCancelled);
    }
    im.logits_valid = has_head;
    if (res.timings.prefill_s > 0) {
      res.timings.prefill_tok_per_s = static_cast<double>(total) / res.timings.prefill_s;
    }
  }
  if (req.prefill_only) return finish(FinishReason::kStop);

  OutputStream::Options oo;
  oo.chat_start = req.chat_start;
  oo.stop = req.stop;
  oo.eos_ids = c.eos_token_ids;
  oo.call_id_tag = req.call_id_tag.empty() ? CallIdTag(prompt, req.sampling.seed) : req.call_id_tag;
  OutputStream output(tokenizer(), std::move(oo));
  model::Sampler own_sampler(req.sampling.temperature, req.sampling.top_p, req.sampling.seed);
  model::Sampler& sampler = req.sampler ? *req.sampler : own_sampler;
  const int64_t max_new = req.max_tokens > 0 ? req.max_tokens : limit;
  bool client_gone = false;
  auto deliver = [&](const Delta& d) {
    if (!d.empty() && cb.on_delta && !cb.on_delta(d)) client_gone = true;
  };
  auto close_output = [&] {
    deliver(output.Finish());
    res.content = output.content();
    res.reasoning = output.reasoning();
    res.tool_calls = output.tool_calls();
    res.warnings = output.warnings();
    res.stop_matched = output.stop_matched();
    res.usage.reasoning_tokens = output.reasoning_tokens();
  };

  FinishReason reason = FinishReason::kStop;
  double t_first = 0;
  model::ForwardOutputs step;
  step.logits_last = im.logits.data();
  for (;;) {
    if (cancelled()) {
      reason = FinishReason::kCancelled;
      break;
    }
    if (static_cast<int64_t>(prompt.size() + res.ids.size()) >= limit) {
      reason = FinishReason::kLength;
      res.context_limited = true;
      break;
    }
    int32_t id;
    if (structured) {
      const double t0 = NowSeconds();
      const int64_t done = static_cast<int64_t>(res.ids.size());
      const int64_t left = std::min(max_new - done, limit - static_cast<int64_t>(prompt.size()) - done);
      im.masked.assign(im.logits.begin(), im.logits.end());
      const int32_t forced = structured->Prepare(im.masked, left);
      res.timings.constrain_s += NowSeconds() - t0;
      if (forced >= 0) {
        id = forced;
      } else {
        // Masked logits are -inf, so never drawn. Near the end of max_tokens
        // the decoder may still refuse a draw that leaves no room to close the
        // answer: it is masked and drawn again, a few times, then steered.
        // The checks count as constraint time, the draws do not.
        for (int tries = 0;; ++tries) {
          id = sampler.Sample(im.masked);
          const double tc = NowSeconds();
          const bool allowed = structured->Allowed(id);
          if (!allowed) {
            im.masked[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
            if (tries == 8) {
              const int32_t f = structured->Fallback();
              id = f >= 0 ? f : model::Sampler::Argmax(im.masked);
            }
          }
          res.timings.constrain_s += NowSeconds() - tc;
          if (allowed || tries == 8) break;
        }
      }
      const double t1 = NowSeconds();
      structured->Accept(id);
      res.timings.constrain_s += NowSeconds() - t1;
    } else if (req.ignore_eos) {
      im.masked.assign(im.logits.begin(), im.logits.end());
      for (int64_t e : c.eos_token_ids) {
        if (e >= 0 && e < static_cast<int64_t>(im.masked.size())) {
          im.masked[static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
        }
      }
      id = sampler.Sample(im.masked);
    } else {
      id = sampler.Sample(im.logits);
    }
    res.ids.push_back(id);
    if (res.ids.size() == 1) {
      t_first = NowSeconds();
      res.timings.ttft_s = t_first - t_start;
    } else {
      res.timings.decode_s = NowSeconds() - t_first;
    }
    deliver(output.Push(id));
    if (client_gone) {
      reason = FinishReason::kCancelled;
      break;
    }
    if (output.done()) {
      reason = output.finish();
      break;
    }
    if (static_cast<int64_t>(res.ids.size()) >= max_new) {
      reason = FinishReason::kLength;
      break;
    }
    if (cancelled()) {
      reason = FinishReason::kCancelled;
      break;
    }
    // Decode steps are not interrupted inside: the token is fed whole, so the
    // session keeps everything (a cancel is seen before the next step).
    im.logits_valid = false;
    try {
      im.session->Forward(std::span<const int32_t>(&id, 1), step);
    } catch (...) {
      im.Reset();
      throw;
    }
    im.logits_valid = true;
    im.PublishStats();
  }
  // The turn's end: a follow-up turn that extends it restores from here.
  if (im.checkpoints->enabled()) im.checkpoints->Save(*im.session);
  close_output();
  return finish(reason);
}

}  // namespace k3::engine
