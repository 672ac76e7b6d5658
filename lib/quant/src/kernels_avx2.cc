// AVX2 + FMA kernels for x86-64 CPUs without AVX-512 (Haswell .. Zen 3, client
// cores); built twice, the second time with AVX-VNNI (kernels_avx2_vnni.cc,
// K3_AVXVNNI: vpdpbusd in place of maddubs + madd, the same exact int32 lanes).
// Same structure as kernels_avx512.cc, a zmm's 16 lanes held in two ymm: a row is decoded on the
// fly (batch 1) or once per chunk into 64-byte aligned scratch, several rows sharing each
// activation load (batched), and every (row, activation) pair runs the same floating-point
// operations either way (the dot routines are templates over the tile shape; decode is the 1 x 1
// case). Weight lines are prefetched K3_PREFETCH bytes ahead.
//
// f32-activation path: the one order's 16-lane slots as pairs of ymm -- units of
// 16 columns (slot k mod 2), one MXFP4 group (slot k mod 2) or one int4 group
// (slot k mod 4), see F32Tile. int4/MXFP4 nibbles are widened with vpmovzxbd (8
// bytes -> 8 lanes: low nibbles = even columns, high = odd), and the activations
// are re-laid out once per call to match.
//
// IDOT path: the exact int32 dot of each 32-column group (maddubs + madd, or
// vpdpbusd), gathered per block of 16 groups into the one order's 16 float
// lanes (kernels.h BlockLane) by in-lane horizontal adds (decode) or by the
// batched tile's transposed layout (no horizontal adds), then one cvt and one
// FMA per 8 groups. int4/MXFP4 take 64 columns per step (the nibble IDOT below);
// int8 one group per ymm (without AVX-VNNI by the sign trick, as a +128 bias
// would overflow maddubs' int16 pair sums). Every lane is exact.
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "f32_tiles.h"
#include "kernels.h"
#include "attn.h"
#include "kda.h"
#include "situ.h"

namespace k3::quant::internal {
namespace {

struct Scratch {
  AlignedVec<float> xp;      // f32 path: activations in kernel layout
  AlignedVec<float> wrow;    // f32 path: decoded row
  AlignedVec<float> gscale;  // per-group factors of the row
  AlignedVec<int8_t> wq;     // batched IDOT: decoded weight bytes of a row block
  AlignedVec<int32_t> corr;  // IDOT: activation-only terms -B·Σxq
  AlignedVec<int8_t> xn;     // nibble IDOT: activations in step layout [batch][psteps*64]
  AlignedVec<float> wgs;     // batched nibble IDOT: weight block factors of a row block
  AlignedVec<float> xsg;     // IDOT: activation block factors (ActBlockFactors)
  AlignedVec<float> acc;     // batched f32 path: tile accumulators between column blocks
  AlignedVec<float> panels;  // AddRows: a chunk's f32 rows in 16-column panels
  AlignedVec<float> coefs;   // AddRows over int8 rows: c * row scale per token and row
};

Scratch& Tls() {
  thread_local Scratch s;
  return s;
}

inline float Hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// ---------------------------------------------------------------------------
// f32-activation path

// The one order's 16 float lanes as two ymm: lanes 0-7 and 8-15.
struct Y2 {
  __m256 lo, hi;
};

inline Y2 Add(Y2 a, Y2 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }

struct F32Src {  // f32 values (small or in cache: no prefetch)
  static constexpr bool kScaled = true;  // int4 rows: decoded with the group scale applied
  const float* w;
  Y2 Load16(size_t i) const { return {_mm256_loadu_ps(w + i), _mm256_loadu_ps(w + i + 8)}; }
  void Block16(size_t c, __m256& even, __m256& odd) const {
    even = _mm256_loadu_ps(w + c);
    odd = _mm256_loadu_ps(w + c + 8);
  }
  void Prefetch(size_t) const {}
};

struct I8Src {
  const int8_t* q;
  size_t pf = 0;  // PrefetchBytes()
  static __m256 Cvt8(const int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  Y2 Load16(size_t i) const { return {Cvt8(q + i), Cvt8(q + i + 8)}; }
  void Prefetch(size_t i) const {
    if (pf != 0) PrefetchLine(q + i, pf);
  }
};

// 8 packed bytes (16 columns): lane j holds byte j; low nibble = column 2j.
// int4 gives v - 8 (the tile multiplies by the group scale).
template <bool kMx>
struct NibbleSrc {
  static constexpr bool kScaled = false;
  const uint8_t* p;
  size_t pf = 0;  // PrefetchBytes()
  static __m256 Value(__m256i nib) {
    if constexpr (kMx) {
      // Doubled e2m1 magnitude from bits 0..2, sign from bit 3 (code 8 = -0).
      const __m256 mag = _mm256_permutevar8x32_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 6, 8, 12), nib);
      const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28);
      return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
    } else {
      return _mm256_cvtepi32_ps(_mm256_sub_epi32(nib, _mm256_set1_epi32(8)));
    }
  }
  void Block16(size_t c, __m256& even, __m256& odd) const {
    const __m256i v =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c / 2)));
    even = Value(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    odd = Value(_mm256_srli_epi32(v, 4));
  }
  void Prefetch(size_t c) const {
    if (pf != 0) PrefetchLine(p + c / 2, pf);
  }
};

// f32-activation dot products as R x B tiles (f32_tiles.h) in the one order
// (kernels_scalar.cc), every slot 16 lanes = one Y2:
// - plain rows (f32, int8): unit k = 16 columns into slot k mod 2, so column i
//   is in lane i mod 32; a = fma(x, w, a).
// - MXFP4: unit k = group k into slot k mod 2; lanes 0-7 take bytes 0-7 of the
//   group, 8-15 bytes 8-15: p = fma(x_odd, w_odd, x_even * w_even), then
//   a = fma(p, E8M0 * 0.5, a).
// - int4: unit k = group k into slot k mod 4; the weights are (v-8)·s_k and
//   each lane a chain of four FMAs, columns 2l, 2l+1, 32+2l, 33+2l.
// The activations are in PermuteEvenOdd16's layout for the nibble formats, so
// that the widened nibbles (even columns, odd columns) meet their columns.
// Pins a loaded vector in a register: otherwise GCC folds the same load into
// every FMA that uses it, once per activation row of the tile.
template <typename V>
inline V InReg(V v) {
  __asm__("" : "+x"(v));
  return v;
}

template <F32Unit U, int R, int B, typename Src>
struct F32Tile {
  const Src* w;            // R weight rows
  const float* const* x;   // B activation rows (kernel layout)
  const float* const* gs;  // R group-factor rows (group units only)
  size_t n;                // columns (the plain unit's tail)

  // p = x_even*w_even + x_odd*w_odd of the 16-column block at xb.
  static __m256 Pair(const float* xb, __m256 we, __m256 wo) {
    return _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), wo, _mm256_mul_ps(_mm256_loadu_ps(xb), we));
  }

  void Step(size_t k, Y2 (&a)[R][B]) const {
    if constexpr (U == F32Unit::kPlain) {
      const size_t i = k * 16;
      if (i + 16 <= n) {
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          if ((k & 3) == 0) w[r].Prefetch(i);
          const Y2 wv = w[r].Load16(i);
          const __m256 lo = InReg(wv.lo), hi = InReg(wv.hi);
#pragma GCC unroll 4
          for (int b = 0; b < B; ++b) {
            a[r][b].lo = _mm256_fmadd_ps(_mm256_loadu_ps(x[b] + i), lo, a[r][b].lo);
            a[r][b].hi = _mm256_fmadd_ps(_mm256_loadu_ps(x[b] + i + 8), hi, a[r][b].hi);
          }
        }
      } else {  // the tail, zero padded: fma(0, 0, a) = a (a is never -0)
        alignas(32) float xt[B][16] = {};
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) std::memcpy(xt[b], x[b] + i, (n - i) * sizeof(float));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const Y2 wv = TailWeights(w[r], i, n - i);
#pragma GCC unroll 4
          for (int b = 0; b < B; ++b) {
            a[r][b].lo = _mm256_fmadd_ps(_mm256_load_ps(xt[b]), wv.lo, a[r][b].lo);
            a[r][b].hi = _mm256_fmadd_ps(_mm256_load_ps(xt[b] + 8), wv.hi, a[r][b].hi);
          }
        }
      }
    } else if constexpr (U == F32Unit::kG32) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        if ((k & 3) == 0) w[r].Prefetch(k * 32);
        __m256 w0, w1, w2, w3;
        w[r].Block16(k * 32, w0, w1);
        w[r].Block16(k * 32 + 16, w2, w3);
        const __m256 g = _mm256_set1_ps(gs[r][k]);
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) {
          const float* xg = x[b] + k * 32;
          a[r][b].lo = _mm256_fmadd_ps(Pair(xg, w0, w1), g, a[r][b].lo);
          a[r][b].hi = _mm256_fmadd_ps(Pair(xg + 16, w2, w3), g, a[r][b].hi);
        }
      }
    } else {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        if ((k & 1) == 0) w[r].Prefetch(k * 64);
        __m256 wv[8];  // [16-column block][even, odd]
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) w[r].Block16(k * 64 + 16 * j, wv[2 * j], wv[2 * j + 1]);
        if constexpr (!Src::kScaled) {
          const __m256 s = _mm256_set1_ps(gs[r][k]);
#pragma GCC unroll 8
          for (int j = 0; j < 8; ++j) wv[j] = _mm256_mul_ps(wv[j], s);
        }
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) {
          const float* xg = x[b] + k * 64;
          __m256 lo = a[r][b].lo, hi = a[r][b].hi;
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {  // columns 32h + 2l, 32h + 2l + 1
            const float* xh = xg + 32 * h;
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(xh), wv[4 * h], lo);
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(xh + 8), wv[4 * h + 1], lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(xh + 16), wv[4 * h + 2], hi);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(xh + 24), wv[4 * h + 3], hi);
          }
          a[r][b].lo = lo;
          a[r][b].hi = hi;
        }
      }
    }
  }

  // The last m < 16 weights of a plain row, zero padded.
  static Y2 TailWeights(const Src& src, size_t i, size_t m) {
    alignas(32) float t[16] = {};
    const Y2 all = [&] {
      if constexpr (std::is_same_v<Src, I8Src>) {
        alignas(16) int8_t b[16] = {};
        std::memcpy(b, src.q + i, m);
        return I8Src{b}.Load16(0);
      } else {
        std::memcpy(t, src.w + i, m * sizeof(float));
        return F32Src{t}.Load16(0);
      }
    }();
    return all;
  }
};

