// The seam between routing and the routed experts' arithmetic: an
// ExpertExecutor computes w2 · SiTU-GLU(w1 z, w3 z) for a chunk's
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
#include <span>
#include <vector>

#include "k3/model/config.h"
#include "k3/model/expert_store.h"
#include "k3/quant/quant.h"

namespace k3::model {

// One MoE layer over one chunk. A "pair" is (token t, rank kk) with index
// t * top_k + kk; `users[e]` lists the pairs routed to expert e (ascending),
// empty when e is unused. `experts` is the union, in the order the caller
// wants the bytes read (ExpertStore::DiskOrder). The executor writes
// out[pair * LT .. +LT) for every listed pair and touches no other row.
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
  float* out = nullptr;  // [C * K][LT]
};

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // Computes every pair of `batch`. `store` is the model's expert store, where
  // an executor that needs the MXFP4 bytes on this host gets them.
  virtual void Run(const ExpertBatch& batch, ExpertStore& store) = 0;
};

// Today's CPU code: the store protocol (BeginLayer(union) / Acquire / Release
// / EndLayer) and quant::MatMul / MatMulQ8 per expert over its gathered rows.
// Owns only scratch; not thread-safe.
class CpuExpertExecutor final : public ExpertExecutor {
 public:
  explicit CpuExpertExecutor(const ModelConfig& config);
  void Run(const ExpertBatch& batch, ExpertStore& store) override;

 private:
  const ModelConfig& config_;
  quant::ActsQ8 acts_latent_, acts_expert_;
  std::vector<float> zg_, g_, u_, y_;
};

}  // namespace k3::model
