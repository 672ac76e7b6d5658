// IDOT path, op by op: every quantized matmul the model runs with int8
// activations (K3_IDOT=1) against its f32-activation twin on the same
// weights, within a bound derived from the activation quantization:
//
//   x̂_i = q_i·sc_g with |x̂_i − x_i| ≤ sc_g/2 (round to nearest, sc_g = absmax_g/127)
//   |y_q8 − y_f32| ≤ Σ_i |W_oi|·sc_g(i)/2 + 2·n·u·Σ_i |W_oi|·(|x_i| + sc_g(i))
//
// (u = 2^-24; the second term covers f32 rounding in both accumulations).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "k3/model/model.h"
#include "k3/quant/ops.h"
#include "k3/quant/quant.h"

using namespace k3;
using namespace k3::model;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";

// Activations with the spread real ones have: mostly O(1), a few outliers.
std::vector<float> Acts(size_t rows, size_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(rows * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = n(rng) * ((i % 97 == 0) ? 8.0f : 1.0f);
  return x;
}

// Checks one matrix; returns the worst |err| / bound seen.
double CheckIdot(const quant::WeightView& w, size_t batch, uint64_t seed) {
  const size_t rows = w.rows, cols = w.cols;
  REQUIRE(cols % 32 == 0);
  std::vector<float> x = Acts(batch, cols, seed);
  std::vector<float> y32(batch * rows), y8(batch * rows);
  quant::MatMul(w, x.data(), batch, y32.data());
  quant::ActsQ8 q;
  quant::QuantizeActs(x.data(), batch, cols, &q);
  quant::MatMulQ8(w, q, y8.data());
  std::vector<float> wrow(cols);
  const double u = std::ldexp(1.0, -24);
  double worst = 0;
  for (size_t o = 0; o < rows; ++o) {
    quant::DequantizeRow(w, o, wrow.data());
    for (size_t b = 0; b < batch; ++b) {
      double quant_err = 0, mag = 0;
      for (size_t i = 0; i < cols; ++i) {
        const double sc = q.scales[b * (cols / 32) + i / 32];
        quant_err += std::fabs(wrow[i]) * sc / 2;
        mag += std::fabs(wrow[i]) * (std::fabs(x[b * cols + i]) + sc);
      }
      const double bound =
          quant_err * (1 + 1e-5) + 2.0 * static_cast<double>(cols) * u * mag + 1e-30;
      const double err = std::fabs(static_cast<double>(y8[b * rows + o]) - y32[b * rows + o]);
      CHECK_MESSAGE(err <= bound,
                    "row " << o << " batch " << b << " err " << err << " bound " << bound);
      worst = std::max(worst, err / bound);
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("int8 / int4 resident matrices: MatMulQ8 within the derived bound of MatMul") {
  for (int bits : {8, 4}) {
    LoadOptions lo;
    lo.bits = bits;
    lo.mla_bits = 8;
    lo.head_bits = 8;
    lo.bits_explicit = true;
    lo.progress = false;
    auto m = Model::LoadOrThrow(kTiny, lo);
    double worst = 0;
    int checked = 0;
    uint64_t seed = 1;
    auto check = [&](const Matrix& mat) {
      if (mat.empty() || mat.format() == quant::WeightFormat::kF32 || mat.cols() % 32) return;
      worst = std::max(worst, CheckIdot(mat.view(), 3, seed++));
      ++checked;
    };
    for (const LayerWeights& L : m->weights().layers) {
      for (const Matrix* mat :
           {&L.kda.q, &L.kda.k, &L.kda.v, &L.kda.g, &L.kda.o, &L.mla.q_a, &L.mla.q_b, &L.mla.kv_a,
            &L.mla.kv_b, &L.mla.o, &L.mla.g, &L.dense.gate, &L.dense.up, &L.dense.down,
            &L.moe.latent_down, &L.moe.latent_up, &L.moe.shared.gate, &L.moe.shared.up,
            &L.moe.shared.down}) {
        check(*mat);
      }
    }
    check(m->weights().lm_head);
    MESSAGE("bits " << bits << ": " << checked << " matrices, worst err/bound " << worst);
    CHECK(checked > 50);
  }
}

TEST_CASE("MXFP4 experts: MatMulQ8 within the derived bound of MatMul") {
  LoadOptions lo;
  lo.progress = false;
  auto m = Model::LoadOrThrow(kTiny, lo);
  ExpertStore& store = m->experts();
  const ModelConfig& c = m->config();
  double worst = 0;
  uint64_t seed = 100;
  for (int64_t layer = c.first_k_dense_replace; layer < c.num_hidden_layers; layer += 3) {
    for (int32_t e = 0; e < c.num_experts; e += 5) {
      store.BeginLayer(layer, std::span<const int32_t>(&e, 1));
      ExpertView v = store.Acquire(layer, e);
      worst = std::max(worst, CheckIdot(v.w1, 2, seed++));
      worst = std::max(worst, CheckIdot(v.w2, 2, seed++));
      worst = std::max(worst, CheckIdot(v.w3, 2, seed++));
      store.Release(layer, e);
      store.EndLayer(layer);
    }
  }
  MESSAGE("experts: worst err/bound " << worst);
}

TEST_CASE("gathering pre-quantized latent rows equals quantizing the gathered rows") {
  std::vector<float> x = Acts(5, 64, 7);
  quant::ActsQ8 all, one;
  quant::QuantizeActs(x.data(), 5, 64, &all);
  for (size_t r = 0; r < 5; ++r) {
    quant::QuantizeActs(x.data() + r * 64, 1, 64, &one);
    CHECK(std::equal(one.q.begin(), one.q.begin() + 64, all.q.begin() + static_cast<long>(r * 64)));
    CHECK(std::equal(one.scales.begin(), one.scales.begin() + 2,
                     all.scales.begin() + static_cast<long>(r * 2)));
  }
}
