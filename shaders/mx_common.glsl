// Shared by the MXFP4 shaders (docs/vulkan.md §2). Weights are the expert's
// bytes as stored, read as 32-bit words: row o of a [rows, cols] matrix is
// cols/8 words of e2m1 nibbles (nibble k of a word = column 8j+k, low nibble
// of each byte = even column) and cols/32 E8M0 scale bytes.

// e2m1: bit 3 = sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Decoded
// by building the f32 bits (no table: a dynamically indexed array is slow
// on some drivers): magnitude 0/1 -> 0 / 0.5, else exponent (m >> 1) + 126
// and mantissa bit (m & 1) -> 1, 1.5, 2, 3, 4, 6.
float E2m1(uint code) {
  const uint m = code & 7u;
  const uint mag = m < 2u ? m * 0x3F000000u : ((((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
  return uintBitsToFloat(mag | ((code & 8u) << 28));
}

// Byte `i` of the weight buffer (scale bytes need not be word-aligned).
uint WeightByte(uint i) { return (weights[i >> 2] >> ((i & 3u) * 8u)) & 0xffu; }

// 2^(s-127) by placing s in the f32 exponent field: s = 0 -> +0, 255 -> +inf.
float E8m0(uint s) { return uintBitsToFloat(s << 23); }
