// AVX-512 (F/BW/VL/DQ + VNNI) kernels. Compiled with per-file -mavx512* flags and
// only reached through the kernel table after CPUID says yes (isa.cc).
//
// A weight row is decoded on the fly (batch 1) or once per chunk into 64-byte
// aligned per-thread scratch, several rows sharing each activation load
// (batched); every (row, activation) pair runs the same floating-point
// operations either way (determinism contract: the dot routines are templates
// over the tile shape and decode is the 1 x 1 case), while the weight row is read
// from RAM once per chunk. Weight lines are prefetched K3_PREFETCH bytes ahead.
//
// f32-activation path: units of 16 columns or one int4/MXFP4 group, unit k into
// slot k mod S of the pair's accumulators (F32Tile; S = 4 for int4, else 2). For int4/MXFP4 the nibbles
// are widened with vpmovzxbd, which puts the even columns of a 32-column block in
// one vector and the odd ones in the other; the activations are re-laid out to
// match once per call (PermuteEvenOdd32).
//
// IDOT path (§6.5): weights are biased to unsigned bytes so vpdpbusd can multiply
// them with the signed activations; the activation-only correction -B*Σxq is
// formed once per call and is the dpbusd's start value, so every lane's int32 is
// exact. int4/MXFP4 ("nibble IDOT" below): 128 columns per step, activations
// stored even/odd per group once per call so that 128-bit lane L is group L of
// the step and the nibbles need no shuffle; the float work runs once per block
// of 16 whole groups. int8 uses the same block layout and GEMM tile (its decode
// forms the block's group sums by the sign trick, with no correction table).
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "f32_tiles.h"
#include "kernels.h"
#include "kda.h"
#include "situ.h"

namespace k3::quant::internal {
namespace {

// The nibble IDOT activations of one call (PrepareNibActs' result).
struct NibActsCache {
  const int8_t* xq = nullptr;     // [batch][steps*128], zero padded
  const int32_t* corr = nullptr;  // [batch][steps*16]
  const float* xsg = nullptr;     // [batch][xsg_stride]: xs_g (x0.5 for MXFP4's doubled codes)
  size_t steps = 0;
  size_t xsg_stride = 0;  // steps*4 rounded up to 16 (= blocks*16)
  // The GEMM layout (batch > 1 only), per 16-group block (NibGemm below), the
  // blocks in NibActBlock order:
  const int8_t* xb = nullptr;   // [blocks][8][64]: the 8 chunk vectors X_j
  const int32_t* cb = nullptr;  // [blocks][16]: -B*Σq per group, block lane order
  const float* fb = nullptr;    // [blocks][16]: xs_g, block lane order
  size_t batch = 0;
};

// Column panels of the GEMM: a row group's decoded bytes are one byte per
// column (72 KiB for 6 rows of 12288 columns, 198 KiB at 33792), more than L1
// holds beside the activations, so long rows go in panels of kNibPanelBlocks
// blocks (24 KiB per group of 6; 4 and 12 blocks measured slower): each panel
// meets every activation row of the chunk before the next, the tile
// accumulators carried between panels in scratch.
constexpr size_t kNibPanelBlocks = 8;

// Where the GEMM layout keeps block k of activation row r (in blocks; xb holds
// 512 bytes per block, cb and fb 16 values): panel-major, [panel][row][the
// panel's blocks], so that one panel of a chunk of rows is one contiguous run.
// Row-major would put a panel's rows a whole row apart: at 8192 or 12288
// columns (16 or 24 KiB, a multiple of 4 KiB) they fall into a quarter or a half
// of L2's sets, and a 128-row chunk does not stay in L2 (the A/B is in
// docs/PERFORMANCE-history.md, eleventh prefill session).
inline size_t NibActBlock(size_t r, size_t k, size_t blocks, size_t batch) noexcept {
  const size_t k0 = k / kNibPanelBlocks * kNibPanelBlocks;
  const size_t pb = blocks - k0 < kNibPanelBlocks ? blocks - k0 : kNibPanelBlocks;
  return k0 * batch + r * pb + (k - k0);
}

struct Scratch {
  AlignedVec<float> xp;       // f32 path: activations in kernel layout [batch][cols]
  AlignedVec<float> wrow;     // f32 path: decoded row
  AlignedVec<float> gscale;   // per-group factor of the row
  AlignedVec<uint8_t> wu;     // nibble GEMM: decoded weight panels of a row group
  AlignedVec<int32_t> corr;   // nibble IDOT: -B*Σxq per 4-column lane [batch][steps*16]
  AlignedVec<int8_t> xn;      // nibble IDOT: activations in step layout [batch][steps*128]
  AlignedVec<float> wgs;      // nibble IDOT: decoded weight factors of R rows
  AlignedVec<float> xsg;      // nibble IDOT: activation factors, once per group
  AlignedVec<int8_t> xgb;     // nibble GEMM: activation chunk vectors per block
  AlignedVec<int32_t> cgb;    // nibble GEMM: corrections per group, block lane order
  AlignedVec<float> fgb;      // nibble GEMM: activation factors, block lane order
  AlignedVec<float> acc;      // batched f32 path: tile accumulators between column blocks
  // t_call_id (kernels.h) of the call whose activations xp / the nibble IDOT
  // buffers hold (0: none): its later chunks on this thread reuse them.
  uint64_t xp_call = 0;
  uint64_t nib_call = 0;
  NibActsCache nib;
};

Scratch& Tls() {
  thread_local Scratch s;
  return s;
}

inline __mmask16 TailMask16(size_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// Software prefetch `pf` bytes ahead along one weight row of a block of R rows
// that decode reads side by side (DotDirectRows): past the row's end it goes on
// in the same row of the next block (`skip` = (R-1) rows further), not into the
// next row, which is another stream of this block that is already being read.
// (Prefetching by address would send three of four streams' prefetches into the
// neighbouring row: on the 12288-column int4 row (6 KiB) an 8 KiB distance is
// 2 KiB ahead in the neighbour and nothing ahead in the row itself.) One row
// (R = 1): `row_bytes` is unbounded and this is the address-order prefetch.
inline void PrefetchAlongRow(const void* row, size_t off, size_t pf, size_t row_bytes,
                             size_t skip) {
  size_t t = off + pf;
  if (t >= row_bytes) t += skip;
  __builtin_prefetch(static_cast<const char*>(row) + t, 0, 3);
}

// Decode prefetch distances (K3_PREFETCH overrides them all), chosen by same-run
// A/B on the 2-vCPU Zen 5 VM (docs/PERFORMANCE-history.md, "Kernels"): 8 KiB
// ahead beats 4 KiB for the int4/MXFP4 rows on both paths and for one int8 row of
// the f32 path; the int8 IDOT row keeps 4 KiB. Rows read side by side: per row,
// below.
constexpr size_t kPrefetchNibble = 8192;
constexpr size_t kPrefetchI8Row = 8192;
// Several rows per activation load (DotDirectRows, PrefetchAlongRow): bytes
// ahead per row. An address-order prefetch would land in the neighbouring row,
// which the block already reads; along each row, 2 KiB read best of the 1-8 KiB
// tried for both int4 and int8 (12288-column rows at 4 per load, 1 thread;
// docs/PERFORMANCE-history.md, "Kernels").
constexpr size_t kPrefetchNibbleRows = 2048;
constexpr size_t kPrefetchI8Rows = 2048;
// The IDOT GEMM decodes one panel of each row of a group in turn, so what it
// reads next is the same columns a row or two further down, not the row's
// later panels (those come after every tile of the panel): it prefetches
// kGemmPrefetchRows rows ahead, at least kPrefetchNibble (8 KiB, as int8's):
// 8 KiB along the row would reach a later panel of the same row. Two rows ahead
// cut the trunk rows' decode time, one row ahead a little less; the MXFP4
// experts' short rows (8 KiB = 4.5 rows) do not notice (rdtsc A/B in
// docs/PERFORMANCE-history.md, fourteenth prefill session).
constexpr size_t kGemmPrefetchRows = 2;
inline size_t GemmDecodePrefetch(size_t row_bytes) {
  return PrefetchBytes(std::max(kGemmPrefetchRows * row_bytes, kPrefetchNibble));
}


// ---------------------------------------------------------------------------
// f32-activation path

// Weight sources: the dot routines below are templates over where the weight
// vectors come from -- decoded on the fly (batch 1) or loaded from the row buffer
// (batch > 1). Decoding is exact, so both give the same vectors and the same
// floating-point operations run either way.
struct F32Src {  // f32 values already in the kernel layout (small or in cache: no prefetch)
  static constexpr bool kDecoded = true;  // int4 rows: decoded with the group factors applied
  const float* w;
  __m512 Load(size_t i) const { return _mm512_loadu_ps(w + i); }
  __m512 LoadTail(size_t i, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, w + i); }
  void Block32(size_t c, __m512& even, __m512& odd) const {
    even = _mm512_loadu_ps(w + c);
    odd = _mm512_loadu_ps(w + c + 16);
  }
  void Prefetch(size_t) const {}
};

struct I8Src {  // int8 row, converted 16 at a time
  const int8_t* q;
  size_t pf = 0;  // PrefetchBytes()
  __m512 Load(size_t i) const {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i))));
  }
  __m512 LoadTail(size_t i, __mmask16 m) const {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q + i)));
  }
  size_t row_bytes = ~size_t{0};  // PrefetchAlongRow: rows of a multi-row block
  size_t skip = 0;
  void Prefetch(size_t i) const {
    if (pf != 0) PrefetchAlongRow(q, i, pf, row_bytes, skip);
  }
};

// 16 packed bytes (32 columns): vpmovzxbd gives byte j in lane j, so the low
// nibbles are the even columns and the high nibbles the odd ones.
struct NibbleSrc {
  static constexpr bool kDecoded = false;
  const uint8_t* p;  // the row's packed bytes
  __m512 lut;        // nibble -> f32 value (doubled e2m1, or v-8 for int4)
  size_t pf = 0;     // PrefetchBytes()
  void Block32(size_t c, __m512& even, __m512& odd) const { Block32(c, lut, even, odd); }
  // With another 16-entry table (int4: lut times the group's factor).
  void Block32(size_t c, __m512 table, __m512& even, __m512& odd) const {
    const __m512i v =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + c / 2)));
    // vpermps reads only index bits 3:0, so the low nibble needs no mask (one
    // uop fewer per 32 columns; this decode is what bounds the f32 path).
    even = _mm512_permutexvar_ps(v, table);
    odd = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
  }
  size_t row_bytes = ~size_t{0};  // PrefetchAlongRow: rows of a multi-row block
  size_t skip = 0;
  void Prefetch(size_t c) const {
    if (pf != 0) PrefetchAlongRow(p, c / 2, pf, row_bytes, skip);
  }
};

