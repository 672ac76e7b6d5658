// The AttnRes softmax mix (spec §5.2); Session::ForwardChunk keeps the stream.
#include "attn_res.h"

#include <cmath>

#include "k3/quant/ops.h"

namespace k3::model {

void Mix(const float* const* entries, size_t n, const float* w, size_t d, float eps, float* scores,
         float* out) {
  for (size_t j = 0; j < n; ++j) {
    double dot = 0, ss = 0;
    quant::DotSumSquares(entries[j], w, d, &dot, &ss);
    scores[j] =
        static_cast<float>(dot / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
  }
  quant::Softmax(scores, n);
  for (size_t i = 0; i < d; ++i) out[i] = scores[0] * entries[0][i];
  for (size_t j = 1; j < n; ++j) {
    const float pj = scores[j];
    const float* e = entries[j];
    for (size_t i = 0; i < d; ++i) out[i] += pj * e[i];
  }
}

}  // namespace k3::model
