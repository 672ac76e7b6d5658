// The f32-activation path's loop structure, shared by the SIMD kernel files.
//
// A row is a sequence of units: one vector of Kit::kLanes columns (f32, int8
// weights), one 32-column MXFP4 group or one 64-column int4 group. Unit k of a
// (weight row, activation row) pair goes to that pair's accumulator slot
// k mod S, and the pair's result is Kit::Reduce of its S slots. A tile runs R
// weight rows against B activation rows (Kit::Tile<U, R, B, Src>::Step does one
// unit); per pair the operations do not depend on R, B or the column blocking
// (a block's accumulators only go to memory and back), so decode (1 x 1, weights
// decoded in registers) and batched (decoded rows, Kit::kRows<U> x
// Kit::kTileActs<U> tiles over kF32BlockCols-column blocks) agree bit for bit.
//
// A Kit (one per ISA file) provides:
//   V, kLanes, Zero(), Load(const float*), Store(float*, V)
//   template <F32Unit U> static constexpr int kSlots, kTileActs, kRows
//   template <F32Unit U, int R, int B, typename Src> using Tile   (aggregate {w, x, gs, n})
//   using RowSrc (the decoded-row source), template <int S> float Reduce(const V*)
//   DecodeRow(w, o, float* out) -> const float*, MxScales(e8m0, groups, float* out)
#pragma once

#include <cstddef>
#include <cstring>

#include "kernels.h"

namespace k3::quant::internal {

enum class F32Unit { kPlain, kG32, kG64 };

template <typename Kit, F32Unit U>
constexpr size_t kUnitCols = U == F32Unit::kPlain ? Kit::kLanes
                             : U == F32Unit::kG32 ? 32
                                                  : 64;

// Column block of the batched loop: a multiple of every unit times its slot
// count; any size from 256 to 16384 runs alike (the tiles are bound by loads and
// FMAs, not by the caches).
inline constexpr size_t kF32BlockCols = 1024;

template <typename Kit, F32Unit U>
size_t UnitCount(size_t n) {
  return (n + kUnitCols<Kit, U> - 1) / kUnitCols<Kit, U>;
}

// R weight rows against one activation row (decode): each activation vector is
// loaded once for the R rows (an R x 1 tile over the whole row, accumulators in
// registers). Per row the operations are DotF32's, so the result does not depend
// on R; what R changes is the activation traffic per weight byte, which for a
// 12288-column f32 row (48 KiB, beyond L1) is 8 bytes from L2 per int4 weight
// byte at R = 1.
template <typename Kit, F32Unit U, int R, typename Src>
void DotF32Rows(const Src* w, const float* x, const float* const* gs, size_t n,
                float* out) noexcept {
  constexpr int S = Kit::template kSlots<U>;
  typename Kit::V a[S][R][1];
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) a[j][r][0] = Kit::Zero();
  }
  const float* xs[1] = {x};
  const typename Kit::template Tile<U, R, 1, Src> tile{w, xs, gs, n};
  ForSlots(0, UnitCount<Kit, U>(n), a, [&](size_t k, auto& slot) { tile.Step(k, slot); });
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    typename Kit::V v[S];
#pragma GCC unroll 4
    for (int j = 0; j < S; ++j) v[j] = a[j][r][0];
    out[r] = Kit::template Reduce<S>(v);
  }
}

// One weight row against one activation row (decode, RowDot).
template <typename Kit, F32Unit U, typename Src>
float DotF32(const Src& w, const float* x, const float* gs, size_t n) noexcept {
  float out;
  DotF32Rows<Kit, U, 1>(&w, x, &gs, n, &out);
  return out;
}

// One column block of an R x B tile, its accumulators [batch][slot][row] in acc.
// With acc null the block is the whole row (n <= kF32BlockCols: MLA's 512-wide
// latent scores, small projections): the accumulators start at zero in
// registers and are reduced straight into y (rows o.. of w), instead of going
// to the [batch] accumulator array and back, which with many activation rows
// streamed several MB per row block through L2. The same zero start, the same
// Steps in the same slots and the same Reduce as the array path: the same bits.
template <typename Kit, F32Unit U, int R, int B>
void F32TileBlock(const typename Kit::RowSrc* src, const float* const* gs, const float* xl,
                  size_t n, size_t b0, size_t k0, size_t k1, float* acc,
                  const WeightView* w = nullptr, size_t o = 0, float* y = nullptr) noexcept {
  constexpr int S = Kit::template kSlots<U>;
  constexpr int L = Kit::kLanes;
  typename Kit::V a[S][R][B];
  const float* x[B];
#pragma GCC unroll 4
  for (int b = 0; b < B; ++b) {
    x[b] = xl + (b0 + b) * n;
#pragma GCC unroll 4
    for (int j = 0; j < S; ++j) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        a[j][r][b] = acc != nullptr ? Kit::Load(acc + (((b0 + b) * S + j) * R + r) * L) : Kit::Zero();
      }
    }
  }
  const typename Kit::template Tile<U, R, B, typename Kit::RowSrc> tile{src, x, gs, n};
  ForSlots(k0, k1, a, [&](size_t k, auto& slot) { tile.Step(k, slot); });
#pragma GCC unroll 4
  for (int b = 0; b < B; ++b) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      if (acc != nullptr) {
#pragma GCC unroll 4
        for (int j = 0; j < S; ++j) Kit::Store(acc + (((b0 + b) * S + j) * R + r) * L, a[j][r][b]);
        continue;
      }
      typename Kit::V v[S];
