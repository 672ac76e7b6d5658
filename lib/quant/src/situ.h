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
// Internal linkage: every kernel file compiles these loops with its own ISA
// flags, so no TU may end up calling another TU's out-of-line copy.
namespace {

// c ? a : b, as bit masks. Written with `?:`, GCC moves the float operations
// that use the result into the branches (c ? -104 * k : x * k), and as they may
// trap (-ftrapping-math) the branches stay: the loop is then vectorized only
// where the ISA has masked operations (AVX-512), not on AVX2 or NEON. The value
// is the same either way.
inline float SelectBits(bool c, float a, float b) noexcept {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

inline float SituExp(float x) noexcept {
  x = SelectBits(x < -104.0f, -104.0f, x);
  x = SelectBits(x > 89.0f, 89.0f, x);
  const float k = x * 1.44269504f + 12582912.0f;  // in [2^23, 2^24): ulp 1
  const float n = k - 12582912.0f;
  float r = x - n * 0.693145752f;
  r = r - n * 1.42860677e-6f;
  float q = 0.000198948052f;
  q = q * r + 0.00139296066f;
  q = q * r + 0.00833330397f;
  q = q * r + 0.041666504f;
  q = q * r + 0.166666672f;
  q = q * r + 0.5f;
  const float p = (q * (r * r) + r) + 1.0f;
  // n as an integer from k's bits (k's ulp is 1, so they differ from
  // 1.5 * 2^23's by exactly n), not by a float-to-int conversion, which needs
  // a NaN guard (a branch, as in SelectBits). For a NaN x the integer is
  // meaningless and p, hence the result, NaN already.
  const int32_t ni = static_cast<int32_t>(std::bit_cast<uint32_t>(k) - 0x4b400000u);
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
  const float t = SelectBits(ax < 0.5625f, small, large);
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

// Softmax in place over n floats (ops.h), in 16 lanes so that every ISA's
// vectorized build of this loop gives the scalar bits: m = max (lane maxima,
// then a fixed tree); e_i = SituExp(v_i - m); s = the lanes' sums (element i
// in lane i % 16) folded by the tree j + (j+8), + (j+4), + (j+2), + (j+1), then
// the tail elements in order; v_i = e_i / s. MLA's scores are T^2/2 x heads
// elements per window: libm's expf and one serial sum would be most of the
// softmax's time at 8192 tokens.
inline constexpr size_t kSoftmaxLanes = 16;

// The lanes folded by the tree: a[j] = op(a[j], a[j + half]) for half = 8, 4, 2, 1.
template <typename Op>
inline float SoftmaxFold(float* a, Op op) noexcept {
  for (size_t half = kSoftmaxLanes / 2; half > 0; half /= 2) {
    for (size_t j = 0; j < half; ++j) a[j] = op(a[j], a[j + half]);
  }
  return a[0];
}

inline void SoftmaxLoop(float* v, size_t n) noexcept {
  if (n == 0) return;
  const size_t full = n / kSoftmaxLanes * kSoftmaxLanes;
  float m = v[0];
  if (full > 0) {
    float lm[kSoftmaxLanes];
    for (size_t j = 0; j < kSoftmaxLanes; ++j) lm[j] = v[j];
    for (size_t i = kSoftmaxLanes; i < full; i += kSoftmaxLanes) {
      for (size_t j = 0; j < kSoftmaxLanes; ++j) lm[j] = v[i + j] > lm[j] ? v[i + j] : lm[j];
    }
    m = SoftmaxFold(lm, [](float a, float b) { return b > a ? b : a; });
  }
  for (size_t i = full; i < n; ++i) m = v[i] > m ? v[i] : m;
  float ls[kSoftmaxLanes];
  for (size_t j = 0; j < kSoftmaxLanes; ++j) ls[j] = 0.0f;
  for (size_t i = 0; i < full; i += kSoftmaxLanes) {
    for (size_t j = 0; j < kSoftmaxLanes; ++j) {
      const float e = SituExp(v[i + j] - m);
      v[i + j] = e;
      ls[j] = ls[j] + e;
    }
  }
  float s = SoftmaxFold(ls, [](float a, float b) { return a + b; });
  for (size_t i = full; i < n; ++i) {
    v[i] = SituExp(v[i] - m);
    s = s + v[i];
  }
  for (size_t i = 0; i < n; ++i) v[i] = v[i] / s;
}

}  // namespace
}  // namespace k3::quant::internal
