// AVX2 + FMA kernels for x86-64 CPUs without AVX-512 (Haswell .. Zen 3, client
// cores); built twice, the second time with AVX-VNNI (kernels_avx2_vnni.cc,
// K3_AVXVNNI: vpdpbusd in place of maddubs + madd, the same exact int32 lanes).
// Same structure as kernels_avx512.cc with 8 lanes: a row is decoded on the fly
// (batch 1) or once per chunk into 64-byte aligned scratch, several rows sharing
// each activation load (batched), and every (row, activation) pair runs the same
// floating-point operations either way (the dot routines are templates over the
// tile shape; decode is the 1 x 1 case). Weight lines are prefetched
// K3_PREFETCH bytes ahead.
//
// f32-activation path: units of 8 columns (slot k mod 4) or one int4/MXFP4 group
// (slot k mod 2), see F32Tile. int4/MXFP4 nibbles are widened with vpmovzxbd (8
// bytes -> 8 lanes: low nibbles = even columns, high = odd), and the activations
// are re-laid out once per call to match.
//
// IDOT path: one ymm = one 32-column activation group; maddubs (u8 x s8 pairs to
// saturating int16) then madd with ones gives 8 int32 lanes. int4/MXFP4 weights
// are biased to unsigned bytes (nibble = v+8; a table gives 2v+12), so the pair
// sums stay below 2^15 (24*127*2), and the activation-only term -B*Σxq is added
// per lane from a table built once per call. int8 weights would overflow int16
// with a +128 bias, so they use the sign trick maddubs(|w|, sign(xq, w))
// (|w|·|xq| <= 127*127). Every lane is exact either way.
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
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
  AlignedVec<int8_t> wq;     // IDOT: weight bytes of one row (as Q8Direct gives them)
  AlignedVec<int32_t> corr;  // IDOT: -B*Σxq per 4-column lane [batch][groups][8]
  AlignedVec<int8_t> xn;     // nibble IDOT: activations in step layout [batch][steps*64]
  AlignedVec<float> xse;     // nibble IDOT: activation factors, 4 lanes per group
  AlignedVec<float> wgs;     // nibble IDOT: decoded weight factors of one row
  AlignedVec<float> xsg;     // nibble IDOT: activation factors, once per group
  AlignedVec<float> acc;     // batched f32 path: tile accumulators between column blocks
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

inline float Reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  return Hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// ---------------------------------------------------------------------------
// f32-activation path

struct F32Src {  // f32 values (small or in cache: no prefetch)
  const float* w;
  __m256 Load(size_t i) const { return _mm256_loadu_ps(w + i); }
  __m256 LoadTail(size_t i, size_t m) const {
    alignas(32) float t[8] = {};
    std::memcpy(t, w + i, m * sizeof(float));
    return _mm256_load_ps(t);
  }
  void Block16(size_t c, __m256& even, __m256& odd) const {
    even = _mm256_loadu_ps(w + c);
    odd = _mm256_loadu_ps(w + c + 8);
  }
  void Prefetch(size_t) const {}
};

struct I8Src {
  const int8_t* q;
  size_t pf = 0;  // PrefetchBytes()
  __m256 Load(size_t i) const {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i))));
  }
  __m256 LoadTail(size_t i, size_t m) const {
    alignas(16) int8_t t[16] = {};
    std::memcpy(t, q + i, m);
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(t))));
  }
  void Prefetch(size_t i) const {
    if (pf != 0) PrefetchLine(q + i, pf);
  }
};

// 8 packed bytes (16 columns): lane j holds byte j; low nibble = column 2j.
template <bool kMx>
struct NibbleSrc {
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

// f32-activation dot products as R x B tiles (the AVX-512 scheme with 8 lanes):
// a row is a sequence of units -- 8-column chunks (f32, int8), 32-column MXFP4
// groups, 64-column int4 groups -- and unit k of a (row, activation) pair goes to
// that pair's accumulator slot k mod S (S = 4 for the one-FMA chunks, whose
// latency would otherwise bound decode, 2 for groups), the result being
// Hsum((slot0 + slot1) + (slot2 + slot3)) or Hsum(slot0 + slot1). The operations
// per pair do not depend on R, B or the column blocking, so batch 1 (1 x 1,
// decoded in registers) and batched (tiles over decoded rows, accumulators in
// scratch between 1024-column blocks) agree bit for bit.
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

