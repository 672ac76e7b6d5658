// Formats, quantizers (spec §6.2, §6.5, §6.7) and the OpenMP row split in front of
// the per-ISA kernels. Quantizers are scalar on purpose: their bytes are a file
// format (k3-repack writes them, the runtime re-derives them at load time) and
// must not depend on the ISA or the compiler's vectoriser.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#include "k3/core/error.h"
#include "k3/quant/quant.h"
#include "k3/quant/ops.h"
#include "kernels.h"

namespace k3::quant {

using internal::kActGroup;
using internal::kInt4Group;
using internal::kMxGroup;

using internal::kMinScale;

namespace {

// max |x_i| in f32; NaNs are skipped (a > am is false), as the reference does.
inline float AbsMax(const float* x, size_t n) {
  float am = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    float a = std::fabs(x[i]);
    if (a > am) am = a;
  }
  return am;
}

// clamp(lrintf(v), lo, hi): lrintf rounds half to even in the default mode.
// NaN (x·inv for a NaN x, or any x once an inf made inv 0) is `lo`, written out
// because lrint's NaN result is the architecture's: LONG_MIN on x86-64 (so lo
// after the clamp, the bytes k3 has always written), 0 on aarch64. Containers
// must not depend on the host that wrote them.
inline int RoundClamp(float v, long lo, long hi) {
  if (std::isnan(v)) return static_cast<int>(lo);
  long r = std::lrint(v);
  return static_cast<int>(std::clamp(r, lo, hi));
}

// One group/row of symmetric quantisation: s = am/qmax, floor, inv = 1/s.
inline float QuantizeSpan(const float* x, size_t n, float qmax, long lo, long hi, int* v) {
  float s = AbsMax(x, n) / qmax;
  if (s < kMinScale) s = kMinScale;
  float inv = 1.0f / s;
  for (size_t i = 0; i < n; ++i) v[i] = RoundClamp(x[i] * inv, lo, hi);
  return s;
}

}  // namespace

size_t WeightView::data_bytes() const {
  switch (format) {
    case WeightFormat::kF32:
      return rows * cols * sizeof(float);
    case WeightFormat::kInt8:
      return rows * cols;
    case WeightFormat::kInt4G64:
    case WeightFormat::kMxfp4:
      return rows * (cols / 2);
  }
  return 0;
}

size_t WeightView::scale_count() const {
  switch (format) {
    case WeightFormat::kF32:
      return 0;
    case WeightFormat::kInt8:
      return rows;
    case WeightFormat::kInt4G64:
      return rows * (cols / kInt4Group);
    case WeightFormat::kMxfp4:
      return rows * (cols / kMxGroup);
  }
  return 0;
}

WeightView RowRange(const WeightView& w, size_t r0, size_t n) noexcept {
  WeightView v = w;
  v.rows = 1;
  const size_t row_bytes = v.data_bytes(), row_scales = v.scale_count();
  v.rows = n;
  v.data = static_cast<const uint8_t*>(w.data) + r0 * row_bytes;
  if (w.scales != nullptr) v.scales = w.scales + r0 * row_scales;
  if (w.e8m0 != nullptr) v.e8m0 = w.e8m0 + r0 * row_scales;
  return v;
}

float E8m0ToF32(uint8_t s) noexcept { return std::bit_cast<float>(uint32_t{s} << 23); }

namespace internal {

void QuantizeInt8RowsScalar(const float* x, size_t rows, size_t cols, int8_t* q,
                            float* scales) noexcept {
  std::vector<int> v(cols);
  for (size_t r = 0; r < rows; ++r) {
    scales[r] = QuantizeSpan(x + r * cols, cols, 127.0f, -127, 127, v.data());
    for (size_t i = 0; i < cols; ++i) q[r * cols + i] = static_cast<int8_t>(v[i]);
  }
}

namespace {
// Packs 64 values in [-8, 7] as +8-biased nibbles, low nibble = even column.
inline void PackInt4Group(const int* v, uint8_t* out) {
  for (size_t j = 0; j < kInt4Group / 2; ++j) {
    out[j] = static_cast<uint8_t>((v[2 * j] + 8) | ((v[2 * j + 1] + 8) << 4));
  }
}
}  // namespace

void QuantizeInt4RowsScalar(const float* x, size_t rows, size_t cols, uint8_t* packed,
                            float* scales) noexcept {
  const size_t groups = cols / kInt4Group;
  int v[kInt4Group];
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < groups; ++g) {
      const float* xg = x + r * cols + g * kInt4Group;
      scales[r * groups + g] = QuantizeSpan(xg, kInt4Group, 7.0f, -8, 7, v);
      PackInt4Group(v, packed + r * (cols / 2) + g * (kInt4Group / 2));
    }
  }
}

