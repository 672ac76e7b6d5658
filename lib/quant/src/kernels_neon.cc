// aarch64 ASIMD ("NEON") kernels: the IDOT path (int8 activations against
// MXFP4, int4-g64 and int8 weights), the four quantizers and the f32 path. Built twice: here
// for baseline armv8-a (vmull_s8 + vpadalq_s16), and again as
// kernels_neon_dot.cc with the dot-product extension (K3_NEON_DOT: sdot in
// place of the widening multiply-add), plus the f32-activation path (MatMul,
// RowDot, AddRow; the same in both builds).
//
// IDOT. Every output element is the scalar reference's sum (kernels_scalar.cc,
// "the one order"): per 32-column group g the exact int32 dot gi, fused as
// fma((float)gi, factor_g, lane) into lane BlockLane(g) of 16, then Tree16.
// Here the dots of groups 4m .. 4m+3 of each block of 16 fill the four int32
// lanes of one vector (any order is exact: |gi| <= 32·127·128 < 2^24, so the
// conversion is exact too), and one vector FMA with the four factors (the
// scalar's IEEE products, lane for lane) adds them to accumulator m; lane L of
// accumulator m is then block lane 4L + m, and Tree16Block reduces the four
// accumulators in the scalar tree's order. So every output has the scalar bits,
// whatever the batch, the row split, the thread count or the build (with or
// without the dot product). Each (row, activation) pair runs one routine;
// batched calls loop it (the row stays in L1 between the activations).
//
// Nibble rows (int4, MXFP4): the 16 packed bytes of a 32-column group are split
// into low nibbles (even columns) and high nibbles (odd columns); vld2q_s8
// de-interleaves the group's activations to match, so no weight shuffle is
// needed. int4 values are nibble - 8, MXFP4 values the doubled e2m1 codes
// (kE2m1x2, a vqtbl1q lookup; the 0.5 is in the factor as in the scalar code).
//
// Quantizers: the same operations as quant.cc's scalar code, lane-wise. The
// absmax is a max of |x| that skips NaN (select on a > m, as `if (a > am)`
// does), which does not depend on order; s, the 1e-20 floor and inv are the
// same scalar f32 code; x·inv is one IEEE multiply; FCVTNS rounds to nearest
// even like lrintf; NaN, which FCVTNS turns into 0, is mapped to `lo` as the
// scalar RoundClamp does. Every byte equals the scalar one (quant_test).
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels.h"
#include "attn.h"
#include "kda.h"
#include "situ.h"

namespace k3::quant::internal {
namespace {

// ---------------------------------------------------------------------------
// IDOT path

// acc += the 16 exact int8 products of a and b (lane order is immaterial).
inline int32x4_t Dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#ifdef K3_NEON_DOT
  return vdotq_s32(acc, a, b);
#else
  // Each product fits int16 (|w·x| <= 128·128 = 2^14); pairs are summed only
  // after widening to int32, so even -128·-128 twice cannot overflow.
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

// Lanes of the int32 partial sums of group g of one row against one activation
// row; their sum is the scalar reference's gi.
template <WeightFormat F>
inline int32x4_t GroupDot(const uint8_t* row, const int8_t* xq, size_t g) {
  const int32x4_t zero = vdupq_n_s32(0);
  if constexpr (F == WeightFormat::kInt8) {
    const int8_t* w = reinterpret_cast<const int8_t*>(row) + g * kActGroup;
    const int8_t* x = xq + g * kActGroup;
    return Dot16(Dot16(zero, vld1q_s8(w), vld1q_s8(x)), vld1q_s8(w + 16), vld1q_s8(x + 16));
  } else {
    const uint8x16_t p = vld1q_u8(row + g * (kActGroup / 2));
    const uint8x16_t lo = vandq_u8(p, vdupq_n_u8(15));
    const uint8x16_t hi = vshrq_n_u8(p, 4);
    int8x16_t we, wo;
    if constexpr (F == WeightFormat::kMxfp4) {
      const int8x16_t lut = vld1q_s8(kE2m1x2);
      we = vqtbl1q_s8(lut, lo);
      wo = vqtbl1q_s8(lut, hi);
    } else {
      we = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(8));
      wo = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(8));
    }
    const int8x16x2_t x = vld2q_s8(xq + g * kActGroup);  // [0] even columns, [1] odd
    return Dot16(Dot16(zero, we, x.val[0]), wo, x.val[1]);
  }
}

