// The AttnRes softmax mix over a token's block snapshots (spec §5.2).
#pragma once

#include <cstddef>

namespace k3::model {

// Entries e_0..e_{n-1} = snapshots, e_n = p. Scores in f64 (products formed
// in f64, summed in quant::DotSumSquares' fixed lane order), softmax in f32,
// mix in f32 with the snapshots first and p last. `scores` is scratch of n
// floats.
void Mix(const float* const* entries, size_t n, const float* w, size_t d, float eps, float* scores,
         float* out);

}  // namespace k3::model
