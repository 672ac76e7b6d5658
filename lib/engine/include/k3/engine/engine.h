// k3::engine — the generation runtime that `k3-run generate`, `chat` and `serve`
// share: model + tokenizer + streaming expert store from one options struct,
// prompt building, prefix reuse, chunked prefill with cancel, sampling, stop
// conditions, channel deltas, usage, timings and expert stats.
//
// CONTRACT: lib/server codes against this header. Add fields and
// functions freely; do not rename or change the meaning of what is here.
//
// Ownership and threads: an Engine owns the Model, the Tokenizer and its
// sequences (one Session each). With EngineOptions::parallel == 1 it is not
// thread-safe: one Generate() at a time (the server's queue serialises
// requests); only expert_stats(), checkpoint_stats() and step_stats() may be
// called from other threads. With parallel > 1, up to that many Generate()
// calls run at once from different threads (more wait for a sequence).
// Callbacks run on the calling thread, inside Generate().
// Failures: LoadOrThrow and Generate throw k3::Error (kInvalidArgument for a
// bad request: ids out of the vocabulary, a prompt past the context limit);
// a cancel is not an error: Generate returns with finish == kCancelled.
// After any exception or cancel the engine stays usable (its session is reset
// or kept at a consistent prefix: never half-fed).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "k3/constrain/constrain.h"
#include "k3/container/snapshot.h"
#include "k3/engine/checkpoint_cache.h"
#include "k3/model/config.h"
#include "k3/model/model.h"
#include "k3/model/weights.h"
#include "k3/stream/streaming_store.h"
#include "k3/tokenizer/chat.h"
#include "k3/tokenizer/tokenizer.h"

namespace k3::engine {

// Every runtime choice, filled in one place (FromEnv + the apps' flags). Each
// K3_* variable is read once, here, with one meaning and one default
// (docs/environment.md lists them all).
struct EngineOptions {
  std::string model_dir;
  model::LoadOptions load;        // K3_BITS, K3_MLA_BITS, K3_HEAD_BITS, K3_MMAP, K3_LAYERS, ...
  model::RunOptions run;          // K3_IDOT, K3_CHUNK, K3_TOPP (run.prefill_budget_bytes: below)
  Snapshot::Options snapshot;     // K3_DIRS
  stream::StreamOptions stream;   // K3_EXPERT_GB, K3_DIRECT, K3_URING, K3_PIPE, K3_QD, ...
  // Memory a prefill window may hold, bytes (K3_PREFILL_GB / --prefill-mem-gb
  // x 1e9). Negative (the default): sized at load from MemAvailable with the
  // expert cache's reserve rule (PrefillBudgetFor); the result goes to
  // run.prefill_budget_bytes.
  double prefill_budget_bytes = -1;
  // Context capacity in tokens (K3_MAXT); 0 = the model's max_position_embeddings.
  int64_t max_context = 0;
  bool progress = true;           // load progress lines on stderr
  // Compute threads (OpenMP) for the forward pass; 0 = every CPU. A flag, not
  // an environment variable (OMP_NUM_THREADS still applies when this is 0).
  int threads = 0;
  // Requests that run at once (k3-run serve --parallel, docs/engine.md
  // "Steps"). 1: one Generate at a time, the prompt in windows (the CLI's
  // and a library user's default). N > 1: Generate is thread-safe; up to N
  // requests run on their own sequences, fed together in steps of at most
  // `step_tokens` rows, and each gets the tokens it would get alone.
  // 0: from memory (AutoParallelFor, at most 4; k3-run serve's default).
  int parallel = 1;
  int64_t step_tokens = 512;
  // What running requests' sequences may hold together (KDA states, MLA rows
  // for prompt + max_tokens); a request that does not fit waits for others to
  // finish, one that could never fit is refused. 0: sized at load from
  // MemAvailable (what the expert cache and prefill windows leave).
  double sequence_budget_bytes = 0;
  // Called once after the model is loaded and the streaming store installed,
  // before the session is made: the place to install further expert
  // executors (e.g. a GPU tier) on every command. Empty: nothing.
  std::function<void(model::Model&)> on_model_loaded;

  // Reads every K3_* runtime variable (docs/environment.md) with core's strict
  // parser: a malformed or out-of-range value throws kInvalidArgument naming it.
  // Also validates K3_LOG and applies it (SetLogLevel).
  // Recurrent-state checkpoints (docs/checkpoints.md), from the
  // apps' --ckpt-slots / --ckpt-dir / --ckpt-disk-gb / --ckpt-every (whose
  // default, -1, sizes the slots from free memory). RAM slots 0: off, the
  // default of the struct, so that a library user opts in.
  CheckpointCacheOptions checkpoints{.ram_slots = 0};
  // Prefill checkpoints every this many positions (0: none), besides the one
  // just before a long prompt's last id (retry, edit) and each turn's end.
  int64_t checkpoint_every = 1024;

