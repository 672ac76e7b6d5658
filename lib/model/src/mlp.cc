// The dense MLP and the MoE layer's shared experts: down(SiTU(gate x, up x)).
#include <algorithm>

#include "k3/quant/ops.h"
#include "linear.h"
#include "session_impl.h"
#include "tiling.h"

namespace k3::model {

// In slices of at most kMlpSliceTokens tokens. The gate and up outputs are the
// widest rows of the forward pass (K3's dense layer: 33792 floats, 2.4x a KDA
// projection): over a whole window they would be the largest part of its
// memory and of the pages a first prefill faults in. Every GEMM already walks
// its weights once per L2-sized chunk of activation rows, so slices read no
// more weight bytes; each row is computed alone, so the bits are those of the
// whole window. When the model's DenseExecutor holds all three matrices a
// slice is one submission there (gate, up, SiTU-GLU, down); a failed one is
// computed here.
void Session::MlpForward(const MlpWeights& w, const float* x, size_t C, float* out) {
  const ModelConfig& c = model_.config();
  const bool idot = options_.idot;
  const size_t inter = w.gate.rows(), in = w.gate.cols(), outc = w.down.rows();
  const size_t S = std::min(C, kMlpSliceTokens);
  LayerScratch::Mlp buf = impl_->work->scratch.mlp();
  float *g = buf.gate(S * inter), *u = buf.up(S * inter);
  DenseExecutor* dense = model_.dense_executor();
  for (size_t t0 = 0; t0 < C; t0 += S) {
    const size_t n = std::min(S, C - t0);
    if (dense != nullptr && dense->BeginMlp(w, x + t0 * in, n, c.situ_beta, c.situ_linear_beta) &&
        dense->FinishMlp(out + t0 * outc)) {
      continue;
    }
    Linear(w.gate, x + t0 * in, n, g, idot, &impl_->work->acts, dense);
    Linear(w.up, x + t0 * in, n, u, idot, &impl_->work->acts, dense);
    quant::SituGlu(g, u, n * inter, c.situ_beta, c.situ_linear_beta, g);
    Linear(w.down, g, n, out + t0 * outc, idot, &impl_->work->acts, dense);
  }
}

}  // namespace k3::model
