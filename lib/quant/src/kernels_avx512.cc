// AVX-512 (F/BW/VL/DQ + VNNI) kernels. Compiled with per-file -mavx512* flags and
// only reached through the kernel table after CPUID says yes (isa.cc).
//
// Every kernel decodes one weight row into a small per-thread buffer and then runs
// one fixed dot routine per activation row over that buffer, so batch 1 and batch
// N execute the same floating-point operations (determinism contract) while the
// weight row is read from RAM once per chunk.
//
// f32-activation path: lanes hold f32 products, 4 accumulators (chunk/group k goes
// to accumulator k mod 4), summed ((a0+a1)+(a2+a3)) then reduced. For int4/MXFP4
// the nibbles are widened with vpmovzxbd, which puts the even columns of a
// 32-column block in one vector and the odd ones in the other; the activations
// are re-laid out to match once per call (PermuteEvenOdd32).
//
// IDOT path (§6.5): activations are offset to unsigned (xq+128) once per call so
// vpdpbusd can multiply them with signed weights; the per-lane correction
// -128*Σw is the dpbusd's initial value, so every lane's int32 is exact. One zmm
// covers 64 columns = two activation groups (lanes 0-7, 8-15).
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace k3::quant::internal {
namespace {

struct Scratch {
  std::vector<float> xp;       // f32 path: activations in kernel layout [batch][cols]
  std::vector<float> wrow;     // f32 path: decoded row
  std::vector<float> gscale;   // per-group factor of the row
  std::vector<uint8_t> xu;     // IDOT: xq ^ 0x80 [batch][cols]
  std::vector<int8_t> wq;      // IDOT: signed weight bytes, padded to 64
  std::vector<int32_t> corr;   // IDOT: -128*Σw per lane, 16 per 64 columns
};

Scratch& Tls() {
  thread_local Scratch s;
  return s;
}

template <typename T>
T* Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

inline __mmask16 TailMask16(size_t n) { return static_cast<__mmask16>((1u << n) - 1); }

inline float Reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// ---------------------------------------------------------------------------
// f32-activation path

// Σ x·w over n columns (plain layout): 16-column chunk k -> accumulator k & 3.
float DotPlain(const float* w, const float* x, size_t n) noexcept {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                 _mm512_setzero_ps()};
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a[0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), a[0]);
    a[1] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(w + i + 16), a[1]);
    a[2] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(w + i + 32), a[2]);
    a[3] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(w + i + 48), a[3]);
  }
  for (int k = 0; i < n; ++k, i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : TailMask16(n - i);
    a[k] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, w + i), a[k]);
  }
  return Reduce4(a[0], a[1], a[2], a[3]);
}

// MXFP4 over the permuted layout: group g (32 columns = 2 vectors) partial
// p = x_odd*w_odd + x_even*w_even, then acc[g&3] += p * gscale[g].
float DotGroups32(const float* w, const float* x, const float* gs, size_t groups) noexcept {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                 _mm512_setzero_ps()};
  for (size_t g = 0; g < groups; ++g) {
    const float* wg = w + g * 32;
    const float* xg = x + g * 32;
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(xg), _mm512_loadu_ps(wg));
    p = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), _mm512_loadu_ps(wg + 16), p);
    a[g & 3] = _mm512_fmadd_ps(p, _mm512_set1_ps(gs[g]), a[g & 3]);
  }
  return Reduce4(a[0], a[1], a[2], a[3]);
}

// int4-g64 over the permuted layout: two 32-column blocks per group, summed
// pairwise, then scaled.
float DotGroups64(const float* w, const float* x, const float* gs, size_t groups) noexcept {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                 _mm512_setzero_ps()};
  for (size_t g = 0; g < groups; ++g) {
    const float* wg = w + g * 64;
    const float* xg = x + g * 64;
    __m512 p0 = _mm512_mul_ps(_mm512_loadu_ps(xg), _mm512_loadu_ps(wg));
    p0 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), _mm512_loadu_ps(wg + 16), p0);
    __m512 p1 = _mm512_mul_ps(_mm512_loadu_ps(xg + 32), _mm512_loadu_ps(wg + 32));
    p1 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 48), _mm512_loadu_ps(wg + 48), p1);
    a[g & 3] = _mm512_fmadd_ps(_mm512_add_ps(p0, p1), _mm512_set1_ps(gs[g]), a[g & 3]);
  }
  return Reduce4(a[0], a[1], a[2], a[3]);
}

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