  static EngineOptions FromEnv(std::string model_dir);
};

// EngineOptions::parallel == 0 (k3-run serve's default): as many sequences
// as the sequence budget holds at `sequence_bytes` each (the state of one at
// `tokens` positions: kTokens, a long agent conversation, or the context
// limit when that is shorter), at least 1 and at most kMax.
struct AutoParallel {
  static constexpr int kMax = 4;
  static constexpr int64_t kTokens = 32768;
  int parallel = 1;
  std::string why;  // the start-up line: the count and the arithmetic behind it
};
AutoParallel AutoParallelFor(uint64_t sequence_budget_bytes, uint64_t sequence_bytes,
                             int64_t tokens);

// The default prefill window budget (docs/engine.md "Windows"): the
// expert cache takes 0.88 x MemAvailable minus stream.reserve_bytes (page
// cache 2.5 GB + activations 1.2 GB); windows get what that leaves besides
// the page-cache share: 0.88 x available - (reserve - 1.2 GB) - cache bytes,
// and never less than the 1.2 GB activation share the reserve set aside.
double PrefillBudgetFor(const stream::StreamOptions& stream, uint64_t available_bytes,
                        uint64_t cache_bytes);

// Validates K3_LOG (debug|info|warn|error|quiet, k3::toolenv::LogLevelFromEnv)
// and applies it; throws kInvalidArgument for any other value. EngineOptions::
// FromEnv calls it (the tools have applied it already, with the rest of their
// start-up environment, through k3::toolenv::ApplyFromEnv).
void ApplyLogLevelFromEnv();

// Sampling choices. The defaults of a model come from its generation_config.json
// (K3 ships temperature 1.0, top_p 1.0); temperature <= 0 is greedy.
struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  uint64_t seed = 1;
};

// Structured output (the rules in docs/server.md "Constrained
// decoding"): what the sampling loop guarantees by masking, in chat mode only.
// Compiled schemas are immutable and shared (one spec may serve many requests).
struct ToolConstraint {
  std::string name;                  // a declared tool (the call header's tool="...")
  constrain::CompiledSchema parameters = constrain::Schema::JsonObject();  // its arguments
};
struct StructuredOutput {
  // Content channel: compact JSON that validates against this schema
  // (response_format json_object / json_schema). Ignored when calls are required.
  std::optional<constrain::CompiledSchema> response;
  // The declared tools: every call, forced or opened by the model, names one of
  // them and carries arguments that validate against its schema.
  std::vector<ToolConstraint> tools;
  enum class Calls { kAuto, kNone, kRequired };
  Calls calls = Calls::kAuto;
  // kRequired with one function (named tool_choice); empty: any declared tool.
  std::string only_tool;
  // Think tokens at most: >= 0 is a hard cap (the Messages API's
  // thinking.budget_tokens; with nothing else to enforce the answer is then
  // free text), after which the think channel's close is forced. -1: when a
  // structure is forced, half of what max_tokens leaves after its shortest
  // completion; otherwise no cap.
  int64_t think_budget = -1;
  // Whether the loop has anything to enforce (tools declared, JSON asked for,
  // or a think cap).
  bool active() const {
    return response.has_value() || !tools.empty() || calls == Calls::kRequired || think_budget >= 0;
  }
};

// Why a request with ignore_eos and structured output is refused: by
// Generate (kInvalidArgument) and by the server's parser (a 400 naming the
// field), one text for both. Header-only, so lib/server's fuzz targets, built
// without lib/engine, still link.
inline constexpr const char* kIgnoreEosWithStructured =
    "ignore_eos cannot be combined with tools, a response format or a thinking budget "
    "(structured output decides where the answer ends)";

