// Element-wise ops exactly as spec §4 defines them; scalar so that every ISA
// (and the GPU tier's CPU fallback) agrees bit for bit, except SituGlu, Softmax
// and the KDA sweeps, whose one definition (situ.h, kda.h) each ISA's kernel
// file compiles (quant.cc dispatches them).
#include "k3/quant/ops.h"

#include "kernels.h"

#include <cmath>

namespace k3::quant {

float Sigmoid(float x) noexcept { return 1.0f / (1.0f + std::exp(-x)); }

float Silu(float x) noexcept { return x / (1.0f + std::exp(-x)); }

void RmsNorm(const float* x, const float* w, size_t n, float eps, float* out) noexcept {
  double ms = 0.0;
  for (size_t i = 0; i < n; ++i) ms += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ms / static_cast<double>(n)) + eps);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
}

}  // namespace k3::quant
