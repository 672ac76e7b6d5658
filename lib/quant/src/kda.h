// The KDA recurrence's two sweeps over a head's state S (spec §5.3), written
// once as plain float loops that every kernel file compiles for its own ISA
// (as situ.h): the scalar build runs them element by element, the AVX2 /
// AVX-512 / NEON builds vectorize across the value dimension. k3_quant has no
// FMA contraction and each element sees the same multiplies and adds in the
// same key order (kk ascending) in every build, so every ISA gives the scalar
// bits, which are the forward pass's own (lib/model wrote these loops inline,
// mul then add, before they moved here). quant_test checks it per ISA.
//
// Strips of kKdaStrip value columns: a strip's sums stay in registers while the
// sweep walks the hd key rows, and the strip's several vectors are independent
// chains (one 16-lane chain per sweep was bound by the add latency).
#pragma once

#include <cstddef>

namespace k3::quant::internal {
// Internal linkage: every kernel file compiles these loops with its own ISA
// flags, so no TU may end up calling another TU's out-of-line copy.
namespace {

inline constexpr size_t kKdaStrip = 64;

// One sweep: every element of s becomes next(old, kk, v), and
// out[v] = sum over kk ascending of w[kk] * the new s[kk][v] (from 0).
template <typename Next>
inline void KdaSweep(float* __restrict s, size_t hd, const float* __restrict w,
                     float* __restrict out, Next next) noexcept {
  size_t v0 = 0;
  for (; v0 + kKdaStrip <= hd; v0 += kKdaStrip) {
    float acc[kKdaStrip];
    for (size_t j = 0; j < kKdaStrip; ++j) acc[j] = 0.0f;
    for (size_t kk = 0; kk < hd; ++kk) {
      float* __restrict row = s + kk * hd + v0;
      const float wk = w[kk];
      for (size_t j = 0; j < kKdaStrip; ++j) {
        const float r = next(row[j], kk, v0 + j);
        row[j] = r;
        acc[j] = acc[j] + wk * r;
      }
    }
    for (size_t j = 0; j < kKdaStrip; ++j) out[v0 + j] = acc[j];
  }
  for (; v0 < hd; ++v0) {  // columns past the last whole strip
    float acc = 0.0f;
    for (size_t kk = 0; kk < hd; ++kk) {
      float& r = s[kk * hd + v0];
      r = next(r, kk, v0);
      acc = acc + w[kk] * r;
    }
    out[v0] = acc;
  }
}

// S <- Diag(alpha) S (row kk scaled by alpha[kk]); ks[v] = sum_kk kn[kk] * S[kk][v].
inline void KdaDecayLoop(float* s, size_t hd, const float* alpha, const float* kn,
                         float* ks) noexcept {
  KdaSweep(s, hd, kn, ks, [alpha](float r, size_t kk, size_t) { return r * alpha[kk]; });
}

// S += kn vt^T (row kk plus kn[kk] * vt); oh[v] = sum_kk qn[kk] * S[kk][v].
inline void KdaUpdateLoop(float* s, size_t hd, const float* kn, const float* vt, const float* qn,
                          float* oh) noexcept {
  KdaSweep(s, hd, qn, oh, [kn, vt](float r, size_t kk, size_t v) { return r + kn[kk] * vt[v]; });
}

}  // namespace
}  // namespace k3::quant::internal