// f32-activation dot products as R x B tiles: R weight rows against B activation
// rows. A row is a sequence of units -- 16-column chunks (f32, int8), 32-column
// MXFP4 groups or 64-column int4 groups -- and unit k of a (row, activation) pair
// goes to that pair's accumulator slot k mod S (S = 2; 4 for int4); the pair's
// result is reduce_add of the slots (pairwise sums). Per pair the operations are
// the same whatever R and B are and however the columns are blocked (a block's
// accumulators only go to memory and back, which is exact), so batch 1 (R = B =
// 1, one block, weights decoded in registers) and batched (decoded rows, 4 x 2
// tiles, 4 x 1 for int4, 1024-column blocks) agree bit for bit.
// Pins a loaded vector in a register: otherwise GCC folds the same load into
// every FMA that uses it (once per activation row of the tile), and the tiles
// are bound by their loads.
template <typename V>
inline V InReg(V v) {
  __asm__("" : "+v"(v));
  return v;
}

template <F32Unit U, int R, int B, typename Src>
struct F32Tile {
  const Src* w;            // R weight rows
  const float* const* x;   // B activation rows (kernel layout)
  const float* const* gs;  // R group-factor rows (group units only)
  size_t n;                // columns (the plain unit's tail)

  void Step(size_t k, __m512 (&a)[R][B]) const {
    if constexpr (U == F32Unit::kPlain) {
      const size_t i = k * 16;
      if (i + 16 <= n) {
        __m512 xv[B];
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) xv[b] = _mm512_loadu_ps(x[b] + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          if ((k & 3) == 0) w[r].Prefetch(i);
          const __m512 wv = InReg(w[r].Load(i));
#pragma GCC unroll 4
          for (int b = 0; b < B; ++b) a[r][b] = _mm512_fmadd_ps(xv[b], wv, a[r][b]);
        }
      } else {
        const __mmask16 m = TailMask16(n - i);
        __m512 xv[B];
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) xv[b] = _mm512_maskz_loadu_ps(m, x[b] + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m512 wv = w[r].LoadTail(i, m);
#pragma GCC unroll 4
          for (int b = 0; b < B; ++b) a[r][b] = _mm512_fmadd_ps(xv[b], wv, a[r][b]);
        }
      }
    } else if constexpr (U == F32Unit::kG32) {
      // p = x_even*w_even + x_odd*w_odd over the permuted layout, then p * gs.
      __m512 xe[B], xo[B];
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) {
        xe[b] = _mm512_loadu_ps(x[b] + k * 32);
        xo[b] = _mm512_loadu_ps(x[b] + k * 32 + 16);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        if ((k & 3) == 0) w[r].Prefetch(k * 32);
        __m512 we, wo;
        w[r].Block32(k * 32, we, wo);
        we = InReg(we);
        wo = InReg(wo);
        const __m512 g = _mm512_set1_ps(gs[r][k]);
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) {
          const __m512 p = _mm512_fmadd_ps(xo[b], wo, _mm512_mul_ps(xe[b], we));
          a[r][b] = _mm512_fmadd_ps(p, g, a[r][b]);
        }
      }
    } else {
      // int4: the group's factor goes into the 16-entry table (one multiply per
      // group and row, not one per 16 columns), then the group's four column
      // vectors of (v-8)*s go into its slot by a chain of four FMAs. Four slots
      // (kSlots) keep four such chains in flight per pair, so one row (R = 1)
      // is not bound by their latency. Decoded rows (batched) hold the same
      // (v-8)*s values (DecodeRowF32), so both give the same bits.
      __m512 xv[B][4];
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) xv[b][j] = _mm512_loadu_ps(x[b] + k * 64 + 16 * j);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        if ((k & 1) == 0) w[r].Prefetch(k * 64);
        __m512 wv[4];
        if constexpr (Src::kDecoded) {
          w[r].Block32(k * 64, wv[0], wv[1]);
          w[r].Block32(k * 64 + 32, wv[2], wv[3]);
        } else {
          const __m512 table = _mm512_mul_ps(w[r].lut, _mm512_set1_ps(gs[r][k]));
          w[r].Block32(k * 64, table, wv[0], wv[1]);
          w[r].Block32(k * 64 + 32, table, wv[2], wv[3]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) wv[j] = InReg(wv[j]);
#pragma GCC unroll 4
        for (int b = 0; b < B; ++b) {
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) a[r][b] = _mm512_fmadd_ps(xv[b][j], wv[j], a[r][b]);
        }
      }
    }
  }
};

// Within each 32-column block: the 16 even columns, then the 16 odd ones.
void PermuteEvenOdd32(const float* x, size_t n, float* out) noexcept {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (size_t i = 0; i < n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(x + i);
    const __m512 hi = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_ps(out + i, _mm512_permutex2var_ps(lo, even, hi));
    _mm512_storeu_ps(out + i + 16, _mm512_permutex2var_ps(lo, odd, hi));
  }
}

// E8M0 bytes -> 2^(s-127) * 0.5 (the doubled codes' factor), 16 at a time.
void MxGroupScales(const uint8_t* e, size_t groups, float* out) noexcept {
  for (size_t g = 0; g < groups; g += 16) {
    const __mmask16 m = groups - g >= 16 ? __mmask16(0xffff) : TailMask16(groups - g);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, e + g));
    const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(b, 23));
    _mm512_mask_storeu_ps(out + g, m, _mm512_mul_ps(s, _mm512_set1_ps(0.5f)));
  }
}

// Built inside functions, never at namespace scope: a static initialiser would
// execute AVX-512 at start-up on CPUs without it.
inline __m512 LutMx2() {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, -0.0f, -1, -2, -3, -4, -6, -8, -12);
}
inline __m512 LutI4() {
  return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}

// Row o's group factors (MXFP4: E8M0*0.5 into s.gscale; int4: its own scales).
const float* GroupScalesF32(const WeightView& w, size_t o, Scratch& s) noexcept {
  const size_t n = w.cols;
  if (w.format == WeightFormat::kInt4G64) return w.scales + o * (n / kInt4Group);
  if (w.format != WeightFormat::kMxfp4) return nullptr;
  float* gs = Grow(s.gscale, n / kMxGroup);
  MxGroupScales(w.e8m0 + o * (n / kMxGroup), n / kMxGroup, gs);
  return gs;
}

inline __m512 LutFor(WeightFormat f) { return f == WeightFormat::kMxfp4 ? LutMx2() : LutI4(); }

// Decodes row o into `out` (kernel layout) for the batched loop; f32 rows are
// used in place.
const float* DecodeRowF32(const WeightView& w, size_t o, float* out) noexcept {
  const size_t n = w.cols;
  if (w.format == WeightFormat::kF32) return static_cast<const float*>(w.data) + o * n;
  if (w.format == WeightFormat::kInt8) {
    const I8Src src{static_cast<const int8_t*>(w.data) + o * n, PrefetchBytes()};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      if ((i & 63) == 0) src.Prefetch(i);
      _mm512_storeu_ps(out + i, src.Load(i));
    }
    if (i < n)
      _mm512_mask_storeu_ps(out + i, TailMask16(n - i), src.LoadTail(i, TailMask16(n - i)));
    return out;
  }
  const NibbleSrc src{static_cast<const uint8_t*>(w.data) + o * (n / 2), LutFor(w.format),
                      PrefetchBytes()};
  if (w.format == WeightFormat::kInt4G64) {
    // (v-8)*s, the values the int4 unit forms in registers (F32Tile).
    const float* gs = w.scales + o * (n / kInt4Group);
    for (size_t c = 0; c < n; c += 32) {
      src.Prefetch(c);
      __m512 even, odd;
      src.Block32(c, _mm512_mul_ps(src.lut, _mm512_set1_ps(gs[c / kInt4Group])), even, odd);
      _mm512_storeu_ps(out + c, even);
      _mm512_storeu_ps(out + c + 16, odd);
    }
    return out;
  }
  for (size_t c = 0; c < n; c += 32) {
    src.Prefetch(c);
    __m512 even, odd;
    src.Block32(c, even, odd);
    _mm512_storeu_ps(out + c, even);
    _mm512_storeu_ps(out + c + 16, odd);
  }
  return out;
}

// The f32 tiles' ISA kit (f32_tiles.h).
struct Avx512Kit {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // Two slots: 32 zmm hold a 4 x 3 tile of them (the group units also keep their
  // activation vectors, hence 4 x 2 there). (Four slots for the plain unit, to
  // break decode's FMA chain, gained nothing on decode and lost batched: not
  // taken.) The int4 unit's four FMAs per group are one chain into one slot, so
  // it has four slots, and 4 x 1 tiles (16 accumulators; 2 x 2 and 2 x 3 ran
  // slower batched).
  template <F32Unit U>
  static constexpr int kSlots = U == F32Unit::kG64 ? 4 : 2;
  template <F32Unit U>
  static constexpr int kTileActs = U == F32Unit::kPlain ? 3 : U == F32Unit::kG64 ? 1 : 2;
  template <F32Unit U>
  static constexpr int kRows = 4;
  template <F32Unit U, int R, int B, typename Src>
  using Tile = F32Tile<U, R, B, Src>;
  using RowSrc = F32Src;
  template <int S>
  static float Reduce(const V* v) {
    static_assert(S == 2 || S == 4);
    if constexpr (S == 4) {
      return _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(v[0], v[1]), _mm512_add_ps(v[2], v[3])));
    } else {
      return _mm512_reduce_add_ps(_mm512_add_ps(v[0], v[1]));
    }
  }
  static const float* DecodeRow(const WeightView& w, size_t o, float* out) {
    return DecodeRowF32(w, o, out);
  }
  static void MxScales(const uint8_t* e, size_t groups, float* out) {
    MxGroupScales(e, groups, out);
  }
};

