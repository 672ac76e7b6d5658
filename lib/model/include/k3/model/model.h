// The Kimi K3 forward pass (spec §5): AttnRes residual stream, KDA and gated
// MLA attention, LatentMoE / dense MLP, head; chunked layer-major prefill that
// is bit-identical to token-at-a-time.
//
// Model owns the opened snapshot, the config, the resident weights and the
// expert store; it is immutable during inference except for the expert store,
// so one Model serves one Session at a time. Session owns the per-sequence
// state (KDA recurrent state and conv windows, MLA latent cache, position).
// Neither is thread-safe; kernels parallelise internally (OpenMP).
// Failures throw k3::Error (bad ids, I/O from the expert store). Bad ids are
// refused before any state moves; after any other failure inside Forward()
// the session state is unspecified: Reset() it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "k3/container/snapshot.h"
#include "k3/core/default_init.h"
#include "k3/model/config.h"
#include "k3/model/dense_executor.h"
#include "k3/model/expert_executor.h"
#include "k3/model/expert_store.h"
#include "k3/model/weights.h"
#include "k3/quant/quant.h"

namespace k3::model {

struct MlaSegment;          // session_state.h
struct SessionCheckpoint;   // session_state.h
struct StateFingerprint;    // session_state.h

// Inference choices. k3::engine::EngineOptions::FromEnv fills them from K3_IDOT,
// K3_CHUNK, K3_PREFILL_GB and K3_TOPP (docs/environment.md).
struct RunOptions {
  // Quantized matmuls take int8 activations (quant::MatMulQ8). False: every
  // matmul takes f32 activations (the configuration of the oracle goldens).
  bool idot = true;
  // Prefill window in tokens (K3_CHUNK): > 0 forces windows of at most this
  // many tokens; 0 (the default) sizes them from prefill_budget_bytes
  // (PlanWindow): one window when the call fits, else the fewest that fit.
  // Results are bit-identical for every window size.
  int chunk = 0;
  // Memory a prefill window may hold (PrefillWindowBytes), bytes. The engine
  // sets it from K3_PREFILL_GB / --prefill-mem-gb or from MemAvailable.
  double prefill_budget_bytes = 1.2e9;
  // K3_TOPP (spec §5.5 step 4): in (0, 1) keeps the shortest weight-descending
  // prefix of a token's top-k whose mass reaches topp, renormalised; fewer
  // experts means less I/O and compute. 0 or >= 1: off (the default).
  float topp = 0.0f;
  // MLA attention's token group (tests): > 0 forces groups of this many
  // tokens; 0 sizes them to about 8 MiB of the group's buffers. Any group
  // gives the same bits.
  int mla_group = 0;
};

class Model {
 public:
  // Opens `dir` (HF snapshot or k3 container: auto-detected per tensor),
  // loads the weights and a SimpleExpertStore.
  static std::unique_ptr<Model> LoadOrThrow(const std::string& dir, const LoadOptions& options,
                                            const Snapshot::Options& snapshot_options = {});

  const ModelConfig& config() const { return config_; }
  const Snapshot& snapshot() const { return *snapshot_; }
  const ModelWeights& weights() const { return weights_; }
  ExpertStore& experts() { return *experts_; }
  // Replaces the expert store (e.g. lib/stream's streaming store).
  void SetExpertStore(std::unique_ptr<ExpertStore> store) { experts_ = std::move(store); }
  // Who computes the routed experts: null (the default) = the CPU over
  // experts(); otherwise e.g. the Vulkan tier. The executor is handed the
  // current store on every call, so the store may be replaced either side of this.
  ExpertExecutor* executor() { return executor_.get(); }
  void SetExpertExecutor(std::unique_ptr<ExpertExecutor> executor) {
    executor_ = std::move(executor);
  }
  // Who computes the trunk's dense matrices: null (the default) = the CPU;
  // otherwise e.g. lib/vulkan's dense placement, for the matrices it holds.
  DenseExecutor* dense_executor() { return dense_.get(); }
  void SetDenseExecutor(std::unique_ptr<DenseExecutor> dense) { dense_ = std::move(dense); }
  double load_seconds() const { return load_seconds_; }

