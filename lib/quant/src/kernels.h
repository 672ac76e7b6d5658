// Private per-ISA kernel table behind the public quant.h entry points.
//
// Each ISA provides range kernels over output rows [row_begin, row_end); the
// public wrappers split the rows across OpenMP threads. An ISA's kernel must
// compute every output element with the same floating-point operations whatever
// the row range and the batch (quant.h's determinism contract), which all of ours
// do by running one fixed per-(row, activation) routine and only choosing the
// loop order (weight row outer, batch inner, so a row is read from RAM once per
// chunk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "k3/core/sys.h"
#include "k3/quant/isa.h"
#include "k3/quant/quant.h"
#include "k3/quant/roof.h"

namespace k3::quant::internal {

// Per-thread scratch buffers of the SIMD kernels are 64-byte aligned: decoded
// rows and re-laid-out activations are read with full-width loads, and a zmm load
// that straddles two cache lines costs two (malloc's 16-byte alignment made every
// one of them straddle).
template <typename T>
struct CacheAligned {
  using value_type = T;
  CacheAligned() = default;
  template <typename U>
  CacheAligned(const CacheAligned<U>&) noexcept {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, std::align_val_t{64}); }
  template <typename U>
  bool operator==(const CacheAligned<U>&) const noexcept {
    return true;
  }
};
template <typename T>
using AlignedVec = std::vector<T, CacheAligned<T>>;

// Scratch buffer of at least n elements (GrowScratch).
template <typename T>
T* Grow(AlignedVec<T>& v, size_t n) {
  GrowScratch(v, n);
  return v.data();
}

struct KernelTable {
  Isa isa;
  // y[b * w.rows + o] for o in [row_begin, row_end), b in [0, batch).
  void (*matmul)(const WeightView& w, const float* x, size_t batch, float* y, size_t row_begin,
                 size_t row_end) noexcept;
  // Same with int8 activations (w.cols % 32 == 0; f32 weights are not allowed).
  void (*matmul_q8)(const WeightView& w, const ActsQ8& x, float* y, size_t row_begin,
                    size_t row_end) noexcept;
  float (*row_dot)(const WeightView& w, size_t row, const float* x) noexcept;
  void (*add_row)(const WeightView& w, size_t row, float c, float* acc) noexcept;
  // Quantizers over whole rows (the public wrappers split rows across threads).
  // Every ISA must produce exactly the scalar bytes: IEEE multiply and
  // round-to-nearest-even conversion are the same operations in SIMD, and
  // absmax is order-independent, so only the loop shape differs.
  void (*quantize_int8_rows)(const float* x, size_t rows, size_t cols, int8_t* q,
                             float* scales) noexcept;
  void (*quantize_int4_rows)(const float* x, size_t rows, size_t cols, uint8_t* packed,
                             float* scales) noexcept;
  void (*downcast_int8_to_int4)(const int8_t* q8, const float* s8, size_t rows, size_t cols,
                                uint8_t* packed, float* scales) noexcept;
  // QuantizeActs for `rows` activation rows into q [rows*cols] / scales [rows*cols/32].
  void (*quantize_acts)(const float* x, size_t rows, size_t cols, int8_t* q,
                        float* scales) noexcept;
  // RoofLoop (roof.h): the peak loop of the instruction this table's kernels
  // are bound by; returns the multiply-adds done.
  uint64_t (*roof)(RoofOp op, uint64_t iters) noexcept;
  // AddRows (quant.h): optional; null = add_row in a loop, which defines the
  // bits (a fast version does each element's FMAs in the same row order).
  void (*add_rows)(const WeightView& w, size_t row0, size_t nrows, const float* coef,
                   size_t coef_ld, size_t tokens, float* acc, size_t acc_ld) noexcept = nullptr;
  // DotSumSquares (ops.h): optional; null = DotSumSquaresScalar, which defines
  // the bits (a fast version keeps its 16 lanes and its reduction tree).
  void (*dot_sum_squares)(const float* x, const float* w, size_t n, double* dot,
                          double* ss) noexcept = nullptr;
  // SituGlu (ops.h): situ.h's loop compiled for this ISA (null: the scalar one).
  void (*situ_glu)(const float* g, const float* u, size_t n, float b1, float b2,
                   float* out) noexcept = nullptr;
  // KdaDecay / KdaUpdate (ops.h): kda.h's sweeps compiled for this ISA (null:
  // the scalar ones).
  void (*kda_decay)(float* s, size_t hd, const float* alpha, const float* kn,
                    float* ks) noexcept = nullptr;
  void (*kda_update)(float* s, size_t hd, const float* kn, const float* vt, const float* qn,
                     float* oh) noexcept = nullptr;
  // Softmax (ops.h): situ.h's SoftmaxLoop compiled for this ISA (null: the scalar one).
  void (*softmax)(float* v, size_t n) noexcept = nullptr;
  // AttnScores (quant.h) for keys [j0, j1): attn.h's loop compiled for this
  // ISA, or a kernel with its bits (null: the scalar build of the loop). kt:
  // (da + db) * kScoreScratchKeys floats of per-thread scratch.
  void (*attn_scores)(const float* qa, const float* ka, size_t da, const float* qb, const float* kb,
                      size_t db, size_t nq, size_t j0, size_t j1, float scale, float* s, size_t s_ld,
                      float* kt) noexcept = nullptr;
};
// Keys one attn_scores scratch column holds (the widest panel of any kernel).
inline constexpr size_t kScoreScratchKeys = 64;

