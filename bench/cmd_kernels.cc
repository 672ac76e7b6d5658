// `k3-bench kernels`: lib/quant matrix kernels against memory bandwidth measured
// in the same run (decode), OpenBLAS sgemm (batched prefill) and the compute
// roof: the peak of the instruction each path is bound by (quant::RoofLoop:
// vpdpbusd for IDOT, FMA for the f32 path), measured between the kernel passes
// on the same ISA and thread count.
//
// Decode ratios are against plain streaming reads interleaved with the kernel
// passes (R K R K ... K R): each pass against the mean of its two neighbours,
// median and range over the passes reported.
//
// Weight sets are cycled so that each timed repetition streams a working set far
// larger than the caches (like one MoE layer visiting many experts); every
// buffer is written before timing because the first touch of fresh pages in
// these VMs is much slower than a read.
#include <omp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"
#include "k3/quant/isa.h"
#include "k3/quant/quant.h"
#include "k3/quant/roof.h"

#ifdef K3_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace k3::bench {
namespace {

using quant::ActsQ8;

// Look-ahead of the prefetching streaming read (the kernels' default K3_PREFETCH).
constexpr size_t kStreamPrefetchBytes = 4096;
using quant::Isa;
using quant::WeightFormat;
using quant::WeightView;

struct Options {
  bool json = false;
  int reps = 7;
  double ws_mib = 1024;        // decode working set per repetition
  double batch_ws_mib = 96;    // batched working set (compute-bound; caches matter little)
  std::string isas = "avx512,avx2vnni,avx2";
  std::vector<int> threads = {1, 2};
  std::vector<int> batches = {1, 64, 256};
  bool roof = true;
  std::string filter;
  bool quick = false;
  bool sgemm = true;
  std::vector<int> f32_rows = {0};  // decode rows of the f32 path (0: built-in choice)
};

// Plain streaming read: one pass summing 64-bit words, split across `threads`
// like the kernels split rows. Returns seconds. With `prefetch` (bytes) it reads
// with 16-byte loads and also touches the line that far ahead, as the kernels do
// (K3_PREFETCH): on a VM that read can be faster than the plain one, so both
// are reported and the kernels' ratio against each.
double StreamReadPass(const std::vector<uint64_t>& buf, int threads, size_t prefetch = 0) {
  static volatile uint64_t sink = 0;
  const double t0 = NowSeconds();
  uint64_t total = 0;
  const size_t n = buf.size();
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const size_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const size_t b = n * t / nt, e = n * (t + 1) / nt;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#if defined(__SSE2__)
    if (prefetch != 0) {
      // The best plain read found on the dev VM: 16-byte loads into four
      // independent sums, one prefetch per 64-byte line.
      __m128i v0 = _mm_setzero_si128(), v1 = v0, v2 = v0, v3 = v0;
      size_t i = b;
      for (; i + 8 <= e; i += 8) {
        const uint64_t* q = buf.data() + i;
        __builtin_prefetch(reinterpret_cast<const char*>(q) + prefetch, 0, 3);
        v0 = _mm_add_epi64(v0, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
        v1 = _mm_add_epi64(v1, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2)));
        v2 = _mm_add_epi64(v2, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 4)));
        v3 = _mm_add_epi64(v3, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 6)));
      }
      alignas(16) uint64_t lanes[2];
      _mm_store_si128(reinterpret_cast<__m128i*>(lanes),
                      _mm_add_epi64(_mm_add_epi64(v0, v1), _mm_add_epi64(v2, v3)));
      total += lanes[0] + lanes[1];
      for (; i < e; ++i) total += buf[i];
    } else
#endif
    for (size_t i = b; i + 4 <= e; i += 4) {
      s0 += buf[i];
      s1 += buf[i + 1];
      s2 += buf[i + 2];
      s3 += buf[i + 3];
    }
    total += s0 + s1 + s2 + s3;
  }
  sink = sink + total;
  return NowSeconds() - t0;
}