void DowncastScalar(const int8_t* q8, const float* s8, size_t rows, size_t cols, uint8_t* packed,
                    float* scales) noexcept {
  const size_t groups = cols / kInt4Group;
  int v[kInt4Group];
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < groups; ++g) {
      const int8_t* qg = q8 + r * cols + g * kInt4Group;
      int am = 0;
      for (size_t i = 0; i < kInt4Group; ++i) am = std::max(am, std::abs(int{qg[i]}));
      // §6.7 op for op: s = am*s8/7, floor, inv = s8/s.
      float s = static_cast<float>(am) * s8[r] / 7.0f;
      if (s < kMinScale) s = kMinScale;
      float inv = s8[r] / s;
      for (size_t i = 0; i < kInt4Group; ++i) {
        v[i] = RoundClamp(static_cast<float>(qg[i]) * inv, -8, 7);
      }
      scales[r * groups + g] = s;
      PackInt4Group(v, packed + r * (cols / 2) + g * (kInt4Group / 2));
    }
  }
}

}  // namespace internal

void DequantizeRow(const WeightView& w, size_t row, float* out) noexcept {
  const size_t n = w.cols;
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out, static_cast<const float*>(w.data) + row * n, n * sizeof(float));
      return;
    case WeightFormat::kInt8: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + row * n;
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) * w.scales[row];
      return;
    }
    case WeightFormat::kInt4G64: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const float* s = w.scales + row * (n / kInt4Group);
      for (size_t i = 0; i < n; ++i) {
        int nib = (i & 1) ? (p[i / 2] >> 4) : (p[i / 2] & 15);
        out[i] = static_cast<float>(nib - 8) * s[i / kInt4Group];
      }
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * (n / 2);
      const uint8_t* e = w.e8m0 + row * (n / kMxGroup);
      for (size_t i = 0; i < n; ++i) {
        int code = (i & 1) ? (p[i / 2] >> 4) : (p[i / 2] & 15);
        out[i] = internal::kE2m1[code] * E8m0ToF32(e[i / kMxGroup]);
      }
      return;
    }
  }
}

namespace internal {

void QuantizeActsScalar(const float* x, size_t rows, size_t cols, int8_t* q,
                        float* scales) noexcept {
  const size_t groups = cols / kActGroup;
  int v[kActGroup];
  for (size_t b = 0; b < rows; ++b) {
    for (size_t g = 0; g < groups; ++g) {
      const size_t off = b * cols + g * kActGroup;
      scales[b * groups + g] = QuantizeSpan(x + off, kActGroup, 127.0f, -127, 127, v);
      for (size_t i = 0; i < kActGroup; ++i) q[off + i] = static_cast<int8_t>(v[i]);
    }
  }
}

}  // namespace internal

namespace {

// Below this many multiply-adds a parallel region costs more than it saves.
constexpr size_t kMinParallelMacs = size_t{1} << 16;
// Chunks start on multiples of this, so neighbours never share a cache line of
// y for batch 1 (16 floats) and SIMD kernels see aligned row groups.
constexpr size_t kRowAlign = 16;
// Chunks per thread: enough that a thread which loses its core for a while (a
// shared VM, a P/E-core hybrid) has its later chunks taken by the others, few
// enough that per-chunk set-up (activation re-layout, correction tables) stays
// around 1 % and each chunk is a long sequential stream for the prefetcher.
constexpr size_t kChunksPerThread = 8;

// Row chunks handed out dynamically. Which thread computes a row never changes a
// result: every element is computed independently by the same routine.
// `align`: chunks are whole multiples of it (AttnScores: its 64-key groups).
template <typename Fn>
void ForRowRanges(size_t rows, size_t macs, Fn&& fn, size_t align = kRowAlign) noexcept {
  const int max_threads = omp_get_max_threads();
  // Called from inside a parallel region (MLA's per-head output MatMuls), the
  // rows stay on the calling thread: a nested region would run them on one
  // thread anyway, after the cost of opening it.
  const bool parallel = macs >= kMinParallelMacs && rows > align && max_threads > 1 && !omp_in_parallel();
  if (!parallel) {
    fn(size_t{0}, rows);
    return;
  }
  const size_t target = rows / (size_t(max_threads) * kChunksPerThread);
  const size_t chunk = std::max(align, (target + align - 1) / align * align);
  const size_t chunks = (rows + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(max_threads)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t r0 = c * chunk;
    fn(r0, std::min(rows, r0 + chunk));
  }
}

std::atomic<uint64_t> g_calls{0};

// A fresh internal::t_call_id for one MatMul / MatMulQ8 call.
uint64_t NextCallId() noexcept { return g_calls.fetch_add(1, std::memory_order_relaxed) + 1; }

}  // namespace