// One row's weights and scale pointers, as the scalar reference indexes them.
template <WeightFormat F>
struct Q8Row {
  const uint8_t* bytes;  // int8: cols bytes; nibbles: cols/2 bytes
  const float* s4;       // int4: [cols/64] scales
  const uint8_t* e;      // MXFP4: [cols/32] E8M0 bytes
  float s8;              // int8: the row scale
};

template <WeightFormat F>
Q8Row<F> RowOf(const WeightView& w, size_t o) {
  const size_t n = w.cols;
  if constexpr (F == WeightFormat::kInt8) {
    return {static_cast<const uint8_t*>(w.data) + o * n, nullptr, nullptr, w.scales[o]};
  } else if constexpr (F == WeightFormat::kInt4G64) {
    return {static_cast<const uint8_t*>(w.data) + o * (n / 2), w.scales + o * (n / kInt4Group),
            nullptr, 0.0f};
  } else {
    return {static_cast<const uint8_t*>(w.data) + o * (n / 2), nullptr, w.e8m0 + o * (n / kMxGroup),
            0.0f};
  }
}

// The scalar reference's factor of group g: E8M0·(xs·0.5) (MXFP4), s4·xs
// (int4), xs (int8, whose row scale multiplies the total).
template <WeightFormat F>
inline float Factor(const Q8Row<F>& r, const float* xs, size_t g) {
  if constexpr (F == WeightFormat::kMxfp4) {
    return E8m0ToF32(r.e[g]) * (xs[g] * 0.5f);
  } else if constexpr (F == WeightFormat::kInt4G64) {
    return r.s4[g / 2] * xs[g];
  } else {
    return xs[g];
  }
}

// Factors of groups g .. g+3 (g a multiple of 4), each the same IEEE product.
template <WeightFormat F>
inline float32x4_t Factors4(const Q8Row<F>& r, const float* xs, size_t g) {
  const float32x4_t x = vld1q_f32(xs + g);
  if constexpr (F == WeightFormat::kMxfp4) {
    uint32_t four;
    std::memcpy(&four, r.e + g, 4);
    const uint32x4_t e = vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(four))));
    const float32x4_t scale = vreinterpretq_f32_u32(vshlq_n_u32(e, 23));  // E8m0ToF32
    return vmulq_f32(scale, vmulq_n_f32(x, 0.5f));
  } else if constexpr (F == WeightFormat::kInt4G64) {
    const float32x4_t s = vcombine_f32(vdup_n_f32(r.s4[g / 2]), vdup_n_f32(r.s4[g / 2 + 1]));
    return vmulq_f32(s, x);
  } else {
    return x;
  }
}

// Tree16 of the 16 block lanes held as a[m] lane L = lane 4L + m: j + (j+8)
// pairs lanes L, L+2 of each a[m]; j + (j+4) lanes 0, 1 of that; j + (j+2)
// a[0] with a[2], a[1] with a[3]; then the last two (addition commutes, so
// operand order inside a pair is free).
inline float Tree16Block(const float32x4_t (&a)[4]) {
  const float32x4_t h01 = vcombine_f32(vadd_f32(vget_low_f32(a[0]), vget_high_f32(a[0])),
                                       vadd_f32(vget_low_f32(a[1]), vget_high_f32(a[1])));
  const float32x4_t h23 = vcombine_f32(vadd_f32(vget_low_f32(a[2]), vget_high_f32(a[2])),
                                       vadd_f32(vget_low_f32(a[3]), vget_high_f32(a[3])));
  const float32x4_t u = vpaddq_f32(h01, h23);  // u[m] = lane m + lane m+4
  const float32x2_t v = vadd_f32(vget_low_f32(u), vget_high_f32(u));
  return vget_lane_f32(v, 0) + vget_lane_f32(v, 1);
}