// Row o dotted with one (layout-matched) activation row, decoding on the fly.
float DotDirect(const WeightView& w, size_t o, const float* gs, const float* x) noexcept {
  const size_t n = w.cols;
  const size_t pf = PrefetchBytes(w.format == WeightFormat::kInt8 ? kPrefetchI8Row : kPrefetchNibble);
  switch (w.format) {
    case WeightFormat::kF32:
      return DotF32<Avx512Kit, F32Unit::kPlain>(F32Src{static_cast<const float*>(w.data) + o * n},
                                                x, nullptr, n);
    case WeightFormat::kInt8:
      return DotF32<Avx512Kit, F32Unit::kPlain>(
                 I8Src{static_cast<const int8_t*>(w.data) + o * n, pf}, x, nullptr, n) *
             w.scales[o];
    case WeightFormat::kInt4G64:
      return DotF32<Avx512Kit, F32Unit::kG64>(
          NibbleSrc{static_cast<const uint8_t*>(w.data) + o * (n / 2), LutI4(), pf}, x, gs, n);
    case WeightFormat::kMxfp4:
      return DotF32<Avx512Kit, F32Unit::kG32>(
          NibbleSrc{static_cast<const uint8_t*>(w.data) + o * (n / 2), LutMx2(), pf}, x, gs, n);
  }
  return 0.0f;
}

bool NeedsPermute(WeightFormat f) {
  return f == WeightFormat::kInt4G64 || f == WeightFormat::kMxfp4;
}

// Activations in the kernel's layout, in the 64-byte aligned scratch (batch 1
// with no layout change reads the input itself).
const float* LayoutActs(const WeightView& w, const float* x, size_t batch, Scratch& s) noexcept {
  s.xp_call = 0;
  if (!NeedsPermute(w.format)) {
    if (batch == 1) return x;
    float* xa = Grow(s.xp, batch * w.cols);
    std::memcpy(xa, x, batch * w.cols * sizeof(float));
    return xa;
  }
  float* xp = Grow(s.xp, batch * w.cols);
  for (size_t b = 0; b < batch; ++b) PermuteEvenOdd32(x + b * w.cols, w.cols, xp + b * w.cols);
  return xp;
}

// Rows o .. o+R-1 dotted with one (layout-matched) activation row, decoding on
// the fly: DotDirect's operations per row.
template <int R>
void DotDirectRows(const WeightView& w, size_t o, const float* x, float* y,
                   Scratch& s) noexcept {
  const size_t n = w.cols;
  const bool nib = w.format != WeightFormat::kInt8;
  const size_t pf = PrefetchBytes(R == 1 ? (nib ? kPrefetchNibble : kPrefetchI8Row)
                                         : (nib ? kPrefetchNibbleRows : kPrefetchI8Rows));
  const size_t row_bytes = R == 1 ? ~size_t{0} : nib ? n / 2 : n;
  const size_t skip = R == 1 ? 0 : (R - 1) * (nib ? n / 2 : n);
  const float* gs[R];
  switch (w.format) {
    case WeightFormat::kF32: {
      F32Src src[R];
      for (int r = 0; r < R; ++r) {
        src[r] = F32Src{static_cast<const float*>(w.data) + (o + r) * n};
        gs[r] = nullptr;
      }
      DotF32Rows<Avx512Kit, F32Unit::kPlain, R>(src, x, gs, n, y + o);
      return;
    }
    case WeightFormat::kInt8: {
      I8Src src[R];
      for (int r = 0; r < R; ++r) {
        src[r] = I8Src{static_cast<const int8_t*>(w.data) + (o + r) * n, pf, row_bytes, skip};
        gs[r] = nullptr;
      }
      DotF32Rows<Avx512Kit, F32Unit::kPlain, R>(src, x, gs, n, y + o);
      for (int r = 0; r < R; ++r) y[o + r] *= w.scales[o + r];
      return;
    }
    case WeightFormat::kInt4G64: {
      NibbleSrc src[R];
      for (int r = 0; r < R; ++r) {
        src[r] = NibbleSrc{static_cast<const uint8_t*>(w.data) + (o + r) * (n / 2), LutI4(), pf,
                           row_bytes, skip};
        gs[r] = w.scales + (o + r) * (n / kInt4Group);
      }
      DotF32Rows<Avx512Kit, F32Unit::kG64, R>(src, x, gs, n, y + o);
      return;
    }
    case WeightFormat::kMxfp4: {
      const size_t groups = n / kMxGroup;
      const size_t pf_e8 = PrefetchBytes(kPrefetchNibble);  // the rows' bytes are adjacent
      float* gbuf = Grow(s.gscale, R * groups);
      NibbleSrc src[R];
      for (int r = 0; r < R; ++r) {
        src[r] = NibbleSrc{static_cast<const uint8_t*>(w.data) + (o + r) * (n / 2), LutMx2(), pf,
                           row_bytes, skip};
        // The E8M0 bytes are a stream of their own (1 byte per 16 weight bytes)
        // that the row's first instructions wait on: touch it as far ahead as the
        // weights (perf: 3/4 of this function's samples sat on that load's miss).
        for (size_t g = 0; pf_e8 != 0 && g < groups; g += 64) {
          PrefetchLine(w.e8m0 + (o + r) * groups + g, pf_e8 / 16);
        }
        MxGroupScales(w.e8m0 + (o + r) * groups, groups, gbuf + r * groups);
        gs[r] = gbuf + r * groups;
      }
      DotF32Rows<Avx512Kit, F32Unit::kG32, R>(src, x, gs, n, y + o);
      return;
    }
  }
}

void MatMulAvx512(const WeightView& w, const float* x, size_t batch, float* y, size_t r0,
                  size_t r1) noexcept {
  Scratch& s = Tls();
  const float* xl = s.xp.data();
  if (s.xp_call == 0 || s.xp_call != t_call_id) {  // else this call's, laid out on this thread
    xl = LayoutActs(w, x, batch, s);
    if (xl != x) s.xp_call = t_call_id;
  }
  if (batch == 1) {
    auto rows = [&]<int N>(size_t o) { DotDirectRows<N>(w, o, xl, y, s); };
    switch (DecodeRowsF32(w.cols * sizeof(float))) {
      case 4:
        return ForRowBlocks<4>(r0, r1, rows);
      case 2:
        return ForRowBlocks<2>(r0, r1, rows);
      default:
        return ForRowBlocks<1>(r0, r1, rows);
    }
  }
  MatMulF32Batched<Avx512Kit>(w, xl, batch, y, r0, r1, s);
}

float RowDotAvx512(const WeightView& w, size_t row, const float* x) noexcept {
  Scratch& s = Tls();
  const float* xl = LayoutActs(w, x, 1, s);
  return DotDirect(w, row, GroupScalesF32(w, row, s), xl);
}

// ---------------------------------------------------------------------------
// IDOT path. vpdpbusd multiplies unsigned by signed bytes, so the weights are
// made unsigned by a per-format bias B (int8: w^0x80 = w+128, int4: the stored
// nibble = v+8, MXFP4: a table giving doubled code + 12) and the activations stay
// signed: Σ(w+B)·xq = Σw·xq + B·Σxq. The second term depends only on the
// activations, so it is formed once per call (per 4-column lane) and used as
// the dpbusd start value: every lane's int32 is the exact Σw·xq of its columns.

// 64 packed nibbles -> 64 bytes in column order (low nibble = even column):
// widen bytes to u16 (0x00HL), OR with itself shifted by 4 (0x0HL0) and keep
// 0x0F0F -> bytes L, H.
inline __m512i NibblesToBytes(__m256i packed) {
  const __m512i v = _mm512_cvtepu8_epi16(packed);
  return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(v, 4), _mm512_set1_epi16(0x0F0F), 0xA8);
}

// Biased (unsigned) weight bytes of 64 columns starting at column c of a
// nibble row whose bytes start at `row`; `half`: only 32 columns remain (the
// rest must multiply zero activations).
template <WeightFormat F>
inline __m512i WeightBytesU(const uint8_t* row, size_t c, bool half) {
  if constexpr (F == WeightFormat::kInt4G64) {
    // int4 rows are whole 64-column groups, never half.
    return NibblesToBytes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c / 2)));
  } else {
    const __m256i raw = half ? _mm256_maskz_loadu_epi8(0xffffu, row + c / 2)
                             : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c / 2));
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    return _mm512_shuffle_epi8(lut, NibblesToBytes(raw));
  }
}

template <WeightFormat F>
const uint8_t* RowBytes(const WeightView& w, size_t o) {
  const size_t stride = F == WeightFormat::kInt8 ? w.cols : w.cols / 2;
  return static_cast<const uint8_t*>(w.data) + o * stride;
}

// ---------------------------------------------------------------------------
// Nibble IDOT (int4-g64, MXFP4): 128 columns per step from one 64-byte load.
// Low nibbles (even columns) and high nibbles (odd columns) are split with
// and/shift and MXFP4 codes go through a 16-entry byte LUT (doubled code + 12);
// 128-bit lane L of each holds group L of the step. The activations are stored
// in that layout once per call (NibActs: per group its 16 even-column bytes, and
// in the second vector its 16 odd-column bytes), so the weights need no shuffle
// of positions at all; both dpbusd's accumulate into one int32 vector whose
// lane (L, m) holds 8 columns of group L of the step (exact, as the bias
// correction is its start value).
//
// The float part works on blocks of 16 groups (4 steps, 512 columns): the
// block's four step vectors are summed into one vector G of whole-group int32
// sums (SumLanes4, exact), lane 4L+m holding group 4m+L of the block (the
// "block lane order"), and one factor vector f = gs*xs in the same order scales
// it: a = fma(cvt(G_s), f_s, a) over the blocks in column order, then one
// reduction. Batch 1 (DotNib1) forms G from the step vectors; the GEMM
// (NibGemm) forms the same exact G directly, from weights and activations laid
// out per block as 8 chunk vectors whose lane 4L+m holds 4 bytes of that
// group, so that 8 dpbusd's give G with no shuffle and one cvt + mul + fma per
// 16 groups (instead of per 4). Per element the floating-point operations are
// the same either way, so batch 1 and the GEMM agree bit for bit.

constexpr size_t kStep = 128;
constexpr size_t kBlockSteps = 4;  // 16 groups

using NibActs = NibActsCache;

// Lane 4L+m of the result = the sum of the four int32 lanes of 128-bit lane L of
// d_m (the whole group 4m+L of a block when d_m is step m's dot vector).
inline __m512i SumLanes4(__m512i d0, __m512i d1, __m512i d2, __m512i d3) {
  const __m512i e01 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(d0, d1), _mm512_unpackhi_epi32(d0, d1));
  const __m512i e23 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(d2, d3), _mm512_unpackhi_epi32(d2, d3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(e01, e23), _mm512_unpackhi_epi64(e01, e23));
}

