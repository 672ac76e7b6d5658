// Element-wise ops exactly as spec §4 defines them; scalar so that every ISA
// (and the GPU tier's CPU fallback) agrees bit for bit, except SituGlu, whose
// one definition (situ.h) each ISA's kernel file compiles.
#include "k3/quant/ops.h"

#include "kernels.h"

#include <omp.h>

#include <algorithm>
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

// situ.h's exp and tanh (not libm's), so that the vectorized ISA builds of the
// same loop give these bits.
// A prefill's dense MLP is C x 33792 elements (69 M at 2048 tokens): split it
// over the threads in 64-element-aligned ranges. Every element is the same
// branch-free function, so where a range starts changes no bit.
void SituGlu(const float* g, const float* u, size_t n, float b1, float b2, float* out) noexcept {
  const internal::KernelTable& k = internal::ActiveKernels();
  const auto fn = k.situ_glu != nullptr ? k.situ_glu : internal::SituGluScalar;
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (n < internal::kParallelElements || nt < 2) {
    fn(g, u, n, b1, b2, out);
    return;
  }
  const size_t per = ((n + static_cast<size_t>(nt) - 1) / static_cast<size_t>(nt) + 63) / 64 * 64;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int t = 0; t < nt; ++t) {
    const size_t a = static_cast<size_t>(t) * per;
    if (a < n) fn(g + a, u + a, std::min(per, n - a), b1, b2, out + a);
  }
}

void Softmax(float* v, size_t n) noexcept {
  if (n == 0) return;
  float m = v[0];
  for (size_t i = 1; i < n; ++i) {
    if (v[i] > m) m = v[i];
  }
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::exp(v[i] - m);
    s += v[i];
  }
  for (size_t i = 0; i < n; ++i) v[i] = v[i] / s;
}

}  // namespace k3::quant