// One (row, activation) dot: four groups per step, their exact int32 dots in
// the lanes of one vector, converted (exact: |gi| <= 32·127·128 < 2^24) and
// fused into accumulator (g/4) % 4 with their factors. Lane L of a[m] is then
// the scalar's block lane 4L + m (BlockLane), so the tree of Tree16Block is
// the scalar tree.
template <WeightFormat F>
float RowDotQ8(const Q8Row<F>& r, const int8_t* xq, const float* xs, size_t groups,
               size_t pf) noexcept {
  constexpr size_t kRowBytesPerGroup = F == WeightFormat::kInt8 ? kActGroup : kActGroup / 2;
  float32x4_t a[4] = {};  // +0 lanes
  const size_t quads = groups / 4;
  ForSlots<4>(0, quads, a, [&](size_t q, float32x4_t& acc) {
    const size_t g = 4 * q;
    if (pf != 0) {  // 64 bytes of nibbles or 128 of int8 per four groups
      PrefetchLine(r.bytes + g * kRowBytesPerGroup, pf);
      if constexpr (F == WeightFormat::kInt8)
        PrefetchLine(r.bytes + g * kRowBytesPerGroup + 64, pf);
    }
    const int32x4_t a0 = GroupDot<F>(r.bytes, xq, g);
    const int32x4_t a1 = GroupDot<F>(r.bytes, xq, g + 1);
    const int32x4_t a2 = GroupDot<F>(r.bytes, xq, g + 2);
    const int32x4_t a3 = GroupDot<F>(r.bytes, xq, g + 3);
    const int32x4_t gi = vpaddq_s32(vpaddq_s32(a0, a1), vpaddq_s32(a2, a3));  // [gi_g .. gi_g+3]
    acc = vfmaq_f32(acc, vcvtq_f32_s32(gi), Factors4<F>(r, xs, g));
  });
  // The last groups % 4 groups, each into its lane of the next quad's slot
  // (a switch, not a[quads % 4]: a run-time index would keep a[] in memory).
  const auto tail = [&](float32x4_t& acc) {
    float lanes[4];
    vst1q_f32(lanes, acc);
    for (size_t g = 4 * quads; g < groups; ++g) {
      const int32_t gi = vaddvq_s32(GroupDot<F>(r.bytes, xq, g));
      lanes[g % 4] = std::fma(static_cast<float>(gi), Factor<F>(r, xs, g), lanes[g % 4]);
    }
    acc = vld1q_f32(lanes);
  };
  if (groups % 4 != 0) {
    switch (quads % 4) {
      case 0: tail(a[0]); break;
      case 1: tail(a[1]); break;
      case 2: tail(a[2]); break;
      default: tail(a[3]); break;
    }
  }
  const float total = Tree16Block(a);
  if constexpr (F == WeightFormat::kInt8) return total * r.s8;
  return total;
}

template <WeightFormat F>
void MatMulQ8Impl(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1) noexcept {
  const size_t groups = w.cols / kActGroup;
  const size_t pf = PrefetchBytes();
  for (size_t o = r0; o < r1; ++o) {
    const Q8Row<F> r = RowOf<F>(w, o);
    for (size_t b = 0; b < x.batch; ++b) {
      y[b * w.rows + o] =
          RowDotQ8<F>(r, x.q.data() + b * w.cols, x.scales.data() + b * groups, groups, pf);
    }
  }
}

void MatMulQ8Neon(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1) noexcept {
  switch (w.format) {
    case WeightFormat::kInt8:
      return MatMulQ8Impl<WeightFormat::kInt8>(w, x, y, r0, r1);
    case WeightFormat::kInt4G64:
      return MatMulQ8Impl<WeightFormat::kInt4G64>(w, x, y, r0, r1);
    case WeightFormat::kMxfp4:
      return MatMulQ8Impl<WeightFormat::kMxfp4>(w, x, y, r0, r1);
    case WeightFormat::kF32:
      return;  // rejected by MatMulQ8
  }
}

// ---------------------------------------------------------------------------
// f32-activation path (MatMul, RowDot, AddRow)
//
// The scalar reference's lanes, one q register per four of them, so every
// element has the scalar bits: plain rows put column i into lane i % 32 (eight
// accumulators), int4 groups into 16 lanes of slot g % 4, MXFP4 groups into 16
// lanes of slot g % 2; the slots and lanes are then folded in the scalar
// order. One routine per (row, activation); batched MatMul loops it, so batch,
// row split and threads cannot change a bit, and RowDot is MatMul's element.

inline float32x4_t I8ToF32x4(int8x8_t v, bool high) {
  const int16x8_t w = vmovl_s8(v);
  return vcvtq_f32_s32(high ? vmovl_high_s16(w) : vmovl_s16(vget_low_s16(w)));
}

// Tree16 of 16 lanes held as v[k] lane j = lane 4k + j: j + (j+8) is v[k] +
// v[k+2], j + (j+4) is v[0] + v[1], then the halves and the last pair.
inline float Tree16Lanes(const float32x4_t (&v)[4]) {
  const float32x4_t t = vaddq_f32(vaddq_f32(v[0], v[2]), vaddq_f32(v[1], v[3]));
  const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t));
  return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