// 4 x 4 transpose of int32 lanes within each 128-bit lane: out_j lane (L, m) =
// in_m lane (L, j). Step m's vector with chunk j of group L in lane (L, j)
// becomes chunk vector j with group 4m+L's chunk in lane 4L+m.
inline void Transpose4(const __m512i in[4], __m512i out[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(in[0], in[1]);
  const __m512i t1 = _mm512_unpackhi_epi32(in[0], in[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(in[2], in[3]);
  const __m512i t3 = _mm512_unpackhi_epi32(in[2], in[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

// Natural group order (16 groups of a block) -> block lane order.
inline __m512i BlockLaneOrder() {
  return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}

template <WeightFormat F>
NibActs PrepareNibActs(const ActsQ8& x, Scratch& s) noexcept {
  if (s.nib_call == t_call_id && t_call_id != 0) return s.nib;  // this call's, on this thread
  s.nib_call = 0;
  constexpr int kB = F == WeightFormat::kInt4G64 ? 8 : 12;
  const float mult = F == WeightFormat::kMxfp4 ? 0.5f : 1.0f;
  const size_t n = x.cols;
  const size_t groups = n / kActGroup;
  const size_t steps = (n + kStep - 1) / kStep;
  const size_t blocks = (steps + kBlockSteps - 1) / kBlockSteps;
  const bool gemm = x.batch > 1;
  // Whole blocks, zero padded: the GEMM layout is built from them.
  const size_t psteps = blocks * kBlockSteps;
  int8_t* xq = Grow(s.xn, x.batch * psteps * kStep);
  int32_t* corr = Grow(s.corr, x.batch * psteps * 16);
  const size_t xsg_stride = blocks * 16;
  float* xsg = Grow(s.xsg, x.batch * xsg_stride);
  int8_t* xb = gemm ? Grow(s.xgb, x.batch * blocks * 8 * 64) : nullptr;
  int32_t* cb = gemm ? Grow(s.cgb, x.batch * blocks * 16) : nullptr;
  float* fb = gemm ? Grow(s.fgb, x.batch * blocks * 16) : nullptr;
  const __m512i b = _mm512_set1_epi8(static_cast<char>(kB));
  const __m512i order = BlockLaneOrder();
  for (size_t r = 0; r < x.batch; ++r) {
    const int8_t* q = x.q.data() + r * n;
    const float* xs = x.scales.data() + r * groups;
    int8_t* dq = xq + r * psteps * kStep;
    int32_t* dc = corr + r * psteps * 16;
    float* dx = xsg + r * xsg_stride;
    for (size_t t = 0; t < psteps; ++t) {
      int8_t* d = dq + t * kStep;
      NibbleStepActs(q, groups, t, 4, d);
      for (size_t g = t * 4; g < t * 4 + 4; ++g) dx[g] = g < groups ? xs[g] * mult : 0.0f;
      const __m512i xa = _mm512_load_si512(d);
      const __m512i xo = _mm512_load_si512(d + 64);
      const __m512i sum =
          _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), b, xa), b, xo);
      _mm512_store_si512(dc + t * 16, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
    }
    if (!gemm) continue;
    for (size_t k = 0; k < blocks; ++k) {
      const int8_t* d = dq + k * kBlockSteps * kStep;
      const int32_t* c = dc + k * kBlockSteps * 16;
      __m512i ev[4], od[4], cv[4];
      for (int m = 0; m < 4; ++m) {
        ev[m] = _mm512_load_si512(d + m * kStep);
        od[m] = _mm512_load_si512(d + m * kStep + 64);
        cv[m] = _mm512_load_si512(c + m * 16);
      }
      __m512i xe[4], xo[4];
      Transpose4(ev, xe);
      Transpose4(od, xo);
      const size_t at = NibActBlock(r, k, blocks, x.batch);
      int8_t* out = xb + at * 8 * 64;
      for (int j = 0; j < 4; ++j) {
        _mm512_store_si512(out + j * 64, xe[j]);
        _mm512_store_si512(out + (4 + j) * 64, xo[j]);
      }
      _mm512_store_si512(cb + at * 16, SumLanes4(cv[0], cv[1], cv[2], cv[3]));
      _mm512_store_ps(fb + at * 16, _mm512_permutexvar_ps(order, _mm512_load_ps(dx + k * 16)));
    }
  }
  s.nib = NibActs{xq, corr, xsg, steps, xsg_stride, xb, cb, fb, x.batch};
  s.nib_call = t_call_id;
  return s.nib;
}

// Row o decoded step by step straight from the stored bytes and factors.
template <WeightFormat F>
struct NibDirect {
  const uint8_t* row;    // cols/2 bytes
  const void* factors;   // MXFP4: E8M0 [cols/32]; int4: f32 [cols/64]
  size_t bytes;          // cols/2
  size_t groups;         // factor count
  size_t pf;             // PrefetchBytes()

  // Biased weight bytes: even columns (low nibbles) and odd columns (high).
  void Weights(size_t t, __m512i* wa, __m512i* wb) const {
    const size_t off = t * 64;
    if (pf != 0) PrefetchLine(row + off, pf);
    const bool full = off + 64 <= bytes;
    const __m512i raw =
        full ? _mm512_loadu_si512(row + off)
             : _mm512_maskz_loadu_epi8((1ull << (bytes - off)) - 1, row + off);
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512i lo = _mm512_and_si512(raw, nib);
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
    if constexpr (F == WeightFormat::kMxfp4) {
      const __m512i lut = _mm512_broadcast_i32x4(
          _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
      lo = _mm512_shuffle_epi8(lut, lo);
      hi = _mm512_shuffle_epi8(lut, hi);
    }
    *wa = lo;
    *wb = hi;
  }

  // The weight factors of the 16 groups of block k (natural order; 0 past the
  // row's end).
  __m512 BlockFactors(size_t k) const {
    const size_t g0 = k * 16;  // activation (32-column) groups
    if constexpr (F == WeightFormat::kMxfp4) {
      const uint8_t* e = static_cast<const uint8_t*>(factors);
      const size_t ng = groups - g0 >= 16 ? 16 : groups - g0;
      if (pf != 0) PrefetchLine(e + g0, pf / 16);  // 1 E8M0 byte per 16 weight bytes
      const __m512i eb = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(TailMask16(ng), e + g0));
      return _mm512_castsi512_ps(_mm512_slli_epi32(eb, 23));
    } else {
      const __m512i halves = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
      const float* sc = static_cast<const float*>(factors);
      const size_t s0 = g0 / 2;  // int4 groups: one per two activation groups
      const size_t ns = groups - s0 >= 8 ? 8 : groups - s0;
      if (pf != 0) PrefetchLine(sc + s0, pf / 8);  // 4 scale bytes per 32 weight bytes
      return _mm512_permutexvar_ps(halves, _mm512_maskz_loadu_ps(TailMask16(ns), sc + s0));
    }
  }
};

// Row o, prefetching `pf` bytes ahead (batch 1: PrefetchBytes(kPrefetchNibble);
// the GEMM's decode: GemmDecodePrefetch).
template <WeightFormat F>
NibDirect<F> NibRow(const WeightView& w, size_t o, size_t pf) {
  const size_t n = w.cols;
  if constexpr (F == WeightFormat::kMxfp4) {
    return {RowBytes<F>(w, o), w.e8m0 + o * (n / kMxGroup), n / 2, n / kMxGroup, pf};
  } else {
    return {RowBytes<F>(w, o), w.scales + o * (n / kInt4Group), n / 2, n / kInt4Group, pf};
  }
}

// Batch 1: per block, the four steps' dpbusd pairs, SumLanes4 into whole-group
// sums, one cvt and one FMA with f = gs*xs (the block's factors from one
// multiply, permuted into block lane order; IEEE multiply is lane-wise, so this
// is the GEMM's f). Steps past the row's end contribute 0 (as the GEMM's zero
// padded activations do).
template <WeightFormat F>
float DotNib1(const NibDirect<F>& w, const NibActs& x) noexcept {
  __m512 a = _mm512_setzero_ps();
  const __m512i order = BlockLaneOrder();
  const size_t blocks = x.xsg_stride / 16;
  for (size_t k = 0; k < blocks; ++k) {
    const __m512 f16 = _mm512_mul_ps(w.BlockFactors(k), _mm512_loadu_ps(x.xsg + k * 16));
    __m512i d[4];
#pragma GCC unroll 4
    for (size_t m = 0; m < 4; ++m) {
      const size_t t = k * kBlockSteps + m;
      if (t < x.steps) {
        __m512i wa, wb;
        w.Weights(t, &wa, &wb);
        const __m512i xa = _mm512_load_si512(x.xq + t * kStep);
        const __m512i xb = _mm512_load_si512(x.xq + t * kStep + 64);
        const __m512i cv = _mm512_load_si512(x.corr + t * 16);
        d[m] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(cv, wa, xa), wb, xb);
      } else {
        d[m] = _mm512_setzero_si512();
      }
    }
    const __m512i g = SumLanes4(d[0], d[1], d[2], d[3]);
    a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(g), _mm512_permutexvar_ps(order, f16), a);
  }
  return _mm512_reduce_add_ps(a);
}

// The GEMM: R weight rows decoded once into the block layout (8 chunk vectors
// and 16 factors, block lane order, per block), then tiles of R rows x B
// activation rows. Per block and (row, activation) pair: G from the correction,
// 8 dpbusd's, then a = fma(cvt(G), gs*xs, a) -- DotNib1's operations; each chunk
// load feeds B (weights) or R (activations) dpbusd's, and the float work is 3
// instructions per 16 dpbusd's of a pair's 8.
// 6 x 2: 12 int32 and 12 f32 accumulators beside 6 + 2 chunk loads. The
// activations come from L2 (a chunk), the decoded rows from L1, so a tile's L2
// bytes per dpbusd fall with R: 6 x 2 (10.7 B) beats 4 x 2 (16 B); 4 x 3, 4 x 4
// and 8 x 1 are no better than 4 x 2, and 8 x 2 spills (docs/PERFORMANCE-history.md,
// tenth prefill session). The tile never changes a bit.
constexpr int kNibGemmRows = 6;
constexpr int kNibGemmActs = 2;

//
// Blocks [k0, k1) of the row: a panel, decoded at wr/gr (block k0 first). The
// pair accumulators start at zero for the first panel (k0 = 0) and are
// otherwise loaded from `carry` ([R][B]
// vectors), where a panel that does not end the row leaves them; the last one
// reduces them into `out`. Stored and reloaded exactly, so the panels change
// no bit.
// kUnit: every weight factor is 1 (int8, whose row scale multiplies the total
// afterwards): f = xs, the same bits as 1 * xs without the multiply.
template <int R, int B, bool kUnit = false>
void NibGemmTile(const uint8_t* const* wr, const float* const* gr, const NibActs& x, size_t b0,
                 size_t blocks, size_t k0, size_t k1, float* carry, float* out) noexcept {
  __m512 a[R][B];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < B; ++c) {
      a[r][c] = k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(carry + (r * B + c) * 16);
    }
  }
  const int8_t* xb[B];
  const int32_t* cb[B];
  const float* fb[B];
#pragma GCC unroll 8
  for (int c = 0; c < B; ++c) {  // the panel's blocks of row b0 + c, block k0 first
    const size_t at = NibActBlock(b0 + c, k0, blocks, x.batch);
    xb[c] = x.xb + at * 8 * 64;
    cb[c] = x.cb + at * 16;
    fb[c] = x.fb + at * 16;
  }
  for (size_t k = k0; k < k1; ++k) {
    __m512i g[R][B];
#pragma GCC unroll 8
    for (int c = 0; c < B; ++c) {
      const __m512i cv = InReg(_mm512_load_si512(cb[c] + (k - k0) * 16));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) g[r][c] = cv;
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i wv[R], xv[B];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = InReg(_mm512_load_si512(wr[r] + ((k - k0) * 8 + j) * 64));
#pragma GCC unroll 8
      for (int c = 0; c < B; ++c) xv[c] = InReg(_mm512_load_si512(xb[c] + ((k - k0) * 8 + j) * 64));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
        for (int c = 0; c < B; ++c) g[r][c] = _mm512_dpbusd_epi32(g[r][c], wv[r], xv[c]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 gs = kUnit ? _mm512_set1_ps(1.0f) : InReg(_mm512_load_ps(gr[r] + (k - k0) * 16));
#pragma GCC unroll 8
      for (int c = 0; c < B; ++c) {
        const __m512 xs = _mm512_load_ps(fb[c] + (k - k0) * 16);
        a[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(g[r][c]), kUnit ? xs : _mm512_mul_ps(gs, xs),
                                  a[r][c]);
      }
    }
  }
  if (k1 < blocks) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int c = 0; c < B; ++c) _mm512_store_ps(carry + (r * B + c) * 16, a[r][c]);
    }
    return;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < B; ++c) out[c * kNibGemmRows + r] = _mm512_reduce_add_ps(a[r][c]);
  }
}