void MatMul(const WeightView& w, const float* x, size_t batch, float* y) noexcept {
  if (w.rows == 0 || batch == 0) return;
  const internal::KernelTable& k = internal::ActiveKernels();
  const uint64_t call = NextCallId();
  ForRowRanges(w.rows, w.rows * w.cols * batch, [&](size_t r0, size_t r1) {
    internal::t_call_id = call;
    k.matmul(w, x, batch, y, r0, r1);
    internal::t_call_id = 0;
  });
}

void MatMulQ8(const WeightView& w, const ActsQ8& x, float* y) noexcept {
  K3_CHECK(w.format != WeightFormat::kF32);
  K3_CHECK(x.cols == w.cols && w.cols % kActGroup == 0);
  if (w.rows == 0 || x.batch == 0) return;
  const internal::KernelTable& k = internal::Q8Kernels(w.format, x.batch);
  const uint64_t call = NextCallId();
  ForRowRanges(w.rows, w.rows * w.cols * x.batch, [&](size_t r0, size_t r1) {
    internal::t_call_id = call;
    k.matmul_q8(w, x, y, r0, r1);
    internal::t_call_id = 0;
  });
}

uint64_t RoofLoop(RoofOp op, uint64_t iters) noexcept {
  return internal::ActiveKernels().roof(op, iters);
}

float RowDot(const WeightView& w, size_t row, const float* x) noexcept {
  return internal::ActiveKernels().row_dot(w, row, x);
}

void AddRow(const WeightView& w, size_t row, float c, float* acc) noexcept {
  internal::ActiveKernels().add_row(w, row, c, acc);
}

// AddRows takes its rows in chunks of about kAddRowsChunkBytes, and every
// token passes over a chunk before the next: the chunk stays in L2 for all of
// them. MLA's weighted latent sum (a thread's ~96 query rows over up to 8192
// cached rows of 2 KiB) otherwise streamed the whole cache from L3 or memory
// once per 4-token tile. Each element still gets its rows in ascending order
// (a chunk's accumulators go to `acc` and back, as between tiles): the bits.
constexpr size_t kAddRowsChunkBytes = size_t{256} << 10;

void AddRows(const WeightView& w, size_t row0, size_t nrows, const float* coef, size_t coef_ld,
             size_t tokens, float* acc, size_t acc_ld) noexcept {
  const internal::KernelTable& k = internal::ActiveKernels();
  const size_t row_bytes = std::max<size_t>(w.format == WeightFormat::kF32 ? w.cols * 4 : w.cols, 1);
  const size_t chunk = tokens > 1 ? std::max<size_t>(kAddRowsChunkBytes / row_bytes, 16) : nrows;
  for (size_t j0 = 0; j0 < nrows; j0 += chunk) {
    const size_t n = std::min(chunk, nrows - j0);
    if (k.add_rows != nullptr) {
      k.add_rows(w, row0 + j0, n, coef + j0, coef_ld, tokens, acc, acc_ld);
    } else {
      internal::AddRowsLoop(k.add_row, w, row0 + j0, n, coef + j0, coef_ld, tokens, acc, acc_ld);
    }
  }
}

// Keys go to threads in chunks of whole 64-key groups (the AVX-512 kernel's
// transposed group; a part group costs a whole one).
void AttnScores(const float* qa, const float* ka, size_t da, const float* qb, const float* kb,
                size_t db, size_t nq, size_t nk, float scale, float* s) noexcept {
  if (nq == 0 || nk == 0) return;
  const internal::KernelTable& k = internal::ActiveKernels();
  const auto fn = k.attn_scores != nullptr ? k.attn_scores : internal::AttnScoresScalar;
  ForRowRanges(
      nk, nq * nk * (da + db),
      [&](size_t j0, size_t j1) {
        thread_local internal::AlignedVec<float> kt;
        fn(qa, ka, da, qb, kb, db, nq, j0, j1, scale, s, nk,
           internal::Grow(kt, (da + db) * internal::kScoreScratchKeys));
      },
      internal::kScoreScratchKeys);
}

void DotSumSquares(const float* x, const float* w, size_t n, double* dot, double* ss) noexcept {
  const internal::KernelTable& k = internal::ActiveKernels();
  (k.dot_sum_squares != nullptr ? k.dot_sum_squares : internal::DotSumSquaresScalar)(x, w, n, dot, ss);
}