  // p = x_even*w_even + x_odd*w_odd of the 16-column block at column c.
  static __m256 Block(const float* xb, __m256 we, __m256 wo) {
    return _mm256_fmadd_ps(_mm256_loadu_ps(xb + 8), wo, _mm256_mul_ps(_mm256_loadu_ps(xb), we));
  }

  void Step(size_t k, __m256 (&a)[R][B]) const {
    if constexpr (U == F32Unit::kPlain) {
      const size_t i = k * 8;
      if (i + 8 <= n) {
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          if ((k & 7) == 0) w[r].Prefetch(i);
          const __m256 wv = InReg(w[r].Load(i));
#pragma GCC unroll 4
          for (int b = 0; b < B; ++b)
            a[r][b] = _mm256_fmadd_ps(_mm256_loadu_ps(x[b] + i), wv, a[r][b]);
        }
      } else {
        __m256 xv[B];
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) {
          alignas(32) float t[8] = {};
          std::memcpy(t, x[b] + i, (n - i) * sizeof(float));
          xv[b] = _mm256_load_ps(t);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256 wv = w[r].LoadTail(i, n - i);
#pragma GCC unroll 4
          for (int b = 0; b < B; ++b) a[r][b] = _mm256_fmadd_ps(xv[b], wv, a[r][b]);
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
          const __m256 p = _mm256_add_ps(Block(xg, w0, w1), Block(xg + 16, w2, w3));
          a[r][b] = _mm256_fmadd_ps(p, g, a[r][b]);
        }
      }
    } else {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        if ((k & 1) == 0) w[r].Prefetch(k * 64);
        __m256 s01[B];
        {
          __m256 w0, w1, w2, w3;
          w[r].Block16(k * 64, w0, w1);
          w[r].Block16(k * 64 + 16, w2, w3);
#pragma GCC unroll 4
          for (int b = 0; b < B; ++b) {
            const float* xg = x[b] + k * 64;
            s01[b] = _mm256_add_ps(Block(xg, w0, w1), Block(xg + 16, w2, w3));
          }
        }
        __m256 w4, w5, w6, w7;
        w[r].Block16(k * 64 + 32, w4, w5);
        w[r].Block16(k * 64 + 48, w6, w7);
        const __m256 g = _mm256_set1_ps(gs[r][k]);
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) {
          const float* xg = x[b] + k * 64;
          const __m256 s23 = _mm256_add_ps(Block(xg + 32, w4, w5), Block(xg + 48, w6, w7));
          a[r][b] = _mm256_fmadd_ps(_mm256_add_ps(s01[b], s23), g, a[r][b]);
        }
      }
    }
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
// in place.
const float* DecodeRowF32(const WeightView& w, size_t o, float* out) noexcept {
  const size_t n = w.cols;
  if (w.format == WeightFormat::kF32) return static_cast<const float*>(w.data) + o * n;
  if (w.format == WeightFormat::kInt8) {
    const int8_t* q = static_cast<const int8_t*>(w.data) + o * n;
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]);
    return out;
  }
  const uint8_t* packed = static_cast<const uint8_t*>(w.data) + o * (n / 2);
  for (size_t c = 0; c < n; c += 16) {
    __m256 even, odd;
    if (w.format == WeightFormat::kMxfp4) {
      NibbleSrc<true>{packed}.Block16(c, even, odd);
    } else {
      NibbleSrc<false>{packed}.Block16(c, even, odd);
    }
    _mm256_storeu_ps(out + c, even);
    _mm256_storeu_ps(out + c + 8, odd);
  }
  return out;
}