// situ.h's loop in the baseline build: the reference the ISA builds must equal.
void SituGluScalar(const float* g, const float* u, size_t n, float b1, float b2, float* out) noexcept;
void SoftmaxScalar(float* v, size_t n) noexcept;
void AttnScoresScalar(const float* qa, const float* ka, size_t da, const float* qb, const float* kb,
                      size_t db, size_t nq, size_t j0, size_t j1, float scale, float* s, size_t s_ld,
                      float* kt) noexcept;
// kda.h's sweeps in the baseline build: the reference the ISA builds must equal.
void KdaDecayScalar(float* s, size_t hd, const float* alpha, const float* kn, float* ks) noexcept;
void KdaUpdateScalar(float* s, size_t hd, const float* kn, const float* vt, const float* qn,
                     float* oh) noexcept;

// DotSumSquares' reference: 16 f64 lanes (element i in lane i % 16), products
// exact in f64, lanes folded j + (j+8), then + (j+4), + (j+2), + (j+1), then
// the n % 16 tail elements in order.
void DotSumSquaresScalar(const float* x, const float* w, size_t n, double* dot, double* ss) noexcept;
// The tail of every DotSumSquares: elements i..n-1 in order onto the folded
// lane sums, then the results out.
inline void DotSumSquaresTail(const float* x, const float* w, size_t i, size_t n, double dd, double qq,
                              double* dot, double* ss) noexcept {
  for (; i < n; ++i) {
    const double xv = x[i];
    dd += xv * static_cast<double>(w[i]);
    qq += xv * xv;
  }
  *dot = dd;
  *ss = qq;
}

// AddRows as the AddRow loop that defines its bits (quant.h): the fallback of
// every table without add_rows and of formats a fast add_rows leaves out.
inline void AddRowsLoop(void (*add_row)(const WeightView&, size_t, float, float*) noexcept,
                        const WeightView& w, size_t row0, size_t nrows, const float* coef,
                        size_t coef_ld, size_t tokens, float* acc, size_t acc_ld) noexcept {
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t j = 0; j < nrows; ++j) add_row(w, row0 + j, coef[t * coef_ld + j], acc + t * acc_ld);
  }
}

// The scalar quantizers (quant.cc): the reference every ISA's bytes must equal.
void QuantizeInt8RowsScalar(const float* x, size_t rows, size_t cols, int8_t* q,
                            float* scales) noexcept;
