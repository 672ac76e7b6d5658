// Engine: loading (model, tokenizer, streaming store, session, checkpoint
// cache), the accessors, and the small public helpers of engine.h. One
// request's steps are in generate.cc.
#include "k3/engine/engine.h"

#include <omp.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "engine_impl.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/model/session_state.h"

namespace k3::engine {
namespace {

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

AutoParallel AutoParallelFor(uint64_t sequence_budget_bytes, uint64_t sequence_bytes,
                             int64_t tokens) {
  AutoParallel a;
  const uint64_t per = std::max<uint64_t>(sequence_bytes, 1);
  const uint64_t fit = sequence_budget_bytes / per;
  a.parallel = static_cast<int>(std::clamp<uint64_t>(fit, 1, AutoParallel::kMax));
  a.why = std::to_string(a.parallel) + (a.parallel == 1 ? " sequence" : " sequences") +
          " from memory (" + FormatBytes(sequence_budget_bytes) + " for sequences, " +
          FormatBytes(per) + " each at " + std::to_string(tokens) + " positions; at most " +
          std::to_string(AutoParallel::kMax) + (fit < 1 ? "; one, though it does not fit" : "") +
          ")";
  return a;
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
  // The sequences. The MLA cache grows on demand (doubling), so nothing is
  // reserved for the whole context up front; they share one work space.
  if (options.parallel < 0 || options.parallel > 256) {
    throw Error(ErrorCode::kInvalidArgument, "parallel must be in [0, 256] (0: from memory), got " +
                                                 std::to_string(options.parallel));
  }
  if (options.step_tokens < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "step tokens must be >= 1, got " + std::to_string(options.step_tokens));
  }
  // Admission: what the prefill windows would have had, less one step's work
  // space (steps replace windows), at least one 4096-position sequence.
  model::WindowShape shape;
  shape.tokens = options.step_tokens;
  shape.threads = omp_get_max_threads();
  shape.idot = im.options.run.idot;
  const double step_bytes =
      static_cast<double>(model::PrefillWindowBytes(im.model->config(), shape));
  const uint64_t sequence_budget =
      options.sequence_budget_bytes > 0
          ? static_cast<uint64_t>(options.sequence_budget_bytes)
          : static_cast<uint64_t>(std::max(im.options.run.prefill_budget_bytes - step_bytes,
                                           static_cast<double>(im.SequenceBytes(4096))));
  if (options.parallel == 0) {
    const int64_t tokens = std::min(AutoParallel::kTokens, e->context_limit());
    const AutoParallel a = AutoParallelFor(sequence_budget, im.SequenceBytes(tokens), tokens);
    im.options.parallel = a.parallel;
    if (im.options.progress) K3_LOG_INFO("parallel: %s", a.why.c_str());
  }
  const int parallel = im.options.parallel;
  im.seqs.resize(static_cast<size_t>(parallel));
  for (Impl::Sequence& s : im.seqs) {
    s.session =
        std::make_unique<model::Session>(*im.model, im.options.run, 0, im.seqs[0].session.get());
    s.logits.resize(static_cast<size_t>(im.model->config().vocab_size));
  }
  im.checkpoints =
      std::make_unique<CheckpointCache>(im.options.checkpoints, im.seqs[0].session->Fingerprint(),
                                        model::StateLayout::For(im.model->config()));
  if (im.options.progress) K3_LOG_INFO("%s", im.checkpoints->Describe().c_str());
  if (parallel > 1) {
    im.sequence_budget = sequence_budget;
    Impl* ip = &im;
    // Each step's store records are dropped after it (a request's own are
    // not separable when several run): a long-running server stays bounded.
    im.batcher = std::make_unique<StepBatcher>(options.step_tokens, [ip] {
      ip->streaming->ClearSteps();
      ip->PublishStats();
    });
    if (im.options.progress) {
      K3_LOG_INFO(
          "parallel: %d sequences in steps of at most %lld rows (%s of work space); "
          "running requests may hold %s of state (%s per 4096 positions)",
          parallel, static_cast<long long>(options.step_tokens),
          FormatBytes(static_cast<uint64_t>(step_bytes)).c_str(),
          FormatBytes(im.sequence_budget).c_str(), FormatBytes(im.SequenceBytes(4096)).c_str());
    }
  }
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
const std::vector<int32_t>& Engine::session_ids() const {
  return impl_->seqs[0].session->history();
}
void Engine::ResetSession() {
  std::lock_guard lock(impl_->seq_mu);
  for (Impl::Sequence& s : impl_->seqs) {
    if (!s.busy) s.Reset();
  }
}

uint64_t Engine::Impl::SequenceBytes(int64_t positions) const {
  const ModelConfig& c = model->config();
  const double mla_row = 4.0 * static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim) *
                         static_cast<double>(c.num_mla_layers());
  return model::StateLayout::For(c).kda_bytes() +
         static_cast<uint64_t>(mla_row * static_cast<double>(std::max<int64_t>(positions, 0)));
}

uint64_t Engine::RequestBytes(int64_t prompt_tokens, int64_t max_tokens) const {
  // An answer without max_tokens is counted at 4096 tokens (it may grow past
  // that; the MLA cache grows on demand), never past the context limit.
  constexpr int64_t kUnboundedAnswer = 4096;
  const int64_t answer = max_tokens > 0 ? max_tokens : kUnboundedAnswer;
  return impl_->SequenceBytes(std::min(prompt_tokens + answer, context_limit()));
}

Engine::StepStats Engine::step_stats() const {
  StepStats st;
  st.parallel = static_cast<int>(impl_->seqs.size());
  if (!impl_->batcher) return st;
  const StepBatcher::Stats b = impl_->batcher->stats();
  st.steps = b.steps;
  st.rows = b.rows;
  st.decode_rows = b.decode_rows;
  st.max_sequences = b.max_sequences;
  st.rows_hist = b.rows_hist;
  std::lock_guard lock(impl_->seq_mu);
  for (const Impl::Sequence& s : impl_->seqs) st.running += s.busy ? 1 : 0;
  st.admission_waits = impl_->admission_waits;
  st.reserved_bytes = impl_->reserved_total;
  st.budget_bytes = impl_->sequence_budget;
  return st;
}

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

}  // namespace k3::engine