// Within each 16-column block: the 8 even columns, then the 8 odd ones.
void PermuteEvenOdd16(const float* x, size_t n, float* out) noexcept {
  for (size_t i = 0; i < n; i += 16) {
    for (size_t j = 0; j < 8; ++j) {
      out[i + j] = x[i + 2 * j];
      out[i + 8 + j] = x[i + 2 * j + 1];
    }
  }
}

inline float E8m0Half(uint8_t e) { return std::bit_cast<float>(uint32_t{e} << 23) * 0.5f; }

// MXFP4 group factors E8M0 * 0.5 (the kernels use doubled e2m1 codes).
void MxGroupScales(const uint8_t* e, size_t groups, float* out) noexcept {
  for (size_t g = 0; g < groups; ++g) out[g] = E8m0Half(e[g]);
}

const float* GroupScalesF32(const WeightView& w, size_t o, Scratch& s) noexcept {
  const size_t n = w.cols;
  if (w.format == WeightFormat::kInt4G64) return w.scales + o * (n / kInt4Group);
  if (w.format != WeightFormat::kMxfp4) return nullptr;
  float* gs = Grow(s.gscale, n / kMxGroup);
  MxGroupScales(w.e8m0 + o * (n / kMxGroup), n / kMxGroup, gs);
  return gs;
}

// Row o in the kernel layout into `out` for the batched loop; f32 rows are used
// in place, int4 rows get their group scales applied ((v-8)·s, the product the
// decode path forms).
const float* DecodeRowF32(const WeightView& w, size_t o, float* out) noexcept {
  const size_t n = w.cols;
  if (w.format == WeightFormat::kF32) return static_cast<const float*>(w.data) + o * n;
  if (w.format == WeightFormat::kInt8) {
    const int8_t* q = static_cast<const int8_t*>(w.data) + o * n;
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]);
    return out;
  }
  const uint8_t* packed = static_cast<const uint8_t*>(w.data) + o * (n / 2);
  const float* s4 = w.scales + o * (n / kInt4Group);
  for (size_t c = 0; c < n; c += 16) {
    __m256 even, odd;
    if (w.format == WeightFormat::kMxfp4) {
      NibbleSrc<true>{packed}.Block16(c, even, odd);
    } else {
      NibbleSrc<false>{packed}.Block16(c, even, odd);
      const __m256 s = _mm256_set1_ps(s4[c / kInt4Group]);
      even = _mm256_mul_ps(even, s);
      odd = _mm256_mul_ps(odd, s);
    }
    _mm256_storeu_ps(out + c, even);
    _mm256_storeu_ps(out + c + 8, odd);
  }
  return out;
}

// The f32 tiles' ISA kit (f32_tiles.h). Sixteen ymm registers; a slot is two.
// Plain rows: 2 x 1 tiles (8 accumulators); MXFP4: 1 x 2 (8, the four weight
// vectors of a group shared by both activation rows); int4's four slots take 8
// ymm per pair, so 1 x 1.
struct Avx2Kit {
  using V = Y2;
  static constexpr int kLanes = 16;
  static V Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V Load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void Store(float* p, V v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }
  template <F32Unit U>
  static constexpr int kSlots = U == F32Unit::kG64 ? 4 : 2;
  template <F32Unit U>
  static constexpr int kTileActs = U == F32Unit::kG32 ? 2 : 1;
  template <F32Unit U>
  static constexpr int kRows = U == F32Unit::kPlain ? 2 : 1;
  template <F32Unit U, int R, int B, typename Src>
  using Tile = F32Tile<U, R, B, Src>;
  using RowSrc = F32Src;
  // Plain: slot 0 + slot 1 is lane j + lane j+16; MXFP4 the slots' sum; int4
  // (s0 + s1) + (s2 + s3). Then the 16-lane tree: lo + hi (j + (j+8)) and Hsum.
  template <int S>
  static float Reduce(const V* v) {
    static_assert(S == 2 || S == 4);
    const Y2 t = S == 4 ? Add(Add(v[0], v[1]), Add(v[2], v[3])) : Add(v[0], v[1]);
    return Hsum(_mm256_add_ps(t.lo, t.hi));
  }
  static const float* DecodeRow(const WeightView& w, size_t o, float* out) {
    return DecodeRowF32(w, o, out);
  }
  static void MxScales(const uint8_t* e, size_t groups, float* out) {
    MxGroupScales(e, groups, out);
  }
};

float DotDirect(const WeightView& w, size_t o, const float* gs, const float* x) noexcept {
  const size_t n = w.cols;
  const size_t pf = PrefetchBytes();
  const uint8_t* packed = static_cast<const uint8_t*>(w.data) + o * (n / 2);
  switch (w.format) {
    case WeightFormat::kF32:
      return DotF32<Avx2Kit, F32Unit::kPlain>(F32Src{static_cast<const float*>(w.data) + o * n}, x,
                                              nullptr, n);
    case WeightFormat::kInt8:
      return DotF32<Avx2Kit, F32Unit::kPlain>(I8Src{static_cast<const int8_t*>(w.data) + o * n, pf},
                                              x, nullptr, n) *
             w.scales[o];
    case WeightFormat::kInt4G64:
      return DotF32<Avx2Kit, F32Unit::kG64>(NibbleSrc<false>{packed, pf}, x, gs, n);
    case WeightFormat::kMxfp4:
      return DotF32<Avx2Kit, F32Unit::kG32>(NibbleSrc<true>{packed, pf}, x, gs, n);
  }
  return 0.0f;
}

// Activations in the kernel's layout: the nibble formats' even/odd order in the
// 64-byte aligned scratch; plain rows (f32, int8) read the input itself (their
// batched tiles, MatMulF32PlainAvx2, read it in place too).
const float* LayoutActs(const WeightView& w, const float* x, size_t batch, Scratch& s) noexcept {
  if (w.format != WeightFormat::kInt4G64 && w.format != WeightFormat::kMxfp4) return x;
  float* xp = Grow(s.xp, batch * w.cols);
  for (size_t b = 0; b < batch; ++b) PermuteEvenOdd16(x + b * w.cols, w.cols, xp + b * w.cols);
  return xp;
}

// f32 and int8 weights on the f32 path, batched (the router, KDA's gate
// projections; MLA's per-head outputs over kv_b's int8 rows): a pair's plain
// accumulators are four independent chains -- slot k mod 2 of unit k, its
// low and high eight lanes -- so a tile can run one chain at a time, eight
// columns in every 32 of a column block: four rows x two activations take
// eight ymm and six loads per eight FMAs, where the shared tile (both slots,
// both halves: four ymm per pair) fits 2 x 1 and loads six per four.
// Per pair and chain the FMAs are the same, in the same unit order, and the
// reduce is the same: the bits of every other path (f32_tiles.h). The
// activations are read in place (f32 rows need no layout) in chunks of about
// kF32WeightActBytes; the weights are swept once per chunk. Zen 3, 1 thread:
// 896 x 7168 (the router) at 512 tokens 0.18-0.19 -> 0.32-0.35 of the FMA
// roof (3 x 3 and 2 x 4 measured no better; what holds it there is not the
// tile's loads -- an L1-resident 96 x 1024 reads 0.44 -- and without
// counters in this VM it stays open); int8 rows (converted in registers, the
// row scale after the reduce as F32TileBlock applies it), 128 x 512 at 64-256
// tokens: 0.21-0.25 -> 0.41-0.46.
constexpr int kPlainRows = 4;
constexpr int kPlainActs = 2;

// Chain c (slot c / 2, half c % 2) of units [k0, k1) for N rows from w0 x B
// activations from x0, both n floats apart (one stride register for all:
// separate row pointers spilled and were reloaded every step).
template <typename T>
inline __m256 PlainLoad8(const T* p) {
  if constexpr (std::is_same_v<T, int8_t>) {
    return I8Src::Cvt8(p);
  } else {
    return _mm256_loadu_ps(p);
  }
}

template <typename T, int N, int B>
void PlainChain(const T* w0, const float* x0, size_t n, size_t k0, size_t k1, size_t c,
                __m256 (&a)[N][B]) noexcept {
  const size_t lane = (c % 2) * 8;
  const size_t full = n / 16;  // units before the zero-padded tail
  const size_t kf = std::min(k1, full);
  size_t k = k0 + c / 2;
  for (; k < kf; k += 2) {
    const T* wp = w0 + k * 16 + lane;
    const float* xp = x0 + k * 16 + lane;
    __m256 xv[B];
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) xv[b] = InReg(_mm256_loadu_ps(xp + b * n));
#pragma GCC unroll 4
    for (int r = 0; r < N; ++r) {
      const __m256 wv = InReg(PlainLoad8(wp + r * n));
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) a[r][b] = _mm256_fmadd_ps(xv[b], wv, a[r][b]);
    }
  }
  if (k < k1) {  // the tail unit, zero padded as F32Tile::Step pads it
    alignas(32) float xt[B][16] = {};
    alignas(32) float wt[N][16] = {};
    const size_t m = n - k * 16;
    for (int b = 0; b < B; ++b) std::memcpy(xt[b], x0 + b * n + k * 16, m * sizeof(float));
    for (int r = 0; r < N; ++r) {
      for (size_t i = 0; i < m; ++i) wt[r][i] = static_cast<float>(w0[r * n + k * 16 + i]);
    }
    for (int r = 0; r < N; ++r) {
      for (int b = 0; b < B; ++b) {
        a[r][b] =
            _mm256_fmadd_ps(_mm256_load_ps(xt[b] + lane), _mm256_load_ps(wt[r] + lane), a[r][b]);
      }
    }
  }
}

