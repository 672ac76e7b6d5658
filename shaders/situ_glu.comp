#version 450
// g[i] = SiTU-GLU(g[i], u[i]) in place over count floats of the I/O buffer:
// b1 tanh(g / b1) sigmoid(g) b2 tanh(u / b2) (lib/quant's SituGlu), with
// tanh arguments clamped to +-15 as mx_gate_up.comp does. A grid-stride loop
// so any count fits the workgroup-count limit.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Weights { uint weights[]; };
layout(std430, binding = 1) buffer Io { float io[]; };

layout(push_constant) uniform Push {
  uint g_off;   // float offset of g (also the output)
  uint u_off;   // float offset of u
  uint count;
  uint unused0, unused1, unused2, unused3, unused4;
  float beta1;  // situ_beta
  float beta2;  // situ_linear_beta
} p;

float SafeTanh(float v) { return tanh(clamp(v, -15.0, 15.0)); }

void main() {
  const uint stride = gl_NumWorkGroups.x * 64u;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    const float g = io[p.g_off + i];
    const float u = io[p.u_off + i];
    const float sig = 1.0 / (1.0 + exp(-g));
    io[p.g_off + i] = p.beta1 * SafeTanh(g / p.beta1) * sig * p.beta2 * SafeTanh(u / p.beta2);
  }
}
