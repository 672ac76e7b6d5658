#version 450
// y[r][o] = w2[o] . h[r] for one expert (the down projection back to the
// latent width), TN tokens per workgroup, one output row per workgroup.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint kTokens = 4;

layout(std430, binding = 0) readonly buffer Weights { uint weights[]; };
layout(std430, binding = 1) readonly buffer In { float x[]; };
layout(std430, binding = 2) writeonly buffer Out { float y[]; };

layout(push_constant) uniform Push {
  uint a_words;   // word offset of w2's nibbles
  uint a_scales;  // byte offset of w2's E8M0 scales
  uint b_words;   // unused
  uint b_scales;  // unused
  uint rows;      // LT
  uint cols;      // MI (multiple of 32)
  uint x_row;     // first row (token) of this expert
  uint n;
  float beta1;    // unused
  float beta2;    // unused
} p;

#include "mx_common.glsl"

shared float red[kTokens][64];

void main() {
  const uint o = gl_WorkGroupID.x;
  const uint t0 = gl_WorkGroupID.y * kTokens;
  const uint lid = gl_LocalInvocationID.x;
  const uint groups = p.cols / 32u;
  float acc[kTokens];
  for (uint t = 0; t < kTokens; ++t) acc[t] = 0.0;
  for (uint g = lid; g < groups; g += 64u) {
    float part[kTokens];
    for (uint t = 0; t < kTokens; ++t) part[t] = 0.0;
    const uint wa = p.a_words + o * (p.cols / 8u) + g * 4u;
    for (uint j = 0; j < 4u; ++j) {
      const uint q = weights[wa + j];
      for (uint k = 0; k < 8u; ++k) {
        const float v = E2m1((q >> (4u * k)) & 15u);
        const uint col = g * 32u + j * 8u + k;
        for (uint t = 0; t < kTokens; ++t) {
          const uint r = t0 + t;
          const float xv = r < p.n ? x[(p.x_row + r) * p.cols + col] : 0.0;
          part[t] += xv * v;
        }
      }
    }
    const float s = E8m0(WeightByte(p.a_scales + o * groups + g));
    for (uint t = 0; t < kTokens; ++t) acc[t] += part[t] * s;
  }
  for (uint t = 0; t < kTokens; ++t) red[t][lid] = acc[t];
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (lid < s) {
      for (uint t = 0; t < kTokens; ++t) red[t][lid] += red[t][lid + s];
    }
    barrier();
  }
  if (lid < kTokens) {
    const uint r = t0 + lid;
    if (r < p.n) y[(p.x_row + r) * p.rows + o] = red[lid][0];
  }
}