// Activations b0 .. b0+B-1 against rows wr over units [k0, k1), chain by
// chain, the accumulators [batch][slot][row] (16 floats: low, high) in acc.
template <typename T, int N, int B>
void PlainTile(const T* w0, const float* xl, size_t n, size_t b0, size_t k0, size_t k1,
               float* acc) noexcept {
  for (size_t c = 0; c < 4; ++c) {
    auto at = [&](int r, int b) {
      return acc + (((b0 + b) * 2 + c / 2) * N + r) * 16 + (c % 2) * 8;
    };
    __m256 a[N][B];
#pragma GCC unroll 4
    for (int r = 0; r < N; ++r) {
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) a[r][b] = _mm256_loadu_ps(at(r, b));
    }
    PlainChain<T, N, B>(w0, xl + b0 * n, n, k0, k1, c, a);
#pragma GCC unroll 4
    for (int r = 0; r < N; ++r) {
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) _mm256_storeu_ps(at(r, b), a[r][b]);
    }
  }
}

template <typename T, int N>
void PlainRowBlock(const WeightView& w, const float* xl, size_t batch, size_t o, float* y,
                   Scratch& s) noexcept {
  const size_t n = w.cols;
  const T* w0 = static_cast<const T*>(w.data) + o * n;
  const size_t units = (n + 15) / 16;
  const size_t block = kF32BlockCols / 16;
  float* acc = Grow(s.acc, batch * 2 * N * 16);
  std::memset(acc, 0, batch * 2 * N * 16 * sizeof(float));
  for (size_t k0 = 0; k0 < units; k0 += block) {
    const size_t k1 = std::min(k0 + block, units);
    size_t b = 0;
    for (; b + kPlainActs <= batch; b += kPlainActs)
      PlainTile<T, N, kPlainActs>(w0, xl, n, b, k0, k1, acc);
    for (; b < batch; ++b) PlainTile<T, N, 1>(w0, xl, n, b, k0, k1, acc);
  }
  for (size_t b = 0; b < batch; ++b) {
    for (int r = 0; r < N; ++r) {
      const Y2 v[2] = {Avx2Kit::Load(acc + ((b * 2 + 0) * N + r) * 16),
                       Avx2Kit::Load(acc + ((b * 2 + 1) * N + r) * 16)};
      const float d = Avx2Kit::Reduce<2>(v);
      y[b * w.rows + o + r] = std::is_same_v<T, int8_t> ? d * w.scales[o + r] : d;
    }
  }
}

void MatMulF32PlainAvx2(const WeightView& w, const float* x, size_t batch, float* y, size_t r0,
                        size_t r1, Scratch& s) noexcept {
  // int8 weights are decoded in registers; their chunk is f32's (the
  // activations are f32 either way).
  const size_t rows = kF32WeightActBytes / std::max<size_t>(w.cols * sizeof(float), 1);
  const size_t chunk = std::max<size_t>(rows / kPlainActs * kPlainActs, kPlainActs);
  for (size_t b0 = 0; b0 < batch; b0 += chunk) {
    const size_t nb = std::min(chunk, batch - b0);
    ForRowBlocks<kPlainRows>(r0, r1, [&]<int N>(size_t o) {
      if (w.format == WeightFormat::kInt8) {
        PlainRowBlock<int8_t, N>(w, x + b0 * w.cols, nb, o, y + b0 * w.rows, s);
      } else {
        PlainRowBlock<float, N>(w, x + b0 * w.cols, nb, o, y + b0 * w.rows, s);
      }
    });
  }
}

void MatMulAvx2(const WeightView& w, const float* x, size_t batch, float* y, size_t r0,
                size_t r1) noexcept {
  Scratch& s = Tls();
  if ((w.format == WeightFormat::kF32 || w.format == WeightFormat::kInt8) && batch > 1) {
    return MatMulF32PlainAvx2(w, x, batch, y, r0, r1, s);
  }
  const float* xl = LayoutActs(w, x, batch, s);
  if (batch == 1) {
    for (size_t o = r0; o < r1; ++o) y[o] = DotDirect(w, o, GroupScalesF32(w, o, s), xl);
    return;
  }
  MatMulF32Batched<Avx2Kit>(w, xl, batch, y, r0, r1, s);
}

float RowDotAvx2(const WeightView& w, size_t row, const float* x) noexcept {
  Scratch& s = Tls();
  const float* xl = LayoutActs(w, x, 1, s);
  return DotDirect(w, row, GroupScalesF32(w, row, s), xl);
}

// ---------------------------------------------------------------------------
// IDOT path (§6.5) in the one order (kernels.h, BlockLane): every 32-column
// group's exact int32 dot gi, then per block of 16 groups one float vector of 16
// lanes -- two ymm, A = lanes 0-7, B = lanes 8-15 -- with group 4m + L of the
// block in lane 4L + m, a = fma(cvt(G), f, a) with the block's factors f in the
// same lane order, and at the end Tree16: A + B (j + (j+8)), then Hsum (+ (j+4),
// + (j+2), + (j+1)). The integer sums are exact, so how the lanes are gathered
// into G changes no bit; the factors are the scalar reference's IEEE products.

// Lane 4h + m of the result = the sum of the four int32 lanes of 128-bit lane h
// of s_m (exact): three in-lane horizontal adds ...
inline __m256i SumLanes4(__m256i s0, __m256i s1, __m256i s2, __m256i s3) {
  return _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(s2, s3));
}

// ... or the same sums by an in-lane 4 x 4 transpose folded into adds, which
// the int8 GEMM (four sums per block and row where the nibble kernel has one)
// ran faster with on Zen 3.
inline __m256i SumLanes4Unpack(__m256i s0, __m256i s1, __m256i s2, __m256i s3) {
  const __m256i e01 =
      _mm256_add_epi32(_mm256_unpacklo_epi32(s0, s1), _mm256_unpackhi_epi32(s0, s1));
  const __m256i e23 =
      _mm256_add_epi32(_mm256_unpacklo_epi32(s2, s3), _mm256_unpackhi_epi32(s2, s3));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(e01, e23), _mm256_unpackhi_epi64(e01, e23));
}

// Tree16 of the 16 lanes held as A (0-7) and B (8-15).
inline float Tree16(__m256 a, __m256 b) { return Hsum(_mm256_add_ps(a, b)); }

// Block lane order of 16 natural-order bytes (lane 4L + m <- byte 4m + L).
inline __m128i BlockLaneBytes(__m128i v) {
  return _mm_shuffle_epi8(v, _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
}

// The activations' part of every group factor, per block in block lane order
// (xs_g, times 0.5 for MXFP4's doubled codes; 0 past the row's end):
// [batch][blocks * 16].
const float* ActBlockFactors(const ActsQ8& x, float mult, AlignedVec<float>& buf) noexcept {
  const size_t groups = x.cols / kActGroup;
  const size_t blocks = (groups + 15) / 16;
  float* out = Grow(buf, x.batch * blocks * 16);
  for (size_t r = 0; r < x.batch; ++r) {
    const float* xs = x.scales.data() + r * groups;
    float* o = out + r * blocks * 16;
    for (size_t g = 0; g < blocks * 16; ++g) {
      o[g - g % 16 + BlockLane(g)] = g < groups ? xs[g] * mult : 0.0f;
    }
  }
  return out;
}

// 16 packed bytes -> 32 nibbles in column order.
inline __m256i NibblesToBytes(__m128i p) {
  const __m128i m = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(p, m);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(p, 4), m);
  return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
}

// Signed weight bytes of the 32-column group starting at column c (AddRow).
template <WeightFormat F>
inline __m256i WeightBytes32(const uint8_t* row, size_t c) {
  const __m256i nib =
      NibblesToBytes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2)));
  if constexpr (F == WeightFormat::kInt4G64) {
    return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
  } else {
    const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    return _mm256_shuffle_epi8(lut, nib);
  }
}

template <WeightFormat F>
const uint8_t* RowBytes(const WeightView& w, size_t o) {
  const size_t stride = F == WeightFormat::kInt8 ? w.cols : w.cols / 2;
  return static_cast<const uint8_t*>(w.data) + o * stride;
}

// ---------------------------------------------------------------------------
// int8 IDOT: one ymm = one group, 8 int32 lanes of 4 columns. Without AVX-VNNI
// the sign trick maddubs(|w|, sign(xq, w)) keeps the int16 pair sums exact
// (|w|·|xq| <= 127*127; a +128 bias would overflow them); with AVX-VNNI the
// weights are biased (w ^ 0x80 = w + 128) and vpdpbusd starts from the
// activation-only term -128·Σxq of each lane. Per block, the 16 group vectors
// are summed into block lane order: SumLanes4 over groups L, L+4, L+8, L+12
// gives the two 128-bit halves' sums of those groups, and adding the halves
// (two vperm2i128) puts L = 0, 1 into A and L = 2, 3 into B.
#ifdef K3_AVXVNNI
constexpr bool kInt8Biased = true;
#else
constexpr bool kInt8Biased = false;
#endif

// Weight bytes as the dot takes them (biased with AVX-VNNI).
struct Q8Direct {
  const uint8_t* row;
  size_t pf = 0;  // PrefetchBytes() (one line per two groups)
  __m256i Group(size_t g) const {
    if (pf != 0 && (g & 1) == 0) PrefetchLine(row + g * 32, pf);
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + g * 32));
    return kInt8Biased ? _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))) : w;
  }
};

