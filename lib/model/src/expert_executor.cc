#include "k3/model/expert_executor.h"

#include <algorithm>
#include <cstring>

#include "k3/quant/ops.h"

namespace k3::model {

CpuExpertExecutor::CpuExpertExecutor(const ModelConfig& config) : config_(config) {}

void CpuExpertExecutor::Run(const ExpertBatch& b, ExpertStore& store) {
  const ModelConfig& c = config_;
  const size_t K = b.top_k;
  const size_t LT = static_cast<size_t>(c.routed_expert_hidden_size);
  const size_t MI = static_cast<size_t>(c.moe_intermediate_size);
  const bool idot = b.int8_acts;
  if (b.experts.empty()) return;
  if (idot) quant::QuantizeActs(b.latent, b.num_tokens, LT, &acts_latent_);

  // Scratch sized once for the busiest expert of the pass (no regrowth copies
  // inside the pass: PrefillWindowBytes counts these rows once).
  size_t n_max = 0;
  for (int32_t e : b.experts) n_max = std::max(n_max, (*b.users)[static_cast<size_t>(e)].size());
  g_.resize(n_max * MI);
  u_.resize(n_max * MI);
  y_.resize(n_max * LT);
  if (!idot) zg_.resize(n_max * LT);

  store.BeginLayer(b.layer, b.experts);
  size_t done = 0;
  for (int32_t e : b.experts) {
    if (b.Stop(done++)) break;
    const auto& us = (*b.users)[static_cast<size_t>(e)];
    const size_t n = us.size();
    ExpertView ev = store.Acquire(b.layer, e);
    if (idot) {
      // Gather the pre-quantized latent rows (quantization is per row, so this
      // equals quantizing the gathered rows).
      quant::ActsQ8& ga = acts_expert_;
      const quant::ActsQ8& za = acts_latent_;
      const size_t groups = LT / 32;
      ga.batch = n;
      ga.cols = LT;
      ga.q.reserve(n_max * std::max(LT, MI));
      ga.scales.reserve(n_max * std::max(LT, MI) / 32);
      ga.q.resize(n * LT);
      ga.scales.resize(n * groups);
      for (size_t r = 0; r < n; ++r) {
        const size_t t = us[r] / K;
        std::memcpy(ga.q.data() + r * LT, za.q.data() + t * LT, LT);
        std::memcpy(ga.scales.data() + r * groups, za.scales.data() + t * groups,
                    groups * sizeof(float));
      }
      quant::MatMulQ8(ev.w1, ga, g_.data());
      quant::MatMulQ8(ev.w3, ga, u_.data());
      quant::SituGlu(g_.data(), u_.data(), n * MI, c.situ_beta, c.situ_linear_beta, g_.data());
      quant::QuantizeActs(g_.data(), n, MI, &ga);
      quant::MatMulQ8(ev.w2, ga, y_.data());
    } else {
      for (size_t r = 0; r < n; ++r) {
        std::memcpy(zg_.data() + r * LT, b.latent + (us[r] / K) * LT, LT * sizeof(float));
      }
      quant::MatMul(ev.w1, zg_.data(), n, g_.data());
      quant::MatMul(ev.w3, zg_.data(), n, u_.data());
      quant::SituGlu(g_.data(), u_.data(), n * MI, c.situ_beta, c.situ_linear_beta, g_.data());
      quant::MatMul(ev.w2, g_.data(), n, y_.data());
    }
    store.Release(b.layer, e);
    for (size_t r = 0; r < n; ++r) b.Emit(us[r], y_.data() + r * LT);
  }
  store.EndLayer(b.layer);
}

}  // namespace k3::model