// 32 columns at x into the plain lanes a[k] (lane 4k + j = column 4k + j).
inline void Plain32(float32x4_t (&a)[8], const float* x, const float32x4_t (&w)[8]) {
  for (int k = 0; k < 8; ++k) a[k] = vfmaq_f32(a[k], vld1q_f32(x + 4 * k), w[k]);
}

// Plain rows: f32 (`q8` null) or int8 (`f` null, the row scale applied by the
// caller). Column i into lane i % 32; the last n % 32 columns zero-padded, as
// fma(0, 0, a) = a (a lane is never -0: it starts +0 and a sum is -0 only if
// both addends are).
float DotPlain(const float* f, const int8_t* q8, const float* x, size_t n, size_t pf) noexcept {
  float32x4_t a[8] = {};  // +0 lanes
  float32x4_t w[8];
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if (f != nullptr) {
      for (int k = 0; k < 8; ++k) w[k] = vld1q_f32(f + i + 4 * k);
    } else {
      if (pf != 0 && (i & 63) == 0) PrefetchLine(q8 + i, pf);
      for (int h = 0; h < 2; ++h) {
        const int8x16_t b = vld1q_s8(q8 + i + 16 * h);
        w[4 * h] = I8ToF32x4(vget_low_s8(b), false);
        w[4 * h + 1] = I8ToF32x4(vget_low_s8(b), true);
        w[4 * h + 2] = I8ToF32x4(vget_high_s8(b), false);
        w[4 * h + 3] = I8ToF32x4(vget_high_s8(b), true);
      }
    }
    Plain32(a, x + i, w);
  }
  if (i < n) {
    alignas(16) float xt[kPlainLanes] = {}, wt[kPlainLanes] = {};
    for (size_t j = 0; i + j < n; ++j) {
      xt[j] = x[i + j];
      wt[j] = f != nullptr ? f[i + j] : static_cast<float>(q8[i + j]);
    }
    for (int k = 0; k < 8; ++k) w[k] = vld1q_f32(wt + 4 * k);
    Plain32(a, xt, w);
  }
  const float32x4_t h[4] = {vaddq_f32(a[0], a[4]), vaddq_f32(a[1], a[5]), vaddq_f32(a[2], a[6]),
                            vaddq_f32(a[3], a[7])};  // lane j + lane j+16
  return Tree16Lanes(h);
}

// 16 packed bytes (32 columns) as f32 values: ev[k] = even columns 8k..8k+6,
// od[k] = odd columns, matching vld2q_f32 of the activations at column 8k.
// MXFP4 values are the doubled codes, code 8 giving +0 where the scalar table
// has -0: its lane's product x·(±0) is a zero (or NaN for x = ±inf, NaN either
// way) that can change only the sign of a zero pair sum p, and fma(p, k, a)
// with a never -0 gives the same a (or NaN) for either sign.
template <WeightFormat F>
inline void NibbleValues32(const uint8_t* p, float32x4_t (&ev)[4], float32x4_t (&od)[4]) {
  const uint8x16_t b = vld1q_u8(p);
  int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(15)));
  int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
  if constexpr (F == WeightFormat::kMxfp4) {
    const int8x16_t lut = vld1q_s8(kE2m1x2);  // doubled codes, exact in int8
    lo = vqtbl1q_s8(lut, vreinterpretq_u8_s8(lo));
    hi = vqtbl1q_s8(lut, vreinterpretq_u8_s8(hi));
  } else {
    lo = vsubq_s8(lo, vdupq_n_s8(8));
    hi = vsubq_s8(hi, vdupq_n_s8(8));
  }
  ev[0] = I8ToF32x4(vget_low_s8(lo), false);
  ev[1] = I8ToF32x4(vget_low_s8(lo), true);
  ev[2] = I8ToF32x4(vget_high_s8(lo), false);
  ev[3] = I8ToF32x4(vget_high_s8(lo), true);
  od[0] = I8ToF32x4(vget_low_s8(hi), false);
  od[1] = I8ToF32x4(vget_low_s8(hi), true);
  od[2] = I8ToF32x4(vget_high_s8(hi), false);
  od[3] = I8ToF32x4(vget_high_s8(hi), true);
}

