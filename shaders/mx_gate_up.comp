#version 450
// h[r][o] = SiTU-GLU(w1[o] . z[r], w3[o] . z[r]) for one expert, TN tokens per
// workgroup, one output row per workgroup (docs/vulkan.md §2).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint kTokens = 4;  // tokens per workgroup (TN)

layout(std430, binding = 0) readonly buffer Weights { uint weights[]; };
layout(std430, binding = 1) readonly buffer In { float x[]; };
layout(std430, binding = 2) writeonly buffer Out { float y[]; };

layout(push_constant) uniform Push {
  uint a_words;   // word offset of w1's nibbles
  uint a_scales;  // byte offset of w1's E8M0 scales
  uint b_words;   // w3
  uint b_scales;
  uint rows;      // MI
  uint cols;      // LT (multiple of 32)
  uint x_row;     // first input row (token) of this expert
  uint n;         // tokens of this expert
  float beta1;    // situ_beta
  float beta2;    // situ_linear_beta
} p;

#include "mx_common.glsl"

shared float red_g[kTokens][64];
shared float red_u[kTokens][64];

float SafeTanh(float v) { return tanh(clamp(v, -15.0, 15.0)); }

void main() {
  const uint o = gl_WorkGroupID.x;
  const uint t0 = gl_WorkGroupID.y * kTokens;
  const uint lid = gl_LocalInvocationID.x;
  const uint groups = p.cols / 32u;
  float acc_g[kTokens], acc_u[kTokens];
  for (uint t = 0; t < kTokens; ++t) { acc_g[t] = 0.0; acc_u[t] = 0.0; }
  for (uint g = lid; g < groups; g += 64u) {
    float part_g[kTokens], part_u[kTokens];
    for (uint t = 0; t < kTokens; ++t) { part_g[t] = 0.0; part_u[t] = 0.0; }
    const uint wa = p.a_words + o * (p.cols / 8u) + g * 4u;
    const uint wb = p.b_words + o * (p.cols / 8u) + g * 4u;
    for (uint j = 0; j < 4u; ++j) {
      const uint qa = weights[wa + j];
      const uint qb = weights[wb + j];
      for (uint k = 0; k < 8u; ++k) {
        const float va = E2m1((qa >> (4u * k)) & 15u);
        const float vb = E2m1((qb >> (4u * k)) & 15u);
        const uint col = g * 32u + j * 8u + k;
        for (uint t = 0; t < kTokens; ++t) {
          const uint r = t0 + t;
          const float xv = r < p.n ? x[(p.x_row + r) * p.cols + col] : 0.0;
          part_g[t] += xv * va;
          part_u[t] += xv * vb;
        }
      }
    }
    const float sa = E8m0(WeightByte(p.a_scales + o * groups + g));
    const float sb = E8m0(WeightByte(p.b_scales + o * groups + g));
    for (uint t = 0; t < kTokens; ++t) {
      acc_g[t] += part_g[t] * sa;
      acc_u[t] += part_u[t] * sb;
    }
  }
  for (uint t = 0; t < kTokens; ++t) { red_g[t][lid] = acc_g[t]; red_u[t][lid] = acc_u[t]; }
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (lid < s) {
      for (uint t = 0; t < kTokens; ++t) {
        red_g[t][lid] += red_g[t][lid + s];
        red_u[t][lid] += red_u[t][lid + s];
      }
    }
    barrier();
  }
  if (lid < kTokens) {
    const uint r = t0 + lid;
    if (r < p.n) {
      const float gv = red_g[lid][0];
      const float uv = red_u[lid][0];
      const float sig = 1.0 / (1.0 + exp(-gv));
      y[(p.x_row + r) * p.rows + o] =
          p.beta1 * SafeTanh(gv / p.beta1) * sig * p.beta2 * SafeTanh(uv / p.beta2);
    }
  }
}