// -128·(sum of each lane's 4 activations), per group of every row (AVX-VNNI's
// dpbusd start values); null without AVX-VNNI.
const int32_t* Int8Corrections(const ActsQ8& x, Scratch& s) noexcept {
  if constexpr (!kInt8Biased) {
    return nullptr;
  } else {
    const size_t groups = x.cols / kActGroup;
    int32_t* out = Grow(s.corr, x.batch * groups * 8);
    const __m256i b = _mm256_set1_epi8(static_cast<char>(128));
    const __m256i ones = _mm256_set1_epi16(1);
    for (size_t i = 0; i < x.batch * groups; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + i * 32));
      const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(b, v), ones);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * 8),
                          _mm256_sub_epi32(_mm256_setzero_si256(), sum));
    }
    return out;
  }
}

// One group's int32 lanes (exact): sign trick, or vpdpbusd from the correction.
inline __m256i Int8Dot(__m256i wv, __m256i x, [[maybe_unused]] const int32_t* corr) {
#ifdef K3_AVXVNNI
  return _mm256_dpbusd_avx_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr)), wv,
                                 x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(x, wv)),
                           _mm256_set1_epi16(1));
#endif
}

// Block g0 (16 groups) of one activation row against R rows: a[h][r] gets
// half h (A: L = 0, 1; B: L = 2, 3). kTail: groups may pass the row's end.
template <int R, bool kTail, typename Src>
__attribute__((always_inline)) inline void Int8Block(const Src* w, const int8_t* xq,
                                                     const int32_t* corr, const float* xf,
                                                     size_t groups, size_t g0,
                                                     __m256 (&a)[2][R]) {
  // Groups l, l+4, l+8, l+12 of the block, summed per 128-bit half (SumLanes4).
  auto quad = [&](size_t l, __m256i (&q)[R]) {
    __m256i d[4][R];
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
      const size_t g = g0 + l + 4 * m;
      if (kTail && g >= groups) {
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) d[m][r] = _mm256_setzero_si256();
        continue;
      }
      const __m256i x = InReg(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + g * 32)));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) d[m][r] = Int8Dot(w[r].Group(g), x, corr + g * 8);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) q[r] = SumLanes4Unpack(d[0][r], d[1][r], d[2][r], d[3][r]);
  };
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m256i q0[R], q1[R];
    quad(2 * h, q0);
    quad(2 * h + 1, q1);
    const __m256 fv = _mm256_loadu_ps(xf + g0 + 8 * h);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      // Both halves' sums of groups 4m + 2h (low lane) and 4m + 2h + 1 (high).
      const __m256i g = _mm256_add_epi32(_mm256_permute2x128_si256(q0[r], q1[r], 0x20),
                                         _mm256_permute2x128_si256(q0[r], q1[r], 0x31));
      a[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g), fv, a[h][r]);
    }
  }
}

// One activation row against R int8 weight rows (decode: R = 1; the batched
// path is the transposed tile below, with the same float steps). xf: the row's block
// factors (ActBlockFactors); out: Tree16 before the row scale.
template <int R, typename Src>
void DotQ8Rows(const Src* w, const int8_t* xq, const int32_t* corr, const float* xf,
               size_t groups, float* out) noexcept {
  __m256 a[2][R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) a[0][r] = a[1][r] = _mm256_setzero_ps();
  size_t g0 = 0;
  for (; g0 + 16 <= groups; g0 += 16) Int8Block<R, false>(w, xq, corr, xf, groups, g0, a);
  if (g0 < groups) Int8Block<R, true>(w, xq, corr, xf, groups, g0, a);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r] = Tree16(a[0][r], a[1][r]);
}

// ---------------------------------------------------------------------------
// Nibble IDOT (int4-g64, MXFP4): 64 columns (two groups) per step from one
// 32-byte load, with no shuffle across or within lanes on the weights. The low
// nibbles of the step's 32 bytes are its even columns and the high nibbles its
// odd ones; 128-bit lane h holds group 2t + h of step t. The activations are
// stored once per call in that layout (per group its 16 even-column bytes, and
// 32 bytes on its 16 odd-column bytes), so `and`/shift (MXFP4 then a byte LUT)
// gives unsigned biased bytes (nibble = v + 8; the LUT gives 2v + 12) that
// maddubs pairs with the activations directly; the two maddubs results add as
// int16 (|sum| <= 4*24*127 < 2^15, exact) and one madd gives int32 lanes of 8
// columns, lane (h, j) of step t in group 2t + h. Σ(w+B)·xq = Σw·xq + B·Σxq, so
// the activation-only term -B·Σxq is added per block from a table built once
// per call, and every group sum is exact.
//
// A block (16 groups) is 8 steps: group 4m + L is step 2m + L/2, half L%2, so
// SumLanes4 of steps 0, 2, 4, 6 is A in block lane order (lane 4h + m = group
// 4m + h) and of steps 1, 3, 5, 7 is B (group 4m + 2 + h). Batch 1 decodes a row
// on the fly, batched runs rows decoded once; per (row, activation) pair the
// operations are the same.

constexpr size_t kStep = 64;
constexpr size_t kBlockSteps = 8;

struct NibActs {
  const int8_t* xq;     // [batch][psteps * 64]: per step the even bytes then the odd, zero padded
  const int32_t* corr;  // [batch][blocks * 16]: -B·Σxq per block, block lane order
  const float* xf;      // [batch][blocks * 16]: ActBlockFactors
  size_t steps;         // steps holding columns
  size_t blocks;
  size_t full;          // blocks of 16 whole groups
};

template <WeightFormat F>
constexpr int kBias = F == WeightFormat::kInt4G64 ? 8 : 12;

template <WeightFormat F>
NibActs PrepareNibActs(const ActsQ8& x, Scratch& s) noexcept {
  const size_t n = x.cols;
  const size_t groups = n / kActGroup;
  const size_t steps = (n + kStep - 1) / kStep;
  const size_t blocks = (groups + 15) / 16;
  const size_t psteps = blocks * kBlockSteps;
  int8_t* xq = Grow(s.xn, x.batch * psteps * kStep);
  int32_t* corr = Grow(s.corr, x.batch * blocks * 16);
  const float* xf = ActBlockFactors(x, F == WeightFormat::kMxfp4 ? 0.5f : 1.0f, s.xsg);
  const __m256i b = _mm256_set1_epi8(static_cast<char>(kBias<F>));
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t r = 0; r < x.batch; ++r) {
    const int8_t* q = x.q.data() + r * n;
    for (size_t k = 0; k < blocks; ++k) {
      __m256i c[kBlockSteps];
      for (size_t m = 0; m < kBlockSteps; ++m) {
        const size_t t = k * kBlockSteps + m;
        int8_t* d = xq + (r * psteps + t) * kStep;
        NibbleStepActs(q, groups, t, 2, d);
        const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d));
        const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + 32));
        const __m256i p =
            _mm256_add_epi16(_mm256_maddubs_epi16(b, xa), _mm256_maddubs_epi16(b, xb));
        c[m] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(p, ones));
      }
      int32_t* dc = corr + (r * blocks + k) * 16;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dc), SumLanes4(c[0], c[2], c[4], c[6]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dc + 8), SumLanes4(c[1], c[3], c[5], c[7]));
    }
  }
  return {xq, corr, xf, steps, blocks, groups / 16};
}

// One step's int32 lanes Σ(w+B)·xq (exact).
inline __m256i NibDot(__m256i we, __m256i wo, __m256i xe, __m256i xo) {
#ifdef K3_AVXVNNI
  // vpdpbusd: the same exact int32 lanes in two instructions instead of four.
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), we, xe), wo, xo);
#else
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(we, xe), _mm256_maddubs_epi16(wo, xo));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

// Biased weight bytes of 32 packed bytes: the low nibbles and the high ones
// (int4: nibble = v + 8; MXFP4: the LUT's 2v + 12).
template <WeightFormat F>
inline void DecodeNibbles(__m256i raw, __m256i* lo, __m256i* hi) {
  const __m256i nib = _mm256_set1_epi8(15);
  *lo = _mm256_and_si256(raw, nib);
  *hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
  if constexpr (F == WeightFormat::kMxfp4) {
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    *lo = _mm256_shuffle_epi8(lut, *lo);
    *hi = _mm256_shuffle_epi8(lut, *hi);
  }
}

// Row o decoded step by step straight from the stored bytes and factors.
template <WeightFormat F>
struct NibDirect {
  const uint8_t* row;   // cols/2 bytes
  const void* factors;  // MXFP4: E8M0 [cols/32]; int4: f32 [cols/64]
  size_t bytes;         // cols/2
  size_t groups;        // factor count
  size_t pf;            // PrefetchBytes()