// Blocks [k0, k1) of weight row `o` decoded into the block layout: 8 chunk
// vectors per block at `wo`, the 16 block factors (block lane order) at `go`.
template <WeightFormat F>
void NibDecodeRow(const WeightView& w, const NibActs& x, size_t o, size_t k0, size_t k1,
                  uint8_t* wo, float* go) noexcept {
  const __m512i order = BlockLaneOrder();
  const NibDirect<F> d = NibRow<F>(w, o, GemmDecodePrefetch(w.cols / 2));
  for (size_t k = k0; k < k1; ++k) {
    __m512i lo[4], hi[4];
    for (size_t m = 0; m < 4; ++m) {
      const size_t t = k * kBlockSteps + m;
      if (t < x.steps) {
        d.Weights(t, &lo[m], &hi[m]);
      } else {  // multiplies zero activations
        lo[m] = hi[m] = _mm512_setzero_si512();
      }
    }
    __m512i we[4], wod[4];
    Transpose4(lo, we);
    Transpose4(hi, wod);
    uint8_t* out = wo + (k - k0) * 8 * 64;
    for (int j = 0; j < 4; ++j) {
      _mm512_store_si512(out + j * 64, we[j]);
      _mm512_store_si512(out + (4 + j) * 64, wod[j]);
    }
    _mm512_store_ps(go + (k - k0) * 16, _mm512_permutexvar_ps(order, d.BlockFactors(k)));
  }
}


// Rows o .. o+R-1, panel [k0, k1) decoded at wr/gr, against activation rows
// [b0, b1); `carry`: this row group's tile accumulators between panels.
template <int R, bool kUnit = false>
void NibPanelTiles(const uint8_t* const* wr, const float* const* gr, const NibActs& x, size_t b0,
                   size_t b1, size_t blocks, size_t k0, size_t k1, size_t o, size_t ld, float* y,
                   float* carry) noexcept {
  float d[kNibGemmActs * kNibGemmRows];
  size_t b = b0;
  for (float* c = carry; b < b1; b += kNibGemmActs) {
    if (b + kNibGemmActs <= b1) {
      NibGemmTile<R, kNibGemmActs, kUnit>(wr, gr, x, b, blocks, k0, k1, c, d);
      if (k1 == blocks) {
        for (int t = 0; t < kNibGemmActs; ++t) {
          for (int r = 0; r < R; ++r) y[(b + t) * ld + o + r] = d[t * kNibGemmRows + r];
        }
      }
    } else {
      for (size_t t = b; t < b1; ++t) {  // the odd activation row: R x 1 tiles
        NibGemmTile<R, 1, kUnit>(wr, gr, x, t, blocks, k0, k1,
                                 c == nullptr ? nullptr : c + (t - b) * R * 16, d);
        if (k1 == blocks) {
          for (int r = 0; r < R; ++r) y[t * ld + o + r] = d[r];
        }
      }
    }
    if (c != nullptr) c += kNibGemmRows * kNibGemmActs * 16;
  }
}

// Cache blocking of the nibble GEMM (one byte per column for a decoded weight
// row and for an activation row). The activations go in chunks of rows whose
// one-panel slice stays in L2 (kNibChunkBytes: 128 rows at a full panel); a
// panel of a row group is decoded into L1 and meets every row of the chunk.
// Rows of more than one panel are walked panel-major over a superblock of
// kNibSuperGroups row groups: each panel's activation slice is read from L2 by
// all of the superblock's groups before the next panel, and each group's tile
// accumulators wait in scratch (48 KiB per group at 128 rows). A group's whole
// row against a chunk of whole rows would stream the 33792-column down
// projection's activations from L3 for every group and cut the 12288-column
// rows' chunks to 42 rows (docs/PERFORMANCE-history.md, eleventh prefill
// session). Neither the chunks nor the order change a bit: every (row,
// activation) pair sums its blocks in column order.
constexpr size_t kNibChunkBytes = size_t{512} << 10;
constexpr size_t kNibSuperGroups = 4;

// The GEMM over rows [r0, r1): decode(o, k0, k1, wo, go) writes blocks [k0, k1)
// of row o in the block layout (go: the block factors; unused when kUnit).
template <bool kUnit, class Decode>
void NibGemm(const NibActs& x, size_t batch, size_t blocks, size_t r0, size_t r1, size_t ld,
             float* y, Scratch& s, Decode&& decode) noexcept {
  const size_t panel = std::min(blocks, kNibPanelBlocks);
  const size_t panel_bytes = panel * 8 * 64;
  const size_t chunk = std::max<size_t>(
      kNibChunkBytes / panel_bytes / kNibGemmActs * kNibGemmActs, kNibGemmActs);
  uint8_t* wbuf = Grow(s.wu, kNibGemmRows * panel_bytes);
  float* gbuf = Grow(s.wgs, kNibGemmRows * panel * 16);
  // Carry slots: the superblock's full groups, then its single-row tail.
  const size_t tiles = (std::min(chunk, batch) + kNibGemmActs - 1) / kNibGemmActs;
  const size_t slot = tiles * kNibGemmRows * kNibGemmActs * 16;
  float* carry = blocks > panel ? Grow(s.acc, (kNibSuperGroups + kNibGemmRows) * slot) : nullptr;
  for (size_t b0 = 0; b0 < batch; b0 += chunk) {
    const size_t b1 = std::min(batch, b0 + chunk);
    for (size_t g0 = r0; g0 < r1; g0 += kNibSuperGroups * kNibGemmRows) {
      const size_t g1 = std::min(r1, g0 + kNibSuperGroups * kNibGemmRows);
      for (size_t k0 = 0; k0 < blocks; k0 += panel) {
        const size_t k1 = std::min(blocks, k0 + panel);
        size_t group = 0;
        ForRowBlocks<kNibGemmRows>(g0, g1, [&]<int N>(size_t o) {
          const uint8_t* wr[N];
          const float* gr[N];
          for (int r = 0; r < N; ++r) {
            uint8_t* wo = wbuf + size_t(r) * panel_bytes;
            float* go = gbuf + size_t(r) * panel * 16;
            decode(o + size_t(r), k0, k1, wo, go);
            wr[r] = wo;
            gr[r] = go;
          }
          float* c = carry == nullptr ? nullptr : carry + group++ * slot;
          NibPanelTiles<N, kUnit>(wr, gr, x, b0, b1, blocks, k0, k1, o, ld, y, c);
        });
      }
    }
  }
}

template <WeightFormat F>
void MatMulNibImpl(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1,
                   Scratch& s) noexcept {
  const NibActs acts = PrepareNibActs<F>(x, s);
  if (x.batch == 1) {
    const size_t pf = PrefetchBytes(kPrefetchNibble);
    for (size_t o = r0; o < r1; ++o) y[o] = DotNib1<F>(NibRow<F>(w, o, pf), acts);
    return;
  }
  NibGemm<false>(acts, x.batch, acts.xsg_stride / 16, r0, r1, w.rows, y, s,
                 [&](size_t o, size_t k0, size_t k1, uint8_t* wo, float* go) {
                   NibDecodeRow<F>(w, acts, o, k0, k1, wo, go);
                 });
}

// ---------------------------------------------------------------------------
// int8 IDOT in the nibble kernels' block layout: whole 32-column groups summed
// in int32, 16 groups (512 columns) per float step, lane 4L+m of a block's G
// holding group 4m+L (BlockLaneOrder). Per (row, activation) pair:
// a = fma(cvt(G_k), xs_k, a) over the blocks in column order (xs in block lane
// order; past the row's end G = 0 and xs = 0), then reduce_add(a) * s_row.
// Batch 1 forms G from natural-order dots (sign trick, no correction table);
// the GEMM from the block layout through NibGemmTile with unit weight factors
// (f = xs, as 1 * xs would be), so both give the same bits, whatever the batch. The
// float work is one cvt and one fma per 16 groups instead of per 2 (a cvt +
// permute + fma per dpbusd would bound the GEMM far below the roof).
// These bits are AVX-512's own; avx2/avx2vnni keep theirs (docs/quant.md §3.5).