// Decodes 16 packed bytes (32 columns) into even/odd f32 vectors via `lut`.
inline void DecodeNibbles16(const uint8_t* p, __m512 lut, float* out) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i lo = _mm512_and_si512(v, _mm512_set1_epi32(15));
  const __m512i hi = _mm512_srli_epi32(v, 4);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(lo, lut));
  _mm512_storeu_ps(out + 16, _mm512_permutexvar_ps(hi, lut));
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

// Decodes row `o` into s.wrow / s.gscale; returns the f32 row to dot with.
const float* DecodeRowF32(const WeightView& w, size_t o, Scratch& s) noexcept {
  const size_t n = w.cols;
  switch (w.format) {
    case WeightFormat::kF32:
      return static_cast<const float*>(w.data) + o * n;
    case WeightFormat::kInt8: {
      float* out = Grow(s.wrow, n);
      const int8_t* q = static_cast<const int8_t*>(w.data) + o * n;
      size_t i = 0;
      for (; i + 16 <= n; i += 16) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i));
        _mm512_storeu_ps(out + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
      }
      for (; i < n; ++i) out[i] = static_cast<float>(q[i]);
      return out;
    }
    case WeightFormat::kInt4G64: {
      float* out = Grow(s.wrow, n);
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + o * (n / 2);
      const __m512 lut = LutI4();
      for (size_t i = 0; i < n; i += 32) DecodeNibbles16(p + i / 2, lut, out + i);
      float* gs = Grow(s.gscale, n / kInt4Group);
      std::memcpy(gs, w.scales + o * (n / kInt4Group), n / kInt4Group * sizeof(float));
      return out;
    }
    case WeightFormat::kMxfp4: {
      float* out = Grow(s.wrow, n);
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + o * (n / 2);
      const __m512 lut = LutMx2();
      for (size_t i = 0; i < n; i += 32) DecodeNibbles16(p + i / 2, lut, out + i);
      MxGroupScales(w.e8m0 + o * (n / kMxGroup), n / kMxGroup, Grow(s.gscale, n / kMxGroup));
      return out;
    }
  }
  return nullptr;
}

// The row's decoded values dotted with one (layout-matched) activation row.
inline float DotDecoded(const WeightView& w, size_t o, const float* wrow, const float* gs,
                        const float* x) noexcept {
  switch (w.format) {
    case WeightFormat::kF32:
      return DotPlain(wrow, x, w.cols);
    case WeightFormat::kInt8:
      return DotPlain(wrow, x, w.cols) * w.scales[o];
    case WeightFormat::kInt4G64:
      return DotGroups64(wrow, x, gs, w.cols / kInt4Group);
    case WeightFormat::kMxfp4:
      return DotGroups32(wrow, x, gs, w.cols / kMxGroup);
  }
  return 0.0f;
}

bool NeedsPermute(WeightFormat f) {
  return f == WeightFormat::kInt4G64 || f == WeightFormat::kMxfp4;
}

// Activations in the kernel's layout (the input itself when no change is needed).
const float* LayoutActs(const WeightView& w, const float* x, size_t batch, Scratch& s) noexcept {
  if (!NeedsPermute(w.format)) return x;
  float* xp = Grow(s.xp, batch * w.cols);
  for (size_t b = 0; b < batch; ++b) PermuteEvenOdd32(x + b * w.cols, w.cols, xp + b * w.cols);
  return xp;
}