// MXFP4: group g into slot g % 2; lane l (register l / 4) takes p = fma(x_odd,
// w_odd, x_even·w_even) of columns 2l, 2l+1, then fma(p, E8M0·0.5, lane).
float DotMx(const uint8_t* p, const uint8_t* e, const float* x, size_t n, size_t pf) noexcept {
  float32x4_t a[2][4] = {};  // +0 lanes
  ForSlots<2>(0, n / kMxGroup, a, [&](size_t g, float32x4_t (&slot)[4]) {
    if (pf != 0 && (g & 3) == 0) PrefetchLine(p + g * 16, pf);
    float32x4_t ev[4], od[4];
    NibbleValues32<WeightFormat::kMxfp4>(p + g * 16, ev, od);
    const float gk = E8m0ToF32(e[g]) * 0.5f;
    for (int k = 0; k < 4; ++k) {
      const float32x4x2_t xv = vld2q_f32(x + g * kMxGroup + 8 * k);
      const float32x4_t pr = vfmaq_f32(vmulq_f32(xv.val[0], ev[k]), xv.val[1], od[k]);
      slot[k] = vfmaq_n_f32(slot[k], pr, gk);
    }
  });
  const float32x4_t r[4] = {vaddq_f32(a[0][0], a[1][0]), vaddq_f32(a[0][1], a[1][1]),
                            vaddq_f32(a[0][2], a[1][2]), vaddq_f32(a[0][3], a[1][3])};
  return Tree16Lanes(r);
}

// int4-g64: group g into slot g % 4; weights (v-8)·s_g, and lane l takes
// columns 2l, 2l+1, 32+2l, 33+2l by a chain of four FMAs in that order.
float DotI4(const uint8_t* p, const float* sc, const float* x, size_t n, size_t pf) noexcept {
  float32x4_t a[4][4] = {};  // +0 lanes
  ForSlots<4>(0, n / kInt4Group, a, [&](size_t g, float32x4_t (&slot)[4]) {
    if (pf != 0 && (g & 1) == 0) PrefetchLine(p + g * 32, pf);
    const float s = sc[g];
    for (int h = 0; h < 2; ++h) {
      float32x4_t ev[4], od[4];
      NibbleValues32<WeightFormat::kInt4G64>(p + g * 32 + 16 * h, ev, od);
      for (int k = 0; k < 4; ++k) {
        const float32x4x2_t xv = vld2q_f32(x + g * kInt4Group + 32 * h + 8 * k);
        slot[k] = vfmaq_f32(slot[k], xv.val[0], vmulq_n_f32(ev[k], s));
        slot[k] = vfmaq_f32(slot[k], xv.val[1], vmulq_n_f32(od[k], s));
      }
    }
  });
  float32x4_t r[4];
  for (int k = 0; k < 4; ++k) {
    r[k] = vaddq_f32(vaddq_f32(a[0][k], a[1][k]), vaddq_f32(a[2][k], a[3][k]));
  }
  return Tree16Lanes(r);
}

float RowDotNeon(const WeightView& w, size_t o, const float* x) noexcept {
  const size_t n = w.cols;
  const size_t pf = PrefetchBytes();
  switch (w.format) {
    case WeightFormat::kF32:
      return DotPlain(static_cast<const float*>(w.data) + o * n, nullptr, x, n, 0);
    case WeightFormat::kInt8:
      return DotPlain(nullptr, static_cast<const int8_t*>(w.data) + o * n, x, n, pf) * w.scales[o];
    case WeightFormat::kInt4G64:
      return DotI4(static_cast<const uint8_t*>(w.data) + o * (n / 2),
                   w.scales + o * (n / kInt4Group), x, n, pf);
    case WeightFormat::kMxfp4:
      return DotMx(static_cast<const uint8_t*>(w.data) + o * (n / 2), w.e8m0 + o * (n / kMxGroup),
                   x, n, pf);
  }
  return 0.0f;
}

void MatMulNeon(const WeightView& w, const float* x, size_t batch, float* y, size_t r0,
                size_t r1) noexcept {
  for (size_t o = r0; o < r1; ++o) {
    for (size_t b = 0; b < batch; ++b) y[b * w.rows + o] = RowDotNeon(w, o, x + b * w.cols);
  }
}