void QuantizeInt4RowsScalar(const float* x, size_t rows, size_t cols, uint8_t* packed,
                            float* scales) noexcept;
void DowncastScalar(const int8_t* q8, const float* s8, size_t rows, size_t cols, uint8_t* packed,
                    float* scales) noexcept;
void QuantizeActsScalar(const float* x, size_t rows, size_t cols, int8_t* q,
                        float* scales) noexcept;

// §6.2 floor on a scale so that inv = 1/s stays finite for all-zero groups.
inline constexpr float kMinScale = 1e-20f;

// The public MatMul / MatMulQ8 call whose row chunk the running thread is
// computing: quant.cc sets it before each chunk, unique per call and never 0.
// A kernel may keep set-up that depends only on the activations (their
// re-laid-out copy) in its thread's scratch under this id and reuse it for the
// same call's later chunks on that thread, so splitting a call into many chunks
// (quant.cc: 8 per thread) repeats no set-up. Only read inside those calls.
inline thread_local uint64_t t_call_id = 0;

const KernelTable& ScalarKernels() noexcept;
// Only call after CPUID / AT_HWCAP says the ISA runs here (IsaSupported). Each
// architecture compiles only its own kernel files (lib/quant/CMakeLists.txt).
#if defined(__x86_64__)
const KernelTable& Avx2Kernels() noexcept;
const KernelTable& Avx2VnniKernels() noexcept;  // kernels_avx2.cc built with AVX-VNNI
const KernelTable& Avx512Kernels() noexcept;
#endif
#if defined(__aarch64__)
const KernelTable& NeonKernels() noexcept;     // baseline armv8-a ASIMD
const KernelTable& NeonDotKernels() noexcept;  // kernels_neon.cc built with +dotprod
#endif

// The table of ActiveIsa() (the configuration was validated by ConfigureKernels).
const KernelTable& ActiveKernels() noexcept;
// The table MatMulQ8 uses for `format` weights and `batch` activation rows: the
// active one, except where a per-CPU rule (isa.cc) takes that kernel from another
// table with identical bits.
const KernelTable& Q8Kernels(WeightFormat format, size_t batch) noexcept;

// Software prefetch of weight streams: the SIMD kernels touch the line this many
// bytes ahead of the one they decode (K3_PREFETCH=bytes, 0 = off). The hardware
// prefetchers keep too few lines in flight for one core to reach the memory
// bandwidth once a kernel does real work per byte (docs/quant.md, the prefetch
// A/B in docs/PERFORMANCE-history.md). Prefetching past a matrix end is harmless
// (prefetches never fault).
inline constexpr size_t kDefaultPrefetchBytes = 4096;
// KernelConfig::prefetch_bytes (K3_PREFETCH) when set, else `default_bytes`: a
// kernel may default to its own distance where one was measured better
// (kernels_avx512.cc).
size_t PrefetchBytes(size_t default_bytes = kDefaultPrefetchBytes) noexcept;

// Rows of the f32-activation decode that share each activation load (1, 2, 4)
// for rows of `act_bytes` of f32 activations: SetDecodeRowsForTesting's value,
// else 1 while the activations fit in L1 and more rows beyond (interleaved
// weight streams read slower than one, so extra rows only pay once the
// activations come from L2; docs/PERFORMANCE-history.md, "Kernels").
int DecodeRowsF32(size_t act_bytes) noexcept;
inline void PrefetchLine(const void* p, size_t ahead) {
  __builtin_prefetch(static_cast<const char*>(p) + ahead, 0, 3);
}

