#version 450
// y = sum_g s_og * ((v - 8) . x)_g for an int4-g64 matrix: [rows, cols/2]
// bytes of v + 8 nibbles (low nibble = even column; read as words, 8 words
// per 64-column group) and cols/64 f32 scales per row (dense_common.glsl).
#include "dense_common.glsl"

void main() {
  const uint o = gl_WorkGroupID.x;
  const uint t0 = gl_WorkGroupID.y * kTokens;
  const uint lid = gl_LocalInvocationID.x;
  float acc[kTokens];
  for (uint t = 0; t < kTokens; ++t) acc[t] = 0.0;
  const uint words = p.cols / 8u;
  const uint base = p.w_word + o * words;
  const uint sbase = p.s_word + o * (p.cols / 64u);
  for (uint j = lid; j < words; j += 64u) {
    const uint q = weights[base + j];
    float part[kTokens];
    for (uint t = 0; t < kTokens; ++t) part[t] = 0.0;
    for (uint k = 0; k < 8u; ++k) {
      const float w = float(int((q >> (4u * k)) & 15u) - 8);
      const uint i = 8u * j + k;
      for (uint t = 0; t < kTokens; ++t) part[t] = fma(X(t0, t, i), w, part[t]);
    }
    const float s = uintBitsToFloat(weights[sbase + j / 8u]);
    for (uint t = 0; t < kTokens; ++t) acc[t] = fma(part[t], s, acc[t]);
  }
  ReduceAndStore(o, t0, lid, acc, 1.0);
}