// Chunk c (64 bytes, natural order) of a block holds groups 2c (128-bit lanes
// 0-1) and 2c+1 (lanes 2-3). in^h_m = lanes h and 2+h of chunks 2m and 2m+1:
// its 128-bit lane L is half h (16 bytes) of group 4m+L.
inline __m512i HalfGroups(__m512i c0, __m512i c1, int h) {
  return h == 0 ? _mm512_shuffle_i32x4(c0, c1, 0x88) : _mm512_shuffle_i32x4(c0, c1, 0xDD);
}

// The 8 natural chunks of a block -> the 8 chunk vectors of the block layout
// (vector 4h+j, lane 4L+m = bytes 16h+4j..16h+4j+3 of group 4m+L).
inline void I8BlockPieces(const __m512i c[8], __m512i out[8]) {
  for (int h = 0; h < 2; ++h) {
    const __m512i in[4] = {HalfGroups(c[0], c[1], h), HalfGroups(c[2], c[3], h),
                           HalfGroups(c[4], c[5], h), HalfGroups(c[6], c[7], h)};
    Transpose4(in, out + 4 * h);
  }
}

// Chunk c of block k of an n-column int8 row (zero past the end).
inline __m512i I8Chunk(const int8_t* q, size_t n, size_t k, int c) {
  const size_t col = k * 512 + size_t(c) * 64;
  if (col >= n) return _mm512_setzero_si512();
  return n - col >= 64 ? _mm512_loadu_si512(q + col) : _mm512_maskz_loadu_epi8(0xffffffffull, q + col);
}

// The block's 16 activation factors in block lane order.
inline __m512 I8BlockScales(const float* xs, size_t groups, size_t k) {
  const size_t g0 = k * 16, ng = groups - g0 >= 16 ? 16 : groups - g0;
  return _mm512_permutexvar_ps(BlockLaneOrder(), _mm512_maskz_loadu_ps(TailMask16(ng), xs + g0));
}

// Batch 1: one row against one activation row (natural order, sign trick).
float DotI8Blocks1(const uint8_t* row, size_t n, const int8_t* q, const float* xs,
                   size_t pf) noexcept {
  const size_t groups = n / kActGroup;
  const size_t blocks = (n + 511) / 512;
  __m512 a = _mm512_setzero_ps();
  for (size_t k = 0; k < blocks; ++k) {
    __m512i d[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const size_t col = k * 512 + size_t(c) * 64;
      if (col >= n) {
        d[c] = _mm512_setzero_si512();
        continue;
      }
      if (pf != 0) PrefetchLine(row + col, pf);
      const bool full = n - col >= 64;
      const __m512i wv = full ? _mm512_loadu_si512(row + col)
                              : _mm512_maskz_loadu_epi8(0xffffffffull, row + col);
      const __m512i x = full ? _mm512_loadu_si512(q + col)
                             : _mm512_maskz_loadu_epi8(0xffffffffull, q + col);
      const __m512i xs_w = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(wv), _mm512_setzero_si512(), x);
      d[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(wv), xs_w);
    }
    __m512i e[4];
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
      e[m] = _mm512_add_epi32(HalfGroups(d[2 * m], d[2 * m + 1], 0),
                              HalfGroups(d[2 * m], d[2 * m + 1], 1));
    }
    const __m512i g = SumLanes4(e[0], e[1], e[2], e[3]);
    a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(g), I8BlockScales(xs, groups, k), a);
  }
  return _mm512_reduce_add_ps(a);
}

// The GEMM's activations: per row and block the 8 chunk vectors, -128*Σq per
// group and xs, both in block lane order (the nibble GEMM's NibActs fields).
NibActs PrepareI8Acts(const ActsQ8& x, Scratch& s) noexcept {
  if (s.nib_call == t_call_id && t_call_id != 0) return s.nib;
  s.nib_call = 0;
  const size_t n = x.cols, groups = n / kActGroup, blocks = (n + 511) / 512;
  int8_t* xb = Grow(s.xgb, x.batch * blocks * 8 * 64);
  int32_t* cb = Grow(s.cgb, x.batch * blocks * 16);
  float* fb = Grow(s.fgb, x.batch * blocks * 16);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (size_t r = 0; r < x.batch; ++r) {
    const int8_t* q = x.q.data() + r * n;
    const float* xs = x.scales.data() + r * groups;
    for (size_t k = 0; k < blocks; ++k) {
      __m512i c[8], v[8];
      for (int j = 0; j < 8; ++j) c[j] = I8Chunk(q, n, k, j);
      I8BlockPieces(c, v);
      const size_t at = NibActBlock(r, k, blocks, x.batch);
      int8_t* out = xb + at * 8 * 64;
      __m512i sum = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        _mm512_store_si512(out + j * 64, v[j]);
        sum = _mm512_dpbusd_epi32(sum, bias, v[j]);
      }
      _mm512_store_si512(cb + at * 16, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
      _mm512_store_ps(fb + at * 16, I8BlockScales(xs, groups, k));
    }
  }
  s.nib = NibActs{nullptr, nullptr, nullptr, 0, blocks * 16, xb, cb, fb, x.batch};
  s.nib_call = t_call_id;
  return s.nib;
}

// Blocks [k0, k1) of weight row o into the block layout, biased to unsigned
// bytes (w ^ 0x80).
void I8DecodeRow(const WeightView& w, size_t o, size_t k0, size_t k1, uint8_t* wo) noexcept {
  const size_t n = w.cols;
  const int8_t* q = static_cast<const int8_t*>(w.data) + o * n;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const size_t pf = GemmDecodePrefetch(n);
  for (size_t k = k0; k < k1; ++k) {
    __m512i c[8], v[8];
    for (int j = 0; j < 8; ++j) {
      if (pf != 0) PrefetchLine(q + k * 512 + size_t(j) * 64, pf);
      c[j] = _mm512_xor_si512(I8Chunk(q, n, k, j), flip);
    }
    I8BlockPieces(c, v);
    for (int j = 0; j < 8; ++j) _mm512_store_si512(wo + ((k - k0) * 8 + j) * 64, v[j]);
  }
}

void MatMulI8Blocks(const WeightView& w, const ActsQ8& x, float* y, size_t r0, size_t r1,
                    Scratch& s) noexcept {
  const size_t n = w.cols;
  if (x.batch == 1) {
    const size_t pf = PrefetchBytes();
    for (size_t o = r0; o < r1; ++o) {
      y[o] = DotI8Blocks1(RowBytes<WeightFormat::kInt8>(w, o), n, x.q.data(), x.scales.data(), pf) *
             w.scales[o];
    }
    return;
  }
  const NibActs acts = PrepareI8Acts(x, s);
  NibGemm<true>(acts, x.batch, acts.xsg_stride / 16, r0, r1, w.rows, y, s,
                [&](size_t o, size_t k0, size_t k1, uint8_t* wo, float*) {
                  I8DecodeRow(w, o, k0, k1, wo);
                });
  for (size_t b = 0; b < x.batch; ++b) {
    for (size_t o = r0; o < r1; ++o) y[b * w.rows + o] *= w.scales[o];
  }
}

void MatMulQ8Avx512(const WeightView& w, const ActsQ8& x, float* y, size_t r0,
                    size_t r1) noexcept {
  Scratch& s = Tls();
  switch (w.format) {
    case WeightFormat::kInt8:
      return MatMulI8Blocks(w, x, y, r0, r1, s);
    case WeightFormat::kInt4G64:
      return MatMulNibImpl<WeightFormat::kInt4G64>(w, x, y, r0, r1, s);
    case WeightFormat::kMxfp4:
      return MatMulNibImpl<WeightFormat::kMxfp4>(w, x, y, r0, r1, s);
    case WeightFormat::kF32:
      return;
  }
}

// Signed weight bytes for AddRow (natural column order).
inline __m512i WeightBytes64(const WeightView& w, size_t o, size_t c, bool half) {
  if (w.format == WeightFormat::kMxfp4) {
    return _mm512_sub_epi8(
        WeightBytesU<WeightFormat::kMxfp4>(RowBytes<WeightFormat::kMxfp4>(w, o), c, half),
        _mm512_set1_epi8(12));
  }
  return _mm512_sub_epi8(
      WeightBytesU<WeightFormat::kInt4G64>(RowBytes<WeightFormat::kInt4G64>(w, o), c, half),
      _mm512_set1_epi8(8));
}

// ---------------------------------------------------------------------------
// AddRow: acc[i] += k_i * w_i with one FMA per element (natural column order).

// The columns [from, cols) of an f32 or int8 row past its last whole vector:
// acc[i] = fma(k, w_i, acc[i]), k = c for f32 and c * scale for int8.
void AddRowTail(const WeightView& w, size_t row, float k, float* acc, size_t from) noexcept {
  const size_t n = w.cols;
  if (w.format == WeightFormat::kF32) {
    const float* r = static_cast<const float*>(w.data) + row * n;
    for (size_t i = from; i < n; ++i) acc[i] = std::fma(k, r[i], acc[i]);
  } else {
    const int8_t* q = static_cast<const int8_t*>(w.data) + row * n;
    for (size_t i = from; i < n; ++i) acc[i] = std::fma(k, static_cast<float>(q[i]), acc[i]);
  }
}

void AddRowAvx512(const WeightView& w, size_t row, float c, float* acc) noexcept {
  const size_t n = w.cols;
  if (w.format == WeightFormat::kF32) {
    const float* r = static_cast<const float*>(w.data) + row * n;
    const __m512 cv = _mm512_set1_ps(c);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(acc + i,
                       _mm512_fmadd_ps(cv, _mm512_loadu_ps(r + i), _mm512_loadu_ps(acc + i)));
    }
    AddRowTail(w, row, c, acc, i);
    return;
  }
  if (w.format == WeightFormat::kInt8) {
    const int8_t* q = static_cast<const int8_t*>(w.data) + row * n;
    const float k = c * w.scales[row];
    const __m512 kv = _mm512_set1_ps(k);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 wv = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i))));
      _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(kv, wv, _mm512_loadu_ps(acc + i)));
    }
    AddRowTail(w, row, k, acc, i);
    return;
  }
  // int4 / MXFP4: natural-order bytes 64 columns at a time; per-group coefficient.
  const bool mx = w.format == WeightFormat::kMxfp4;
  const size_t group = mx ? kMxGroup : kInt4Group;
  const float* s4 = mx ? nullptr : w.scales + row * (n / kInt4Group);
  const uint8_t* e = mx ? w.e8m0 + row * (n / kMxGroup) : nullptr;
  for (size_t c0 = 0; c0 < n; c0 += 64) {
    const bool half = c0 + 64 > n;
    alignas(64) int8_t bytes[64];
    _mm512_store_si512(bytes, WeightBytes64(w, row, c0, half));
    for (size_t j = 0; j < (half ? 2u : 4u); ++j) {
      const size_t i = c0 + 16 * j;
      const size_t g = i / group;
      // MXFP4 bytes are doubled codes: fold the 0.5 into the coefficient (exact).
      const float k = mx ? c * (std::bit_cast<float>(uint32_t{e[g]} << 23) * 0.5f) : c * s4[g];
      const __m512 wv = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes + 16 * j))));
      _mm512_storeu_ps(acc + i,
                       _mm512_fmadd_ps(_mm512_set1_ps(k), wv, _mm512_loadu_ps(acc + i)));
    }
  }
}

