#include "k3/model/expert_executor.h"

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

  store.BeginLayer(b.layer, b.experts);
  for (int32_t e : b.experts) {
    const auto& us = (*b.users)[static_cast<size_t>(e)];
    const size_t n = us.size();
    ExpertView ev = store.Acquire(b.layer, e);
    g_.resize(n * MI);
    u_.resize(n * MI);
    y_.resize(n * LT);
    if (idot) {
      // Gather the pre-quantized latent rows (quantization is per row, so this
      // equals quantizing the gathered rows).
      quant::ActsQ8& ga = acts_expert_;
      const quant::ActsQ8& za = acts_latent_;
      const size_t groups = LT / 32;
      ga.batch = n;
      ga.cols = LT;
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
      zg_.resize(n * LT);
      for (size_t r = 0; r < n; ++r) {
        std::memcpy(zg_.data() + r * LT, b.latent + (us[r] / K) * LT, LT * sizeof(float));
      }
      quant::MatMul(ev.w1, zg_.data(), n, g_.data());
      quant::MatMul(ev.w3, zg_.data(), n, u_.data());
      quant::SituGlu(g_.data(), u_.data(), n * MI, c.situ_beta, c.situ_linear_beta, g_.data());
      quant::MatMul(ev.w2, g_.data(), n, y_.data());
    }
    store.Release(b.layer, e);
    for (size_t r = 0; r < n; ++r) {
      std::memcpy(b.out + static_cast<size_t>(us[r]) * LT, y_.data() + r * LT, LT * sizeof(float));
    }
  }
  store.EndLayer(b.layer);
}

}  // namespace k3::model