double StreamReadGbps(const std::vector<uint64_t>& buf, int threads, int reps,
                      size_t prefetch = 0) {
  StreamReadPass(buf, threads, prefetch);  // warm
  std::vector<double> secs;
  for (int r = 0; r < reps; ++r) secs.push_back(StreamReadPass(buf, threads, prefetch));
  return double(buf.size() * 8) / Median(secs) / 1e9;
}

// Process CPU seconds (all threads): with wall time it shows how much of the
// requested cores the benchmark really got on a shared machine.
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The compute roof: GMAC/s of the active ISA's peak loop for `op` on `threads`
// threads (int8 products for IDOT, f32 lanes for FMA). Each thread runs slices
// of the loop until it has had 20 ms of CPU time, so a pass is never too short
// to time on a machine whose cores are shared.
struct Roof {
  quant::RoofOp op;
  int threads;
  double last_cpu_gmacs = 0;  // GMAC/s per `threads` CPU-seconds of the last Pass()

  // Wall-clock GMAC/s; last_cpu_gmacs the rate per CPU-second of the threads
  // (times threads), which depends much less on the share of the cores a pass
  // got on a shared machine.
  double Pass() {
    constexpr uint64_t kSlice = 1 << 13;
    uint64_t macs = 0;
    double cpu = 0;
    const quant::RoofOp o = op;
    const double t0 = NowSeconds();
#pragma omp parallel num_threads(threads) reduction(+ : macs, cpu)
    {
      const double c0 = ThreadCpuSeconds();
      double c = 0;
      do {
        macs += quant::RoofLoop(o, kSlice);
        c = ThreadCpuSeconds() - c0;
      } while (c < 0.02);
      cpu += c;
    }
    const double wall = NowSeconds() - t0;
    last_cpu_gmacs = double(macs) / cpu / 1e9 * threads;
    return double(macs) / wall / 1e9;
  }
};

const char* RoofName(quant::RoofOp op) { return op == quant::RoofOp::kIdot ? "idot" : "fma"; }

// One matrix's storage, filled with realistic bytes (MXFP4 scale bytes 112..122
// as real checkpoints hold).
using Matrix = quant::OwnedWeight;

Matrix MakeMatrix(WeightFormat fmt, size_t rows, size_t cols, uint32_t seed) {
  Matrix m{fmt, rows, cols, {}, {}, {}};
  std::mt19937 rng(seed);
  auto fill = [&](std::vector<uint8_t>& v, size_t n, int lo, int hi) {
    v.resize(n);
    std::uniform_int_distribution<int> d(lo, hi);
    for (auto& b : v) b = static_cast<uint8_t>(d(rng));
  };
  switch (fmt) {
    case WeightFormat::kF32: {
      m.data.resize(rows * cols * 4);
      float* f = reinterpret_cast<float*>(m.data.data());
      std::normal_distribution<float> nd(0, 0.02f);
      for (size_t i = 0; i < rows * cols; ++i) f[i] = nd(rng);
      break;
    }
    case WeightFormat::kInt8:
      fill(m.data, rows * cols, 0, 255);
      for (auto& b : m.data) b = b == 0x80 ? 0x81 : b;  // -128 never occurs
      m.scales.assign(rows, 1e-3f);
      break;
    case WeightFormat::kInt4G64:
      fill(m.data, rows * cols / 2, 0, 255);
      m.scales.assign(rows * cols / 64, 1e-2f);
      break;
    case WeightFormat::kMxfp4:
      fill(m.data, rows * cols / 2, 0, 255);
      fill(m.e8m0, rows * cols / 32, 112, 122);
      break;
  }
  return m;
}

struct Shape {
  const char* name;
  WeightFormat fmt;
  size_t rows, cols;
};

const char* FmtName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kInt8: return "int8";
    case WeightFormat::kInt4G64: return "int4g64";
    case WeightFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