#pragma GCC unroll 4
      for (int j = 0; j < S; ++j) v[j] = a[j][r][b];
      const float d = Kit::template Reduce<S>(v);
      y[(b0 + b) * w->rows + o + r] = w->format == WeightFormat::kInt8 ? d * w->scales[o + r] : d;
    }
  }
}

// R weight rows decoded once (kernel layout, group factors), then every
// activation row against them, block by block. Scratch: wrow, gscale, acc.
template <typename Kit, F32Unit U, int R, typename Scratch>
void F32RowBlock(const WeightView& w, const float* xl, size_t batch, size_t o, float* y,
                 Scratch& s) noexcept {
  constexpr int S = Kit::template kSlots<U>;
  constexpr int T = Kit::template kTileActs<U>;
  constexpr int L = Kit::kLanes;
  const size_t n = w.cols;
  const size_t groups = U == F32Unit::kPlain ? 0 : n / kUnitCols<Kit, U>;
  float* wbuf = Grow(s.wrow, R * n);
  float* gbuf = Grow(s.gscale, R * groups + 1);
  typename Kit::RowSrc src[R];
  const float* gs[R];
  for (int r = 0; r < R; ++r) {
    src[r] = typename Kit::RowSrc{Kit::DecodeRow(w, o + r, wbuf + r * n)};
    gs[r] = gbuf + r * groups;
    if constexpr (U == F32Unit::kG64) {
      gs[r] = w.scales + (o + r) * groups;
    } else if constexpr (U == F32Unit::kG32) {
      Kit::MxScales(w.e8m0 + (o + r) * groups, groups, gbuf + r * groups);
    }
  }
  const size_t units = UnitCount<Kit, U>(n);
  const size_t block = kF32BlockCols / kUnitCols<Kit, U>;
  if (units <= block) {
    size_t b = 0;
    for (; b + T <= batch; b += T) {
      F32TileBlock<Kit, U, R, T>(src, gs, xl, n, b, 0, units, nullptr, &w, o, y);
    }
    for (; b < batch; ++b) F32TileBlock<Kit, U, R, 1>(src, gs, xl, n, b, 0, units, nullptr, &w, o, y);
    return;
  }
  float* acc = Grow(s.acc, batch * S * R * L);
  std::memset(acc, 0, batch * S * R * L * sizeof(float));
  for (size_t k0 = 0; k0 < units; k0 += block) {
    const size_t k1 = k0 + block < units ? k0 + block : units;
    size_t b = 0;
    for (; b + T <= batch; b += T) F32TileBlock<Kit, U, R, T>(src, gs, xl, n, b, k0, k1, acc);
    for (; b < batch; ++b) F32TileBlock<Kit, U, R, 1>(src, gs, xl, n, b, k0, k1, acc);
  }
  for (size_t b = 0; b < batch; ++b) {
    for (int r = 0; r < R; ++r) {
      typename Kit::V v[S];
      for (int j = 0; j < S; ++j) v[j] = Kit::Load(acc + ((b * S + j) * R + r) * L);
      const float d = Kit::template Reduce<S>(v);
      y[b * w.rows + o + r] = w.format == WeightFormat::kInt8 ? d * w.scales[o + r] : d;
    }
  }
}

// Activation rows per pass of f32 weights: about this many bytes of them, so
// that they stay in L2 while every row block of the weights passes.
inline constexpr size_t kF32WeightActBytes = size_t{512} << 10;

// f32 weights need no decode (DecodeRow points at the stored row), so the batch
// goes in chunks that stay in L2 and the weights stream once per chunk. Whole,
// a prefill window's activations streamed past every row block: the router
// (896 x 7168) at 2048 tokens re-read 58 MB of them 224 times. Other formats
// keep one pass (a decode per chunk would cost more than the reads it saves).
// A chunk changes no bit: each (row, activation) pair's operations do not
// depend on the tile or the batch (the file comment).
template <typename Kit, F32Unit U, typename Scratch>
void MatMulF32Rows(const WeightView& w, const float* xl, size_t batch, float* y, size_t r0,
                   size_t r1, Scratch& s) noexcept {
  size_t chunk = batch;
  if (w.format == WeightFormat::kF32 && w.cols > 0) {
    constexpr size_t T = Kit::template kTileActs<U>;
    const size_t rows = kF32WeightActBytes / (w.cols * sizeof(float));
    chunk = rows < T ? T : rows / T * T;
  }
  for (size_t b0 = 0; b0 < batch; b0 += chunk) {
    const size_t nb = batch - b0 < chunk ? batch - b0 : chunk;
    ForRowBlocks<Kit::template kRows<U>>(r0, r1, [&]<int N>(size_t o) {
      F32RowBlock<Kit, U, N>(w, xl + b0 * w.cols, nb, o, y + b0 * w.rows, s);
    });
  }
}

// The batched f32 path for any format (xl: activations in the kernel layout).
template <typename Kit, typename Scratch>
void MatMulF32Batched(const WeightView& w, const float* xl, size_t batch, float* y, size_t r0,
                      size_t r1, Scratch& s) noexcept {
  switch (w.format) {
    case WeightFormat::kF32:
    case WeightFormat::kInt8:
      return MatMulF32Rows<Kit, F32Unit::kPlain>(w, xl, batch, y, r0, r1, s);
    case WeightFormat::kInt4G64:
      return MatMulF32Rows<Kit, F32Unit::kG64>(w, xl, batch, y, r0, r1, s);
    case WeightFormat::kMxfp4:
      return MatMulF32Rows<Kit, F32Unit::kG32>(w, xl, batch, y, r0, r1, s);
  }
}

}  // namespace k3::quant::internal
