// k3-bench mix: the nibble/int8 IDOT GEMM's instruction mix on this core
// (docs/PERFORMANCE.md, "Kernels, batched"). The GEMM tile
// (kernels_avx512.cc NibGemmTile) runs, per 512-column block and (row,
// activation) pair, 8 vpdpbusd and then one cvt + mul + fma (int8: cvt + fma).
// This measures vpdpbusd throughput alone and with that float work at the same
// ratio, interleaved (after every 16 vpdpbusd) or grouped (after every 64), in
// registers only: no loads, no dependency chain shorter than the pipes need.
// It says how much of the vpdpbusd roof the tile's arithmetic alone allows.
//
// AVX2 without VNNI (kernels_avx2.cc TileT) has its own mix, per (row,
// activation) pair and set of eight groups (256 columns): nibbles 4 x (2
// maddubs + add16 + madd + add), int8 8 x (sign + maddubs + madd + add), then
// cvt + mul + fma (int8: cvt + fma). Its roof is RoofAvx2's sequence (maddubs +
// madd + add per 32 multiply-adds); the shares are multiply-add rates over that
// roof's, and the nibble one can pass 1 (three multiplies per 64 products
// where the roof has four).
#if defined(__x86_64__)

// GCC 12's AVX-512 headers start some conversions from an "undefined" vector,
// which -Wmaybe-uninitialized reports once they are inlined into a function
// with a target attribute (the kernel files get -mavx512* per file instead).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/sys.h"
#include "k3/quant/isa.h"

namespace k3::bench {
namespace {

#define K3_MIX_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni"), noinline))

enum MixMode : int { kIdotOnly = 0, kInterleaved = 1, kGrouped = 2 };

// One round: 64 vpdpbusd over 16 chains and (unless kIdotOnly) 8 pairs' float
// work, i.e. one float step per 8 vpdpbusd of a chain, as in the tile.
template <int kMode, bool kMul>
K3_MIX_TARGET double MixRate(long rounds, float* sink) {
  __m512i a0 = _mm512_set1_epi32(1), a1 = _mm512_set1_epi32(2), a2 = _mm512_set1_epi32(3),
          a3 = _mm512_set1_epi32(4), a4 = _mm512_set1_epi32(5), a5 = _mm512_set1_epi32(6),
          a6 = _mm512_set1_epi32(7), a7 = _mm512_set1_epi32(8), a8 = _mm512_set1_epi32(9),
          a9 = _mm512_set1_epi32(10), a10 = _mm512_set1_epi32(11), a11 = _mm512_set1_epi32(12),
          a12 = _mm512_set1_epi32(13), a13 = _mm512_set1_epi32(14), a14 = _mm512_set1_epi32(15),
          a15 = _mm512_set1_epi32(16);
  __m512 f0 = _mm512_set1_ps(1), f1 = _mm512_set1_ps(2), f2 = _mm512_set1_ps(3), f3 = _mm512_set1_ps(4);
  const __m512 s = _mm512_set1_ps(1.0001f);
  const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
#define K3_D16                                                                              \
  a0 = _mm512_dpbusd_epi32(a0, w, x); a1 = _mm512_dpbusd_epi32(a1, w, x);                   \
  a2 = _mm512_dpbusd_epi32(a2, w, x); a3 = _mm512_dpbusd_epi32(a3, w, x);                   \
  a4 = _mm512_dpbusd_epi32(a4, w, x); a5 = _mm512_dpbusd_epi32(a5, w, x);                   \
  a6 = _mm512_dpbusd_epi32(a6, w, x); a7 = _mm512_dpbusd_epi32(a7, w, x);                   \
  a8 = _mm512_dpbusd_epi32(a8, w, x); a9 = _mm512_dpbusd_epi32(a9, w, x);                   \
  a10 = _mm512_dpbusd_epi32(a10, w, x); a11 = _mm512_dpbusd_epi32(a11, w, x);               \
  a12 = _mm512_dpbusd_epi32(a12, w, x); a13 = _mm512_dpbusd_epi32(a13, w, x);               \
  a14 = _mm512_dpbusd_epi32(a14, w, x); a15 = _mm512_dpbusd_epi32(a15, w, x);
  // The factor's multiply takes a value of this step (in the tile both of its
  // operands are loaded), so it can be neither folded nor hoisted.
#define K3_F2(fa, fb, p, q)                                                                  \
  {                                                                                          \
    const __m512 c = _mm512_cvtepi32_ps(p), d = _mm512_cvtepi32_ps(q);                       \
    fa = _mm512_fmadd_ps(c, kMul ? _mm512_mul_ps(c, s) : s, fa);                             \
    fb = _mm512_fmadd_ps(d, kMul ? _mm512_mul_ps(d, s) : s, fb);                             \
  }
  const double t0 = NowSeconds();
  for (long r = 0; r < rounds; ++r) {
    if constexpr (kMode == kInterleaved) {
      K3_D16 K3_F2(f0, f1, a0, a8) K3_D16 K3_F2(f2, f3, a4, a12)
      K3_D16 K3_F2(f0, f1, a1, a9) K3_D16 K3_F2(f2, f3, a5, a13)
    } else if constexpr (kMode == kGrouped) {
      K3_D16 K3_D16 K3_D16 K3_D16
      K3_F2(f0, f1, a0, a8) K3_F2(f2, f3, a4, a12) K3_F2(f0, f1, a1, a9) K3_F2(f2, f3, a5, a13)
    } else {
      K3_D16 K3_D16 K3_D16 K3_D16
    }
  }
  const double sec = NowSeconds() - t0;
#undef K3_D16
#undef K3_F2
  // Keep every chain live (scalar sums: no reduce intrinsics needed).
  alignas(64) int32_t ti[16];
  alignas(64) float tf[16];
  const __m512i t = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                       _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7))),
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)),
                       _mm512_add_epi32(_mm512_add_epi32(a12, a13), _mm512_add_epi32(a14, a15))));
  _mm512_store_si512(ti, t);
  _mm512_store_ps(tf, _mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, f3)));
  for (int i = 0; i < 16; ++i) *sink += tf[i] + static_cast<float>(ti[i]);
  return static_cast<double>(rounds) * 64.0 / sec / 1e9;  // G vpdpbusd / s
}

