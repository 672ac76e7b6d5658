// Scalar reference kernels: they define the bits every ISA's kernels must give
// (docs/quant.md §3, "The one order"). The matrix kernels sum in a fixed lane
// order with fused multiply-adds -- 32 lanes for plain rows, 16 for groups, a
// halving tree at the end -- which SIMD registers of 4, 8 or 16 floats all
// reach without a shuffle, so a row's bits depend on neither the ISA nor the
// batch. std::fma is the fused operation (glibc runs the FMA instruction where
// the CPU has one). Always compiled; every SIMD kernel is tested against these.
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "attn.h"
#include "kda.h"
#include "situ.h"

namespace k3::quant::internal {
namespace {

inline int Nibble(const uint8_t* p, size_t i) { return (i & 1) ? (p[i / 2] >> 4) : (p[i / 2] & 15); }

// Plain rows (f32, int8): element i into lane i % 32, a[i % 32] = fma(x, w, a),
// then lane j + lane j+16 and the 16-lane tree.
template <typename T>
float DotPlain(const T* w, const float* x, size_t n) noexcept {
  float a[kPlainLanes] = {};
  for (size_t i = 0; i < n; ++i) {
    a[i % kPlainLanes] = std::fma(x[i], static_cast<float>(w[i]), a[i % kPlainLanes]);
  }
  for (size_t j = 0; j < kTreeLanes; ++j) a[j] = a[j] + a[j + kTreeLanes];
  return Tree16(a);
}

// MXFP4, one 32-column group g per step into slot g % 2: lane l takes the
// pair p = fma(x_odd, w_odd, x_even * w_even) of columns 2l, 2l+1 (doubled
// codes), then a = fma(p, 2^(s-127) * 0.5, a); the slots added, then the tree.
float DotMx(const uint8_t* p, const uint8_t* e, const float* x, size_t n) noexcept {
  float a[2][kTreeLanes] = {};
  for (size_t g = 0; g < n / kMxGroup; ++g) {
    const float gk = E8m0ToF32(e[g]) * 0.5f;
    const uint8_t* b = p + g * (kMxGroup / 2);
    const float* xg = x + g * kMxGroup;
    float* slot = a[g % 2];
    for (size_t l = 0; l < kTreeLanes; ++l) {
      const float pr = std::fma(xg[2 * l + 1], kE2m1x2f[b[l] >> 4], xg[2 * l] * kE2m1x2f[b[l] & 15]);
      slot[l] = std::fma(pr, gk, slot[l]);
    }
  }
  for (size_t l = 0; l < kTreeLanes; ++l) a[0][l] = a[0][l] + a[1][l];
  return Tree16(a[0]);
}

// int4-g64, one 64-column group g per step into slot g % 4: the weights are
// (v-8)*s_g, and lane l takes columns 2l, 2l+1, 32+2l, 33+2l by a chain of four
// FMAs; then ((slot0 + slot1) + (slot2 + slot3)) and the tree.
float DotI4(const uint8_t* p, const float* s, const float* x, size_t n) noexcept {
  float a[4][kTreeLanes] = {};
  for (size_t g = 0; g < n / kInt4Group; ++g) {
    const float* xg = x + g * kInt4Group;
    const uint8_t* b = p + g * (kInt4Group / 2);
    float* slot = a[g % 4];
    for (size_t l = 0; l < kTreeLanes; ++l) {
      for (size_t h = 0; h < 2; ++h) {
        const uint8_t byte = b[16 * h + l];
        const float we = static_cast<float>((byte & 15) - 8) * s[g];
        const float wo = static_cast<float>((byte >> 4) - 8) * s[g];
        slot[l] = std::fma(xg[32 * h + 2 * l], we, slot[l]);
        slot[l] = std::fma(xg[32 * h + 2 * l + 1], wo, slot[l]);
      }
    }
  }
  float r[kTreeLanes];
  for (size_t l = 0; l < kTreeLanes; ++l) r[l] = (a[0][l] + a[1][l]) + (a[2][l] + a[3][l]);
  return Tree16(r);
}

float RowDotScalar(const WeightView& w, size_t row, const float* x) noexcept {
  const size_t n = w.cols;
  switch (w.format) {
    case WeightFormat::kF32:
      return DotPlain(static_cast<const float*>(w.data) + row * n, x, n);
    case WeightFormat::kInt8:
      return DotPlain(static_cast<const int8_t*>(w.data) + row * n, x, n) * w.scales[row];
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

// §6.5: per 32-group exact int32 dot gi; group g goes to lane BlockLane(g) by
// a = fma((float)gi, factor_g, a), factor_g = 2^(s-127)·(0.5·sc_g) for MXFP4
// (doubled codes), s4[g/2]·sc_g for int4, sc_g for int8 (whose row scale
// multiplies the total); then the 16-lane tree.
float RowDotQ8Scalar(const WeightView& w, size_t row, const int8_t* xq, const float* xs) noexcept {
  const size_t n = w.cols;
  const size_t groups = n / kActGroup;
  float a[kTreeLanes] = {};
  const auto add = [&](size_t g, int32_t gi, float f) {
    float& lane = a[BlockLane(g)];
    lane = std::fma(static_cast<float>(gi), f, lane);
  };
  switch (w.format) {
    case WeightFormat::kF32:
      return 0.0f;  // rejected by MatMulQ8
    case WeightFormat::kInt8: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + row * n;
      for (size_t g = 0; g < groups; ++g) {
        int32_t gi = 0;
        for (size_t i = g * kActGroup; i < (g + 1) * kActGroup; ++i) gi += int32_t{q[i]} * xq[i];
        add(g, gi, xs[g]);
      }
      return Tree16(a) * w.scales[row];
    }
    case WeightFormat::kInt4G64: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const float* s = w.scales + row * (n / kInt4Group);
      for (size_t g = 0; g < groups; ++g) {
        int32_t gi = 0;
        for (size_t i = g * kActGroup; i < (g + 1) * kActGroup; ++i) {
          gi += (Nibble(p, i) - 8) * int32_t{xq[i]};
        }
        add(g, gi, s[g / 2] * xs[g]);
      }
      return Tree16(a);
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const uint8_t* e = w.e8m0 + row * (n / kMxGroup);
      for (size_t g = 0; g < groups; ++g) {
        int32_t gi = 0;
        for (size_t i = g * kActGroup; i < (g + 1) * kActGroup; ++i) {
          gi += int32_t{kE2m1x2[Nibble(p, i)]} * xq[i];
        }
        add(g, gi, E8m0ToF32(e[g]) * (xs[g] * 0.5f));
      }
      return Tree16(a);
    }
  }
  return 0.0f;
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

// acc[i] = fma(k, w_i, acc[i]) (§6.3 addrow), k = c (f32), c·scale (int8),
// c·s_g (int4), c·(2^(s-127)·0.5) with the doubled integer codes (MXFP4).
void AddRowScalar(const WeightView& w, size_t row, float c, float* acc) noexcept {
  const size_t n = w.cols;
  switch (w.format) {
    case WeightFormat::kF32: {
      const float* r = static_cast<const float*>(w.data) + row * n;
      for (size_t i = 0; i < n; ++i) acc[i] = std::fma(c, r[i], acc[i]);
      return;
    }
    case WeightFormat::kInt8: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + row * n;
      const float k = c * w.scales[row];
      for (size_t i = 0; i < n; ++i) acc[i] = std::fma(k, static_cast<float>(q[i]), acc[i]);
      return;
    }
    case WeightFormat::kInt4G64: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const float* s = w.scales + row * (n / kInt4Group);
      for (size_t i = 0; i < n; ++i) {
        const float k = c * s[i / kInt4Group];
        acc[i] = std::fma(k, static_cast<float>(Nibble(p, i) - 8), acc[i]);
      }
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const uint8_t* e = w.e8m0 + row * (n / kMxGroup);
      for (size_t i = 0; i < n; ++i) {
        const float k = c * (E8m0ToF32(e[i / kMxGroup]) * 0.5f);
        acc[i] = std::fma(k, static_cast<float>(kE2m1x2[Nibble(p, i)]), acc[i]);
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
