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

// S <- Diag(alpha) S (row kk scaled by alpha[kk]); ks[v] = sum_kk kn[kk] * S[kk][v].
inline void KdaDecayLoop(float* __restrict s, size_t hd, const float* __restrict alpha,
                         const float* __restrict kn, float* __restrict ks) noexcept {
  size_t v0 = 0;
  for (; v0 + kKdaStrip <= hd; v0 += kKdaStrip) {
    float acc[kKdaStrip];
    for (size_t j = 0; j < kKdaStrip; ++j) acc[j] = 0.0f;
    for (size_t kk = 0; kk < hd; ++kk) {
      float* __restrict row = s + kk * hd + v0;
      const float al = alpha[kk], kv = kn[kk];
      for (size_t j = 0; j < kKdaStrip; ++j) {
        const float r = row[j] * al;
        row[j] = r;
        acc[j] = acc[j] + kv * r;
      }
    }
    for (size_t j = 0; j < kKdaStrip; ++j) ks[v0 + j] = acc[j];
  }
  for (; v0 < hd; ++v0) {  // columns past the last whole strip
    float acc = 0.0f;
    for (size_t kk = 0; kk < hd; ++kk) {
      float& r = s[kk * hd + v0];
      r = r * alpha[kk];
      acc = acc + kn[kk] * r;
    }
    ks[v0] = acc;
  }
}

// S += kn vt^T (row kk plus kn[kk] * vt); oh[v] = sum_kk qn[kk] * S[kk][v].
inline void KdaUpdateLoop(float* __restrict s, size_t hd, const float* __restrict kn,
                          const float* __restrict vt, const float* __restrict qn,
                          float* __restrict oh) noexcept {
  size_t v0 = 0;
  for (; v0 + kKdaStrip <= hd; v0 += kKdaStrip) {
    float acc[kKdaStrip];
    for (size_t j = 0; j < kKdaStrip; ++j) acc[j] = 0.0f;
    for (size_t kk = 0; kk < hd; ++kk) {
      float* __restrict row = s + kk * hd + v0;
      const float kv = kn[kk], qv = qn[kk];
      for (size_t j = 0; j < kKdaStrip; ++j) {
        const float r = row[j] + kv * vt[v0 + j];
        row[j] = r;
        acc[j] = acc[j] + qv * r;
      }
    }
    for (size_t j = 0; j < kKdaStrip; ++j) oh[v0 + j] = acc[j];
  }
  for (; v0 < hd; ++v0) {
    float acc = 0.0f;
    for (size_t kk = 0; kk < hd; ++kk) {
      float& r = s[kk * hd + v0];
      r = r + kn[kk] * vt[v0];
      acc = acc + qn[kk] * r;
    }
    oh[v0] = acc;
  }
}

}  // namespace
}  // namespace k3::quant::internal
