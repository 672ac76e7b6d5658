// Scalar reference kernels: the spec's definitions (§4, §6.3-§6.5) written as
// plainly as possible, sequential in i, one f32 accumulator, no FMA. Always
// compiled; every SIMD kernel is tested against these.
#include <cstring>

#include "kernels.h"
#include "attn.h"
#include "kda.h"
#include "situ.h"

namespace k3::quant::internal {
namespace {

inline int Nibble(const uint8_t* p, size_t i) { return (i & 1) ? (p[i / 2] >> 4) : (p[i / 2] & 15); }

float DotF32(const float* w, const float* x, size_t n) noexcept {
  float acc = 0.0f;
  for (size_t i = 0; i < n; ++i) acc += x[i] * w[i];
  return acc;
}

// (Σ x·q) · s, the scale applied once at the end (§6.3 fmt 1).
float DotI8(const int8_t* q, float s, const float* x, size_t n) noexcept {
  float acc = 0.0f;
  for (size_t i = 0; i < n; ++i) acc += x[i] * static_cast<float>(q[i]);
  return acc * s;
}

// Σ_g (Σ_{i∈g} x·(nib−8)) · s_g, group partial first (§6.3 fmt 4).
float DotI4(const uint8_t* p, const float* s, const float* x, size_t n) noexcept {
  float total = 0.0f;
  for (size_t g = 0; g < n / kInt4Group; ++g) {
    float part = 0.0f;
    for (size_t i = g * kInt4Group; i < (g + 1) * kInt4Group; ++i) {
      part += x[i] * static_cast<float>(Nibble(p, i) - 8);
    }
    total += part * s[g];
  }
  return total;
}

// Σ_g (Σ_{i∈g} x·e2m1) · 2^(s_g−127), columns in even/odd pairs (§6.4 float kernel).
float DotMx(const uint8_t* p, const uint8_t* e, const float* x, size_t n) noexcept {
  float total = 0.0f;
  for (size_t g = 0; g < n / kMxGroup; ++g) {
    float part = 0.0f;
    for (size_t j = g * kMxGroup / 2; j < (g + 1) * kMxGroup / 2; ++j) {
      part += x[2 * j] * kE2m1[p[j] & 15];
      part += x[2 * j + 1] * kE2m1[p[j] >> 4];
    }
    total += part * E8m0ToF32(e[g]);
  }
  return total;
}

float RowDotScalar(const WeightView& w, size_t row, const float* x) noexcept {
  const size_t n = w.cols;
  switch (w.format) {
    case WeightFormat::kF32:
      return DotF32(static_cast<const float*>(w.data) + row * n, x, n);
    case WeightFormat::kInt8:
      return DotI8(static_cast<const int8_t*>(w.data) + row * n, w.scales[row], x, n);
    case WeightFormat::kInt4G64:
      return DotI4(static_cast<const uint8_t*>(w.data) + row * (n / 2),
                   w.scales + row * (n / kInt4Group), x, n);
    case WeightFormat::kMxfp4:
      return DotMx(static_cast<const uint8_t*>(w.data) + row * (n / 2),
                   w.e8m0 + row * (n / kMxGroup), x, n);
  }
  return 0.0f;
}

void MatMulScalar(const WeightView& w, const float* x, size_t batch, float* y, size_t r0,
                  size_t r1) noexcept {
  for (size_t o = r0; o < r1; ++o) {
    for (size_t b = 0; b < batch; ++b) y[b * w.rows + o] = RowDotScalar(w, o, x + b * w.cols);
  }
}

// §6.5: per 32-group exact int32 dot gi, then y = Σ_g (float)gi · factor_g in
// group order, factor_g = (2^(s−127)·0.5)·sc_g for MXFP4 (doubled codes),
// s4[g/2]·sc_g for int4, sc_g for int8 (whose row scale multiplies the total).
float RowDotQ8Scalar(const WeightView& w, size_t row, const int8_t* xq, const float* xs) noexcept {
  const size_t n = w.cols;
  const size_t groups = n / kActGroup;
  float total = 0.0f;
  switch (w.format) {
    case WeightFormat::kF32:
      return 0.0f;  // rejected by MatMulQ8
    case WeightFormat::kInt8: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + row * n;
      for (size_t g = 0; g < groups; ++g) {
        int32_t gi = 0;
        for (size_t i = g * kActGroup; i < (g + 1) * kActGroup; ++i) gi += int32_t{q[i]} * xq[i];
        total += static_cast<float>(gi) * xs[g];
      }
      return total * w.scales[row];
    }
    case WeightFormat::kInt4G64: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const float* s = w.scales + row * (n / kInt4Group);
      for (size_t g = 0; g < groups; ++g) {
        int32_t gi = 0;
        for (size_t i = g * kActGroup; i < (g + 1) * kActGroup; ++i) {
          gi += (Nibble(p, i) - 8) * int32_t{xq[i]};
        }
        total += static_cast<float>(gi) * (s[g / 2] * xs[g]);
      }
      return total;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const uint8_t* e = w.e8m0 + row * (n / kMxGroup);
      for (size_t g = 0; g < groups; ++g) {
        int32_t gi = 0;
        for (size_t i = g * kActGroup; i < (g + 1) * kActGroup; ++i) {
          gi += int32_t{kE2m1x2[Nibble(p, i)]} * xq[i];
        }
        total += static_cast<float>(gi) * (E8m0ToF32(e[g]) * 0.5f * xs[g]);
      }
      return total;
    }
  }
  return total;
}

