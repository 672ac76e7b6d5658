// How the layer rooms tile a window: MLA's query blocks and token groups, the
// MLPs' token slices. The window memory model (window_plan.cc) counts the
// buffers at these same sizes.
#pragma once

#include <algorithm>
#include <cstddef>

namespace k3::model {

// MLA attention's block: all heads of this many tokens share each pass over
// the cached rows (about 512 query rows: 5 tokens x 96 heads on K3).
// AttnScores keeps a 64-key group in L2 while the queries pass; each thread's
// weighted latent sum reads every cached row once per block, so larger blocks
// read the cache less per query, with little left to gain past about 512 rows
// (docs/model.md has the measurements).
inline size_t MlaBlockTokens(size_t heads) {
  return std::max<size_t>(1, 512 / std::max<size_t>(heads, 1));
}

// MLA's blocks come in groups of this many tokens (a multiple of the block):
// the group's absorbed queries, latent sums and outputs, about kMlaGroupBytes,
// are made per head over all of its tokens, so kv_b is read once per group.
inline constexpr size_t kMlaGroupBytes = size_t{8} << 20;
inline size_t MlaGroupTokens(size_t heads, size_t kvl, size_t rope, size_t vh) {
  const size_t tb = MlaBlockTokens(heads);
  const size_t per_token = std::max<size_t>(heads, 1) * (2 * kvl + rope + vh) * sizeof(float);
  return std::max<size_t>(1, kMlaGroupBytes / std::max<size_t>(per_token, 1) / tb) * tb;
}

// The MLPs run over a window in slices of this many tokens (mlp.cc): at K3's
// dense 33792 columns a slice's gate and up rows are 2 x 66 MiB, against
// 2 x 1.1 GiB for an 8192-token window taken whole.
inline constexpr size_t kMlpSliceTokens = 512;

}  // namespace k3::model
