// Element-wise and normalisation ops with the precision spec §4 states
// (f64 where it says so). Scalar and deterministic; noexcept.
#pragma once

#include <cstddef>

namespace k3::quant {

float Sigmoid(float x) noexcept;  // 1/(1+expf(-x))
float Silu(float x) noexcept;     // x/(1+expf(-x))
// out_i = x_i * r * w_i, r = 1/sqrtf((float)(sum_f64(x^2)/n) + eps). In-place allowed.
void RmsNorm(const float* x, const float* w, size_t n, float eps, float* out) noexcept;
// out_i = b1*tanhf(g/b1)*sigmoid(g) * b2*tanhf(u/b2), left to right in f32.
void SituGlu(const float* g, const float* u, size_t n, float b1, float b2, float* out) noexcept;
// dot = sum x_i*w_i and ss = sum x_i^2, in f64 (each product exact): 16 lanes
// (i % 16) folded by a fixed tree, then the tail; every ISA gives these bits
// (the scalar reference: kernels.h DotSumSquaresScalar).
void DotSumSquares(const float* x, const float* w, size_t n, double* dot, double* ss) noexcept;
// One KDA step's two sweeps over a head's state s [hd][hd] (row = key dim),
// keys in ascending order, mul then add per element (every ISA gives the same
// bits; the scalar reference: kernels.h KdaDecayScalar / KdaUpdateScalar):
// KdaDecay: s <- Diag(alpha) s, ks = s^T kn. KdaUpdate: s += kn vt^T, oh = s^T qn.
void KdaDecay(float* s, size_t hd, const float* alpha, const float* kn, float* ks) noexcept;
void KdaUpdate(float* s, size_t hd, const float* kn, const float* vt, const float* qn,
               float* oh) noexcept;
// In place: m = max, e = exp(v-m) (situ.h's exp, within 1 ulp), s = sum in 16
// lanes (element i in lane i % 16) folded by a fixed tree, then the tail in
// order (f32), v = e/s. Every ISA gives the scalar bits (kernels.h SoftmaxScalar).
void Softmax(float* v, size_t n) noexcept;

}  // namespace k3::quant