struct Context {
  std::string sha, cpu;
  std::vector<double> mem_gbps;  // by thread count
};

// One timed configuration: medians over the repetitions. For decode the plain
// streaming read runs before the first kernel pass, between every two and after
// the last (R K R K ... K R, the prefetching read beside each plain one), so
// each kernel pass has a read on either side; its ratio is against the mean of
// those two adjacent reads, and the median and the range of the per-pass ratios
// are reported (never one sample): on a shared VM the read itself swings by 2x
// from minute to minute.
struct Timing {
  double secs_per_matrix = 0;
  double mem_gbps = 0;        // median of all interleaved plain reads
  double mem_min = 0, mem_max = 0;
  double ratio = 0;           // median of per-pass ratios against the adjacent reads
  double ratio_min = 0, ratio_max = 0;
  double mem_pf_gbps = 0;     // prefetching read (decode only)
  double ratio_pf = 0;
  double ratio_pf_min = 0, ratio_pf_max = 0;
  double cpu_util = 0;        // process CPU time / (wall time x threads)
  double base_secs = 0;       // interleaved baseline pass (sgemm), median
  double vs_base = 0;         // median of per-repetition baseline_time / kernel_time
  double base_cpu_util = 0;
  int reads = 0;              // interleaved plain reads
  double roof_gmacs = 0;      // median of the interleaved roof passes
  double roof_min = 0, roof_max = 0;
  double roof_frac = 0;  // median of per-pass kernel GMAC/s / mean of the adjacent roofs
  double roof_frac_min = 0, roof_frac_max = 0;
  const char* roof_op = nullptr;
  double roof_cpu_gmacs = 0;  // the roof per CPU-second (x threads), median
  double roof_cpu_frac = 0;   // kernel GMAC per CPU-second / roof per CPU-second, median
  double roof_cpu_frac_min = 0, roof_cpu_frac_max = 0;
};

// A baseline pass run before every kernel pass of a batched configuration.
using BaselineFn = std::function<void()>;

