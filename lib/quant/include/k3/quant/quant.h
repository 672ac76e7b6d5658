// Weight formats, quantizers and matrix kernels (spec §6; byte layouts in
// docs/quant.md). This header is the contract between lib/quant and its users
// (lib/model, k3-repack): the implementations may change, these semantics may not.
//
// Determinism contract: every output element of MatMul / MatMulQ8 / RowDot /
// AddRow / AddRows is computed by one sequence of floating-point operations (the
// one order, docs/quant.md §3) whatever the ISA, the batch size and the thread
// count: a row's bits depend on none of them, so chunked prefill is bit-identical
// to token-at-a-time and every machine gives the same answer. Kernels are
// noexcept and thread-safe (they parallelise internally with OpenMP over output
// rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace k3::quant {

enum class WeightFormat : uint8_t {
  kF32 = 0,      // f32 [rows, cols]
  kInt8 = 1,     // int8 [rows, cols] + f32 scale per row
  kInt4G64 = 4,  // u8 [rows, cols/2] (v+8 nibbles, low = even col) + f32 [rows, cols/64]
  kMxfp4 = 7,    // u8 [rows, cols/2] e2m1 nibbles + u8 E8M0 [rows, cols/32]
};

// --- Quantizers: exactly §6.2, op for op in f32 -------------------------------
// s = absmax/127 (or /7), s = max(s, 1e-20), inv = 1/s, v = clamp(rint(x*inv)).

// True when `bits` selects int4-g64 for a row of `cols` (bits <= 4 and cols % 64 == 0);
// otherwise int8 per row (bits 5..31) or f32 (bits >= 32).
inline bool UsesInt4(int bits, size_t cols) { return bits <= 4 && cols % 64 == 0; }

void QuantizeInt8Rows(const float* x, size_t rows, size_t cols, int8_t* q, float* scales) noexcept;
void QuantizeInt4G64Rows(const float* x, size_t rows, size_t cols, uint8_t* packed,
                         float* scales) noexcept;
// §6.7: int8 per-row -> int4-g64 (cols % 64 == 0).
void DowncastInt8ToInt4G64(const int8_t* q8, const float* s8, size_t rows, size_t cols,
                           uint8_t* packed, float* scales) noexcept;

// Dequantizers (reference semantics, used by tests and by f32 fallbacks).
void DequantizeRow(const struct WeightView& w, size_t row, float* out) noexcept;
float E8m0ToF32(uint8_t s) noexcept;  // s<<23 bit pattern: 0 -> +0, 255 -> +inf

// --- Non-owning view of one resident matrix -----------------------------------
struct WeightView {
  WeightFormat format = WeightFormat::kF32;
  size_t rows = 0;
  size_t cols = 0;
  const void* data = nullptr;      // f32 | int8 | packed nibbles
  const float* scales = nullptr;   // int8: [rows]; int4: [rows * cols/64]
  const uint8_t* e8m0 = nullptr;   // mxfp4: [rows * cols/32]

  size_t data_bytes() const;
  size_t scale_count() const;
};

// Rows [r0, r0 + n) of w as a view of their own, any format (their data,
// scales and E8M0 exponents): a MatMul over it gives those rows' elements of a
// MatMul over w, bit for bit (each element is computed on its own).
WeightView RowRange(const WeightView& w, size_t r0, size_t n) noexcept;

// Owns the buffers behind one WeightView (tests, benchmarks, conversions).
struct OwnedWeight {
  WeightFormat format = WeightFormat::kF32;
  size_t rows = 0;
  size_t cols = 0;
  std::vector<uint8_t> data;
  std::vector<float> scales;
  std::vector<uint8_t> e8m0;

  WeightView View() const;
  size_t bytes() const { return data.size() + scales.size() * sizeof(float) + e8m0.size(); }
};

// y[b*rows + o] = sum_i x[b*cols + i] * W[o, i]   (f32 activations; spec §6.3/§6.4)
void MatMul(const WeightView& w, const float* x, size_t batch, float* y) noexcept;

// --- IDOT path: int8 activations quantized per 32-column group (§6.5) ----------
struct ActsQ8 {
  std::vector<int8_t> q;       // [batch, cols]
  std::vector<float> scales;   // [batch, cols/32]
  size_t batch = 0;
  size_t cols = 0;
};
// Requires cols % 32 == 0. Reuses out's buffers (no allocation when large enough).
void QuantizeActs(const float* x, size_t batch, size_t cols, ActsQ8* out) noexcept;
// y as MatMul, with activations from QuantizeActs (mxfp4, int8 and int4 weights).
void MatMulQ8(const WeightView& w, const ActsQ8& x, float* y) noexcept;

// --- Row helpers used by MLA's absorbed attention (§6.3) ------------------------
float RowDot(const WeightView& w, size_t row, const float* x) noexcept;
void AddRow(const WeightView& w, size_t row, float c, float* acc) noexcept;
// For t in [0, tokens), for j in [0, nrows): AddRow(w, row0 + j, coef[t * coef_ld + j],
// acc + t * acc_ld) -- and exactly its bits: each element gets the same
// operations in the same row order. A register-tiled kernel where the ISA has
// one (f32 and int8 rows on AVX-512): MLA's absorbed query and weighted latent
// sum over a block of tokens.
void AddRows(const WeightView& w, size_t row0, size_t nrows, const float* coef, size_t coef_ld,
             size_t tokens, float* acc, size_t acc_ld) noexcept;
// MLA's scores: s[q * nk + j] = scale * (qa[q] . ka[j] + qb[q] . kb[j]) for
// q < nq, j < nk, with qa [nq][da], ka [nk][da], qb [nq][db], kb [nk][db]
// (db may be 0). Each element is one fused multiply-add chain from 0 over the
// da columns in order, then the db columns, then one multiply by scale
// (internal attn.h): every ISA, batch, key count and thread split gives the
// same bits.
void AttnScores(const float* qa, const float* ka, size_t da, const float* qb, const float* kb,
                size_t db, size_t nq, size_t nk, float scale, float* s) noexcept;

}  // namespace k3::quant