// Slot rotation of the dot loops: body(k, a[k mod S]) for k in [k0, k1), k0 a
// multiple of S, unrolled so that every slot index is a constant. (Indexed with
// a run-time k & 3, GCC kept the accumulators on the stack and every FMA waited
// on a store-to-load round trip.) A slot is one accumulator or an array of them.
template <int S, typename Slot, typename Body>
inline void ForSlots(size_t k0, size_t k1, Slot (&a)[S], Body&& body) {
  size_t k = k0;
  for (; k + S <= k1; k += S) {
#pragma GCC unroll 4
    for (int j = 0; j < S; ++j) body(k + j, a[j]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j) {
    if (k + j < k1) body(k + j, a[j]);
  }
}

// Output rows [r0, r1) in blocks of R, then one at a time: block.operator()<N>(o)
// handles rows o .. o+N-1 (the batched kernels share each activation load
// between the rows of a block).
template <int R, typename Block>
inline void ForRowBlocks(size_t r0, size_t r1, Block&& block) {
  size_t o = r0;
  for (; o + R <= r1; o += R) block.template operator()<R>(o);
  for (; o < r1; ++o) block.template operator()<1>(o);
}

// One 32-column activation group split into its 16 even and 16 odd columns (the
// nibble IDOT layout: low nibbles are even columns, high nibbles odd ones).
inline void SplitEvenOdd32(const int8_t* q, int8_t* even, int8_t* odd) {
  for (int j = 0; j < 16; ++j) {
    even[j] = q[2 * j];
    odd[j] = q[2 * j + 1];
  }
}

// e2m1 code -> value (spec §6.4) and the doubled exact-int8 table the IDOT and
// SIMD paths use.
inline constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline constexpr int8_t kE2m1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// The doubled codes as f32, code 8 = -0 (the f32-activation path's table).
inline constexpr float kE2m1x2f[16] = {0.0f,  1.0f,  2.0f,  3.0f,  4.0f,  6.0f,  8.0f,  12.0f,
                                       -0.0f, -1.0f, -2.0f, -3.0f, -4.0f, -6.0f, -8.0f, -12.0f};

inline constexpr size_t kActGroup = 32;   // QuantizeActs group (§6.5)
inline constexpr size_t kInt4Group = 64;  // int4-g64 group (§6.2)
inline constexpr size_t kMxGroup = 32;    // MXFP4 scale group (§6.4)

// Step t of the nibble IDOT's activation layout, `lanes` groups per step (one
// per 128-bit lane): group t*lanes + l's even-column bytes at d + 16l, its odd
// ones at d + 16*lanes + 16l; zeros for groups past the row's `groups`.
inline void NibbleStepActs(const int8_t* q, size_t groups, size_t t, size_t lanes, int8_t* d) {
  for (size_t l = 0; l < lanes; ++l) {
    const size_t g = t * lanes + l;
    int8_t* even = d + 16 * l;
    int8_t* odd = d + 16 * lanes + 16 * l;
    if (g < groups) {
      SplitEvenOdd32(q + g * kActGroup, even, odd);
    } else {
      std::memset(even, 0, 16);
      std::memset(odd, 0, 16);
    }
  }
}

// The one order of the matrix kernels (docs/quant.md §3, "The one order"):
// the scalar reference defines it, every ISA gives its bits.
// Plain rows (f32, int8; f32-activation path): column i into lane i % 32.
inline constexpr size_t kPlainLanes = 32;
// Groups (int4/MXFP4 f32 path, every IDOT format) and the final tree: 16 lanes.
inline constexpr size_t kTreeLanes = 16;
// IDOT: activation group g into lane BlockLane(g): within each block of 16
// groups, group 4m + L goes to lane 4L + m ("block lane order", what one
// 128-bit lane per group of a 4-group step gives after summing four steps).
inline constexpr size_t BlockLane(size_t g) {
  const size_t i = g % 16;
  return 4 * (i % 4) + i / 4;
}
// The final reduction of 16 lanes: j + (j+8), then + (j+4), + (j+2), + (j+1).
inline float Tree16(float* a) {
  for (size_t h = kTreeLanes / 2; h >= 1; h /= 2) {
    for (size_t j = 0; j < h; ++j) a[j] = a[j] + a[j + h];
  }
  return a[0];
}

}  // namespace k3::quant::internal