// `isa` is the requested one (an ISA name or "auto"), `ran` the ISA whose kernel
// this line timed (under auto, the dispatch's per-format choice).
void Emit(const Options& opt, const Context& ctx, const std::string& kernel, const Shape& s,
          size_t batch, int threads, const char* isa, const char* ran, const Timing& tm,
          size_t bytes, int copies) {
  const double secs_per_matrix = tm.secs_per_matrix;
  const double mem_gbps = tm.mem_gbps;
  const double gbps = double(bytes) / secs_per_matrix / 1e9;
  const double ratio = tm.ratio > 0 ? tm.ratio : gbps / mem_gbps;
  const double gmacs = double(s.rows) * s.cols * batch / secs_per_matrix / 1e9;
  JsonWriter j;
  j.BeginObject()
      .Field("bench", "kernels")
      .Field("kernel", kernel)
      .Field("shape", s.name)
      .Field("rows", uint64_t(s.rows))
      .Field("cols", uint64_t(s.cols))
      .Field("batch", uint64_t(batch))
      .Field("threads", int64_t(threads))
      .Field("isa", isa)
      .Field("kernel_isa", ran)
      .Field("weight_gbps", gbps)
      .Field("mem_read_gbps", mem_gbps)
      .Field("ratio", ratio);
  if (tm.reads > 0) {
    j.Field("ratio_min", tm.ratio_min)
        .Field("ratio_max", tm.ratio_max)
        .Field("mem_read_min_gbps", tm.mem_min)
        .Field("mem_read_max_gbps", tm.mem_max)
        .Field("reads", int64_t(tm.reads));
  }
  if (tm.mem_pf_gbps > 0) {
    j.Field("mem_read_pf_gbps", tm.mem_pf_gbps)
        .Field("ratio_pf", tm.ratio_pf)
        .Field("ratio_pf_min", tm.ratio_pf_min)
        .Field("ratio_pf_max", tm.ratio_pf_max);
  }
  j.Field("gmacs", gmacs).Field("gops", 2 * gmacs);
  if (tm.roof_op) {
    j.Field("roof_op", tm.roof_op)
        .Field("roof_gmacs", tm.roof_gmacs)
        .Field("roof_gmacs_min", tm.roof_min)
        .Field("roof_gmacs_max", tm.roof_max)
        .Field("roof_fraction", tm.roof_frac)
        .Field("roof_fraction_min", tm.roof_frac_min)
        .Field("roof_fraction_max", tm.roof_frac_max)
        .Field("roof_cpu_gmacs", tm.roof_cpu_gmacs)
        .Field("roof_fraction_cpu", tm.roof_cpu_frac)
        .Field("roof_fraction_cpu_min", tm.roof_cpu_frac_min)
        .Field("roof_fraction_cpu_max", tm.roof_cpu_frac_max);
  }
  j.Field("cpu_util", tm.cpu_util)
      .Field("ms_per_matrix", secs_per_matrix * 1e3)
      .Field("copies", int64_t(copies))
      .Field("reps", int64_t(opt.reps));
  if (tm.vs_base > 0) {
    j.Field("vs_sgemm", tm.vs_base)
        .Field("sgemm_gmacs", double(s.rows) * s.cols * batch / tm.base_secs / 1e9)
        .Field("sgemm_cpu_util", tm.base_cpu_util);
  }
  j.Field("git", ctx.sha).Field("cpu", ctx.cpu).EndObject();
  if (opt.json) {
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf(
        "%-16s %-13s %6zux%-6zu b%-3zu t%d %-8s %6.2f GB/s mem %5.2f ratio %.2f %6.1f GMAC/s cpu "
        "%.2f",
        kernel.c_str(), s.name, s.rows, s.cols, batch, threads, isa, gbps, mem_gbps, ratio, gmacs,
        tm.cpu_util);
    if (tm.reads > 0) std::printf(" [%.2f, %.2f]", tm.ratio_min, tm.ratio_max);
    if (tm.mem_pf_gbps > 0)
      std::printf("  (pf read %.2f, ratio %.2f)", tm.mem_pf_gbps, tm.ratio_pf);
    if (tm.roof_op)
      std::printf("  roof(%s) %.1f GMAC/s: %.2f [%.2f, %.2f]; per cpu-s %.1f: %.2f [%.2f, %.2f]",
                  tm.roof_op, tm.roof_gmacs, tm.roof_frac, tm.roof_frac_min, tm.roof_frac_max,
                  tm.roof_cpu_gmacs, tm.roof_cpu_frac, tm.roof_cpu_frac_min, tm.roof_cpu_frac_max);
    if (tm.vs_base > 0) std::printf("  vs sgemm %.2fx", tm.vs_base);
    if (std::strcmp(isa, ran) != 0) std::printf("  (kernel %s)", ran);
    std::printf("\n");
  }
  std::fflush(stdout);
}