// acc[i] += k·w_i, one FMA per element in column order (k = c·scale; MXFP4's
// doubled codes carry the 0.5 in k, exactly).
void AddRowNeon(const WeightView& w, size_t row, float c, float* acc) noexcept {
  const size_t n = w.cols;
  if (w.format == WeightFormat::kF32 || w.format == WeightFormat::kInt8) {
    const bool f32 = w.format == WeightFormat::kF32;
    const float* f = f32 ? static_cast<const float*>(w.data) + row * n : nullptr;
    const int8_t* q = f32 ? nullptr : static_cast<const int8_t*>(w.data) + row * n;
    const float k = f32 ? c : c * w.scales[row];
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      float32x4_t w0, w1;
      if (f32) {
        w0 = vld1q_f32(f + i);
        w1 = vld1q_f32(f + i + 4);
      } else {
        const int8x8_t b = vld1_s8(q + i);
        w0 = I8ToF32x4(b, false);
        w1 = I8ToF32x4(b, true);
      }
      vst1q_f32(acc + i, vfmaq_n_f32(vld1q_f32(acc + i), w0, k));
      vst1q_f32(acc + i + 4, vfmaq_n_f32(vld1q_f32(acc + i + 4), w1, k));
    }
    for (; i < n; ++i) acc[i] = std::fma(k, f32 ? f[i] : static_cast<float>(q[i]), acc[i]);
    return;
  }
  const bool mx = w.format == WeightFormat::kMxfp4;
  const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
  for (size_t c0 = 0; c0 < n; c0 += 32) {
    const float k = mx ? c * (E8m0ToF32(w.e8m0[row * (n / kMxGroup) + c0 / kMxGroup]) * 0.5f)
                       : c * w.scales[row * (n / kInt4Group) + c0 / kInt4Group];
    float32x4_t ev[4], od[4];
    if (mx) {
      NibbleValues32<WeightFormat::kMxfp4>(p + c0 / 2, ev, od);
    } else {
      NibbleValues32<WeightFormat::kInt4G64>(p + c0 / 2, ev, od);
    }
    for (int j = 0; j < 4; ++j) {
      float32x4x2_t a = vld2q_f32(acc + c0 + 8 * j);  // even, odd columns
      a.val[0] = vfmaq_n_f32(a.val[0], ev[j], k);
      a.val[1] = vfmaq_n_f32(a.val[1], od[j], k);
      vst2q_f32(acc + c0 + 8 * j, a);
    }
  }
}

// ---------------------------------------------------------------------------
// Quantizers

// max |x_i| skipping NaN, exactly as quant.cc's AbsMax (order-independent).
inline float AbsMax(const float* x, size_t n) {
  float32x4_t m0 = vdupq_n_f32(0.0f), m1 = m0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float32x4_t a0 = vabsq_f32(vld1q_f32(x + i));
    const float32x4_t a1 = vabsq_f32(vld1q_f32(x + i + 4));
    m0 = vbslq_f32(vcgtq_f32(a0, m0), a0, m0);
    m1 = vbslq_f32(vcgtq_f32(a1, m1), a1, m1);
  }
  // No NaN can be in m0/m1, so an ordinary max finishes the job.
  float am = vmaxvq_f32(vmaxq_f32(m0, m1));
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > am) am = a;
  }
  return am;
}

// s = am/qmax, the 1e-20 floor, inv = 1/s: quant.cc's QuantizeSpan head.
inline float SpanScale(float am, float qmax, float* inv) {
  float s = am / qmax;
  if (s < kMinScale) s = kMinScale;
  *inv = 1.0f / s;
  return s;
}

// clamp(lrintf(v), lo, hi) per lane; NaN -> lo as in the scalar reference.
inline int32x4_t RoundClamp4(float32x4_t v, int32x4_t lo, int32x4_t hi) {
  const int32x4_t r = vbslq_s32(vceqq_f32(v, v), vcvtnq_s32_f32(v), lo);
  return vminq_s32(vmaxq_s32(r, lo), hi);
}

inline int RoundClamp1(float v, int lo, int hi) {
  if (std::isnan(v)) return lo;
  return static_cast<int>(std::clamp<long>(std::lrint(v), lo, hi));
}