// The f32 tiles' ISA kit (f32_tiles.h). Sixteen ymm registers: 2 x 2 pairs x 2
// slots for groups; the one-FMA 8-column chunks keep four slots (so that one FMA
// chain per chunk does not bound decode) in 2 x 1 tiles.
struct Avx2Kit {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  template <F32Unit U>
  static constexpr int kSlots = U == F32Unit::kPlain ? 4 : 2;
  template <F32Unit U>
  static constexpr int kTileActs = U == F32Unit::kPlain ? 1 : 2;
  static constexpr int kRows = 2;
  template <F32Unit U, int R, int B, typename Src>
  using Tile = F32Tile<U, R, B, Src>;
  using RowSrc = F32Src;
  template <int S>
  static float Reduce(const V* v) {
    if constexpr (S == 4) {
      return Reduce4(v[0], v[1], v[2], v[3]);
    } else {
      return Hsum(_mm256_add_ps(v[0], v[1]));
    }
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

// Activations in the kernel's layout, in the 64-byte aligned scratch (batch 1
// with no layout change reads the input itself).
const float* LayoutActs(const WeightView& w, const float* x, size_t batch, Scratch& s) noexcept {
  if (w.format != WeightFormat::kInt4G64 && w.format != WeightFormat::kMxfp4) {
    if (batch == 1) return x;
    float* xa = Grow(s.xp, batch * w.cols);
    std::memcpy(xa, x, batch * w.cols * sizeof(float));
    return xa;
  }
  float* xp = Grow(s.xp, batch * w.cols);
  for (size_t b = 0; b < batch; ++b) PermuteEvenOdd16(x + b * w.cols, w.cols, xp + b * w.cols);
  return xp;
}

void MatMulAvx2(const WeightView& w, const float* x, size_t batch, float* y, size_t r0,
                size_t r1) noexcept {
  Scratch& s = Tls();
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
// IDOT path

// 16 packed bytes -> 32 nibbles in column order.
inline __m256i NibblesToBytes(__m128i p) {
  const __m128i m = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(p, m);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(p, 4), m);
  return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
}

// Signed weight bytes of the 32-column group starting at column c.
template <WeightFormat F>
inline __m256i WeightBytes32(const uint8_t* row, size_t c) {
  if constexpr (F == WeightFormat::kInt8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c));
  } else {
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
}

// int4/MXFP4 weights as unsigned bytes w + B (B = 8 / 12) for maddubs.
template <WeightFormat F>
inline __m256i WeightBytesU32(const uint8_t* row, size_t c) {
  const __m256i nib =
      NibblesToBytes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2)));
  if constexpr (F == WeightFormat::kInt4G64) {
    return nib;
  } else {
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    return _mm256_shuffle_epi8(lut, nib);
  }
}

template <WeightFormat F>
constexpr int kBias = F == WeightFormat::kInt4G64 ? 8 : F == WeightFormat::kMxfp4 ? 12 : 128;

// int8 rows in the IDOT path: with AVX-VNNI the weights are biased like the
// nibbles (w ^ 0x80 = w + 128, unsigned) and vpdpbusd starts from -128*Σxq (no
// int16 step to overflow); plain AVX2 keeps signed bytes for the sign trick.
#ifdef K3_AVXVNNI
constexpr bool kInt8Biased = true;
#else
constexpr bool kInt8Biased = false;
#endif

template <WeightFormat F>
const uint8_t* RowBytes(const WeightView& w, size_t o) {
  const size_t stride = F == WeightFormat::kInt8 ? w.cols : w.cols / 2;
  return static_cast<const uint8_t*>(w.data) + o * stride;
}

// Signed bytes for int8, biased unsigned bytes for int4/MXFP4.
template <WeightFormat F>
struct Q8Direct {
  const uint8_t* row;
  size_t pf = 0;  // PrefetchBytes() (int8: one line per two groups)
  __m256i Group(size_t g) const {
    if constexpr (F == WeightFormat::kInt8) {
      if (pf != 0 && (g & 1) == 0) PrefetchLine(row + g * 32, pf);
      const __m256i w = WeightBytes32<F>(row, g * 32);
      return kInt8Biased ? _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))) : w;
    } else {
      return WeightBytesU32<F>(row, g * 32);
    }
  }
};

struct Q8Buffered {
  const int8_t* wq;
  __m256i Group(size_t g) const {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + g * 32));
  }
};

// Group factor gs_g (E8M0*0.5 for MXFP4, the g64 scale for int4).
const float* GroupScalesQ8(const WeightView& w, size_t o, Scratch& s) noexcept {
  const size_t n = w.cols;
  const size_t groups = n / kActGroup;
  if (w.format == WeightFormat::kInt8) return nullptr;
  float* gs = Grow(s.gscale, groups);
  if (w.format == WeightFormat::kMxfp4) {
    MxGroupScales(w.e8m0 + o * (n / kMxGroup), groups, gs);
  } else {
    const float* s4 = w.scales + o * (n / kInt4Group);
    for (size_t g = 0; g < groups; ++g) gs[g] = s4[g / 2];
  }
  return gs;
}