// Median seconds of one pass over all copies, per matrix; with `mem` given, the
// plain and prefetching streaming reads over it are interleaved with the kernel
// passes (see Timing).
template <typename Fn>
Timing TimeConfig(int reps, int copies, int threads, size_t pass_bytes,
                  const std::vector<uint64_t>* mem, Fn&& run_copy,
                  const BaselineFn& baseline = nullptr, Roof* roof = nullptr,
                  double macs_per_matrix = 0) {
  for (int c = 0; c < copies; ++c) run_copy(c);  // warm: page-ins, code, scratch
  if (baseline) baseline();
  std::vector<double> secs, util, base_secs, vs_base, base_util;
  std::vector<double> read_gbps, pf_gbps;  // reps + 1 of each when mem is given
  const double mem_bytes = mem ? double(mem->size() * 8) : 0.0;
  std::vector<double> roofs, roofs_cpu;  // reps + 1 when roof is given
  auto reads = [&] {
    if (roof) {
      roofs.push_back(roof->Pass());
      roofs_cpu.push_back(roof->last_cpu_gmacs);
    }
    if (!mem) return;
    read_gbps.push_back(mem_bytes / StreamReadPass(*mem, threads) / 1e9);
    pf_gbps.push_back(mem_bytes / StreamReadPass(*mem, threads, kStreamPrefetchBytes) / 1e9);
  };
  reads();
  for (int r = 0; r < reps; ++r) {
    if (baseline) {
      const double bc0 = ProcessCpuSeconds();
      const double bt0 = NowSeconds();
      baseline();
      const double bw = NowSeconds() - bt0;
      base_secs.push_back(bw);
      base_util.push_back((ProcessCpuSeconds() - bc0) / (bw * threads));
      // OpenBLAS's idle workers spin for ~0.1 s after a call; let them park so
      // they do not steal a core from the kernel pass.
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
    const double c0 = ProcessCpuSeconds();
    const double t0 = NowSeconds();
    for (int c = 0; c < copies; ++c) run_copy(c);
    const double wall = NowSeconds() - t0;
    util.push_back((ProcessCpuSeconds() - c0) / (wall * threads));
    secs.push_back(wall / copies);
    if (baseline) vs_base.push_back(base_secs.back() / (wall / copies));
    reads();
  }
  Timing t;
  t.secs_per_matrix = Median(secs);
  t.cpu_util = Median(util);
  if (baseline) {
    t.base_secs = Median(base_secs);
    t.vs_base = Median(vs_base);
    t.base_cpu_util = Median(base_util);
  }
  if (roof) {
    std::vector<double> fracs;
    for (int r = 0; r < reps; ++r) {
      fracs.push_back(macs_per_matrix / secs[r] / 1e9 / (0.5 * (roofs[r] + roofs[r + 1])));
    }
    t.roof_op = RoofName(roof->op);
    t.roof_gmacs = Median(roofs);
    t.roof_min = *std::min_element(roofs.begin(), roofs.end());
    t.roof_max = *std::max_element(roofs.begin(), roofs.end());
    t.roof_frac = Median(fracs);
    t.roof_frac_min = *std::min_element(fracs.begin(), fracs.end());
    t.roof_frac_max = *std::max_element(fracs.begin(), fracs.end());
    std::vector<double> cfracs;
    for (int r = 0; r < reps; ++r) {
      const double kernel_cpu = macs_per_matrix / (secs[r] * util[r]) / 1e9;
      cfracs.push_back(kernel_cpu / (0.5 * (roofs_cpu[r] + roofs_cpu[r + 1])));
    }
    t.roof_cpu_gmacs = Median(roofs_cpu);
    t.roof_cpu_frac = Median(cfracs);
    t.roof_cpu_frac_min = *std::min_element(cfracs.begin(), cfracs.end());
    t.roof_cpu_frac_max = *std::max_element(cfracs.begin(), cfracs.end());
  }
  if (mem) {
    std::vector<double> ratios, pf_ratios;
    for (int r = 0; r < reps; ++r) {
      const double kernel_gbps = double(pass_bytes) / (secs[r] * copies) / 1e9;
      ratios.push_back(kernel_gbps / (0.5 * (read_gbps[r] + read_gbps[r + 1])));
      pf_ratios.push_back(kernel_gbps / (0.5 * (pf_gbps[r] + pf_gbps[r + 1])));
    }
    t.reads = int(read_gbps.size());
    t.mem_gbps = Median(read_gbps);
    t.mem_min = *std::min_element(read_gbps.begin(), read_gbps.end());
    t.mem_max = *std::max_element(read_gbps.begin(), read_gbps.end());
    t.ratio = Median(ratios);
    t.ratio_min = *std::min_element(ratios.begin(), ratios.end());
    t.ratio_max = *std::max_element(ratios.begin(), ratios.end());
    t.mem_pf_gbps = Median(pf_gbps);
    t.ratio_pf = Median(pf_ratios);
    t.ratio_pf_min = *std::min_element(pf_ratios.begin(), pf_ratios.end());
    t.ratio_pf_max = *std::max_element(pf_ratios.begin(), pf_ratios.end());
  }
  return t;
}

#ifdef K3_HAVE_OPENBLAS
// y[batch, rows] = x[batch, cols] . W^T with f32 weights: the same product as the
// kernels, as a well-tuned BLAS computes it.
struct SgemmBaseline {
  Matrix w;
  std::vector<float> x, y;
  size_t batch;
  SgemmBaseline(const Shape& s, size_t b)
      : w(MakeMatrix(WeightFormat::kF32, s.rows, s.cols, 99)),
        x(b * s.cols, 0.01f),
        y(b * s.rows),
        batch(b) {}
  void Run(int threads) {
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(batch), int(w.rows), int(w.cols), 1.0f,
                x.data(), int(w.cols), reinterpret_cast<const float*>(w.data.data()), int(w.cols),
                0.0f, y.data(), int(w.rows));
  }
};
#endif