void MatMulQ8Scalar(const WeightView& w, const ActsQ8& x, float* y, size_t r0,
                    size_t r1) noexcept {
  const size_t groups = w.cols / kActGroup;
  for (size_t o = r0; o < r1; ++o) {
    for (size_t b = 0; b < x.batch; ++b) {
      y[b * w.rows + o] =
          RowDotQ8Scalar(w, o, x.q.data() + b * w.cols, x.scales.data() + b * groups);
    }
  }
}

// acc[i] += (c·scale)·w_int (§6.3 addrow); one coefficient per row or group.
void AddRowScalar(const WeightView& w, size_t row, float c, float* acc) noexcept {
  const size_t n = w.cols;
  switch (w.format) {
    case WeightFormat::kF32: {
      const float* r = static_cast<const float*>(w.data) + row * n;
      for (size_t i = 0; i < n; ++i) acc[i] += c * r[i];
      return;
    }
    case WeightFormat::kInt8: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + row * n;
      const float k = c * w.scales[row];
      for (size_t i = 0; i < n; ++i) acc[i] += k * static_cast<float>(q[i]);
      return;
    }
    case WeightFormat::kInt4G64: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const float* s = w.scales + row * (n / kInt4Group);
      for (size_t i = 0; i < n; ++i) {
        acc[i] += (c * s[i / kInt4Group]) * static_cast<float>(Nibble(p, i) - 8);
      }
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const uint8_t* e = w.e8m0 + row * (n / kMxGroup);
      for (size_t i = 0; i < n; ++i) {
        acc[i] += (c * E8m0ToF32(e[i / kMxGroup])) * kE2m1[Nibble(p, i)];
      }
      return;
    }
  }
}

// Roof loops (roof.h): 8 independent chains of one multiply and one add (the
// reference's operations). Not vectorised, so it is the scalar units' peak.
__attribute__((optimize("no-tree-vectorize"))) uint64_t RoofScalar(RoofOp op,
                                                                   uint64_t iters) noexcept {
  constexpr int kChains = 8;
  if (op == RoofOp::kIdot) {
    uint32_t a[kChains];  // unsigned: wraps without undefined behaviour
    for (int j = 0; j < kChains; ++j) a[j] = uint32_t(j);
    volatile uint32_t mv = 3, cv = 5;
    const uint32_t m = mv, c = cv;
    for (uint64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < kChains; ++j) a[j] = a[j] * m + c;
    }
    uint32_t t = 0;
    for (int j = 0; j < kChains; ++j) t += a[j];
    volatile uint32_t sink = t;
    (void)sink;
    return iters * kChains;
  }
  float a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = float(j);
  volatile float mv = 0.999f, cv = 1e-3f;
  const float m = mv, c = cv;
  for (uint64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kChains; ++j) a[j] = a[j] * m + c;
  }
  float t = 0;
  for (int j = 0; j < kChains; ++j) t += a[j];
  volatile float sink = t;
  (void)sink;
  return iters * kChains;
}

}  // namespace

void SituGluScalar(const float* g, const float* u, size_t n, float b1, float b2, float* out) noexcept {
  SituGluLoop(g, u, n, b1, b2, out);
}

void SoftmaxScalar(float* v, size_t n) noexcept { SoftmaxLoop(v, n); }
void AttnScoresScalar(const float* qa, const float* ka, size_t da, const float* qb, const float* kb,
                      size_t db, size_t nq, size_t j0, size_t j1, float scale, float* s, size_t s_ld,
                      float* kt) noexcept {
  AttnScoresLoop(qa, ka, da, qb, kb, db, nq, j0, j1, scale, s, s_ld, kt);
}

void KdaDecayScalar(float* s, size_t hd, const float* alpha, const float* kn, float* ks) noexcept {
  KdaDecayLoop(s, hd, alpha, kn, ks);
}

void KdaUpdateScalar(float* s, size_t hd, const float* kn, const float* vt, const float* qn,
                     float* oh) noexcept {
  KdaUpdateLoop(s, hd, kn, vt, qn, oh);
}

void DotSumSquaresScalar(const float* x, const float* w, size_t n, double* dot, double* ss) noexcept {
  constexpr size_t kLanes = 16;
  double d[kLanes] = {}, q[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const double xv = x[i + j];
      d[j] += xv * static_cast<double>(w[i + j]);
      q[j] += xv * xv;
    }
  }
  for (size_t half = kLanes / 2; half >= 1; half /= 2) {
    for (size_t j = 0; j < half; ++j) {
      d[j] += d[j + half];
      q[j] += q[j + half];
    }
  }
  DotSumSquaresTail(x, w, i, n, d[0], q[0], dot, ss);
}

namespace {

constexpr KernelTable kScalarTable = {Isa::kScalar,           MatMulScalar,
                                      MatMulQ8Scalar,         RowDotScalar,
                                      AddRowScalar,           QuantizeInt8RowsScalar,
                                      QuantizeInt4RowsScalar, DowncastScalar,
                                      QuantizeActsScalar,     RoofScalar};

}  // namespace

const KernelTable& ScalarKernels() noexcept { return kScalarTable; }

}  // namespace k3::quant::internal