void MatMulAvx512(const WeightView& w, const float* x, size_t batch, float* y, size_t r0,
                  size_t r1) noexcept {
  Scratch& s = Tls();
  const float* xl = LayoutActs(w, x, batch, s);
  for (size_t o = r0; o < r1; ++o) {
    const float* wrow = DecodeRowF32(w, o, s);
    for (size_t b = 0; b < batch; ++b) {
      y[b * w.rows + o] = DotDecoded(w, o, wrow, s.gscale.data(), xl + b * w.cols);
    }
  }
}

float RowDotAvx512(const WeightView& w, size_t row, const float* x) noexcept {
  Scratch& s = Tls();
  const float* xl = LayoutActs(w, x, 1, s);
  const float* wrow = DecodeRowF32(w, row, s);
  return DotDecoded(w, row, wrow, s.gscale.data(), xl);
}

// ---------------------------------------------------------------------------
// IDOT path

// 64 packed nibbles -> 64 bytes in column order (low nibble = even column):
// widen bytes to u16 (0x00HL), OR with itself shifted by 4 (0x0HL0) and keep
// 0x0F0F -> bytes L, H.
inline __m512i NibblesToBytes(__m256i packed) {
  const __m512i v = _mm512_cvtepu8_epi16(packed);
  return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(v, 4), _mm512_set1_epi16(0x0F0F), 0xA8);
}

// Signed weight bytes of 64 columns starting at column c (tail: 32 columns, zero-filled).
inline __m512i WeightBytes64(const WeightView& w, size_t o, size_t c, bool half) {
  const size_t n = w.cols;
  switch (w.format) {
    case WeightFormat::kInt8: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + o * n + c;
      return half ? _mm512_maskz_loadu_epi8(0xffffffffull, q) : _mm512_loadu_si512(q);
    }
    case WeightFormat::kInt4G64: {
      // int4 rows are whole 64-column groups, so never half.
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + o * (n / 2) + c / 2;
      const __m512i nib = NibblesToBytes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      return _mm512_sub_epi8(nib, _mm512_set1_epi8(8));
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + o * (n / 2) + c / 2;
      const __m256i raw = half ? _mm256_maskz_loadu_epi8(0xffffu, p)
                               : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2,
                                                               -3, -4, -6, -8, -12));
      // Zero-filled tail bytes decode to code 0 = 0.
      return _mm512_shuffle_epi8(lut, NibblesToBytes(raw));
    }
    case WeightFormat::kF32:
      break;
  }
  return _mm512_setzero_si512();
}

// Decodes row o into s.wq (signed bytes, tail zero-padded to 64), s.corr
// (-128*Σ of each lane's 4 weights) and s.gscale (per 32-group weight factor:
// E8M0*0.5 for MXFP4, the g64 scale for int4, unused for int8).
void DecodeRowQ8(const WeightView& w, size_t o, Scratch& s) noexcept {
  const size_t n = w.cols;
  const size_t chunks = (n + 63) / 64;
  int8_t* wq = Grow(s.wq, chunks * 64);
  int32_t* corr = Grow(s.corr, chunks * 16);
  const __m512i k128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (size_t k = 0; k < chunks; ++k) {
    const bool half = (k + 1) * 64 > n;
    const __m512i v = WeightBytes64(w, o, k * 64, half);
    _mm512_storeu_si512(wq + k * 64, v);
    const __m512i sum128 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k128, v);
    _mm512_storeu_si512(corr + k * 16, _mm512_sub_epi32(_mm512_setzero_si512(), sum128));
  }
  const size_t groups = n / kActGroup;
  float* gs = Grow(s.gscale, groups);
  if (w.format == WeightFormat::kMxfp4) {
    MxGroupScales(w.e8m0 + o * (n / kMxGroup), groups, gs);
  } else if (w.format == WeightFormat::kInt4G64) {
    const float* s4 = w.scales + o * (n / kInt4Group);
    for (size_t g = 0; g < groups; ++g) gs[g] = s4[g / 2];
  }
}

