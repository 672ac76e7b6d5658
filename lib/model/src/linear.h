// Linear: the one matmul dispatch of the forward pass's projections.
#pragma once

#include <cstddef>

#include "k3/core/sys.h"
#include "k3/model/dense_executor.h"
#include "k3/model/weights.h"
#include "k3/quant/quant.h"

namespace k3::model {

// y[C, rows] = W x[C, cols]; int8 activations for quantized weights when
// `idot` (and the kernel's 32-column grouping fits), f32 otherwise.
inline void LinearCpu(const Matrix& w, const float* x, size_t batch, float* y, bool idot,
                      quant::ActsQ8* acts) {
  const quant::WeightView& v = w.view();
  if (idot && v.format != quant::WeightFormat::kF32 && v.cols % 32 == 0) {
    quant::QuantizeActs(x, batch, v.cols, acts);
    quant::MatMulQ8(v, *acts, y);
  } else {
    quant::MatMul(v, x, batch, y);
  }
}

// As LinearCpu, on `dense` (the model's DenseExecutor, may be null) when it
// holds W; the CPU otherwise, or when the executor answers false.
inline void Linear(const Matrix& w, const float* x, size_t batch, float* y, bool idot,
                   quant::ActsQ8* acts, DenseExecutor* dense = nullptr) {
  if (dense == nullptr) return LinearCpu(w, x, batch, y, idot, acts);
  if (dense->MatMul(w, x, batch, y)) return;
  const double t0 = NowSeconds();
  LinearCpu(w, x, batch, y, idot, acts);
  dense->AddCpuSeconds(NowSeconds() - t0);
}

}  // namespace k3::model