// 16 values x[i]·inv rounded and clamped, as int8 lanes in column order.
inline int8x16_t Quant16(const float* x, float inv, int lo, int hi) {
  const float32x4_t k = vdupq_n_f32(inv);
  const int32x4_t l = vdupq_n_s32(lo), h = vdupq_n_s32(hi);
  const int32x4_t v0 = RoundClamp4(vmulq_f32(vld1q_f32(x), k), l, h);
  const int32x4_t v1 = RoundClamp4(vmulq_f32(vld1q_f32(x + 4), k), l, h);
  const int32x4_t v2 = RoundClamp4(vmulq_f32(vld1q_f32(x + 8), k), l, h);
  const int32x4_t v3 = RoundClamp4(vmulq_f32(vld1q_f32(x + 12), k), l, h);
  const int16x8_t a = vcombine_s16(vqmovn_s32(v0), vqmovn_s32(v1));
  const int16x8_t b = vcombine_s16(vqmovn_s32(v2), vqmovn_s32(v3));
  return vcombine_s8(vqmovn_s16(a), vqmovn_s16(b));
}

// 64 values in [-8, 7] (column order) -> 32 bytes of +8-biased nibbles, low
// nibble = even column (PackInt4Group).
inline void PackInt4Group64(const int8_t* v, uint8_t* out) {
  for (size_t h = 0; h < 2; ++h) {
    const int8x16x2_t eo = vld2q_s8(v + 32 * h);
    const uint8x16_t e = vreinterpretq_u8_s8(vaddq_s8(eo.val[0], vdupq_n_s8(8)));
    const uint8x16_t o = vreinterpretq_u8_s8(vaddq_s8(eo.val[1], vdupq_n_s8(8)));
    vst1q_u8(out + 16 * h, vorrq_u8(e, vshlq_n_u8(o, 4)));
  }
}

void QuantizeInt8RowsNeon(const float* x, size_t rows, size_t cols, int8_t* q,
                          float* scales) noexcept {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    int8_t* qr = q + r * cols;
    float inv;
    scales[r] = SpanScale(AbsMax(xr, cols), 127.0f, &inv);
    size_t i = 0;
    for (; i + 16 <= cols; i += 16) vst1q_s8(qr + i, Quant16(xr + i, inv, -127, 127));
    for (; i < cols; ++i) qr[i] = static_cast<int8_t>(RoundClamp1(xr[i] * inv, -127, 127));
  }
}

void QuantizeInt4RowsNeon(const float* x, size_t rows, size_t cols, uint8_t* packed,
                          float* scales) noexcept {
  const size_t groups = cols / kInt4Group;
  alignas(16) int8_t v[kInt4Group];
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < groups; ++g) {
      const float* xg = x + r * cols + g * kInt4Group;
      float inv;
      scales[r * groups + g] = SpanScale(AbsMax(xg, kInt4Group), 7.0f, &inv);
      for (size_t i = 0; i < kInt4Group; i += 16) vst1q_s8(v + i, Quant16(xg + i, inv, -8, 7));
      PackInt4Group64(v, packed + r * (cols / 2) + g * (kInt4Group / 2));
    }
  }
}

void DowncastNeon(const int8_t* q8, const float* s8, size_t rows, size_t cols, uint8_t* packed,
                  float* scales) noexcept {
  const size_t groups = cols / kInt4Group;
  alignas(16) int8_t v[kInt4Group];
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < groups; ++g) {
      const int8_t* qg = q8 + r * cols + g * kInt4Group;
      // |q| in int16 so that -128 gives 128 as std::abs(int) does.
      int16x8_t m = vdupq_n_s16(0);
      for (size_t i = 0; i < kInt4Group; i += 16) {
        const int8x16_t b = vld1q_s8(qg + i);
        m = vmaxq_s16(m, vabsq_s16(vmovl_s8(vget_low_s8(b))));
        m = vmaxq_s16(m, vabsq_s16(vmovl_high_s8(b)));
      }
      const int am = vmaxvq_s16(m);
      // §6.7 op for op: s = am*s8/7, floor, inv = s8/s (DowncastScalar).
      float s = static_cast<float>(am) * s8[r] / 7.0f;
      if (s < kMinScale) s = kMinScale;
      const float inv = s8[r] / s;
      const float32x4_t k = vdupq_n_f32(inv);
      const int32x4_t lo = vdupq_n_s32(-8), hi = vdupq_n_s32(7);
      for (size_t i = 0; i < kInt4Group; i += 8) {
        const int16x8_t w = vmovl_s8(vld1_s8(qg + i));
        const float32x4_t f0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
        const float32x4_t f1 = vcvtq_f32_s32(vmovl_high_s16(w));
        const int32x4_t v0 = RoundClamp4(vmulq_f32(f0, k), lo, hi);
        const int32x4_t v1 = RoundClamp4(vmulq_f32(f1, k), lo, hi);
        vst1_s8(v + i, vqmovn_s16(vcombine_s16(vqmovn_s32(v0), vqmovn_s32(v1))));
      }
      scales[r * groups + g] = s;
      PackInt4Group64(v, packed + r * (cols / 2) + g * (kInt4Group / 2));
    }
  }
}