// -B*(sum of each lane's 4 activations) for every 32-column group of every row.
const int32_t* ActCorrections(const ActsQ8& x, int bias, Scratch& s) noexcept {
  const size_t groups = x.cols / kActGroup;
  int32_t* out = Grow(s.corr, x.batch * groups * 8);
  const __m256i b = _mm256_set1_epi8(static_cast<char>(bias));
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t i = 0; i < x.batch * groups; ++i) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + i * 32));
    const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(b, v), ones);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * 8),
                        _mm256_sub_epi32(_mm256_setzero_si256(), sum));
  }
  return out;
}

// One activation row against R weight rows (R = 1 for decode, kQ8Rows for
// batched int8), group g into slot g & 1 of each row, Hsum(slot0 + slot1): the
// same operations per row whatever R is.
template <WeightFormat F, int R, typename Src>
void DotQ8Rows(const Src* w, const float* const* gs, const int8_t* xq, const int32_t* corr,
               const float* xs, size_t groups, float* out) noexcept {
  constexpr bool kInt8 = F == WeightFormat::kInt8;
  __m256 a[2][R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) a[0][r] = a[1][r] = _mm256_setzero_ps();
  auto step = [&](size_t g, __m256 (&acc)[R]) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + g * 32));
    [[maybe_unused]] __m256i c;
    if constexpr (!kInt8 || kInt8Biased) {
      c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + g * 8));
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i wv = w[r].Group(g);
      __m256i d;
#ifdef K3_AVXVNNI
      d = _mm256_dpbusd_avx_epi32(c, wv, x);  // every format biased: exact int32 lanes
#else
      const __m256i ones = _mm256_set1_epi16(1);
      if constexpr (kInt8) {
        d = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(x, wv)),
                              ones);
      } else {
        d = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wv, x), ones), c);
      }
#endif
      const float f = kInt8 ? xs[g] : gs[r][g] * xs[g];
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(f), acc[r]);
    }
  };
  ForSlots(0, groups, a, step);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r] = Hsum(_mm256_add_ps(a[0][r], a[1][r]));
}

// Batched int8: rows decoded kQ8Rows at a time share each activation load.
constexpr int kQ8Rows = 4;

template <WeightFormat F, int R>
void Q8RowBlock(const WeightView& w, const ActsQ8& x, const int32_t* corr, size_t o, float* y,
                Scratch& s) noexcept {
  constexpr bool kI8 = F == WeightFormat::kInt8;
  const size_t n = w.cols;
  const size_t groups = n / kActGroup;
  int8_t* wq = Grow(s.wq, R * n);
  float* gsb = Grow(s.wgs, R * groups + 1);
  Q8Buffered src[R];
  const float* gs[R];
  for (int r = 0; r < R; ++r) {
    const Q8Direct<F> d{RowBytes<F>(w, o + r), PrefetchBytes()};
    int8_t* wr = wq + r * n;
    for (size_t g = 0; g < groups; ++g) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wr + g * 32), d.Group(g));
    }
    src[r] = Q8Buffered{wr};
    gs[r] = nullptr;
    if constexpr (!kI8) {
      const float* g1 = GroupScalesQ8(w, o + r, s);
      std::memcpy(gsb + r * groups, g1, groups * sizeof(float));
      gs[r] = gsb + r * groups;
    }
  }
  for (size_t b = 0; b < x.batch; ++b) {
    float d[R];
    DotQ8Rows<F, R>(src, gs, x.q.data() + b * n, corr ? corr + b * groups * 8 : nullptr,
                    x.scales.data() + b * groups, groups, d);
    for (int r = 0; r < R; ++r) y[b * w.rows + o + r] = kI8 ? d[r] * w.scales[o + r] : d[r];
  }
}