struct MixArgs {
  int reps = 5;
  double seconds = 0.3;  // per measurement
};

// rate(rounds) -> a rate: the round count calibrated (from `rounds`, times 4)
// to about a.seconds, then the median of a.reps.
template <typename Rate>
double CalibratedMedian(const MixArgs& a, long rounds, Rate&& rate) {
  for (;;) {
    const double t0 = NowSeconds();
    rate(rounds);
    if (NowSeconds() - t0 > a.seconds / 4 || rounds > (1L << 40)) break;
    rounds *= 4;
  }
  std::vector<double> r;
  for (int i = 0; i < a.reps; ++i) r.push_back(rate(rounds));
  return Median(r);
}

template <int kMode, bool kMul>
double MedianRate(const MixArgs& a, float* sink) {
  return CalibratedMedian(a, 1 << 16, [&](long n) { return MixRate<kMode, kMul>(n, sink); });
}

bool HasMixIsa() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
}

// --- AVX2 (no VNNI) -----------------------------------------------------------
#define K3_MIX2_TARGET __attribute__((target("avx2,fma"), noinline))

enum Mix2 : int { kRoof2 = 0, kNib2 = 1, kInt82 = 2 };

// Multiply-adds per second of `kMix` on kChains chains, each chain's
// accumulator feeding its own multiplies (nothing to hoist), the float step
// after every set (kFloat) or never.
template <int kMix, bool kFloat>
K3_MIX2_TARGET double Mix2Rate(long rounds, float* sink) {
  constexpr int kChains = kMix == kNib2 ? 6 : 8;
  __m256i a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = _mm256_set1_epi32(j + 1);
  __m256 f0 = _mm256_set1_ps(1), f1 = _mm256_set1_ps(2);
  __m256i x = _mm256_set1_epi8(5), y = _mm256_set1_epi8(-3);
  __m256 s = _mm256_set1_ps(1.0001f);
  __m256i ones = _mm256_set1_epi16(1);
  __asm__("" : "+x"(x), "+x"(y), "+x"(s), "+x"(ones));
  const __m256i ax = _mm256_abs_epi8(x);
  const double t0 = NowSeconds();
  for (long r = 0; r < rounds; ++r) {
    // One set per chain: 256 multiply-adds each.
    constexpr int kSteps = kMix == kNib2 ? 4 : 8;
#pragma GCC unroll 8
    for (int t = 0; t < kSteps; ++t) {
#pragma GCC unroll 8
      for (int j = 0; j < kChains; ++j) {
        if constexpr (kMix == kNib2) {
          const __m256i p =
              _mm256_add_epi16(_mm256_maddubs_epi16(a[j], x), _mm256_maddubs_epi16(a[j], y));
          a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(p, ones));
        } else if constexpr (kMix == kInt82) {
          const __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(a[j], x));
          a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(p, ones));
        } else {
          // The roof: 32 multiply-adds per sequence, so two per 64.
          a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a[j], x), ones));
          a[j] = _mm256_add_epi32(a[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a[j], y), ones));
        }
      }
    }
    if constexpr (kFloat) {
#pragma GCC unroll 8
      for (int j = 0; j < kChains; ++j) {
        const __m256 c = _mm256_cvtepi32_ps(a[j]);
        __m256& fa = j % 2 == 0 ? f0 : f1;
        fa = _mm256_fmadd_ps(c, kMix == kNib2 ? _mm256_mul_ps(c, s) : s, fa);
      }
    }
  }
  const double sec = NowSeconds() - t0;
  alignas(32) int32_t ti[8];
  alignas(32) float tf[8];
  __m256i t = a[0];
  for (int j = 1; j < kChains; ++j) t = _mm256_add_epi32(t, a[j]);
  _mm256_store_si256(reinterpret_cast<__m256i*>(ti), t);
  _mm256_store_ps(tf, _mm256_add_ps(f0, f1));
  for (int i = 0; i < 8; ++i) *sink += tf[i] + static_cast<float>(ti[i]);
  const double macs_per_round = kMix == kRoof2 ? 8.0 * 64 * kChains : 256.0 * kChains;
  return static_cast<double>(rounds) * macs_per_round / sec / 1e9;  // GMAC/s
}