// ---------------------------------------------------------------------------
// Quantizers. Bit-exact with the scalar ones: absmax is a max (order-free;
// vmaxps(a, m) returns m when a is NaN, i.e. NaNs are skipped like the scalar
// `if (a > am)`), the scale and its inverse are computed by the same scalar f32
// code, x*inv is one IEEE multiply either way, and vcvtps2dq rounds to nearest
// even under the default MXCSR exactly as lrintf does; |x*inv| <= qmax*(1+2^-23)
// by construction, and NaN gives INT_MIN in both, which the clamp sends to lo.

inline __m512 AbsPs(__m512 v) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

// max |x_i| over n floats (any n).
inline float AbsMaxPs(const float* x, size_t n) {
  __m512 m = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(AbsPs(_mm512_loadu_ps(x + i)), m);
  if (i < n) m = _mm512_max_ps(AbsPs(_mm512_maskz_loadu_ps(TailMask16(n - i), x + i)), m);
  return _mm512_reduce_max_ps(m);
}

// The §6.2 scale and inverse from an absmax, exactly as the scalar code.
inline float ScaleFrom(float am, float qmax, float* inv) {
  float s = am / qmax;
  if (s < kMinScale) s = kMinScale;
  *inv = 1.0f / s;
  return s;
}

// clamp(rint(x*inv), lo, hi) for 16 lanes.
inline __m512i RoundClamp16(__m512 x, __m512 inv, int lo, int hi) {
  const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(x, inv));
  return _mm512_min_epi32(_mm512_max_epi32(v, _mm512_set1_epi32(lo)), _mm512_set1_epi32(hi));
}

void QuantizeInt8RowsAvx512(const float* x, size_t rows, size_t cols, int8_t* q,
                            float* scales) noexcept {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float inv;
    scales[r] = ScaleFrom(AbsMaxPs(xr, cols), 127.0f, &inv);
    const __m512 iv = _mm512_set1_ps(inv);
    size_t i = 0;
    for (; i + 16 <= cols; i += 16) {
      const __m512i v = RoundClamp16(_mm512_loadu_ps(xr + i), iv, -127, 127);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + r * cols + i), _mm512_cvtepi32_epi8(v));
    }
    if (i < cols) {
      const __mmask16 m = TailMask16(cols - i);
      const __m512i v = RoundClamp16(_mm512_maskz_loadu_ps(m, xr + i), iv, -127, 127);
      _mm_mask_storeu_epi8(q + r * cols + i, m, _mm512_cvtepi32_epi8(v));
    }
  }
}

// 64 values in [0, 15] (4 x 16 int32 lanes, column order) -> 32 packed bytes,
// low nibble = even column.
inline __m256i PackNibbles64(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
  __m512i b = _mm512_castsi128_si512(_mm512_cvtepi32_epi8(v0));
  b = _mm512_inserti32x4(b, _mm512_cvtepi32_epi8(v1), 1);
  b = _mm512_inserti32x4(b, _mm512_cvtepi32_epi8(v2), 2);
  b = _mm512_inserti32x4(b, _mm512_cvtepi32_epi8(v3), 3);
  // u16 lane j = column 2j (low byte) | column 2j+1 (high byte) -> L | H<<4.
  const __m512i packed16 = _mm512_or_si512(_mm512_and_si512(b, _mm512_set1_epi16(0x000f)),
                                           _mm512_srli_epi16(b, 4));
  return _mm512_cvtepi16_epi8(_mm512_and_si512(packed16, _mm512_set1_epi16(0x00ff)));
}

void QuantizeInt4RowsAvx512(const float* x, size_t rows, size_t cols, uint8_t* packed,
                            float* scales) noexcept {
  const size_t groups = cols / kInt4Group;
  const __m512i k8 = _mm512_set1_epi32(8);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < groups; ++g) {
      const float* xg = x + r * cols + g * kInt4Group;
      float inv;
      scales[r * groups + g] = ScaleFrom(AbsMaxPs(xg, kInt4Group), 7.0f, &inv);
      const __m512 iv = _mm512_set1_ps(inv);
      __m512i v[4];
      for (int k = 0; k < 4; ++k) {
        v[k] = _mm512_add_epi32(RoundClamp16(_mm512_loadu_ps(xg + 16 * k), iv, -8, 7), k8);
      }
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(packed + r * (cols / 2) + g * (kInt4Group / 2)),
          PackNibbles64(v[0], v[1], v[2], v[3]));
    }
  }
}

void DowncastAvx512(const int8_t* q8, const float* s8, size_t rows, size_t cols, uint8_t* packed,
                    float* scales) noexcept {
  const size_t groups = cols / kInt4Group;
  const __m512i k8 = _mm512_set1_epi32(8);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < groups; ++g) {
      const int8_t* qg = q8 + r * cols + g * kInt4Group;
      __m512i w[4];
      __m512i am = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        w[k] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qg + 16 * k)));
        am = _mm512_max_epi32(am, _mm512_abs_epi32(w[k]));
      }
      // §6.7 op for op, in the same scalar f32 code as the reference.
      float s = static_cast<float>(_mm512_reduce_max_epi32(am)) * s8[r] / 7.0f;
      if (s < kMinScale) s = kMinScale;
      const float inv = s8[r] / s;
      scales[r * groups + g] = s;
      const __m512 iv = _mm512_set1_ps(inv);
      for (int k = 0; k < 4; ++k) {
        w[k] = _mm512_add_epi32(RoundClamp16(_mm512_cvtepi32_ps(w[k]), iv, -8, 7), k8);
      }
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(packed + r * (cols / 2) + g * (kInt4Group / 2)),
          PackNibbles64(w[0], w[1], w[2], w[3]));
    }
  }
}

void QuantizeActsAvx512(const float* x, size_t rows, size_t cols, int8_t* q,
                        float* scales) noexcept {
  const size_t groups = cols / kActGroup;
  for (size_t b = 0; b < rows; ++b) {
    for (size_t g = 0; g < groups; ++g) {
      const size_t off = b * cols + g * kActGroup;
      const __m512 x0 = _mm512_loadu_ps(x + off);
      const __m512 x1 = _mm512_loadu_ps(x + off + 16);
      const float am = _mm512_reduce_max_ps(_mm512_max_ps(AbsPs(x1), _mm512_max_ps(AbsPs(x0),
                                                                                   _mm512_setzero_ps())));
      float inv;
      scales[b * groups + g] = ScaleFrom(am, 127.0f, &inv);
      const __m512 iv = _mm512_set1_ps(inv);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + off),
                       _mm512_cvtepi32_epi8(RoundClamp16(x0, iv, -127, 127)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + off + 16),
                       _mm512_cvtepi32_epi8(RoundClamp16(x1, iv, -127, 127)));
    }
  }
}

// ---------------------------------------------------------------------------
// Roof loops (roof.h): 16 independent zmm chains (latency 4-5 cycles at up to
// two per cycle needs at least 10), operands in registers.
uint64_t RoofAvx512(RoofOp op, uint64_t iters) noexcept {
  constexpr int kChains = 16;
  if (op == RoofOp::kIdot) {
    __m512i a[kChains];
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) a[j] = _mm512_set1_epi32(j);
    const __m512i u = InReg(_mm512_set1_epi8(3));
    const __m512i v = InReg(_mm512_set1_epi8(-5));
    for (uint64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
      for (int j = 0; j < kChains; ++j) a[j] = _mm512_dpbusd_epi32(a[j], u, v);
    }
    __m512i t = a[0];
#pragma GCC unroll 16
    for (int j = 1; j < kChains; ++j) t = _mm512_add_epi32(t, a[j]);
    volatile int sink = _mm512_reduce_add_epi32(t);
    (void)sink;
    return iters * kChains * 64;
  }
  __m512 a[kChains];
#pragma GCC unroll 16
  for (int j = 0; j < kChains; ++j) a[j] = _mm512_set1_ps(float(j));
  const __m512 m = InReg(_mm512_set1_ps(0.999f));
  const __m512 c = InReg(_mm512_set1_ps(1e-3f));
  for (uint64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) a[j] = _mm512_fmadd_ps(a[j], m, c);
  }
  __m512 t = a[0];
#pragma GCC unroll 16
  for (int j = 1; j < kChains; ++j) t = _mm512_add_ps(t, a[j]);
  volatile float sink = _mm512_reduce_add_ps(t);
  (void)sink;
  return iters * kChains * 16;
}

// AddRows: tiles of T tokens x V 16-column vectors in registers; per row, the
// V weight vectors are loaded (int8: widened and converted) once for the T
// tokens, and each accumulator takes fma(k, w, acc) in row order -- AddRow's
// operation (k = c, or c * scale for int8), so the bits of the AddRow loop.
//
// f32 rows (MLA's weighted latent sum) also take 6-token tiles: 24
// accumulators per row's 4 vectors where 4 tokens had 16, so a third fewer
// loads and broadcasts per FMA. (The token loops unroll 8: unrolled by 4, a
// 6-token tile kept its accumulators on the stack.)
template <int T, int V, bool kF32Rows>
void AddRowsTileOf(const WeightView& w, size_t row0, size_t nrows, const float* coef, size_t coef_ld,
                   float* acc, size_t acc_ld, size_t c0) noexcept {
  __m512 a[T][V];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) a[t][v] = _mm512_loadu_ps(acc + size_t(t) * acc_ld + c0 + size_t(v) * 16);
  }
  const size_t n = w.cols;
  constexpr bool f32 = kF32Rows;
  for (size_t j = 0; j < nrows; ++j) {
    const size_t row = row0 + j;
    __m512 wv[V];
    if constexpr (f32) {
      const float* r = static_cast<const float*>(w.data) + row * n + c0;
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_ps(r + v * 16);
    } else {
      const int8_t* q = static_cast<const int8_t*>(w.data) + row * n + c0;
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        wv[v] = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + v * 16))));
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const float c = coef[size_t(t) * coef_ld + j];
      const __m512 kv = _mm512_set1_ps(f32 ? c : c * w.scales[row]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) a[t][v] = _mm512_fmadd_ps(kv, wv[v], a[t][v]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc + size_t(t) * acc_ld + c0 + size_t(v) * 16, a[t][v]);
  }
}