// Quantizers: rows are independent, so the thread split cannot change a byte.
void QuantizeInt8Rows(const float* x, size_t rows, size_t cols, int8_t* q,
                      float* scales) noexcept {
  const internal::KernelTable& k = internal::ActiveKernels();
  ForRowRanges(rows, rows * cols * 4, [&](size_t r0, size_t r1) {
    k.quantize_int8_rows(x + r0 * cols, r1 - r0, cols, q + r0 * cols, scales + r0);
  });
}

void QuantizeInt4G64Rows(const float* x, size_t rows, size_t cols, uint8_t* packed,
                         float* scales) noexcept {
  K3_CHECK(cols % kInt4Group == 0);
  const internal::KernelTable& k = internal::ActiveKernels();
  const size_t groups = cols / kInt4Group;
  ForRowRanges(rows, rows * cols * 4, [&](size_t r0, size_t r1) {
    k.quantize_int4_rows(x + r0 * cols, r1 - r0, cols, packed + r0 * (cols / 2),
                         scales + r0 * groups);
  });
}

void DowncastInt8ToInt4G64(const int8_t* q8, const float* s8, size_t rows, size_t cols,
                           uint8_t* packed, float* scales) noexcept {
  K3_CHECK(cols % kInt4Group == 0);
  const internal::KernelTable& k = internal::ActiveKernels();
  const size_t groups = cols / kInt4Group;
  ForRowRanges(rows, rows * cols * 4, [&](size_t r0, size_t r1) {
    k.downcast_int8_to_int4(q8 + r0 * cols, s8 + r0, r1 - r0, cols, packed + r0 * (cols / 2),
                            scales + r0 * groups);
  });
}

void QuantizeActs(const float* x, size_t batch, size_t cols, ActsQ8* out) noexcept {
  K3_CHECK(cols % kActGroup == 0);
  const size_t groups = cols / kActGroup;
  out->batch = batch;
  out->cols = cols;
  GrowScratch(out->q, batch * cols);  // rewritten below: contents need not survive
  GrowScratch(out->scales, batch * groups);
  // Per token the work is small and stays on this thread (ForRowRanges' rule);
  // a prefill's rows (2048 x 33792 before a dense down projection) go over the
  // threads. Rows are independent, so no bit changes.
  const internal::KernelTable& k = internal::ActiveKernels();
  int8_t* q = out->q.data();
  float* sc = out->scales.data();
  ForRowRanges(batch, batch * cols, [&](size_t r0, size_t r1) {
    k.quantize_acts(x + r0 * cols, r1 - r0, cols, q + r0 * cols, sc + r0 * groups);
  });
}

// situ.h's exp and tanh (not libm's), so that the vectorized ISA builds of the
// same loop give these bits. A prefill's dense MLP is C x 33792 elements (69 M
// at 2048 tokens): ranges of them over the threads, by ForRowRanges' rule with
// an element as the row. Every element is the same branch-free function, so
// where a range starts changes no bit.
void SituGlu(const float* g, const float* u, size_t n, float b1, float b2, float* out) noexcept {
  const internal::KernelTable& k = internal::ActiveKernels();
  const auto fn = k.situ_glu != nullptr ? k.situ_glu : internal::SituGluScalar;
  ForRowRanges(n, n * 4, [&](size_t i0, size_t i1) { fn(g + i0, u + i0, i1 - i0, b1, b2, out + i0); });
}

// situ.h's softmax (its exp, 16 lanes and fixed fold) for the active ISA: one
// row per call, no threads (MLA's rows are split over threads by the caller).
void Softmax(float* v, size_t n) noexcept {
  const internal::KernelTable& k = internal::ActiveKernels();
  (k.softmax != nullptr ? k.softmax : internal::SoftmaxScalar)(v, n);
}

// kda.h's sweeps for the active ISA. Called per (token, head) from inside the
// forward pass's head loop, which already has the threads: no split here.
void KdaDecay(float* s, size_t hd, const float* alpha, const float* kn, float* ks) noexcept {
  const internal::KernelTable& k = internal::ActiveKernels();
  (k.kda_decay != nullptr ? k.kda_decay : internal::KdaDecayScalar)(s, hd, alpha, kn, ks);
}

void KdaUpdate(float* s, size_t hd, const float* kn, const float* vt, const float* qn,
               float* oh) noexcept {
  const internal::KernelTable& k = internal::ActiveKernels();
  (k.kda_update != nullptr ? k.kda_update : internal::KdaUpdateScalar)(s, hd, kn, vt, qn, oh);
}

WeightView OwnedWeight::View() const {
  WeightView w;
  w.format = format;
  w.rows = rows;
  w.cols = cols;
  w.data = data.data();
  w.scales = scales.empty() ? nullptr : scales.data();
  w.e8m0 = e8m0.empty() ? nullptr : e8m0.data();
  return w;
}

}  // namespace k3::quant