template <int kMix, bool kFloat>
double Median2(const MixArgs& a, float* sink) {
  return CalibratedMedian(a, 1 << 12, [&](long n) { return Mix2Rate<kMix, kFloat>(n, sink); });
}

bool HasMix2Isa() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

struct Mix2Rates {
  double roof = 0, nib = 0, nib_float = 0, int8 = 0, int8_float = 0;
  float sink = 0;
};
Mix2Rates MeasureRates2(const MixArgs& a) {
  Mix2Rates r;
  r.roof = Median2<kRoof2, false>(a, &r.sink);
  r.nib = Median2<kNib2, false>(a, &r.sink);
  r.nib_float = Median2<kNib2, true>(a, &r.sink);
  r.int8 = Median2<kInt82, false>(a, &r.sink);
  r.int8_float = Median2<kInt82, true>(a, &r.sink);
  return r;
}

// Which tile the dispatched kernels run: the AVX-512 or the AVX2 mix, or none.
enum class MixKind { kNone, kAvx512, kAvx2 };
MixKind ActiveMix() {
  switch (quant::ActiveIsa()) {
    case quant::Isa::kAvx512:
      return HasMixIsa() ? MixKind::kAvx512 : MixKind::kNone;
    case quant::Isa::kAvx2:
      return HasMix2Isa() ? MixKind::kAvx2 : MixKind::kNone;
    default:
      return MixKind::kNone;
  }
}

// G vpdpbusd/s of every mix, medians of a.reps (`sink` keeps the chains live).
struct MixRates {
  double only = 0, inter = 0, grouped = 0, inter8 = 0, grouped8 = 0;
  float sink = 0;
};
MixRates MeasureRates(const MixArgs& a) {
  MixRates r;
  r.only = MedianRate<kIdotOnly, false>(a, &r.sink);
  r.inter = MedianRate<kInterleaved, true>(a, &r.sink);
  r.grouped = MedianRate<kGrouped, true>(a, &r.sink);
  r.inter8 = MedianRate<kInterleaved, false>(a, &r.sink);
  r.grouped8 = MedianRate<kGrouped, false>(a, &r.sink);
  return r;
}