struct GenerateRequest {
  // The whole prompt, BOS included (see Engine::ChatPromptIds). The engine keeps
  // its session when these ids start with everything it has fed (prefix reuse)
  // and prefills only the tail.
  std::vector<int32_t> prompt_ids;
  // Chat mode: where the prompt leaves the model; the stream parser splits the
  // output into reasoning / content / tool calls. nullopt: raw mode, every
  // generated byte is content and only EOS ids stop.
  std::optional<tok::ChatStreamParser::Start> chat_start;
  // Generation limit; 0 = up to the context limit.
  int64_t max_tokens = 0;
  // Stop strings, matched on the content channel across token boundaries; a
  // stop string (or any part of one that may still complete) is never emitted.
  std::vector<std::string> stop;
  // The end-of-message / EOS ids are never drawn (masked before sampling):
  // the answer runs to max_tokens, a stop string, the context limit or a
  // cancel (llama-server's and vLLM's ignore_eos, for benchmarks and tests
  // that need an answer of a known length). Not with structured output, whose
  // decoder decides where an answer may end (kInvalidArgument).
  bool ignore_eos = false;  // refused with structured output: kIgnoreEosWithStructured
  SamplingParams sampling;
  // Extra outputs of the prefill (k3-run generate's --logits / --trace dumps),
  // sized for the whole prompt: the session is reset and every prompt id fed.
  const model::ForwardOutputs* prefill_outputs = nullptr;
  // Feed the prompt and generate nothing (a --ngen 0 trace; works without a head).
  bool prefill_only = false;
  // Tool-call ids are "call_<id_tag>_<index>"; empty: derived from the prompt and seed.
  std::string call_id_tag;
  // A sampler whose random stream continues across requests (k3-run chat's
  // turns); null: a fresh one from `sampling`. Borrowed for the call.
  model::Sampler* sampler = nullptr;
  // With checkpoints on, also checkpoint the prefill after this many prompt
  // ids when it feeds past them (0: no extra one). Conversation passes where
  // the new user message starts: the state /edit, /retry and /undo go back to.
  int64_t checkpoint_at = 0;
  // Structured output (chat mode with a tokenizer only); null: unconstrained.
  // Generate throws kInvalidArgument when calls are required and no tool (or
  // not only_tool) is declared.
  std::shared_ptr<const StructuredOutput> structured;
};

// A tool-call fragment. The first fragment of a call has begin = true and
// carries id and name (arguments ""); later fragments carry only index and a
// piece of the arguments JSON text, streamed as the model generates it.
struct ToolCallDelta {
  int index = 0;  // 0-based position of the call in this answer
  bool begin = false;
  std::string id;    // "call_<...>", unique per call, on begin only
  std::string name;  // on begin only
  std::string arguments;
};

// What one step adds to the visible answer. Strings are whole UTF-8 characters.
struct Delta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

enum class FinishReason { kStop, kLength, kToolCalls, kCancelled };
const char* FinishReasonName(FinishReason r);  // "stop", "length", "tool_calls", "cancelled"

// Where a rendered chat leaves the model (GenerateRequest::chat_start): inside
// the think channel when thinking is on, else inside the response.
tok::ChatStreamParser::Start ChatStartFor(const tok::RenderedChat& chat);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;  // completion tokens inside the think channel
  int64_t cached_tokens = 0;     // prompt tokens reused from the session (not prefilled)
};

struct Timings {
  double prefill_s = 0;         // feeding the uncached prompt tail
  double ttft_s = 0;            // Generate() start to the first generated token
  double decode_s = 0;          // first to last generated token
  double prefill_tok_per_s = 0; // prefilled tokens / prefill_s
  double decode_tok_per_s = 0;  // (completion_tokens - 1) / decode_s
  double constrain_s = 0;       // structured output: masks, draw checks, steering and forced ids (inside decode_s)
  // Prefill windows: the largest window this call's prefill used
  // (tokens run layer-major together), how many windows it took, and the
  // expert bytes read from disk during the prefill.
  int64_t prefill_window = 0;
  int64_t prefill_windows = 0;
  uint64_t prefill_expert_bytes = 0;
  // The prefill's forward pass by part (wall seconds; k3-bench prefill).
  model::PhaseTimes prefill_phases;
};

// Prefill progress, passed to Callbacks::on_prefill between layers
// and between experts of a long expert pass. Token counts are of this call;
// `units_*` count token-layers so that progress moves inside a big window.
struct PrefillProgress {
  int64_t prompt_tokens = 0;   // the whole prompt
  int64_t cached_tokens = 0;   // reused (session prefix or checkpoint), not prefilled
  int64_t total = 0;           // tokens this call prefills (prompt - cached)
  int64_t done = 0;            // of `total`, tokens through the whole stack
  int64_t layers = 0;          // layers in the stack
  int64_t units_done = 0;      // token-layers done (finer than `done` inside a window)
  int64_t units_total = 0;     // total * layers
  int64_t window_tokens = 0;   // the current window's size
  uint64_t expert_bytes_read = 0;  // read from disk by this call's prefill so far
  double elapsed_s = 0;
  double eta_s = -1;           // < 0: not yet known
};

