// The seam between the forward pass and the trunk's dense matrices (every
// projection the CPU computes with Linear, the dense MLPs and the MoE layers'
// fused shared experts): a DenseExecutor computes y = W x for the matrices it
// holds, elsewhere than on the CPU (lib/vulkan puts them on a Vulkan device).
//
// lib/model keeps the control flow, the norms, attention, the KDA recurrence,
// the router and sampling; a matrix the executor does not hold, or any call it
// answers false, is computed on the CPU by the caller, so an executor that
// failed (allocation, submit, lost device) turns into the CPU's answer.
//
// Thread-safety: one consumer (the Session's thread); an implementation may
// guard itself. Calls never throw: a failure is a `false` (the implementation
// announces it once and stops taking work).
#pragma once

#include <cstddef>

#include "k3/model/weights.h"

namespace k3::model {

class DenseExecutor {
 public:
  virtual ~DenseExecutor() = default;
  // y[b * rows + o] = W[o] . x[b * cols ..] for b < batch, when W is held here:
  // true. False: not held (or the executor is off now); y is then unspecified
  // and the caller computes it.
  virtual bool MatMul(const Matrix& w, const float* x, size_t batch, float* y) = 0;
  // Starts down(SiTU-GLU(gate x, up x)) for `batch` rows of x [batch][cols],
  // returning at once so the caller can compute something else meanwhile (the
  // routed experts). False: not started (a matrix not held, the batch too
  // large for one submission, the executor off); nothing is pending then.
  virtual bool BeginMlp(const MlpWeights& w, const float* x, size_t batch, float situ_beta,
                        float situ_linear_beta) = 0;
  // Waits for the pending BeginMlp and writes out [batch][down.rows]. False:
  // it failed (out unspecified; the caller computes it on the CPU).
  virtual bool FinishMlp(float* out) = 0;
  // Seconds the caller spent computing trunk matrices on the CPU while this
  // executor was installed (its stats compare device and CPU time).
  virtual void AddCpuSeconds(double seconds) = 0;
};

}  // namespace k3::model
