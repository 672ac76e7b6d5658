// The per-block transform shared by k3-repack (to write) and k3-verify --full (to
// re-derive and compare): source rows -> f32 -> lib/quant's §6.2 quantizer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "k3/container/dtype.h"

namespace k3::repack {

// Quantized layout of one [rows, cols] matrix.
struct QuantShape {
  bool int4 = false;
  uint64_t q_row_bytes(uint64_t cols) const { return int4 ? cols / 2 : cols; }
  uint64_t scales_per_row(uint64_t cols) const { return int4 ? cols / 64 : 1; }
};

// Rows converted to f32 at a time by one thread of QuantizeBlock.
inline constexpr size_t kQuantRowsPerTask = 8;
// Floats of QuantizeBlock's scratch for `cols`-wide rows on `threads` threads:
// a few rows per thread, not the block (which would double its memory).
inline size_t QuantizeScratchFloats(size_t cols, int threads) {
  return static_cast<size_t>(threads < 1 ? 1 : threads) * kQuantRowsPerTask * cols;
}

// Converts `rows` rows of `cols` source values (BF16/F16/F32 bytes at `src`) to
// f32 in `scratch` (QuantizeScratchFloats(cols, threads), kQuantRowsPerTask rows
// per thread at a time) and quantizes them into `q` (rows * q_row_bytes) and
// `scales` (rows * scales_per_row). Rows are split across `threads` OpenMP
// threads; the result does not depend on the split.
void QuantizeBlock(DType dtype, const std::byte* src, size_t rows, size_t cols, QuantShape shape,
                   std::byte* q, float* scales, float* scratch, int threads);

}  // namespace k3::repack
