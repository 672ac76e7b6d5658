#include "transform.h"

#include <omp.h>

#include <span>

#include "k3/container/safetensors.h"
#include "k3/quant/quant.h"

namespace k3::repack {

void QuantizeBlock(DType dtype, const std::byte* src, size_t rows, size_t cols, QuantShape shape,
                   std::byte* q, float* scales, float* scratch, int threads) {
  const size_t esize = DTypeSize(dtype);
  // Small row groups keep every thread busy even for the few-row tail block.
  constexpr size_t kRowsPerTask = kQuantRowsPerTask;
  const int64_t tasks = static_cast<int64_t>((rows + kRowsPerTask - 1) / kRowsPerTask);
  const uint64_t q_row = shape.q_row_bytes(cols);
  const uint64_t s_row = shape.scales_per_row(cols);
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads) if (tasks > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const size_t r0 = static_cast<size_t>(t) * kRowsPerTask;
    const size_t n = std::min(kRowsPerTask, rows - r0);
    float* x = scratch + static_cast<size_t>(omp_get_thread_num()) * kRowsPerTask * cols;
    ConvertToF32(dtype, std::span(src + r0 * cols * esize, n * cols * esize),
                 std::span(x, n * cols));
    if (shape.int4) {
      quant::QuantizeInt4G64Rows(x, n, cols, reinterpret_cast<uint8_t*>(q + r0 * q_row),
                                 scales + r0 * s_row);
    } else {
      quant::QuantizeInt8Rows(x, n, cols, reinterpret_cast<int8_t*>(q + r0 * q_row),
                              scales + r0 * s_row);
    }
  }
}

}  // namespace k3::repack
