#version 450
// y = W x for an f32 matrix [rows, cols] (dense_common.glsl).
#include "dense_common.glsl"

void main() {
  const uint o = gl_WorkGroupID.x;
  const uint t0 = gl_WorkGroupID.y * kTokens;
  const uint lid = gl_LocalInvocationID.x;
  float acc[kTokens];
  for (uint t = 0; t < kTokens; ++t) acc[t] = 0.0;
  const uint base = p.w_word + o * p.cols;
  for (uint i = lid; i < p.cols; i += 64u) {
    const float w = uintBitsToFloat(weights[base + i]);
    for (uint t = 0; t < kTokens; ++t) acc[t] = fma(X(t0, t, i), w, acc[t]);
  }
  ReduceAndStore(o, t0, lid, acc, 1.0);
}