void RunKernels(const Options& opt) {
  Context ctx{SourceRevision(), CpuModel(), {}};
  std::vector<Isa> isas;
  for (Isa i : quant::kAllIsas) {
    bool wanted = false;
    for (size_t b = 0; b <= opt.isas.size();) {
      size_t e = opt.isas.find(',', b);
      if (e == std::string::npos) e = opt.isas.size();
      wanted |= opt.isas.compare(b, e - b, quant::IsaName(i)) == 0;
      b = e + 1;
    }
    if (wanted && quant::IsaSupported(i)) isas.push_back(i);
  }
  // "auto": the start-up dispatch itself (per-CPU rules included), so a run can
  // put it beside the ISAs it mixes. Listed as kAuto below.
  bool want_auto = false;
  for (size_t b = 0; b <= opt.isas.size();) {
    size_t e = opt.isas.find(',', b);
    if (e == std::string::npos) e = opt.isas.size();
    want_auto |= opt.isas.compare(b, e - b, "auto") == 0;
    b = e + 1;
  }
  if (isas.empty() && !want_auto)
    throw Error(ErrorCode::kInvalidArgument, "no requested ISA runs on this CPU");

  // Bandwidth baseline: a 1 GiB (or --ws-mib) buffer written first, kept for the
  // per-configuration passes.
  const double ws_bytes = opt.ws_mib * 1048576.0;
  std::vector<uint64_t> buf(size_t(ws_bytes / 8));
  {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;
    int max_t = *std::max_element(opt.threads.begin(), opt.threads.end());
    ctx.mem_gbps.assign(max_t + 1, 0.0);
    for (int t : opt.threads) {
      ctx.mem_gbps[t] = StreamReadGbps(buf, t, opt.reps);
      const double pf = StreamReadGbps(buf, t, opt.reps, kStreamPrefetchBytes);
      JsonWriter j;
      j.BeginObject()
          .Field("bench", "kernels")
          .Field("kernel", "mem_read")
          .Field("threads", int64_t(t))
          .Field("mem_read_gbps", ctx.mem_gbps[t])
          .Field("mem_read_pf_gbps", pf)
          .Field("bytes", uint64_t(buf.size() * 8))
          .Field("git", ctx.sha)
          .Field("cpu", ctx.cpu)
          .EndObject();
      if (opt.json) {
        std::printf("%s\n", j.str().c_str());
      } else {
        std::printf("mem_read t%d: %.2f GB/s (prefetching read %.2f GB/s)\n", t, ctx.mem_gbps[t],
                    pf);
      }
      std::fflush(stdout);
    }
  }

  std::vector<Shape> shapes = {
      {"expert_w13", WeightFormat::kMxfp4, 3072, 3584},
      {"expert_w2", WeightFormat::kMxfp4, 3584, 3072},
      {"kda_qkvg", WeightFormat::kInt4G64, 12288, 7168},
      {"kda_o", WeightFormat::kInt4G64, 7168, 12288},
      {"kda_qkvg", WeightFormat::kInt8, 12288, 7168},
      {"kda_o", WeightFormat::kInt8, 7168, 12288},
      // The dense layer's down projection (intermediate 33792): the longest rows.
      {"dense_down", WeightFormat::kInt4G64, 7168, 33792},
      // MLA's scores over the cache (f32, the absorbed latent: 512 columns):
      // rows = cached positions, batch = a block's query rows (tokens x heads).
      {"mla_scores", WeightFormat::kF32, 2048, 512},
      // A 1/8 slice of the 163840-row head keeps the bench's memory use modest;
      // per-row work is identical so GB/s carries over.
      {"lm_head_slice", WeightFormat::kInt8, 20480, 7168},
  };
  if (opt.quick) {
    for (auto& s : shapes) s.rows = std::max<size_t>(64, s.rows / 8);
  }

  for (const Shape& s : shapes) {
    const std::string tag = std::string(FmtName(s.fmt)) + "/" + s.name;
    if (!opt.filter.empty() && tag.find(opt.filter) == std::string::npos) continue;
    Matrix proto = MakeMatrix(s.fmt, s.rows, s.cols, 1);
    const size_t bytes = proto.bytes();
    for (size_t batch : opt.batches) {
      const double set_bytes = (batch == 1 ? ws_bytes : opt.batch_ws_mib * 1048576.0);
      const int copies = std::max(1, int(set_bytes / double(bytes) + 0.999));
      // Copies are distinct allocations written here (not views of one buffer).
      std::vector<Matrix> mats;
      mats.reserve(copies);
      for (int c = 0; c < copies; ++c) {
        mats.push_back(proto);
        for (size_t i = 0; i < mats.back().data.size(); i += 4096)
          mats.back().data[i] ^= uint8_t(c);
      }
      std::vector<float> x(batch * s.cols);
      std::mt19937 rng(5);
      std::normal_distribution<float> nd(0, 1);
      for (auto& v : x) v = nd(rng);
      std::vector<float> y(batch * s.rows);
      ActsQ8 xq;
      quant::QuantizeActs(x.data(), batch, s.cols, &xq);
#ifdef K3_HAVE_OPENBLAS
      std::unique_ptr<SgemmBaseline> sgemm;
      if (batch > 1 && opt.sgemm) sgemm = std::make_unique<SgemmBaseline>(s, batch);
#endif
      for (int t : opt.threads) {
        omp_set_num_threads(t);
        // Batched kernels are timed with an sgemm pass before each repetition, so
        // vs_sgemm compares the two under the same machine load.
        BaselineFn baseline;
#ifdef K3_HAVE_OPENBLAS
        if (sgemm) baseline = [&sgemm, t] { sgemm->Run(t); };
#endif
        bool sgemm_reported = false;
        std::vector<int> runs;  // ISA values, -1 = auto (the start-up dispatch)
        for (Isa isa : isas) runs.push_back(int(isa));
        if (want_auto) runs.push_back(-1);
        for (int run : runs) {
          const bool is_auto = run < 0;
          if (is_auto) {
            quant::ResetIsaForTesting();
          } else {
            quant::SetIsaForTesting(Isa(run));
          }
          const Isa isa = quant::ActiveIsa();
          const std::string label = is_auto ? "auto" : quant::IsaName(isa);
          // Decode is a bandwidth question (interleaved streaming reads); batched
          // runs are compute-bound and compare with sgemm instead.
          const std::vector<uint64_t>* mem = batch == 1 ? &buf : nullptr;
          const size_t pass_bytes = bytes * size_t(copies);
          const double macs = double(s.rows) * double(s.cols) * double(batch);
          for (int rows : batch == 1 ? opt.f32_rows : std::vector<int>{0}) {
            quant::SetDecodeRowsForTesting(rows);
            Roof fma{quant::RoofOp::kFma, t};
            Timing tm = TimeConfig(
                opt.reps, copies, t, pass_bytes, mem,
                [&](int c) { quant::MatMul(mats[c].View(), x.data(), batch, y.data()); }, baseline,
                opt.roof ? &fma : nullptr, macs);
            quant::SetDecodeRowsForTesting(0);
            if (!mem) tm.mem_gbps = ctx.mem_gbps[t];
            if (baseline && !sgemm_reported) {
              Timing st;
              st.secs_per_matrix = tm.base_secs;
              st.mem_gbps = ctx.mem_gbps[t];
              st.cpu_util = tm.base_cpu_util;
              Emit(opt, ctx, "sgemm_openblas", s, batch, t, "openblas", "openblas", st,
                   s.rows * s.cols * 4, 1);
              sgemm_reported = true;
            }
            const std::string suffix = rows == 0 ? "" : "_r" + std::to_string(rows);
            Emit(opt, ctx, std::string("matmul_") + FmtName(s.fmt) + suffix, s, batch, t,
                 label.c_str(), quant::IsaName(isa), tm, bytes, copies);
          }
          // f32 weights have no int8-activation path (MatMulQ8 refuses them).
          if (s.fmt == WeightFormat::kF32) continue;
          Roof idot{quant::RoofOp::kIdot, t};
          Timing tm = TimeConfig(
              opt.reps, copies, t, pass_bytes, mem,
              [&](int c) { quant::MatMulQ8(mats[c].View(), xq, y.data()); }, baseline,
              opt.roof ? &idot : nullptr, macs);
          if (!mem) tm.mem_gbps = ctx.mem_gbps[t];
          Emit(opt, ctx, std::string("matmulq8_") + FmtName(s.fmt), s, batch, t, label.c_str(),
               quant::IsaName(quant::Q8Isa(s.fmt, batch)), tm, bytes, copies);
        }
      }
    }
  }
  quant::ResetIsaForTesting();
}