template <WeightFormat F>
void MatMulQ8Impl(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1,
                  Scratch& s) noexcept {
  constexpr bool kI8 = F == WeightFormat::kInt8;
  const size_t n = w.cols;
  const size_t groups = n / kActGroup;
  const int32_t* corr = kI8 && !kInt8Biased ? nullptr : ActCorrections(x, kBias<F>, s);
  if (x.batch == 1) {
    for (size_t o = r0; o < r1; ++o) {
      const float* gs[1] = {GroupScalesQ8(w, o, s)};
      const Q8Direct<F> src[1] = {{RowBytes<F>(w, o), PrefetchBytes()}};
      float d;
      DotQ8Rows<F, 1>(src, gs, x.q.data(), corr, x.scales.data(), groups, &d);
      y[o] = kI8 ? d * w.scales[o] : d;
    }
    return;
  }
  ForRowBlocks<kQ8Rows>(r0, r1, [&]<int N>(size_t o) { Q8RowBlock<F, N>(w, x, corr, o, y, s); });
}

// ---------------------------------------------------------------------------
// Nibble IDOT (int4-g64, MXFP4): 64 columns (two groups) per step from one
// 32-byte load, with no shuffle across or within lanes on the weights. The low
// nibbles of the step's 32 bytes are its even columns and the high nibbles its
// odd ones; 128-bit lane L holds group L of the step. The activations are stored
// once per call in that layout ("xe": the even columns of each group, "xo": the
// odd ones), so `and`/shift (MXFP4 then a byte LUT) gives bytes that maddubs
// pairs directly with xe and xo. The two maddubs results are added as int16
// (|sum| <= 4*24*127 < 2^15, exact) and one madd gives int32 lanes 0-3 = group 0
// (8 columns each), 4-7 = group 1, scaled by one factor vector f = gs*xs.
// Per element: even steps accumulate into a0, odd ones into a1,
// a = fma(cvt(d_t), f_t, a) in step order, then a0+a1 and a fixed reduction,
// whether the row is decoded on the fly (batch 1) or from a buffer (batched).

constexpr size_t kStep = 64;

struct NibActs {
  const int8_t* xq;     // [batch][steps*64]: per step xe (32 bytes) then xo, zero padded
  const int32_t* corr;  // [batch][steps*8]
  const float* xse;     // [batch][steps*8]: xs_g (x0.5 for MXFP4's doubled codes) x4
  const float* xsg;     // [batch][xsg_stride]: the same factors once per group
  size_t steps;
  size_t xsg_stride;    // steps*2 rounded up to 8
};

template <WeightFormat F>
NibActs PrepareNibActs(const ActsQ8& x, Scratch& s) noexcept {
  const float mult = F == WeightFormat::kMxfp4 ? 0.5f : 1.0f;
  const size_t n = x.cols;
  const size_t groups = n / kActGroup;
  const size_t steps = (n + kStep - 1) / kStep;
  const size_t xsg_stride = (steps * 2 + 7) / 8 * 8;
  int8_t* xq = Grow(s.xn, x.batch * steps * kStep);
  int32_t* corr = Grow(s.corr, x.batch * steps * 8);
  float* xse = Grow(s.xse, x.batch * steps * 8);
  float* xsg = Grow(s.xsg, x.batch * xsg_stride);
  const __m256i b = _mm256_set1_epi8(static_cast<char>(kBias<F>));
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t r = 0; r < x.batch; ++r) {
    const int8_t* q = x.q.data() + r * n;
    const float* xs = x.scales.data() + r * groups;
    for (size_t t = 0; t < steps; ++t) {
      int8_t* d = xq + (r * steps + t) * kStep;
      for (size_t l = 0; l < 2; ++l) {
        const size_t g = t * 2 + l;
        if (g < groups) {
          SplitEvenOdd32(q + g * kActGroup, d + 16 * l, d + 32 + 16 * l);
        } else {
          std::memset(d + 16 * l, 0, 16);
          std::memset(d + 32 + 16 * l, 0, 16);
        }
        const float f = g < groups ? xs[g] * mult : 0.0f;
        for (size_t m = 0; m < 4; ++m) xse[(r * steps + t) * 8 + 4 * l + m] = f;
        xsg[r * xsg_stride + g] = f;
      }
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + 32));
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(b, xa), _mm256_maddubs_epi16(b, xb));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(corr + (r * steps + t) * 8),
                          _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(p, ones)));
    }
    for (size_t g = steps * 2; g < xsg_stride; ++g) xsg[r * xsg_stride + g] = 0.0f;
  }
  return {xq, corr, xse, xsg, steps, xsg_stride};
}