template <int T, int V>
void AddRowsTile(const WeightView& w, size_t row0, size_t nrows, const float* coef, size_t coef_ld,
                 float* acc, size_t acc_ld, size_t c0) noexcept {
  if (w.format == WeightFormat::kF32) {
    AddRowsTileOf<T, V, true>(w, row0, nrows, coef, coef_ld, acc, acc_ld, c0);
  } else if constexpr (T <= 4) {  // 6-token tiles are f32 only (AddRowsAvx512)
    AddRowsTileOf<T, V, false>(w, row0, nrows, coef, coef_ld, acc, acc_ld, c0);
  }
}

template <int T>
void AddRowsTokens(const WeightView& w, size_t row0, size_t nrows, const float* coef, size_t coef_ld,
                   float* acc, size_t acc_ld) noexcept {
  const size_t n = w.cols;
  size_t c0 = 0;
  for (; c0 + 64 <= n; c0 += 64) AddRowsTile<T, 4>(w, row0, nrows, coef, coef_ld, acc, acc_ld, c0);
  for (; c0 + 16 <= n; c0 += 16) AddRowsTile<T, 1>(w, row0, nrows, coef, coef_ld, acc, acc_ld, c0);
  if (c0 == n) return;
  // The columns past the last whole vector: AddRowAvx512's scalar tail.
  const bool f32 = w.format == WeightFormat::kF32;
  for (int t = 0; t < T; ++t) {
    for (size_t j = 0; j < nrows; ++j) {
      const float c = coef[size_t(t) * coef_ld + j];
      AddRowTail(w, row0 + j, f32 ? c : c * w.scales[row0 + j], acc + size_t(t) * acc_ld, c0);
    }
  }
}

void AddRowsAvx512(const WeightView& w, size_t row0, size_t nrows, const float* coef, size_t coef_ld,
                   size_t tokens, float* acc, size_t acc_ld) noexcept {
  if (w.format != WeightFormat::kF32 && w.format != WeightFormat::kInt8) {
    return AddRowsLoop(AddRowAvx512, w, row0, nrows, coef, coef_ld, tokens, acc, acc_ld);
  }
  size_t t = 0;
  if (w.format == WeightFormat::kF32) {
    for (; t + 6 <= tokens; t += 6) AddRowsTokens<6>(w, row0, nrows, coef + t * coef_ld, coef_ld, acc + t * acc_ld, acc_ld);
  }
  for (; t + 4 <= tokens; t += 4) AddRowsTokens<4>(w, row0, nrows, coef + t * coef_ld, coef_ld, acc + t * acc_ld, acc_ld);
  for (; t < tokens; ++t) AddRowsTokens<1>(w, row0, nrows, coef + t * coef_ld, coef_ld, acc + t * acc_ld, acc_ld);
}

// ---------------------------------------------------------------------------
// MLA's attention scores (attn.h's definition: one FMA chain per pair, the
// first part's columns then the second's, then the scale). Keys go in groups
// of 64, transposed by 16 x 16 blocks into kt[c][64] (in L2: 144 KiB at K3's
// 576 columns), so that four vectors of a column hold 64 keys; a 6 x 4 tile
// of accumulators takes each query's column value once as a broadcast. No
// pair needs a horizontal sum (the f32 MatMul's per-pair reduction held MLA's
// 512-column scores near 0.55 of the FMA roof, the 64-column rope part 0.24).
constexpr size_t kScoreGroup = 64;
constexpr int kScoreTileQ = 6;

// Rows r[0..15] (16 floats each) in, their columns out: o[c] = column c.
inline void Transpose16(__m512 r[16]) noexcept {
  __m512 t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + m], 128-bit lane L: column 4L + m of rows 4g .. 4g + 3.
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    const __m512 vlo = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44);
    const __m512 vhi = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
    const __m512 wlo = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44);
    const __m512 whi = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
    r[m] = _mm512_shuffle_f32x4(vlo, wlo, 0x88);
    r[4 + m] = _mm512_shuffle_f32x4(vlo, wlo, 0xDD);
    r[8 + m] = _mm512_shuffle_f32x4(vhi, whi, 0x88);
    r[12 + m] = _mm512_shuffle_f32x4(vhi, whi, 0xDD);
  }
}

// Columns [0, d) of keys j0 .. j0 + n - 1 (rows of `d` floats) into
// kt[(c0 + c) * 64 + lane0 + l]; missing keys are zero.
void ScoreTransposePart(const float* k, size_t d, size_t j0, size_t n, size_t c0, size_t lane0,
                        float* kt) noexcept {
  for (size_t b = 0; b < kScoreGroup; b += 16) {
    for (size_t c = 0; c < d; c += 16) {
      const size_t w = d - c < 16 ? d - c : 16;
      const __mmask16 m = TailMask16(w);
      __m512 r[16];
#pragma GCC unroll 16
      for (size_t l = 0; l < 16; ++l) {
        r[l] = b + l < n ? _mm512_maskz_loadu_ps(m, k + (j0 + b + l) * d + c) : _mm512_setzero_ps();
      }
      Transpose16(r);
      for (size_t i = 0; i < w; ++i) _mm512_store_ps(kt + (c0 + c + i) * kScoreGroup + lane0 + b, r[i]);
    }
  }
}

template <int R>
void ScoreTile(const float* qa, size_t da, const float* qb, size_t db, const float* kt, size_t n,
               float scale, float* s, size_t s_ld) noexcept {
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  auto part = [&](const float* q, size_t d, const float* k) {
    for (size_t c = 0; c < d; ++c) {
      const float* kc = k + c * kScoreGroup;
      const __m512 k0 = _mm512_load_ps(kc), k1 = _mm512_load_ps(kc + 16), k2 = _mm512_load_ps(kc + 32),
                   k3 = _mm512_load_ps(kc + 48);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 a = _mm512_set1_ps(q[size_t(r) * d + c]);
        acc[r][0] = _mm512_fmadd_ps(a, k0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(a, k1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(a, k2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(a, k3, acc[r][3]);
      }
    }
  };
  part(qa, da, kt);
  if (db > 0) part(qb, db, kt + da * kScoreGroup);
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* out = s + size_t(r) * s_ld;
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const size_t l0 = size_t(v) * 16;
      if (l0 >= n) break;
      _mm512_mask_storeu_ps(out + l0, TailMask16(n - l0 < 16 ? n - l0 : 16), _mm512_mul_ps(acc[r][v], sc));
    }
  }
}

void AttnScoresAvx512(const float* qa, const float* ka, size_t da, const float* qb, const float* kb,
                      size_t db, size_t nq, size_t j0, size_t j1, float scale, float* s, size_t s_ld,
                      float* kt) noexcept {
  for (size_t p = j0; p < j1; p += kScoreGroup) {
    const size_t n = j1 - p < kScoreGroup ? j1 - p : kScoreGroup;
    ScoreTransposePart(ka, da, p, n, 0, 0, kt);
    if (db > 0) ScoreTransposePart(kb, db, p, n, da, 0, kt);
    size_t q = 0;
    for (; q + kScoreTileQ <= nq; q += kScoreTileQ) {
      ScoreTile<kScoreTileQ>(qa + q * da, da, qb + q * db, db, kt, n, scale, s + q * s_ld + p, s_ld);
    }
    const size_t left = nq - q;
    const float *qa1 = qa + q * da, *qb1 = qb + q * db;
    float* s1 = s + q * s_ld + p;
    switch (left) {
      case 5: ScoreTile<5>(qa1, da, qb1, db, kt, n, scale, s1, s_ld); break;
      case 4: ScoreTile<4>(qa1, da, qb1, db, kt, n, scale, s1, s_ld); break;
      case 3: ScoreTile<3>(qa1, da, qb1, db, kt, n, scale, s1, s_ld); break;
      case 2: ScoreTile<2>(qa1, da, qb1, db, kt, n, scale, s1, s_ld); break;
      case 1: ScoreTile<1>(qa1, da, qb1, db, kt, n, scale, s1, s_ld); break;
      default: break;
    }
  }
}

// DotSumSquaresScalar's lanes: element i in lane i % 16, lanes 0-7 in the
// low accumulator, 8-15 in the high one; the fold is the scalar tree.
void DotSumSquaresAvx512(const float* x, const float* w, size_t n, double* dot, double* ss) noexcept {
  __m512d d0 = _mm512_setzero_pd(), d1 = d0, q0 = d0, q1 = d0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512d x0 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    const __m512d x1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    d0 = _mm512_add_pd(d0, _mm512_mul_pd(x0, _mm512_cvtps_pd(_mm256_loadu_ps(w + i))));
    d1 = _mm512_add_pd(d1, _mm512_mul_pd(x1, _mm512_cvtps_pd(_mm256_loadu_ps(w + i + 8))));
    q0 = _mm512_add_pd(q0, _mm512_mul_pd(x0, x0));
    q1 = _mm512_add_pd(q1, _mm512_mul_pd(x1, x1));
  }
  auto fold = [](__m512d a, __m512d b) {
    const __m512d s8 = _mm512_add_pd(a, b);                                                  // j + (j+8)
    const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));  // + (j+4)
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));     // + (j+2)
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));                           // + (j+1)
  };
  DotSumSquaresTail(x, w, i, n, fold(d0, d1), fold(q0, q1), dot, ss);
}

constexpr KernelTable kAvx512Table = {Isa::kAvx512,           MatMulAvx512,
                                      MatMulQ8Avx512,         RowDotAvx512,
                                      AddRowAvx512,           QuantizeInt8RowsAvx512,
                                      QuantizeInt4RowsAvx512, DowncastAvx512,
                                      QuantizeActsAvx512,     RoofAvx512,
                                      AddRowsAvx512,          DotSumSquaresAvx512,
                                      SituGluLoop,            KdaDecayLoop,
                                      KdaUpdateLoop,          SoftmaxLoop,
                                      AttnScoresAvx512};

}  // namespace

const KernelTable& Avx512Kernels() noexcept { return kAvx512Table; }

}  // namespace k3::quant::internal