  // Biased weight bytes: even columns (low nibbles) and odd columns (high);
  // kCheck: the step may hold the row's end.
  template <bool kCheck = true>
  void Weights(size_t t, __m256i* we, __m256i* wo) const {
    const size_t off = t * 32;
    if (pf != 0) PrefetchLine(row + off, pf);
    __m256i raw;
    if (!kCheck || off + 32 <= bytes) {
      raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + off));
    } else {
      alignas(32) uint8_t tmp[32] = {};
      std::memcpy(tmp, row + off, bytes - off);
      raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
    }
    DecodeNibbles<F>(raw, we, wo);
  }

  // The weight factors of block k in block lane order, A and B (0 past the
  // row's end): MXFP4 2^(s-127) (the 0.5 is in the activations' part), int4 the
  // g64 scale of each group (group 4m + L has scale 2m + L/2 of the block).
  template <bool kCheck = true>
  void BlockFactors(size_t k, __m256* fa, __m256* fb) const {
    if constexpr (F == WeightFormat::kMxfp4) {
      const uint8_t* e = static_cast<const uint8_t*>(factors) + k * 16;
      if (pf != 0) PrefetchLine(e, pf / 16);  // 1 E8M0 byte per 16 weight bytes
      __m128i eb;
      if (!kCheck || k * 16 + 16 <= groups) {
        eb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(e));
      } else {
        alignas(16) uint8_t tmp[16] = {};
        std::memcpy(tmp, e, groups - k * 16);
        eb = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
      }
      eb = BlockLaneBytes(eb);
      *fa = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(eb), 23));
      *fb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(eb, eb)), 23));
    } else {
      const float* sc = static_cast<const float*>(factors) + k * 8;
      if (pf != 0) PrefetchLine(sc, pf / 8);  // 4 scale bytes per 32 weight bytes
      __m256 v;
      if (!kCheck || k * 8 + 8 <= groups) {
        v = _mm256_loadu_ps(sc);
      } else {
        alignas(32) float tmp[8] = {};
        std::memcpy(tmp, sc, (groups - k * 8) * sizeof(float));
        v = _mm256_load_ps(tmp);
      }
      *fa = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
      *fb = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7));
    }
  }
};

template <WeightFormat F>
NibDirect<F> NibRow(const WeightView& w, size_t o) {
  const size_t n = w.cols;
  if constexpr (F == WeightFormat::kMxfp4) {
    return {RowBytes<F>(w, o), w.e8m0 + o * (n / kMxGroup), n / 2, n / kMxGroup, PrefetchBytes()};
  } else {
    return {RowBytes<F>(w, o), w.scales + o * (n / kInt4Group), n / 2, n / kInt4Group,
            PrefetchBytes()};
  }
}

// Batch 1: per block and half (A: even steps, B: odd), four step dots,
// SumLanes4, the correction, one cvt and one FMA with f = gs·xf. Steps past the
// row's end contribute 0 (as the batched path's zero padding does); only the
// last block (kTail) checks for them.
template <WeightFormat F, bool kTail>
__attribute__((always_inline)) inline void NibBlock1(const NibDirect<F>& w, const NibActs& x,
                                                     size_t k, __m256& a0, __m256& a1) {
  auto dot = [&](size_t t) {
    if (kTail && t >= x.steps) return _mm256_setzero_si256();
    __m256i we, wo;
    w.template Weights<kTail>(t, &we, &wo);
    const int8_t* xq = x.xq + t * kStep;
    return NibDot(we, wo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)),
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32)));
  };
  __m256 wf0, wf1;
  w.template BlockFactors<kTail>(k, &wf0, &wf1);
  const size_t t0 = k * kBlockSteps;
  const __m256i g0 = _mm256_add_epi32(
      SumLanes4(dot(t0), dot(t0 + 2), dot(t0 + 4), dot(t0 + 6)),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.corr + k * 16)));
  a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g0), _mm256_mul_ps(wf0, _mm256_loadu_ps(x.xf + k * 16)),
                       a0);
  const __m256i g1 = _mm256_add_epi32(
      SumLanes4(dot(t0 + 1), dot(t0 + 3), dot(t0 + 5), dot(t0 + 7)),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.corr + k * 16 + 8)));
  a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(g1),
                       _mm256_mul_ps(wf1, _mm256_loadu_ps(x.xf + k * 16 + 8)), a1);
}

template <WeightFormat F>
float DotNib1(const NibDirect<F>& w, const NibActs& x) noexcept {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  size_t k = 0;
  for (; k < x.full; ++k) NibBlock1<F, false>(w, x, k, a0, a1);
  if (k < x.blocks) NibBlock1<F, true>(w, x, k, a0, a1);
  return Tree16(a0, a1);
}

// ---------------------------------------------------------------------------
// Batched IDOT (int8, int4-g64, MXFP4), transposed layout. Every block of 16
// groups is two sets of eight, set h holding block lanes 8h .. 8h+7: lane j of
// the set is group 4(j%4) + 2h + j/4 (block lane 8h + j). A slot is 32 bytes,
// lane j's four bytes from that group; a set has eight slots. int8: slot d =
// columns 4d .. 4d+3. Nibbles: slots 2c and 2c+1 = the even and the odd
// columns of 8c .. 8c+7 (the low and the high nibbles of the group's packed
// bytes 4c .. 4c+3). The weight rows (decoded once per block of rows) and the
// activations (once per call) are laid out alike, so the int32 lanes of a
// set's slot dots, added up, are its eight group sums already in block lane
// order: no horizontal adds, which is what bound the previous tiles. The
// float steps (cvt, the factors' product, FMA into A or B, Tree16) are the
// decode path's, in its order.
//
// A row block's decoded slots (kTRows rows x kTChunk blocks, 16 KiB) stay in
// L1 while every activation row passes over them, the chunk's activation rows
// one contiguous stream; each activation slot feeds all of the block's rows
// from a register. Between chunks the A and B accumulators of each
// (activation, row) pair wait in scratch. Zen 3, one thread, against the
// maddubs + madd roof: 4 rows x 8 blocks measured best of 4/6/8 rows x
// 2/4/6/8/12 blocks.

constexpr size_t kTSetBytes = 8 * 32;
constexpr size_t kTBlockBytes = 2 * kTSetBytes;
constexpr int kTRows = 4;
constexpr size_t kTChunk = 8;
constexpr size_t kTPanelBytes = size_t{512} << 10;
constexpr size_t kTPanelMin = 64;

inline __m256i LoadSlot(const int8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// In-lane 4 x 4 transpose of 32-bit elements: t[c] lane (h, m) = a[m] lane (h, c).
inline void Transpose4x4(const __m256i (&a)[4], __m256i (&t)[4]) {
  const __m256i l01 = _mm256_unpacklo_epi32(a[0], a[1]);
  const __m256i l23 = _mm256_unpacklo_epi32(a[2], a[3]);
  const __m256i h01 = _mm256_unpackhi_epi32(a[0], a[1]);
  const __m256i h23 = _mm256_unpackhi_epi32(a[2], a[3]);
  t[0] = _mm256_unpacklo_epi64(l01, l23);
  t[1] = _mm256_unpackhi_epi64(l01, l23);
  t[2] = _mm256_unpacklo_epi64(h01, h23);
  t[3] = _mm256_unpackhi_epi64(h01, h23);
}

inline __m256i LoadHalves(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}

// The slots of one block of 16 groups of 32 bytes (int8 weights, activations;
// src padded to the whole block): kEvenOdd first orders each 8 columns even
// then odd (the nibble formats' activation slots), flip is XORed into every
// byte (AVX-VNNI's biased int8 weights, else 0).
template <bool kEvenOdd>
inline void BlockSlots32(const uint8_t* src, int8_t* blk, __m256i flip) {
  const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15, 0, 2, 4,
                                      6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  for (size_t h = 0; h < 2; ++h) {
    for (size_t half = 0; half < 2; ++half) {
      __m256i a[4], t[4];
      for (size_t m = 0; m < 4; ++m) {
        const uint8_t* g = src + (4 * m + 2 * h) * 32 + 16 * half;
        a[m] = LoadHalves(g, g + 32);
        if constexpr (kEvenOdd) a[m] = _mm256_shuffle_epi8(a[m], eo);
      }
      Transpose4x4(a, t);
      for (size_t d = 0; d < 4; ++d) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + h * kTSetBytes + (4 * half + d) * 32),
                            _mm256_xor_si256(t[d], flip));
      }
    }
  }
}

// Activation row r's block k in the chunk-major layout of `batch` rows.
inline size_t TActBlock(size_t batch, size_t r, size_t k) {
  return ((k / kTChunk * batch + r) * kTChunk + k % kTChunk) * kTBlockBytes;
}

struct TActs {
  const int8_t* xq;     // [chunks][batch][kTChunk * 512]: a chunk's rows in one stream (TActBlock)
  const int32_t* corr;  // [batch][blocks * 16]: -B·Σxq per group, block lane order
  const float* xf;      // [batch][blocks * 16]: ActBlockFactors
  size_t blocks;
};

// bias: B of the weight bytes the dots take (int8: 0, or 128 with AVX-VNNI).
template <WeightFormat F>
TActs PrepareTActs(const ActsQ8& x, int bias, Scratch& s) noexcept {
  const size_t n = x.cols;
  const size_t groups = n / kActGroup;
  const size_t blocks = (groups + 15) / 16;
  const size_t chunks = (blocks + kTChunk - 1) / kTChunk;
  int8_t* xq = Grow(s.xn, chunks * x.batch * kTChunk * kTBlockBytes);
  int32_t* corr = Grow(s.corr, x.batch * blocks * 16);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (size_t r = 0; r < x.batch; ++r) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(x.q.data() + r * n);
    for (size_t k = 0; k < blocks; ++k) {
      const uint8_t* src = row + k * kTBlockBytes;
      alignas(32) uint8_t tail[kTBlockBytes];
      if (k * 16 + 16 > groups) {
        std::memset(tail, 0, sizeof(tail));
        std::memcpy(tail, src, (groups - k * 16) * kActGroup);
        src = tail;
      }
      int8_t* blk = xq + TActBlock(x.batch, r, k);
      BlockSlots32<F != WeightFormat::kInt8>(src, blk, _mm256_setzero_si256());
      // -B·Σq of each group: a set's slots summed lane by lane are its groups'
      // sums in block lane order.
      for (size_t h = 0; h < 2; ++h) {
        __m256i sum = _mm256_setzero_si256();
        for (size_t d = 0; d < 8; ++d) {
          const __m256i v = LoadSlot(blk + h * kTSetBytes + d * 32);
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16));
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(corr + (r * blocks + k) * 16 + 8 * h),
                            _mm256_mullo_epi32(sum, _mm256_set1_epi32(-bias)));
      }
    }
  }
  return {xq, corr, ActBlockFactors(x, F == WeightFormat::kMxfp4 ? 0.5f : 1.0f, s.xsg), blocks};
}

