// The seam between routing and the routed experts' arithmetic: an
// ExpertExecutor computes w2 · SiTU-GLU(w1 z, w3 z) for a window's
// (position, rank) pairs, in the latent space, and nothing else.
//
// lib/model keeps the router, K3_TOPP, the gather of each pair's latent row
// and the combine; the combine sums each token's pairs in ascending expert id
// whatever executor filled them, so which executor computed a pair never
// changes the order of the sum (docs/model.md). Implementations: the CPU one
// below (today's code over an ExpertStore), the Vulkan tier (lib/vulkan), and
// later a remote host, so the batch says nothing about where bytes or
// threads live.
//
// Thread-safety: one consumer (the Session's thread) calls Run(); an
// implementation may use threads of its own. Failures throw k3::Error; on a
// throw the outputs are unspecified.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "k3/model/config.h"
#include "k3/model/expert_store.h"
#include "k3/quant/quant.h"

namespace k3::model {

// Receives routed-expert outputs one (token, rank) pair at a time:
// the combine folds each pair into its token's latent sum as soon as the sum
// order allows, so no [C*K][LT] buffer is needed when experts arrive in
// ascending id order. Called on the thread that called Run(), once per listed
// pair; `row` (LT floats) is only read during the call.
class PairSink {
 public:
  virtual void Put(uint32_t pair, const float* row) = 0;

 protected:
  ~PairSink() = default;
};

// One MoE layer over one window. A "pair" is (token t, rank kk) with index
// t * top_k + kk; `users[e]` lists the pairs routed to expert e (ascending),
// empty when e is unused. `experts` is the union, in the order the caller
// wants the bytes read (ExpertStore::DiskOrder). The executor delivers every
// listed pair's output row through Emit() (to `sink`, or into
// out[pair * LT .. +LT) when there is no sink) and nothing else.
struct ExpertBatch {
  int64_t layer = 0;
  size_t num_tokens = 0;          // C
  size_t top_k = 0;               // K
  const float* latent = nullptr;  // [C][LT] f32 latent inputs (latent_down output)
  std::span<const int32_t> experts;
  const std::vector<std::vector<uint32_t>>* users = nullptr;  // [num_experts]
  // The CPU executor's choice of activations (RunOptions::idot). Executors
  // with one fixed precision (the Vulkan tier: f32) ignore it.
  bool int8_acts = false;
  // Where outputs go: the model's combine (`sink`) when set; without one
  // (a cluster worker, a test collecting rows) the [C * K][LT] buffer `out`.
  float* out = nullptr;
  PairSink* sink = nullptr;
  size_t latent_dim = 0;  // LT: the row length Emit copies into `out`
  // Between experts: true = stop the pass now (a cancel). The executor then
  // ends the store's pass (EndLayer) and returns; the outputs are incomplete
  // and the caller discards them. Null: never.
  const std::function<bool(size_t experts_done)>* stop = nullptr;

  void Emit(uint32_t pair, const float* row) const {
    if (sink != nullptr) {
      sink->Put(pair, row);
    } else {
      std::memcpy(out + static_cast<size_t>(pair) * latent_dim, row, latent_dim * sizeof(float));
    }
  }
  bool Stop(size_t experts_done) const { return stop != nullptr && (*stop)(experts_done); }
};

// How an executor delivers pairs; decides what the combine must hold.
enum class PairOrder {
  kAnyOrder,     // calls Emit in any order
  kExpertOrder,  // calls Emit expert by expert in batch.experts order
};

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // Computes every pair of `batch`. `store` is the model's expert store, where
  // an executor that needs the MXFP4 bytes on this host gets them.
  virtual void Run(const ExpertBatch& batch, ExpertStore& store) = 0;
  // Every executor delivers through Emit; any order is the safe default.
  virtual PairOrder pair_order() const { return PairOrder::kAnyOrder; }
  // The model expects the next pass of `layer` to use most of `likely` (disk
  // order): start what can start now. The default hands the hint to the
  // store; an executor that computes some experts elsewhere (the cluster)
  // passes on only those it reads here.
  virtual void Prefetch(int64_t layer, std::span<const int32_t> likely, ExpertStore& store) {
    store.Prefetch(layer, likely);
  }
};

// Today's CPU code: the store protocol (BeginLayer(union) / Acquire / Release
// / EndLayer) and quant::MatMul / MatMulQ8 per expert over its gathered rows.
// Owns only scratch; not thread-safe.
class CpuExpertExecutor final : public ExpertExecutor {
 public:
  explicit CpuExpertExecutor(const ModelConfig& config);
  void Run(const ExpertBatch& batch, ExpertStore& store) override;
  PairOrder pair_order() const override { return PairOrder::kExpertOrder; }

 private:
  const ModelConfig& config_;
  quant::ActsQ8 acts_latent_, acts_expert_;
  std::vector<float> zg_, g_, u_, y_;
};

}  // namespace k3::model