void RunMix2(const MixArgs& a) {
  const Mix2Rates m = MeasureRates2(a);
  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "mix");
  j.Field("isa", "avx2");
  j.Field("cpu", CpuModel());
  j.Field("git", SourceRevision());
  j.Field("threads", int64_t{1});
  j.Field("roof_gmacs", m.roof);
  j.Field("nibble_gmacs", m.nib);
  j.Field("nibble_float_gmacs", m.nib_float);
  j.Field("int8_gmacs", m.int8);
  j.Field("int8_float_gmacs", m.int8_float);
  j.Field("nibble_share", m.nib / m.roof);
  j.Field("nibble_float_share", m.nib_float / m.roof);
  j.Field("int8_share", m.int8 / m.roof);
  j.Field("int8_float_share", m.int8_float / m.roof);
  j.Field("sink", double(m.sink));
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
}

void RunMix(const MixArgs& a) {
  if (ActiveMix() == MixKind::kAvx2) return RunMix2(a);
  if (!HasMixIsa()) {
    std::printf(
        "{\"bench\":\"mix\",\"skipped\":\"neither AVX-512 VNNI nor plain AVX2 kernels active\"}\n");
    return;
  }
  const MixRates m = MeasureRates(a);
  const double only = m.only, inter = m.inter, grouped = m.grouped, inter8 = m.inter8, grouped8 = m.grouped8;
  const float sink = m.sink;
  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "mix");
  j.Field("cpu", CpuModel());
  j.Field("git", SourceRevision());
  j.Field("threads", int64_t{1});
  j.Field("idot_only_gops", only);
  j.Field("nibble_interleaved_gops", inter);
  j.Field("nibble_grouped_gops", grouped);
  j.Field("int8_interleaved_gops", inter8);
  j.Field("int8_grouped_gops", grouped8);
  j.Field("nibble_interleaved_share", inter / only);
  j.Field("nibble_grouped_share", grouped / only);
  j.Field("int8_interleaved_share", inter8 / only);
  j.Field("int8_grouped_share", grouped8 / only);
  j.Field("sink", double(sink));
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
}

void SetupMixBench(CLI::App& root) {
  auto args = std::make_shared<MixArgs>();
  CLI::App* cmd = root.add_subcommand(
      "mix",
      "the IDOT GEMM tile's instruction mix (AVX-512 VNNI, or AVX2 without VNNI: the active "
      "kernels'), "
      "alone and with its per-block float work, against the multiply roof (one thread)");
  cmd->add_option("--reps", args->reps, "timed repetitions per mix (median reported)")->check(CLI::Range(1, 1000));
  cmd->add_option("--seconds", args->seconds, "about this long per repetition")->check(CLI::Range(0.01, 60.0));
  cmd->callback([args] { RunMix(*args); });
}

K3_REGISTER_BENCH(SetupMixBench);

}  // namespace

MixCeiling MeasureMixCeiling(double seconds, int reps) {
  MixCeiling c;
  const MixKind kind = ActiveMix();
  if (kind == MixKind::kAvx2) {
    // The AVX2 tile treats MXFP4 as a nibble format (the factor product per
    // pair); its nibble share can pass 1 (fewer multiplies than the roof).
    const Mix2Rates m = MeasureRates2(MixArgs{reps, seconds});
    c.measured = m.roof > 0;
    c.nibble = c.mxfp4 = m.nib_float / m.roof;
    c.int8 = m.int8_float / m.roof;
    c.isa = "avx2";
    return c;
  }
  if (kind != MixKind::kAvx512) return c;
  const MixRates m = MeasureRates(MixArgs{reps, seconds});
  // A share above 1 would be a timing artefact (the float work adds, never
  // removes, instructions): clamp so the bound never undercuts the roof.
  c.measured = m.only > 0;
  c.nibble = std::min(1.0, std::max(m.inter, m.grouped) / m.only);
  c.int8 = std::min(1.0, std::max(m.inter8, m.grouped8) / m.only);
  // MXFP4's power-of-two weight scale: the int8 float work (cmd_prefill.cc).
  c.mxfp4 = c.int8;
  c.isa = "avx512";
  return c;
}

}  // namespace k3::bench

#else  // !__x86_64__

#include "bench_util.h"

namespace k3::bench {
MixCeiling MeasureMixCeiling(double, int) { return {}; }
}  // namespace k3::bench

#endif  // __x86_64__