// Row o's weight bytes in slots (the dots' form: nibbles biased, int8 biased
// with AVX-VNNI) and, for the nibbles, each block's factors A then B.
template <WeightFormat F>
void DecodeRowT(const WeightView& w, size_t o, size_t blocks, int8_t* out, float* wf) {
  const size_t groups = w.cols / kActGroup;
  constexpr size_t kGroupBytes = F == WeightFormat::kInt8 ? 32 : 16;
  const uint8_t* row = RowBytes<F>(w, o);
  for (size_t k = 0; k < blocks; ++k) {
    const uint8_t* src = row + k * 16 * kGroupBytes;
    alignas(32) uint8_t tail[16 * kGroupBytes];
    if (k * 16 + 16 > groups) {
      std::memset(tail, 0, sizeof(tail));
      std::memcpy(tail, src, (groups - k * 16) * kGroupBytes);
      src = tail;
    }
    int8_t* blk = out + k * kTBlockBytes;
    if constexpr (F == WeightFormat::kInt8) {
      BlockSlots32<false>(src, blk, _mm256_set1_epi8(kInt8Biased ? -128 : 0));
    } else {
      for (size_t h = 0; h < 2; ++h) {
        __m256i a[4], t[4];
        for (size_t m = 0; m < 4; ++m) {
          a[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (4 * m + 2 * h) * 16));
        }
        Transpose4x4(a, t);
        for (size_t c = 0; c < 4; ++c) {
          __m256i lo, hi;
          DecodeNibbles<F>(t[c], &lo, &hi);
          int8_t* slot = blk + h * kTSetBytes + 2 * c * 32;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(slot), lo);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(slot + 32), hi);
        }
      }
    }
    if constexpr (F != WeightFormat::kInt8) {
      __m256 fa, fb;
      NibRow<F>(w, o).BlockFactors(k, &fa, &fb);
      _mm256_storeu_ps(wf + k * 16, fa);
      _mm256_storeu_ps(wf + k * 16 + 8, fb);
    }
  }
}

// acc += the int32 lanes of one int8 slot / one nibble slot pair (exact).
// Without AVX-VNNI, kWide: the decode path's maddubs(|w|, sign(x, w)); else
// maddubs(|x|, sign(w, x)) with ax = |x| (w != -128, |x| <= 127).
template <bool kWide>
inline __m256i Int8SlotDot(__m256i acc, __m256i w, __m256i x, [[maybe_unused]] __m256i ax) {
#ifdef K3_AVXVNNI
  return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
  const __m256i p = kWide ? _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w))
                          : _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

inline __m256i NibSlotDot(__m256i acc, __m256i we, __m256i wo, __m256i xe, __m256i xo) {
#ifdef K3_AVXVNNI
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, we, xe), wo, xo);
#else
  return _mm256_add_epi32(acc, NibDot(we, wo, xe, xo));
#endif
}

// Blocks [k0, k1) of one activation row (x: its block k0) against R decoded
// rows: fa[r * 16 ..] holds the pair's A and B accumulators.
template <WeightFormat F, int R, bool kWide>
void TileT(const int8_t* const* w, const float* const* wf, const int8_t* x, const int32_t* corr,
           const float* xf, size_t k0, size_t k1, float* fa) noexcept {
  __m256 facc[2][R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    facc[0][r] = _mm256_loadu_ps(fa + r * 16);
    facc[1][r] = _mm256_loadu_ps(fa + r * 16 + 8);
  }
  for (size_t k = k0; k < k1; ++k) {
#pragma GCC unroll 2
    for (size_t h = 0; h < 2; ++h) {
      const size_t off = k * kTBlockBytes + h * kTSetBytes;
      const int8_t* xs = x + (k - k0) * kTBlockBytes + h * kTSetBytes;
      const size_t lane = k * 16 + 8 * h;
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + lane));
      __m256i acc[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = c;
      if constexpr (F == WeightFormat::kInt8) {
#pragma GCC unroll 1
        for (size_t d = 0; d < 8; ++d) {
          const __m256i xv = InReg(LoadSlot(xs + 32 * d));
          const __m256i ax = kWide || kInt8Biased ? xv : _mm256_abs_epi8(xv);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            acc[r] = Int8SlotDot<kWide>(acc[r], LoadSlot(w[r] + off + 32 * d), xv, ax);
          }
        }
      } else {
#pragma GCC unroll 1
        for (size_t d = 0; d < 8; d += 2) {
          const __m256i xe = InReg(LoadSlot(xs + 32 * d));
          const __m256i xo = InReg(LoadSlot(xs + 32 * d + 32));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            acc[r] = NibSlotDot(acc[r], LoadSlot(w[r] + off + 32 * d),
                                LoadSlot(w[r] + off + 32 * d + 32), xe, xo);
          }
        }
      }
      const __m256 xv = _mm256_loadu_ps(xf + lane);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 f =
            F == WeightFormat::kInt8 ? xv : _mm256_mul_ps(_mm256_loadu_ps(wf[r] + lane), xv);
        facc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), f, facc[h][r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(fa + r * 16, facc[0][r]);
    _mm256_storeu_ps(fa + r * 16 + 8, facc[1][r]);
  }
}

template <WeightFormat F, int R>
void RowBlockT(const WeightView& w, const TActs& x, size_t batch, size_t b0, size_t b1, size_t o,
               float* y, Scratch& s) noexcept {
  const size_t bytes = x.blocks * kTBlockBytes;
  int8_t* wbuf = Grow(s.wq, R * bytes);
  float* fbuf = Grow(s.wgs, R * x.blocks * 16);
  const int8_t* wr[R];
  const float* fr[R];
  for (int r = 0; r < R; ++r) {
    wr[r] = wbuf + r * bytes;
    fr[r] = fbuf + r * x.blocks * 16;
    DecodeRowT<F>(w, o + r, x.blocks, wbuf + r * bytes, fbuf + r * x.blocks * 16);
  }
  // int8 without AVX-VNNI: maddubs(|x|, sign(w, x)) -- |x| once per slot for
  // all R rows, one op less per pair than the decode path's maddubs(|w|,
  // sign(x, w)) -- unless a weight byte is -128 (sign would overflow; the
  // quantizer never writes one, a file may).
  bool wide = false;
  if constexpr (F == WeightFormat::kInt8 && !kInt8Biased) {
    __m256i m = _mm256_setzero_si256();
    for (size_t i = 0; i < R * bytes; i += 32) {
      m = _mm256_or_si256(m, _mm256_cmpeq_epi8(LoadSlot(wbuf + i), _mm256_set1_epi8(-128)));
    }
    wide = !_mm256_testz_si256(m, m);
  }
  float* fa = Grow(s.acc, (b1 - b0) * R * 16);
  std::memset(fa, 0, (b1 - b0) * R * 16 * sizeof(float));
  for (size_t k0 = 0; k0 < x.blocks; k0 += kTChunk) {
    const size_t k1 = std::min(k0 + kTChunk, x.blocks);
    for (size_t b = b0; b < b1; ++b) {
      const int8_t* xb = x.xq + TActBlock(batch, b, k0);
      const int32_t* cb = x.corr + b * x.blocks * 16;
      const float* fb = x.xf + b * x.blocks * 16;
      float* fp = fa + (b - b0) * R * 16;
      if (wide) {
        TileT<F, R, true>(wr, fr, xb, cb, fb, k0, k1, fp);
      } else {
        TileT<F, R, false>(wr, fr, xb, cb, fb, k0, k1, fp);
      }
    }
  }
  for (size_t b = b0; b < b1; ++b) {
    for (int r = 0; r < R; ++r) {
      const float* p = fa + ((b - b0) * R + r) * 16;
      const float d = Tree16(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
      y[b * w.rows + o + r] = F == WeightFormat::kInt8 ? d * w.scales[o + r] : d;
    }
  }
}

template <WeightFormat F>
void MatMulBatchedT(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1,
                    Scratch& s) noexcept {
  const int bias = F == WeightFormat::kInt8 ? (kInt8Biased ? 128 : 0) : kBias<F>;
  const TActs acts = PrepareTActs<F>(x, bias, s);
  // Activation rows in panels of about L2's size (512 KiB of slots; Zen 3
  // measured 256 KiB and 1 MiB slower): every block of rows reads its panel
  // whole, once per chunk, and decodes its rows once per panel. Without panels
  // a 2048-row window streamed its activations from L3 or memory for every
  // block of 4 rows (Zen 3, 1 thread, M = 2048: int4-g64 1536x12288 0.45 ->
  // 0.69 of the roof, int8 576x7168 0.35 -> 0.54). At least kTPanelMin rows,
  // though past L2 for long rows: at 15 rows a 33792-column row (the dense
  // MLP's down projection) decoded every block of weights for 15 activation
  // rows; at 64 (2 MiB, from L3) int4-g64 7168x33792 at M = 2048 went from
  // 0.66 to 0.71 of the roof per thread with two threads (Zen 3).
  const size_t panel = std::max<size_t>(kTPanelMin, kTPanelBytes / (acts.blocks * kTBlockBytes));
  for (size_t b0 = 0; b0 < x.batch; b0 += panel) {
    const size_t b1 = std::min(x.batch, b0 + panel);
    ForRowBlocks<kTRows>(
        r0, r1, [&]<int N>(size_t o) { RowBlockT<F, N>(w, acts, x.batch, b0, b1, o, y, s); });
  }
}

void MatMulQ8Int8(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1,
                  Scratch& s) noexcept {
  if (x.batch > 1) return MatMulBatchedT<WeightFormat::kInt8>(w, x, y, r0, r1, s);
  const size_t groups = w.cols / kActGroup;
  const int32_t* corr = Int8Corrections(x, s);
  const float* xf = ActBlockFactors(x, 1.0f, s.xsg);
  for (size_t o = r0; o < r1; ++o) {
    const Q8Direct src[1] = {{RowBytes<WeightFormat::kInt8>(w, o), PrefetchBytes()}};
    float d;
    DotQ8Rows<1>(src, x.q.data(), corr, xf, groups, &d);
    y[o] = d * w.scales[o];
  }
}

template <WeightFormat F>
void MatMulNibImpl(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1,
                   Scratch& s) noexcept {
  if (x.batch == 1) {
    const NibActs acts = PrepareNibActs<F>(x, s);
    for (size_t o = r0; o < r1; ++o) y[o] = DotNib1<F>(NibRow<F>(w, o), acts);
    return;
  }
  MatMulBatchedT<F>(w, x, y, r0, r1, s);
}

void MatMulQ8Avx2(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1) noexcept {
  Scratch& s = Tls();
  switch (w.format) {
    case WeightFormat::kInt8:
      return MatMulQ8Int8(w, x, y, r0, r1, s);
    case WeightFormat::kInt4G64:
      return MatMulNibImpl<WeightFormat::kInt4G64>(w, x, y, r0, r1, s);
    case WeightFormat::kMxfp4:
      return MatMulNibImpl<WeightFormat::kMxfp4>(w, x, y, r0, r1, s);
    case WeightFormat::kF32:
      return;
  }
}
// ---------------------------------------------------------------------------
// QuantizeActs: per 32-column group s = max(absmax/127, kMinScale), inv = 1/s,
// q = clamp(rint(x * inv), -127, 127), NaN -> -127: the scalar reference's IEEE
// operations lane by lane (max_ps returns its second operand for a NaN first,
// which both skips NaNs in the absmax and sends a NaN product to -127), so its
// bytes and scales. Scalar, it was ~1.7 % of a 2048-token prefill on Zen 3.

void QuantizeActsAvx2(const float* x, size_t rows, size_t cols, int8_t* q,
                      float* scales) noexcept {
  const size_t groups = cols / kActGroup;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (size_t b = 0; b < rows; ++b) {
    for (size_t g = 0; g < groups; ++g) {
      const size_t off = b * cols + g * kActGroup;
      __m256 v[4];
      __m256 am = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(x + off + 8 * i);
        am = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), am);
      }
      const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
      const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
      float s = amax / 127.0f;
      if (s < kMinScale) s = kMinScale;
      const __m256 inv = _mm256_set1_ps(1.0f / s);
      __m256i r[4];
      for (int i = 0; i < 4; ++i) {
        const __m256 t = _mm256_round_ps(_mm256_mul_ps(v[i], inv),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r[i] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi));
      }
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]),
                                           _mm256_packs_epi32(r[2], r[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + off),
                          _mm256_permutevar8x32_epi32(p, order));
      scales[b * groups + g] = s;
    }
  }
}