 private:
  Model() = default;
  std::unique_ptr<Snapshot> snapshot_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<ExpertStore> experts_;
  std::unique_ptr<ExpertExecutor> executor_;
  std::unique_ptr<DenseExecutor> dense_;
  double load_seconds_ = 0;
};

// Optional outputs of one Forward() call, all row-major f32; null = not wanted.
struct ForwardOutputs {
  float* logits_all = nullptr;    // [T][vocab]: logits at every fed position
  float* logits_last = nullptr;   // [vocab]: logits at the last fed position
  float* trace = nullptr;         // [T][layers][hidden]: h after each layer (oracle hidden.f32)
  float* final_hidden = nullptr;  // [T][hidden]: lm_head input (oracle final.f32)
};

// What a prefill window holds (docs/model.md "Windows"), in bytes:
// activations, AttnRes block snapshots, the largest layer's scratch (KDA, MLA
// with its score rows, MoE with router logits, latent rows, the executor's
// rows and the combine's held outputs, dense / shared MLP), the int8
// activation scratch, the head and KDA checkpoint captures. Counted from the
// same sizes the forward pass allocates; lib/model's window test checks it
// against a counting allocator.
struct WindowShape {
  int64_t tokens = 0;    // C
  int64_t position = 0;  // the window's first position (MLA rows before it)
  int threads = 1;       // OpenMP threads (per-thread scratch)
  bool idot = true;
  bool head_all = false;  // logits / final hidden at every position
  bool head_last = true;  // logits at the last position
  // The combine holds (token, rank) outputs that arrive before a lower expert
  // id of the same token: C*K*LT floats at worst. False when the executor
  // emits expert by expert in disk order and disk order is ascending id.
  bool combine_buffer = true;
  int64_t captures = 0;  // checkpoints captured inside the window
  int mla_group = 0;     // RunOptions::mla_group
};
uint64_t PrefillWindowBytes(const ModelConfig& config, const WindowShape& shape);

// The window for a call of `total` tokens from `shape.position` within
// `budget_bytes` (shape.tokens and shape.captures are ignored): the largest
// whose equalised windows (the fewest of at most that many tokens) each fit,
// counting the checkpoints strictly inside each (`captures_at`: ascending
// offsets in the call, as for Session::Forward). `total` when the call fits;
// at least 1 (with a warning when even that does not fit).
int64_t PlanWindow(const ModelConfig& config, int64_t total, double budget_bytes, WindowShape shape,
                   std::span<const int64_t> captures_at = {});

// Where a prefill stands when the session polls (Session::SetInterrupt).
struct PrefillPoint {
  int64_t tokens_done = 0;   // of this Forward call, through every layer
  int64_t window_begin = 0;  // the current window, as offsets in the call
  int64_t window_tokens = 0;
  int64_t layer = 0;   // the layer about to run, or running (between experts)
  int64_t layers = 0;  // layers in the stack
  // Inside the layer's routed-expert pass: experts done of the pass's union
  // (0 of 0 between layers).
  int64_t experts_done = 0;
  int64_t experts_total = 0;
};

// Router decisions of one MoE layer for one token (for tests and stats).
struct RoutingRecord {
  int64_t layer = 0;
  int64_t position = 0;
  std::vector<int32_t> experts;  // selection rank order
  std::vector<float> weights;    // renormalised
};

// Wall seconds of the forward pass by part, summed over a session's Forward
// calls (the prefill benchmark states each part's share). The parts are timed
// around the code that does them, threads included; their sum is the forward
// pass less embedding lookups and loop overhead.
struct PhaseTimes {
  double attn_proj = 0;    // KDA and MLA linear layers (q/k/v/g/f/b, q_a/q_b/kv_a/g, o)
  double kda_scan = 0;     // KDA short conv + the gated delta-rule scan, per head
  double mla_attn = 0;     // MLA over the cache: absorbed queries, scores, softmax, sums
  double moe_router = 0;   // router matmul, top-k, latent down-projection
  double moe_experts = 0;  // the routed experts' pass (reads waited for included)
  double moe_latent_up = 0;  // latent norm and up-projection
  double mlp = 0;          // dense MLP and the shared experts
  double residual = 0;     // AttnRes mixes, RMS norms, residual adds
  double head = 0;         // final mix, norm and lm_head
  double Total() const {
    return attn_proj + kda_scan + mla_attn + moe_router + moe_experts + moe_latent_up + mlp +
           residual + head;
  }
  PhaseTimes operator-(const PhaseTimes& o) const {
    return {attn_proj - o.attn_proj,   kda_scan - o.kda_scan,       mla_attn - o.mla_attn,
            moe_router - o.moe_router, moe_experts - o.moe_experts, moe_latent_up - o.moe_latent_up,
            mlp - o.mlp,               residual - o.residual,       head - o.head};
  }
};

class Session {
 public:
  // `max_tokens` bounds the MLA cache (grown on demand beyond it).
  // `share_work_with`: a session of the same model whose work space (every
  // scratch arena a forward pass uses, not its state) this one shares, so
  // that the sequences of one engine hold one set of arenas; such sessions
  // must never run forward passes at the same time (one thread drives them,
  // see Step). Null: a work space of its own.
  Session(Model& model, RunOptions options, int64_t max_tokens = 0,
          const Session* share_work_with = nullptr);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Feeds `ids` at positions position()..position()+T-1 in windows (see
  // RunOptions::chunk) and advances the state.
  //
  // Checkpoints inside the call: for every position in
  // `checkpoint_at` (ascending, in (position(), position()+T]) the session
  // captures each KDA layer's state and conv windows as that layer's scan
  // passes the position (MLA rows are position-indexed), and hands the
  // finished checkpoint to `on_checkpoint` once its window has run through the
  // whole stack, before the next window starts. A window interrupted midway
  // delivers none of its own.
  using CheckpointSink = std::function<void(std::shared_ptr<const SessionCheckpoint>)>;
  void Forward(std::span<const int32_t> ids, const ForwardOutputs& out,
               std::span<const int64_t> checkpoint_at = {},
               const CheckpointSink& on_checkpoint = {});
  // One sequence's rows in a step (Step).
  struct StepSlice {
    Session* session = nullptr;
    std::span<const int32_t> ids;  // fed at session->position() onwards
    float* logits_last = nullptr;  // [vocab]: logits at the slice's last id; null: not wanted
  };
  // One forward pass over the rows of several sequences (continuous batching,
  // docs/engine.md "Steps"): every slice's ids advance its own session as
  // Forward(ids) alone would, and with the same bits: each matmul runs once
  // over all rows (a row's bits never depend on the others), each routed
  // expert is fetched once for every row routed to it, and the sequential
  // parts (KDA conv and scan, the MLA cache and attention) run per slice over
  // its session's state. The step runs in slices[0]'s work space with its
  // options and phase clock; no slice may name the same session twice, and
  // all must be sessions of one model with the same RunOptions::idot. No
  // windows (a slice is one), no checkpoint captures, no interrupt polls: a
  // caller keeps steps short and checkpoints between them (SaveCheckpoint).
  // Bad ids are refused (kInvalidArgument) before any state moves; after any
  // other failure every slice's session is unspecified: Reset() them.
  static void Step(std::span<const StepSlice> slices);

  // The window the last Forward call used (tokens; the largest of its windows)
  // and how many windows it ran.
  int64_t last_window() const { return last_window_; }
  int64_t last_windows() const { return last_windows_; }
  // Time by part of the pass, since the session was made (subtract two reads).
  const PhaseTimes& phase_times() const { return phases_; }
  // Forgets everything (position 0).
  void Reset();
  int64_t position() const { return pos_; }
  // The ids fed so far, one per position. A caller that wants prefix reuse
  // (spec §5.10) keeps the session when a new prompt starts with all of them
  // and feeds only the tail; KDA state cannot be rolled back, so anything
  // else needs Reset().
  const std::vector<int32_t>& history() const { return history_; }
  const RunOptions& options() const { return options_; }

  // Cancellation and progress: `poll(point)` is called before every layer of
  // every window and between the experts of a layer's routed-expert pass
  // (PrefillPoint says where). When it returns true, Forward stops and
  // interrupted() is true. A stop before a window's first layer keeps the
  // windows already fed (position() and history() say how far); a stop inside
  // a window Reset()s the session, since KDA state cannot be rolled back.
  // Either way no state is half-fed. Outputs of an interrupted call are
  // incomplete. Empty function: never.
  using InterruptPoll = std::function<bool(const PrefillPoint& point)>;
  void SetInterrupt(InterruptPoll poll) { interrupt_ = std::move(poll); }
  bool interrupted() const { return interrupted_; }

  // When enabled, every MoE routing decision is appended here.
  void RecordRouting(bool on) { record_routing_ = on; }
  const std::vector<RoutingRecord>& routing() const { return routing_; }

  // Checkpoints (session_state.h). SaveCheckpoint copies the KDA
  // state and conv windows and the MLA rows fed since the last checkpoint this
  // session saved or restored on the same ids; earlier rows are shared with
  // that checkpoint. RestoreCheckpoint makes this session's state exactly the
  // checkpoint's (position, history, every layer), so feeding a tail next is
  // bit-identical to having fed the checkpoint's ids and the tail; it throws
  // kInvalidArgument (nothing changed) when the checkpoint's fingerprint or
  // layout is not this session's.
  std::shared_ptr<const SessionCheckpoint> SaveCheckpoint();
  void RestoreCheckpoint(const SessionCheckpoint& checkpoint);
  // This session's fingerprint (model identity computed once per session).
  StateFingerprint Fingerprint() const;

 private:
  struct Impl;  // session_impl.h; the members below live in the rooms it names
  void ForwardChunk(const int32_t* ids, int64_t n, int64_t t_base, const ForwardOutputs& out,
                    bool last_chunk);
  // A pass's rows by sequence: rows [r0, r0 + n) of the pass are `s`'s ids
  // at positions pos0 onwards. One entry for Forward's windows, one per
  // slice for Step; the layers loop over them where state is per sequence.
  struct Seg {
    Session* s = nullptr;
    size_t r0 = 0, n = 0;
    int64_t pos0 = 0;
  };
  // The embedding and every layer over the C rows of segs_ (the window
  // streams hold the result); returns the AttnRes blocks made, or -1 when a
  // poll stopped it.
  int64_t RunLayers(const int32_t* ids, size_t C, const ForwardOutputs& out, int64_t t_base);
  // The head over `rows` of the pass just run (`nb` blocks): the final mix and
  // norm into `final_hidden` rows when wanted, logits [rows.size()][vocab].
  void Head(std::span<const size_t> rows, size_t nb, float* final_hidden, float* logits);
  // Grows the MLA caches to hold `need` positions (doubling); returns the bytes added.
  double GrowMlaCache(int64_t need);
  void KdaForward(int64_t layer, const float* x, size_t n, float* out);
  void MlaForward(int64_t layer, const float* x, size_t n, float* out);
  void MlaAttend(int64_t layer, Impl& state, const float* qv, const float* gv, size_t n,
                 int64_t pos0, float* ctx);
  void MlpForward(const MlpWeights& w, const float* x, size_t n, float* out);
  void MoeForward(int64_t layer, const float* x, size_t n, float* out);
  // Read-ahead hint for the first MoE layer at or after `from` when a window
  // of `n` tokens will use nearly all of its experts (docs/engine.md).
  void ReadAhead(int64_t from, size_t n);
  // The model's executor, or this session's CPU one when the model has none.
  ExpertExecutor& Executor();
  // True (and interrupted_ set) when the poll asks to stop; see SetInterrupt.
  bool PollInterrupt(int64_t layer, int64_t experts_done = 0, int64_t experts_total = 0);
  // Whether the combine may need to hold outputs (WindowShape::combine_buffer).
  bool CombineMayHold();
  // A checkpoint at `position` <= pos_ with these KDA floats (layer order);
  // shares the MLA segments of the last one saved or restored.
  std::shared_ptr<const SessionCheckpoint> BuildCheckpoint(int64_t position,
                                                           DefaultInitVector<float> kda);

  Model& model_;
  RunOptions options_;
  InterruptPoll interrupt_;
  bool interrupted_ = false;
  int64_t pos_ = 0;
  std::vector<int32_t> history_;
  bool record_routing_ = false;
  std::vector<RoutingRecord> routing_;
  std::unique_ptr<Impl> impl_;
  // Checkpoints: the MLA segments of the last checkpoint saved or restored
  // (valid while they cover a prefix of history_), and the model identity.
  std::vector<std::shared_ptr<const MlaSegment>> ckpt_mla_;
  mutable std::string ckpt_model_id_;
  // The current Forward call's window (for polls) and what the last call used.
  PrefillPoint point_;
  std::vector<Seg> segs_;  // the running pass's rows (this session drives it)
  int64_t last_window_ = 0;
  int64_t last_windows_ = 0;
  PhaseTimes phases_;
};

// Sampling (§5.8). temperature <= 0: greedy argmax, first maximum wins.
// Otherwise softmax at `temperature` (f64 total), nucleus cut at `top_p`, draw
// from a std::mt19937_64 seeded by the caller.
class Sampler {
 public:
  Sampler(float temperature, float top_p, uint64_t seed);
  int32_t Sample(std::span<const float> logits);
  static int32_t Argmax(std::span<const float> logits);

 private:
  float temperature_;
  float top_p_;
  std::mt19937_64 rng_;
};

}  // namespace k3::model
