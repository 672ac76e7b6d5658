// SiTU-GLU's element function (spec §4.3), written once as branch-free float
// code that every kernel file compiles for its own ISA: the scalar build runs
// it element by element, the AVX2 / AVX-512 builds vectorize the same loop.
// k3_quant is compiled with -ffp-contract=off and no fast-math, every step is
// one IEEE operation (add, mul, div, compare-select, exact integer/bit moves),
// so every ISA gives the scalar bits (quant_test checks it, ties included).
//
// exp: x clamped to [-104, 89] (beyond: 0 or inf in float), n = round(x log2 e)
// by the 1.5 * 2^23 trick, r = x - n ln2 in two steps (Cody-Waite), exp(r) =
// 1 + r + r^2 Q(r) with a degree-5 Q fitted on |r| <= ln2/2, times 2^n as two
// exact powers of two (so subnormal results round once). Max error 0.95 ulp
// over float's normal range.
// tanh: |x| < 0.5625: x + x y P(y), y = x^2, degree-5 P fitted on that range;
// else 1 - 2 / (exp(2|x|) + 1); the sign copied back. Max error 1.4 ulp,
// glibc's tanhf's own bound. (Both fitted by least squares in f64, errors
// measured against f64 over 10^6-sample sweeps: docs/quant.md.)
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace k3::quant::internal {

inline float SituExp(float x) noexcept {
  x = x < -104.0f ? -104.0f : x;
  x = x > 89.0f ? 89.0f : x;
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693145752f;
  r = r - n * 1.42860677e-6f;
  float q = 0.000198948052f;
  q = q * r + 0.00139296066f;
  q = q * r + 0.00833330397f;
  q = q * r + 0.041666504f;
  q = q * r + 0.166666672f;
  q = q * r + 0.5f;
  const float p = (q * (r * r) + r) + 1.0f;
  const int32_t ni = static_cast<int32_t>(n == n ? n : 0.0f);  // NaN: p is NaN already
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const float s1 = std::bit_cast<float>((n1 + 127) << 23);
  const float s2 = std::bit_cast<float>((n2 + 127) << 23);
  return (p * s1) * s2;
}

inline float SituTanh(float x) noexcept {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const float ax = std::bit_cast<float>(bits & 0x7fffffffu);
  const float y = ax * ax;
  float q = 0.00248861383f;
  q = q * y - 0.00849680323f;
  q = q * y + 0.0218100678f;
  q = q * y - 0.0539636649f;
  q = q * y + 0.133333191f;
  q = q * y - 0.333333343f;
  const float small = ax + ax * (y * q);
  const float large = 1.0f - 2.0f / (SituExp(2.0f * ax) + 1.0f);
  const float t = ax < 0.5625f ? small : large;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(t) | (bits & 0x80000000u));
}

// out_i = b1 * tanh(g_i / b1) * sigmoid(g_i) * b2 * tanh(u_i / b2), left to
// right, sigmoid(g) = 1 / (1 + exp(-g)). In place allowed (out == g or u).
inline void SituGluLoop(const float* g, const float* u, size_t n, float b1, float b2,
                        float* out) noexcept {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i], ui = u[i];
    const float sig = 1.0f / (1.0f + SituExp(-gi));
    out[i] = b1 * SituTanh(gi / b1) * sig * b2 * SituTanh(ui / b2);
  }
}

}  // namespace k3::quant::internal