// ---------------------------------------------------------------------------
// AddRow: acc[i] += k_i * w_i, one FMA per element, natural column order.

void AddRowAvx2(const WeightView& w, size_t row, float c, float* acc) noexcept {
  const size_t n = w.cols;
  if (w.format == WeightFormat::kF32) {
    const float* r = static_cast<const float*>(w.data) + row * n;
    const __m256 cv = _mm256_set1_ps(c);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(acc + i,
                       _mm256_fmadd_ps(cv, _mm256_loadu_ps(r + i), _mm256_loadu_ps(acc + i)));
    }
    for (; i < n; ++i) acc[i] = std::fma(c, r[i], acc[i]);
    return;
  }
  if (w.format == WeightFormat::kInt8) {
    const int8_t* q = static_cast<const int8_t*>(w.data) + row * n;
    const float k = c * w.scales[row];
    const __m256 kv = _mm256_set1_ps(k);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 wv = I8Src::Cvt8(q + i);
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(kv, wv, _mm256_loadu_ps(acc + i)));
    }
    for (; i < n; ++i) acc[i] = std::fma(k, static_cast<float>(q[i]), acc[i]);
    return;
  }
  const bool mx = w.format == WeightFormat::kMxfp4;
  const float* s4 = mx ? nullptr : w.scales + row * (n / kInt4Group);
  const uint8_t* e = mx ? w.e8m0 + row * (n / kMxGroup) : nullptr;
  const uint8_t* packed = static_cast<const uint8_t*>(w.data) + row * (n / 2);
  for (size_t c0 = 0; c0 < n; c0 += 32) {
    alignas(32) int8_t bytes[32];
    const __m256i v = mx ? WeightBytes32<WeightFormat::kMxfp4>(packed, c0)
                         : WeightBytes32<WeightFormat::kInt4G64>(packed, c0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), v);
    // MXFP4 bytes are doubled codes: the 0.5 folds into the coefficient (exact).
    const float k = mx ? c * E8m0Half(e[c0 / kMxGroup]) : c * s4[c0 / kInt4Group];
    const __m256 kv = _mm256_set1_ps(k);
    for (size_t j = 0; j < 4; ++j) {
      const __m256 wv = I8Src::Cvt8(bytes + 8 * j);
      float* a = acc + c0 + 8 * j;
      _mm256_storeu_ps(a, _mm256_fmadd_ps(kv, wv, _mm256_loadu_ps(a)));
    }
  }
}

// Roof loops (roof.h): independent ymm chains, enough for the latency at two
// per cycle, all in registers. Without AVX-VNNI the IDOT dot is the kernels'
// maddubs + madd + add sequence with the chain's own accumulator as maddubs'
// unsigned operand: until 2026-12-07 both operands were loop invariant, GCC
// computed maddubs + madd once before the loop, and what was timed as the
// multiply roof was twelve adds (and spills) -- 1.46x the true rate on Zen 3.
// Ten chains there: with twelve GCC spilled accumulators inside the loop (2.2
// against 2.85 G sequences/s on Zen 3).
uint64_t RoofAvx2(RoofOp op, uint64_t iters) noexcept {
  constexpr int kChains = 12;
  if (op == RoofOp::kIdot) {
#ifdef K3_AVXVNNI
    constexpr int kIdotChains = 12;
    const __m256i u = InReg(_mm256_set1_epi8(3));
#else
    constexpr int kIdotChains = 10;
    const __m256i ones = InReg(_mm256_set1_epi16(1));
#endif
    const __m256i v = InReg(_mm256_set1_epi8(-5));
    __m256i a[kIdotChains];
#pragma GCC unroll 12
    for (int j = 0; j < kIdotChains; ++j) a[j] = _mm256_set1_epi32(j + 1);
    for (uint64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
      for (int j = 0; j < kIdotChains; ++j) {
#ifdef K3_AVXVNNI
        a[j] = _mm256_dpbusd_avx_epi32(a[j], u, v);
#else
        a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a[j], v), ones));
#endif
      }
    }
    __m256i t = a[0];
#pragma GCC unroll 12
    for (int j = 1; j < kIdotChains; ++j) t = _mm256_add_epi32(t, a[j]);
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), t);
    volatile int32_t sink = lanes[0] + lanes[7];
    (void)sink;
    return iters * kIdotChains * 32;
  }
  __m256 a[kChains];
#pragma GCC unroll 12
  for (int j = 0; j < kChains; ++j) a[j] = _mm256_set1_ps(float(j));
  const __m256 m = InReg(_mm256_set1_ps(0.999f));
  const __m256 c = InReg(_mm256_set1_ps(1e-3f));
  for (uint64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kChains; ++j) a[j] = _mm256_fmadd_ps(a[j], m, c);
  }
  __m256 t = a[0];
#pragma GCC unroll 12
  for (int j = 1; j < kChains; ++j) t = _mm256_add_ps(t, a[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, t);
  volatile float sink = lanes[0] + lanes[7];
  (void)sink;
  return iters * kChains * 8;
}

// DotSumSquaresScalar's lanes: element i in lane i % 16, four per register;
// the fold is the scalar tree.
void DotSumSquaresAvx2(const float* x, const float* w, size_t n, double* dot, double* ss) noexcept {
  __m256d d[4], q[4];
  for (int k = 0; k < 4; ++k) d[k] = q[k] = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 4; ++k) {
      const __m256d xv = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * k));
      d[k] = _mm256_add_pd(d[k], _mm256_mul_pd(xv, _mm256_cvtps_pd(_mm_loadu_ps(w + i + 4 * k))));
      q[k] = _mm256_add_pd(q[k], _mm256_mul_pd(xv, xv));
    }
  }
  auto fold = [](const __m256d* a) {
    const __m256d lo = _mm256_add_pd(a[0], a[2]), hi = _mm256_add_pd(a[1], a[3]);  // j + (j+8)
    const __m256d s4 = _mm256_add_pd(lo, hi);                                      // + (j+4)
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));  // + (j+2)
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));                           // + (j+1)
  };
  DotSumSquaresTail(x, w, i, n, fold(d), fold(q), dot, ss);
}

// ---------------------------------------------------------------------------
// AddRows for f32 rows (MLA's latent sum): tiles of T tokens x 16 columns keep
// their accumulators in registers across the chunk's rows. Each element still
// takes one FMA per row in row order, k = c: AddRowAvx2's bits (the compiled
// loop of AddRow calls reloaded and stored every accumulator once per row and
// ran MLA's latent sum at about 0.2 of the FMA roof). Other formats: the loop.