// Row o decoded step by step straight from the stored bytes and factors.
template <WeightFormat F>
struct NibDirect {
  const uint8_t* row;   // cols/2 bytes
  const void* factors;  // MXFP4: E8M0 [cols/32]; int4: f32 [cols/64]
  size_t bytes;         // cols/2
  size_t groups;        // factor count
  size_t pf;            // PrefetchBytes()

  // Biased weight bytes: even columns (low nibbles) and odd columns (high).
  void Weights(size_t t, __m256i* we, __m256i* wo) const {
    const size_t off = t * 32;
    if (pf != 0) PrefetchLine(row + off, pf);
    __m256i raw;
    if (off + 32 <= bytes) {
      raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + off));
    } else {
      alignas(32) uint8_t tmp[32] = {};
      std::memcpy(tmp, row + off, bytes - off);
      raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
    }
    const __m256i nib = _mm256_set1_epi8(15);
    __m256i lo = _mm256_and_si256(raw, nib);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
    if constexpr (F == WeightFormat::kMxfp4) {
      const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4,
                                           0, 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6,
                                           4, 0);
      lo = _mm256_shuffle_epi8(lut, lo);
      hi = _mm256_shuffle_epi8(lut, hi);
    }
    *we = lo;
    *wo = hi;
  }

  // gs per lane: lanes 0-3 group 2t, lanes 4-7 group 2t+1 (0 past the end).
  __m256 Factors(size_t t) const {
    if constexpr (F == WeightFormat::kMxfp4) {
      const uint8_t* e = static_cast<const uint8_t*>(factors) + t * 2;
      const int e0 = e[0], e1 = t * 2 + 1 < groups ? e[1] : 0;
      const __m256i v = _mm256_setr_epi32(e0, e0, e0, e0, e1, e1, e1, e1);
      return _mm256_castsi256_ps(_mm256_slli_epi32(v, 23));
    } else {
      return _mm256_set1_ps(static_cast<const float*>(factors)[t]);
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

// One step: int32 lanes of the exact group dots, scaled and accumulated.
inline __m256 NibStep(__m256i we, __m256i wo, __m256i xe, __m256i xo, __m256i c, __m256 f,
                      __m256 acc) {
#ifdef K3_AVXVNNI
  // vpdpbusd: the same exact int32 lanes in two instructions instead of five.
  const __m256i d = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(c, we, xe), wo, xo);
#else
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(we, xe), _mm256_maddubs_epi16(wo, xo));
  const __m256i d = _mm256_add_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), c);
#endif
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), f, acc);
}

inline __m256 NibStep(__m256i we, __m256i wo, const int8_t* xq, const int32_t* corr, __m256 f,
                      __m256 acc) {
  return NibStep(we, wo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)),
                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32)),
                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr)), f, acc);
}

// A row decoded once: xe|xo-layout bytes and the factor vector of every step.
struct NibBuffered {
  const int8_t* wb;
  const float* gs;
};

// Batched: one activation row against R decoded rows, sharing each step's
// activation loads; per row the operations are those of the decode path (even
// steps into slot 0, odd into slot 1, Hsum(slot0 + slot1)).
template <int R>
void DotNibBuffered(const NibBuffered* w, const NibActs& x, size_t b, float* out) noexcept {
  const int8_t* xq = x.xq + b * x.steps * kStep;
  const int32_t* corr = x.corr + b * x.steps * 8;
  const float* xse = x.xse + b * x.steps * 8;
  __m256 a[2][R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) a[0][r] = a[1][r] = _mm256_setzero_ps();
  auto step = [&](size_t t, __m256 (&acc)[R]) {
    const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * kStep));
    const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * kStep + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr + t * 8));
    const __m256 xs = _mm256_loadu_ps(xse + t * 8);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* wb = w[r].wb + t * kStep;
      const __m256i we = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb));
      const __m256i wo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32));
      const __m256 f = _mm256_mul_ps(_mm256_loadu_ps(w[r].gs + t * 8), xs);
      acc[r] = NibStep(we, wo, xe, xo, c, f, acc[r]);
    }
  };
  ForSlots(0, x.steps, a, step);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r] = Hsum(_mm256_add_ps(a[0][r], a[1][r]));
}

// Rows decoded R at a time for the batched loop.
constexpr int kNibRows = 4;

