#version 450
// y = s_o * (q_o . x) for an int8 per-row matrix: [rows, cols] signed bytes
// (cols a multiple of 4, read as words) and one f32 scale per row
// (dense_common.glsl).
#include "dense_common.glsl"

void main() {
  const uint o = gl_WorkGroupID.x;
  const uint t0 = gl_WorkGroupID.y * kTokens;
  const uint lid = gl_LocalInvocationID.x;
  float acc[kTokens];
  for (uint t = 0; t < kTokens; ++t) acc[t] = 0.0;
  const uint words = p.cols / 4u;
  const uint base = p.w_word + o * words;
  for (uint j = lid; j < words; j += 64u) {
    const int q = int(weights[base + j]);
    for (uint k = 0; k < 4u; ++k) {
      const float w = float(bitfieldExtract(q, int(8u * k), 8));
      const uint i = 4u * j + k;
      for (uint t = 0; t < kTokens; ++t) acc[t] = fma(X(t0, t, i), w, acc[t]);
    }
  }
  ReduceAndStore(o, t0, lid, acc, uintBitsToFloat(weights[p.s_word + o]));
}