// T tokens x 16 columns: acc[t][0..15] += coef[t][j] * row j's 16 columns,
// rows `stride` floats apart (a matrix's rows, or a packed panel's: 16), the
// accumulators in registers across the rows, one FMA per element per row in
// row order (AddRowAvx2's bits).
template <int T>
void AddRowsTile16(const float* rows, size_t stride, size_t nrows, const float* coef,
                   size_t coef_ld, float* acc, size_t acc_ld) noexcept {
  __m256 a[T][2];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    a[t][0] = _mm256_loadu_ps(acc + size_t(t) * acc_ld);
    a[t][1] = _mm256_loadu_ps(acc + size_t(t) * acc_ld + 8);
  }
  for (size_t j = 0; j < nrows; ++j) {
    const float* r = rows + j * stride;
    const __m256 w0 = _mm256_loadu_ps(r), w1 = _mm256_loadu_ps(r + 8);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256 k = _mm256_broadcast_ss(coef + size_t(t) * coef_ld + j);
      a[t][0] = _mm256_fmadd_ps(k, w0, a[t][0]);
      a[t][1] = _mm256_fmadd_ps(k, w1, a[t][1]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    _mm256_storeu_ps(acc + size_t(t) * acc_ld, a[t][0]);
    _mm256_storeu_ps(acc + size_t(t) * acc_ld + 8, a[t][1]);
  }
}

template <int T>
void AddRowsF32Tokens(const WeightView& w, size_t row0, size_t nrows, const float* coef,
                      size_t coef_ld, float* acc, size_t acc_ld) noexcept {
  const size_t n = w.cols;
  const float* base = static_cast<const float*>(w.data) + row0 * n;
  size_t c0 = 0;
  for (; c0 + 16 <= n; c0 += 16) {
    AddRowsTile16<T>(base + c0, n, nrows, coef, coef_ld, acc + c0, acc_ld);
  }
  if (c0 == n) return;
  for (int t = 0; t < T; ++t) {
    float* at = acc + size_t(t) * acc_ld;
    for (size_t j = 0; j < nrows; ++j) {
      const float k = coef[size_t(t) * coef_ld + j];
      const float* r = base + j * n;
      for (size_t i = c0; i < n; ++i) at[i] = std::fma(k, r[i], at[i]);
    }
  }
}

// From kAddRowsPanelTokens tokens the chunk's rows are first packed in
// 16-column panels: panel p holds columns 16p..16p+15 of every row, row after
// row, so a tile's loads run along contiguous memory. Straight from the rows
// each step loaded one line 2 KiB past the last (MLA's 512-wide latent rows)
// and the sum ran at about 0.55 of the FMA roof with the chunk in L2; packed,
// about 0.8. The tiles are the same: the same bits. Below this many tokens the
// panels' copy costs more than the strided loads.
constexpr size_t kAddRowsPanelTokens = 24;

void AddRowsAvx2(const WeightView& w, size_t row0, size_t nrows, const float* coef, size_t coef_ld,
                 size_t tokens, float* acc, size_t acc_ld) noexcept {
  const bool f32 = w.format == WeightFormat::kF32;
  if (!f32 && w.format != WeightFormat::kInt8) {
    return AddRowsLoop(AddRowAvx2, w, row0, nrows, coef, coef_ld, tokens, acc, acc_ld);
  }
  const size_t n = w.cols;
  const size_t n16 = n / 16 * 16;
  if (tokens < kAddRowsPanelTokens || n16 == 0) {
    if (!f32) return AddRowsLoop(AddRowAvx2, w, row0, nrows, coef, coef_ld, tokens, acc, acc_ld);
    size_t t = 0;
    for (; t + 6 <= tokens; t += 6) {
      AddRowsF32Tokens<6>(w, row0, nrows, coef + t * coef_ld, coef_ld, acc + t * acc_ld, acc_ld);
    }
    for (; t < tokens; ++t) {
      AddRowsF32Tokens<1>(w, row0, nrows, coef + t * coef_ld, coef_ld, acc + t * acc_ld, acc_ld);
    }
    return;
  }
  // int8 rows (MLA's absorbed queries over kv_b) go into the panels as the
  // floats AddRowAvx2 converts them to, and each (token, row) coefficient
  // becomes AddRow's k = c * scale once: the same FMA per element.
  Scratch& sc = Tls();
  const float* base = f32 ? static_cast<const float*>(w.data) + row0 * n : nullptr;
  const int8_t* qbase = f32 ? nullptr : static_cast<const int8_t*>(w.data) + row0 * n;
  float* panels = Grow(sc.panels, nrows * n16);
  for (size_t j = 0; j < nrows; ++j) {
    for (size_t c0 = 0; c0 < n16; c0 += 16) {
      float* dst = panels + c0 * nrows + j * 16;
      if (f32) {
        _mm256_store_ps(dst, _mm256_loadu_ps(base + j * n + c0));
        _mm256_store_ps(dst + 8, _mm256_loadu_ps(base + j * n + c0 + 8));
      } else {
        _mm256_store_ps(dst, I8Src::Cvt8(qbase + j * n + c0));
        _mm256_store_ps(dst + 8, I8Src::Cvt8(qbase + j * n + c0 + 8));
      }
    }
  }
  const float* k = coef;
  size_t k_ld = coef_ld;
  if (!f32) {
    float* kb = Grow(sc.coefs, tokens * nrows);
    for (size_t u = 0; u < tokens; ++u) {
      for (size_t j = 0; j < nrows; ++j) kb[u * nrows + j] = coef[u * coef_ld + j] * w.scales[row0 + j];
    }
    k = kb;
    k_ld = nrows;
  }
  size_t t = 0;
  for (; t + 6 <= tokens; t += 6) {
    for (size_t c0 = 0; c0 < n16; c0 += 16) {
      AddRowsTile16<6>(panels + c0 * nrows, 16, nrows, k + t * k_ld, k_ld, acc + t * acc_ld + c0,
                       acc_ld);
    }
  }
  for (; t < tokens; ++t) {
    for (size_t c0 = 0; c0 < n16; c0 += 16) {
      AddRowsTile16<1>(panels + c0 * nrows, 16, nrows, k + t * k_ld, k_ld, acc + t * acc_ld + c0,
                       acc_ld);
    }
  }
  // Columns past the last whole panel: AddRow's tail, element by element.
  for (size_t u = 0; u < tokens && n16 < n; ++u) {
    float* at = acc + u * acc_ld;
    for (size_t j = 0; j < nrows; ++j) {
      const float kk = k[u * k_ld + j];
      for (size_t i = n16; i < n; ++i) {
        const float v = f32 ? base[j * n + i] : static_cast<float>(qbase[j * n + i]);
        at[i] = std::fma(kk, v, at[i]);
      }
    }
  }
}

// MLA's attention scores in attn.h's order (one FMA chain per (query, key)
// pair over the first part's columns then the second's, then the scale; the
// same bits as every ISA): attn.h's 16-key panels, a panel column as two ymm,
// tiles of R queries x 16 keys in registers, each query's column value one
// broadcast. attn.h's plain loops, which GCC left scalar here, ran MLA's scores
// at about 0.04 of the FMA roof.
constexpr size_t kScoreTileQ = 6;

template <size_t R>
void ScoreTileAvx2(const float* qa, size_t da, const float* qb, size_t db, const float* kt,
                   size_t n, float scale, float* s, size_t s_ld) noexcept {
  __m256 a[R][2];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
  auto part = [&](const float* q, size_t d, const float* k) {
    for (size_t c = 0; c < d; ++c) {
      const __m256 k0 = _mm256_loadu_ps(k + c * kScoreLanes);
      const __m256 k1 = _mm256_loadu_ps(k + c * kScoreLanes + 8);
#pragma GCC unroll 8
      for (size_t r = 0; r < R; ++r) {
        const __m256 x = _mm256_broadcast_ss(q + size_t(r) * d + c);
        a[r][0] = _mm256_fmadd_ps(x, k0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(x, k1, a[r][1]);
      }
    }
  };
  part(qa, da, kt);
  if (db > 0) part(qb, db, kt + da * kScoreLanes);
  const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) {
    float* out = s + size_t(r) * s_ld;
    const __m256 v0 = _mm256_mul_ps(a[r][0], sc), v1 = _mm256_mul_ps(a[r][1], sc);
    if (n == kScoreLanes) {
      _mm256_storeu_ps(out, v0);
      _mm256_storeu_ps(out + 8, v1);
    } else {
      alignas(32) float tmp[kScoreLanes];
      _mm256_store_ps(tmp, v0);
      _mm256_store_ps(tmp + 8, v1);
      std::memcpy(out, tmp, n * sizeof(float));
    }
  }
}

void AttnScoresAvx2(const float* qa, const float* ka, size_t da, const float* qb, const float* kb,
                    size_t db, size_t nq, size_t j0, size_t j1, float scale, float* s, size_t s_ld,
                    float* kt) noexcept {
  ScorePanels<kScoreTileQ>(qa, ka, da, qb, kb, db, nq, j0, j1, s, s_ld, kt,
                           [&]<size_t R>(const float* qa1, const float* qb1, size_t n, float* s1) {
                             ScoreTileAvx2<R>(qa1, da, qb1, db, kt, n, scale, s1, s_ld);
                           });
}

// Quantizers stay scalar on AVX2 (load-time only; AVX-512 machines get SIMD ones).
constexpr KernelTable kAvx2Table = {
#ifdef K3_AVXVNNI
    Isa::kAvx2Vnni,
#else
    Isa::kAvx2,
#endif
    MatMulAvx2,     MatMulQ8Avx2,           RowDotAvx2,
    AddRowAvx2,     QuantizeInt8RowsScalar, QuantizeInt4RowsScalar,
    DowncastScalar, QuantizeActsAvx2,       RoofAvx2,
    AddRowsAvx2,    DotSumSquaresAvx2,      SituGluLoop,
    KdaDecayLoop,   KdaUpdateLoop,          SoftmaxLoop,
    AttnScoresAvx2};

}  // namespace

#ifdef K3_AVXVNNI
const KernelTable& Avx2VnniKernels() noexcept { return kAvx2Table; }
#else
const KernelTable& Avx2Kernels() noexcept { return kAvx2Table; }
#endif

}  // namespace k3::quant::internal