template <WeightFormat F, int R>
void NibRowBlock(const WeightView& w, const NibActs& x, size_t batch, size_t o, float* y,
                 Scratch& s) noexcept {
  const size_t steps = x.steps;
  int8_t* wbuf = Grow(s.wq, R * steps * kStep);
  float* gbuf = Grow(s.wgs, R * steps * 8);
  NibBuffered src[R];
  for (int r = 0; r < R; ++r) {
    const NibDirect<F> d = NibRow<F>(w, o + r);
    int8_t* wr = wbuf + r * steps * kStep;
    float* gr = gbuf + r * steps * 8;
    for (size_t t = 0; t < steps; ++t) {
      __m256i we, wo;
      d.Weights(t, &we, &wo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wr + t * kStep), we);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wr + t * kStep + 32), wo);
      _mm256_storeu_ps(gr + t * 8, d.Factors(t));
    }
    src[r] = NibBuffered{wr, gr};
  }
  for (size_t b = 0; b < batch; ++b) {
    float d[R];
    DotNibBuffered<R>(src, x, b, d);
    for (int r = 0; r < R; ++r) y[b * w.rows + o + r] = d[r];
  }
}

// Batch 1, decoded on the fly. int4: gs is one broadcast scale per step. MXFP4:
// the factors of 8 groups (4 steps) come from one vpmovzxbd of their E8M0 bytes
// and one multiply by xs, and each step's f is a vpermps of that. Each lane's f
// is gs*xse as in the batched path (IEEE multiply is lane-wise), so batch 1 and
// batched agree bit for bit.
template <WeightFormat F>
float DotNibDirect(const NibDirect<F>& w, const NibActs& x) noexcept {
  __m256 a[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  if constexpr (F == WeightFormat::kMxfp4) {
    const uint8_t* e = static_cast<const uint8_t*>(w.factors);
    const __m256i i0 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m256i i1 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
    const __m256i i2 = _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5);
    const __m256i i3 = _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7);
    auto step = [&](size_t t, __m256 f, __m256 acc) {
      __m256i we, wo;
      w.Weights(t, &we, &wo);
      return NibStep(we, wo, x.xq + t * kStep, x.corr + t * 8, f, acc);
    };
    size_t t0 = 0;
    for (; t0 < x.steps; t0 += 4) {
      const size_t g0 = t0 * 2;
      if (w.pf != 0) PrefetchLine(e + g0, w.pf / 16);  // 1 E8M0 byte per 16 weight bytes
      __m128i eb;
      if (g0 + 8 <= w.groups) {
        eb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(e + g0));
      } else {
        alignas(16) uint8_t tmp[16] = {};
        std::memcpy(tmp, e + g0, w.groups - g0);
        eb = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
      }
      const __m256 f8 =
          _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(eb), 23)),
                        _mm256_loadu_ps(x.xsg + g0));
      if (t0 + 4 <= x.steps) {
        a[0] = step(t0, _mm256_permutevar8x32_ps(f8, i0), a[0]);
        a[1] = step(t0 + 1, _mm256_permutevar8x32_ps(f8, i1), a[1]);
        a[0] = step(t0 + 2, _mm256_permutevar8x32_ps(f8, i2), a[0]);
        a[1] = step(t0 + 3, _mm256_permutevar8x32_ps(f8, i3), a[1]);
      } else {
        const __m256i idx[4] = {i0, i1, i2, i3};
        for (size_t t = t0; t < x.steps; ++t) {
          const __m256 f = _mm256_permutevar8x32_ps(f8, idx[t - t0]);
          if ((t & 1) == 0) {
            a[0] = step(t, f, a[0]);
          } else {
            a[1] = step(t, f, a[1]);
          }
        }
      }
    }
  } else {
    ForSlots(0, x.steps, a, [&](size_t t, __m256& acc) {
      __m256i we, wo;
      w.Weights(t, &we, &wo);
      const __m256 f = _mm256_mul_ps(w.Factors(t), _mm256_loadu_ps(x.xse + t * 8));
      acc = NibStep(we, wo, x.xq + t * kStep, x.corr + t * 8, f, acc);
    });
  }
  return Hsum(_mm256_add_ps(a[0], a[1]));
}