// One activation row against the decoded row. Groups are taken 16 at a time:
// factors f_g = gs_g*xs_g (xs_g alone for int8) are formed in one multiply, and
// pair k's vector [f_2k x8, f_2k+1 x8] is a lane permute of it.
template <bool kInt8>
float DotQ8(const int8_t* wq, const int32_t* corr, const float* gs, const uint8_t* xu,
            const float* xs, size_t groups) noexcept {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                 _mm512_setzero_ps()};
  const __m512i pair_base = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (size_t g0 = 0; g0 < groups; g0 += 16) {
    const size_t ng = groups - g0 >= 16 ? 16 : groups - g0;
    const __mmask16 gm = TailMask16(ng);
    __m512 f16 = _mm512_maskz_loadu_ps(gm, xs + g0);
    if constexpr (!kInt8) f16 = _mm512_mul_ps(_mm512_maskz_loadu_ps(gm, gs + g0), f16);
    const size_t pairs = (ng + 1) / 2;
    for (size_t k = 0; k < pairs; ++k) {
      const size_t c = (g0 + 2 * k) * 32;
      const size_t chunk = c / 64;
      const __m512i x = 2 * k + 1 < ng ? _mm512_loadu_si512(xu + c)
                                       : _mm512_maskz_loadu_epi8(0xffffffffull, xu + c);
      const __m512i d = _mm512_dpbusd_epi32(_mm512_loadu_si512(corr + chunk * 16), x,
                                            _mm512_loadu_si512(wq + c));
      const __m512i idx = _mm512_add_epi32(pair_base, _mm512_set1_epi32(static_cast<int>(2 * k)));
      const __m512 f = _mm512_permutexvar_ps(idx, f16);
      a[k & 3] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), f, a[k & 3]);
    }
  }
  return Reduce4(a[0], a[1], a[2], a[3]);
}

// xq ^ 0x80 = xq + 128 as u8, for the unsigned operand of vpdpbusd.
const uint8_t* OffsetActs(const ActsQ8& x, Scratch& s) noexcept {
  const size_t n = x.batch * x.cols;
  uint8_t* xu = Grow(s.xu, n);
  const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    _mm512_storeu_si512(xu + i, _mm512_xor_si512(_mm512_loadu_si512(x.q.data() + i), k80));
  }
  for (; i < n; ++i) xu[i] = static_cast<uint8_t>(x.q[i]) ^ 0x80;
  return xu;
}

void MatMulQ8Avx512(const WeightView& w, const ActsQ8& x, float* y, size_t r0,
                    size_t r1) noexcept {
  Scratch& s = Tls();
  const uint8_t* xu = OffsetActs(x, s);
  const size_t groups = w.cols / kActGroup;
  const bool int8 = w.format == WeightFormat::kInt8;
  for (size_t o = r0; o < r1; ++o) {
    DecodeRowQ8(w, o, s);
    for (size_t b = 0; b < x.batch; ++b) {
      const uint8_t* xb = xu + b * w.cols;
      const float* xs = x.scales.data() + b * groups;
      y[b * w.rows + o] =
          int8 ? DotQ8<true>(s.wq.data(), s.corr.data(), nullptr, xb, xs, groups) * w.scales[o]
               : DotQ8<false>(s.wq.data(), s.corr.data(), s.gscale.data(), xb, xs, groups);
    }
  }
}

// ---------------------------------------------------------------------------
// AddRow: acc[i] += k_i * w_i with one FMA per element (natural column order).

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
    for (; i < n; ++i) acc[i] = std::fma(c, r[i], acc[i]);
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
    for (; i < n; ++i) acc[i] = std::fma(k, static_cast<float>(q[i]), acc[i]);
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

constexpr KernelTable kAvx512Table = {Isa::kAvx512, MatMulAvx512, MatMulQ8Avx512, RowDotAvx512,
                                      AddRowAvx512};

}  // namespace

const KernelTable& Avx512Kernels() noexcept { return kAvx512Table; }

}  // namespace k3::quant::internal