void QuantizeActsNeon(const float* x, size_t rows, size_t cols, int8_t* q, float* scales) noexcept {
  const size_t groups = cols / kActGroup;
  for (size_t b = 0; b < rows; ++b) {
    for (size_t g = 0; g < groups; ++g) {
      const size_t off = b * cols + g * kActGroup;
      float inv;
      scales[b * groups + g] = SpanScale(AbsMax(x + off, kActGroup), 127.0f, &inv);
      vst1q_s8(q + off, Quant16(x + off, inv, -127, 127));
      vst1q_s8(q + off + 16, Quant16(x + off + 16, inv, -127, 127));
    }
  }
}

// Roof loops (roof.h): 8 independent q-register chains (16 for the dot, two
// of them per pipe-latency), operands in registers. Without the dot product
// the IDOT dot is the kernels' smull + sadalp (8 products per pair), smull
// taking the chain's own accumulator so that it cannot move out of the loop.
uint64_t RoofNeon(RoofOp op, uint64_t iters) noexcept {
  constexpr int kChains = 8;
  if (op == RoofOp::kIdot) {
    int32x4_t a[kChains];
    for (int j = 0; j < kChains; ++j) a[j] = vdupq_n_s32(j);
#ifdef K3_NEON_DOT
    const int8x16_t u = vdupq_n_s8(3);
#endif
    const int8x16_t v = vdupq_n_s8(-5);
    for (uint64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < kChains; ++j) {
#ifdef K3_NEON_DOT
        a[j] = vdotq_s32(a[j], u, v);
#else
        a[j] = vpadalq_s16(a[j], vmull_s8(vget_low_s8(vreinterpretq_s8_s32(a[j])), vget_low_s8(v)));
#endif
      }
    }
    int32x4_t t = a[0];
    for (int j = 1; j < kChains; ++j) t = vaddq_s32(t, a[j]);
    volatile int32_t sink = vaddvq_s32(t);
    (void)sink;
#ifdef K3_NEON_DOT
    return iters * kChains * 16;
#else
    return iters * kChains * 8;
#endif
  }
  float32x4_t a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = vdupq_n_f32(float(j));
  const float32x4_t m = vdupq_n_f32(0.999f);
  const float32x4_t c = vdupq_n_f32(1e-3f);
  for (uint64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kChains; ++j) a[j] = vfmaq_f32(c, a[j], m);
  }
  float32x4_t t = a[0];
  for (int j = 1; j < kChains; ++j) t = vaddq_f32(t, a[j]);
  volatile float sink = vaddvq_f32(t);
  (void)sink;
  return iters * kChains * 4;
}

KernelTable MakeTable() {
  KernelTable t = ScalarKernels();
#ifdef K3_NEON_DOT
  t.isa = Isa::kNeonDot;
#else
  t.isa = Isa::kNeon;
#endif
  t.matmul = MatMulNeon;
  t.row_dot = RowDotNeon;
  t.add_row = AddRowNeon;
  t.matmul_q8 = MatMulQ8Neon;
  t.quantize_int8_rows = QuantizeInt8RowsNeon;
  t.quantize_int4_rows = QuantizeInt4RowsNeon;
  t.downcast_int8_to_int4 = DowncastNeon;
  t.quantize_acts = QuantizeActsNeon;
  t.roof = RoofNeon;
  // situ.h's and kda.h's loops compiled for NEON (GCC vectorizes them at -O3;
  // the same IEEE operations per element, so the scalar bits).
  t.situ_glu = SituGluLoop;
  t.kda_decay = KdaDecayLoop;
  t.kda_update = KdaUpdateLoop;
  t.softmax = SoftmaxLoop;
  t.attn_scores = AttnScoresLoop;
  return t;
}

}  // namespace

#ifdef K3_NEON_DOT
const KernelTable& NeonDotKernels() noexcept {
#else
const KernelTable& NeonKernels() noexcept {
#endif
  static const KernelTable table = MakeTable();
  return table;
}

}  // namespace k3::quant::internal
