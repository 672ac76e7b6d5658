// Shared by the trunk's matrix shaders (docs/vulkan.md §6): y = W x for one
// row range of one matrix held in a weight slab as the container stores it,
// over n tokens; one workgroup of 64 invocations per output row and per
// kTokens tokens, f32 accumulation, a shared-memory tree over the 64 partials.
// Inputs and outputs live in one I/O buffer at float offsets.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint kTokens = 4;

layout(std430, binding = 0) readonly buffer Weights { uint weights[]; };
layout(std430, binding = 1) buffer Io { float io[]; };

layout(push_constant) uniform Push {
  uint w_word;    // word offset of the range's first row in the slab
  uint s_word;    // word offset of its f32 scales (int8: one per row; int4: cols/64 per row)
  uint rows;      // rows in the range
  uint cols;
  uint x_off;     // float offset of token 0's input row (cols floats per token)
  uint y_off;     // float offset of token 0's output for the range's first row
  uint y_stride;  // floats between two tokens' outputs (the matrix's rows)
  uint n;         // tokens
  float beta1;    // unused here (situ_glu.comp's)
  float beta2;
} p;

shared float red[kTokens][64];

// x for token t0 + t at column i (0 past the last token).
float X(uint t0, uint t, uint i) {
  const uint r = t0 + t;
  return r < p.n ? io[p.x_off + r * p.cols + i] : 0.0;
}

// Sums each token's 64 partials and writes row o's outputs.
void ReduceAndStore(uint o, uint t0, uint lid, float acc[kTokens], float scale) {
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
    if (r < p.n) io[p.y_off + r * p.y_stride + o] = red[lid][0] * scale;
  }
}
