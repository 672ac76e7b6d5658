// MLA's attention scores (quant.h AttnScores), written once as plain loops
// that every kernel file without its own version compiles for its ISA (as
// kda.h): one fused multiply-add chain per (query, key) pair, from 0 over the
// first part's columns in order, then the second part's, then one multiply by
// the scale. The keys go in panels of kScoreLanes, transposed so that a
// panel's keys sit side by side: the vector lanes are keys, and no pair needs a
// horizontal sum. std::fma is the fused operation in every build (the scalar
// one calls libm's, which rounds once too), so every ISA gives the same bits,
// and so does AVX-512's hand-written kernel (kernels_avx512.cc).
#pragma once

#include <cmath>
#include <cstddef>
#include <utility>

namespace k3::quant::internal {
namespace {

inline constexpr size_t kScoreLanes = 16;   // keys per transposed panel
inline constexpr size_t kScoreQueries = 4;  // queries per pass over a panel

// kt[c][l] = column c of key j0 + l (the first part's columns, then the
// second's); keys past n are zero.
inline void ScorePanel(const float* ka, size_t da, const float* kb, size_t db, size_t j0, size_t n,
                       float* kt) noexcept {
  for (size_t l = 0; l < n; ++l) {
    const float* ra = ka + (j0 + l) * da;
    for (size_t c = 0; c < da; ++c) kt[c * kScoreLanes + l] = ra[c];
    for (size_t c = 0; c < db; ++c) kt[(da + c) * kScoreLanes + l] = kb[(j0 + l) * db + c];
  }
  for (size_t l = n; l < kScoreLanes; ++l) {
    for (size_t c = 0; c < da + db; ++c) kt[c * kScoreLanes + l] = 0.0f;
  }
}

template <size_t R>
inline void ScoreRows(const float* qa, size_t da, const float* qb, size_t db, const float* kt,
                      size_t n, float scale, float* s, size_t s_ld) noexcept {
  float acc[R][kScoreLanes];
  for (size_t r = 0; r < R; ++r) {
    for (size_t l = 0; l < kScoreLanes; ++l) acc[r][l] = 0.0f;
  }
  for (size_t c = 0; c < da; ++c) {
    const float* k = kt + c * kScoreLanes;
    for (size_t r = 0; r < R; ++r) {
      const float a = qa[r * da + c];
      for (size_t l = 0; l < kScoreLanes; ++l) acc[r][l] = std::fma(a, k[l], acc[r][l]);
    }
  }
  for (size_t c = 0; c < db; ++c) {
    const float* k = kt + (da + c) * kScoreLanes;
    for (size_t r = 0; r < R; ++r) {
      const float a = qb[r * db + c];
      for (size_t l = 0; l < kScoreLanes; ++l) acc[r][l] = std::fma(a, k[l], acc[r][l]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    for (size_t l = 0; l < n; ++l) s[r * s_ld + l] = acc[r][l] * scale;
  }
}

// The panel loop every ISA but AVX-512 runs: keys [j0, j1) in panels of
// kScoreLanes, transposed into kt ((da + db) * kScoreLanes floats), then the
// queries in tiles of Q and one tile of the rest. `tile` is a generic lambda
// `[&]<size_t R>(qa, qb, n, s)` scoring R queries against the panel's n keys;
// a tile's shape never changes a pair's operations.
template <size_t Q, typename Tile>
inline void ScorePanels(const float* qa, const float* ka, size_t da, const float* qb,
                        const float* kb, size_t db, size_t nq, size_t j0, size_t j1, float* s,
                        size_t s_ld, float* kt, Tile&& tile) noexcept {
  for (size_t p = j0; p < j1; p += kScoreLanes) {
    const size_t n = j1 - p < kScoreLanes ? j1 - p : kScoreLanes;
    ScorePanel(ka, da, kb, db, p, n, kt);
    size_t q = 0;
    for (; q + Q <= nq; q += Q) tile.template operator()<Q>(qa + q * da, qb + q * db, n, s + q * s_ld + p);
    [&]<size_t... R>(std::index_sequence<R...>) {
      const size_t left = nq - q;
      ((left == R + 1 ? tile.template operator()<R + 1>(qa + q * da, qb + q * db, n, s + q * s_ld + p)
                      : void()),
       ...);
    }(std::make_index_sequence<Q - 1>());
  }
}

inline void AttnScoresLoop(const float* qa, const float* ka, size_t da, const float* qb,
                           const float* kb, size_t db, size_t nq, size_t j0, size_t j1, float scale,
                           float* s, size_t s_ld, float* kt) noexcept {
  ScorePanels<kScoreQueries>(
      qa, ka, da, qb, kb, db, nq, j0, j1, s, s_ld, kt,
      [&]<size_t R>(const float* qa1, const float* qb1, size_t n, float* s1) {
        ScoreRows<R>(qa1, da, qb1, db, kt, n, scale, s1, s_ld);
      });
}

}  // namespace
}  // namespace k3::quant::internal