template <WeightFormat F>
void MatMulNibImpl(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1,
                   Scratch& s) noexcept {
  const NibActs acts = PrepareNibActs<F>(x, s);
  if (x.batch == 1) {
    for (size_t o = r0; o < r1; ++o) y[o] = DotNibDirect<F>(NibRow<F>(w, o), acts);
    return;
  }
  ForRowBlocks<kNibRows>(r0, r1,
                         [&]<int N>(size_t o) { NibRowBlock<F, N>(w, acts, x.batch, o, y, s); });
}

// K3_QUANT_NIBBLE64=1 selects the per-group int4/MXFP4 IDOT kernel
// (MatMulQ8Impl), kept for same-run A/B benchmarks; both are deterministic.
bool LegacyNib() {
  return Nibble64();  // KernelConfig::nibble64
}

void MatMulQ8Avx2(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1) noexcept {
  Scratch& s = Tls();
  switch (w.format) {
    case WeightFormat::kInt8:
      return MatMulQ8Impl<WeightFormat::kInt8>(w, x, y, r0, r1, s);
    case WeightFormat::kInt4G64:
      if (LegacyNib()) return MatMulQ8Impl<WeightFormat::kInt4G64>(w, x, y, r0, r1, s);
      return MatMulNibImpl<WeightFormat::kInt4G64>(w, x, y, r0, r1, s);
    case WeightFormat::kMxfp4:
      if (LegacyNib()) return MatMulQ8Impl<WeightFormat::kMxfp4>(w, x, y, r0, r1, s);
      return MatMulNibImpl<WeightFormat::kMxfp4>(w, x, y, r0, r1, s);
    case WeightFormat::kF32:
      return;
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
      const __m256 wv = I8Src{q}.Load(i);
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
      const __m256 wv = I8Src{bytes}.Load(8 * j);
      float* a = acc + c0 + 8 * j;
      _mm256_storeu_ps(a, _mm256_fmadd_ps(kv, wv, _mm256_loadu_ps(a)));
    }
  }
}

// Roof loops (roof.h): 12 independent ymm chains (16 registers in all with
// the two operands), enough for a 4-5 cycle latency at two per cycle. Without
// AVX-VNNI the IDOT dot is the kernels' maddubs + madd + add sequence.
uint64_t RoofAvx2(RoofOp op, uint64_t iters) noexcept {
  constexpr int kChains = 12;
  if (op == RoofOp::kIdot) {
    __m256i a[kChains];
#pragma GCC unroll 12
    for (int j = 0; j < kChains; ++j) a[j] = _mm256_set1_epi32(j);
    const __m256i u = InReg(_mm256_set1_epi8(3));
    const __m256i v = InReg(_mm256_set1_epi8(-5));
#ifndef K3_AVXVNNI
    const __m256i ones = InReg(_mm256_set1_epi16(1));
#endif
    for (uint64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
      for (int j = 0; j < kChains; ++j) {
#ifdef K3_AVXVNNI
        a[j] = _mm256_dpbusd_avx_epi32(a[j], u, v);
#else
        a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), ones));
#endif
      }
    }
    __m256i t = a[0];
#pragma GCC unroll 12
    for (int j = 1; j < kChains; ++j) t = _mm256_add_epi32(t, a[j]);
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), t);
    volatile int32_t sink = lanes[0] + lanes[7];
    (void)sink;
    return iters * kChains * 32;
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

// Quantizers stay scalar on AVX2 (load-time only; AVX-512 machines get SIMD ones).
constexpr KernelTable kAvx2Table = {
#ifdef K3_AVXVNNI
    Isa::kAvx2Vnni,
#else
    Isa::kAvx2,
#endif
    MatMulAvx2,     MatMulQ8Avx2,           RowDotAvx2,
    AddRowAvx2,     QuantizeInt8RowsScalar, QuantizeInt4RowsScalar,
    DowncastScalar, QuantizeActsScalar,     RoofAvx2,
    nullptr,        DotSumSquaresAvx2,      SituGluLoop,
    KdaDecayLoop,   KdaUpdateLoop,          SoftmaxLoop,
    AttnScoresLoop};

}  // namespace

#ifdef K3_AVXVNNI
const KernelTable& Avx2VnniKernels() noexcept { return kAvx2Table; }
#else
const KernelTable& Avx2Kernels() noexcept { return kAvx2Table; }
#endif

}  // namespace k3::quant::internal