// Token-layers done at a prefill poll: whole windows times the layers, plus
// the current window's tokens times the layers it has finished (and the share
// of experts done inside a layer's expert pass).
int64_t ProgressUnits(const model::PrefillPoint& at);

struct GenerateResult {
  std::vector<int32_t> ids;  // generated ids (stop ids included as sampled)
  std::string reasoning, content;
  std::vector<tok::ToolCall> tool_calls;
  FinishReason finish = FinishReason::kStop;
  bool context_limited = false;  // kLength because the context filled up
  std::string stop_matched;      // the stop string that ended it, if any
  Usage usage;
  Timings timings;
  model::ExpertStoreStats experts;  // this request only
  std::vector<std::string> warnings;  // the stream parser's notes on malformed output
  int64_t prefill_steps = 0;          // prefill chunks fed (for the streaming stats)
};

// Hooks into one generation, all optional, all on the Generate() thread.
struct Callbacks {
  // Each non-empty delta, in order. Return false to cancel (client gone).
  std::function<bool(const Delta&)> on_delta;
  // During prefill, between layers: tokens done of total. Return false to
  // cancel. Also the place for a server's heartbeat.
  std::function<bool(int64_t done, int64_t total)> on_prefill_progress;
  // During prefill, between layers (and between experts in a long expert pass). Return false to cancel.
  // Called before on_prefill_progress at each point; both are honoured.
  std::function<bool(const PrefillProgress&)> on_prefill;
  // Polled between layers and tokens; true = cancel.
  const std::atomic<bool>* cancel = nullptr;
};

class Engine {
 public:
  // Loads the model, the tokenizer (when the directory has tiktoken.model) and
  // installs the streaming expert store.
  static std::unique_ptr<Engine> LoadOrThrow(const EngineOptions& options);
  virtual ~Engine();

  const EngineOptions& options() const;
  const ModelConfig& config() const;
  const tok::Tokenizer* tokenizer() const;  // null without tiktoken.model
  model::Model& model();
  SamplingParams default_sampling() const;  // from generation_config.json
  int64_t context_limit() const;

  // BOS (when the config has one) + the rendered chat's ids.
  std::vector<int32_t> ChatPromptIds(const tok::RenderedChat& chat) const;

  // One generation; see the header comment for threads and failures.
  GenerateResult Generate(const GenerateRequest& request, const Callbacks& callbacks = {});

  // Checkpoint cache counters since load (for /metrics); all zero when off.
  // Safe from any thread, also while Generate runs (the cache publishes a copy
  // after every save, restore and park).
  CheckpointCacheStats checkpoint_stats() const;
  // The checkpoint configuration, one line (slots, bytes, disk dir): what the
  // apps print at start.
  std::string DescribeCheckpoints() const;
  // A clean shutdown: parks the RAM checkpoints not yet on disk to --ckpt-dir
  // (bounded by --ckpt-disk-gb) so the next start resumes them. Returns the
  // files written (0 without a directory). Not while Generate runs.
  int64_t ParkCheckpoints();

  // Cumulative expert-store stats since load (for /metrics). The one call that
  // is safe from any thread, also while Generate runs (a copy refreshed after
  // every prefill and decode step).
  model::ExpertStoreStats expert_stats() const;

  // Continuous batching (parallel > 1; zeros otherwise). Thread-safe.
  struct StepStats {
    int parallel = 1;
    int running = 0;  // requests holding a sequence now
    uint64_t steps = 0;
    uint64_t rows = 0;                // rows fed, summed over steps
    uint64_t decode_rows = 0;         // of them, decoding sequences' one-token rows
    uint64_t max_sequences = 0;       // most sequences in one step
    std::vector<uint64_t> rows_hist;  // steps by rows: <=1, <=2, <=4, ..., <=1024, more
    uint64_t admission_waits = 0;     // requests that waited for sequence memory
    uint64_t reserved_bytes = 0;      // reserved by running requests now
    uint64_t budget_bytes = 0;
  };
  StepStats step_stats() const;
  // The bytes a request of `prompt_tokens` + `max_tokens` (0: to the context
  // limit) reserves while it runs (parallel > 1): admission counts these.
  uint64_t RequestBytes(int64_t prompt_tokens, int64_t max_tokens) const;

  // The streaming store every engine installs (its plan and per-step stats).
  const stream::StreamingExpertStore& streaming() const;
  // Ids the session holds (prefix reuse compares new prompts with these).
  const std::vector<int32_t>& session_ids() const;
  // Forgets the session (the next Generate prefills from position 0).
  void ResetSession();

 private:
  Engine();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::engine