void Setup(CLI::App& root) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = root.add_subcommand(
      "kernels",
      "lib/quant kernels: weight GB/s vs streaming-read GB/s; batched vs OpenBLAS sgemm");
  cmd->add_flag("--json", opt->json, "one JSON object per line");
  cmd->add_option("--reps", opt->reps, "timed repetitions (median reported)")
      ->check(CLI::Range(5, 1000));
  cmd->add_option("--ws-mib", opt->ws_mib, "decode working set per repetition, MiB");
  cmd->add_option("--batch-ws-mib", opt->batch_ws_mib, "batched working set per repetition, MiB");
  cmd->add_option("--isa", opt->isas,
                  "comma list of scalar,avx2,avx2vnni,avx512,neon,neondot (unsupported ones "
                  "skipped) and auto (the start-up dispatch; kernel_isa says what ran)");
  cmd->add_option("--threads", opt->threads, "thread counts")->delimiter(',');
  cmd->add_option("--batch", opt->batches, "batch sizes")->delimiter(',');
  cmd->add_option("--filter", opt->filter, "only shapes whose fmt/name contains this");
  cmd->add_flag("--quick", opt->quick, "1/8 of the rows (smoke test)");
  cmd->add_flag("!--no-sgemm", opt->sgemm, "skip the OpenBLAS baseline");
  cmd->add_flag("!--no-roof", opt->roof,
                "skip the compute roof (peak vpdpbusd / FMA loop between the kernel passes)");
  cmd->add_option("--f32-rows", opt->f32_rows,
                  "decode rows per activation load of the f32 path to compare (0 = built-in; "
                  "1,2,4 force it; lines get a _rN suffix)")
      ->delimiter(',');
  cmd->callback([opt] { RunKernels(*opt); });
}

K3_REGISTER_BENCH(Setup);

}  // namespace
}  // namespace k3::bench
