// Quantizer known answers from the shared oracle checkpoint (k3-tiny): real BF16
// weights are quantised by lib/quant and compared byte for byte with a plain loop
// written independently from spec §6.2/§6.7; the oracle's native MXFP4 experts
// are run through every ISA's kernels against a double-precision reference.
// (A separate executable: quant itself must not depend on k3::container.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "k3/container/safetensors.h"
#include "k3/quant/isa.h"
#include "k3/quant/quant.h"
#include "k3_isa_test_support.h"

using namespace k3;
using namespace k3::quant;

namespace {

const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";

std::vector<std::string> Shards() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(kOracle)) {
    if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// BF16 bytes -> f32 the way §6.2 says (bits << 16), independent of lib/core.
std::vector<float> Bf16Rows(const SafetensorsFile& f, const TensorInfo& t) {
  std::vector<std::byte> raw(t.nbytes());
  f.ReadOrThrow(t, raw);
  std::vector<float> out(raw.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t bits = uint32_t(uint8_t(raw[2 * i])) | (uint32_t(uint8_t(raw[2 * i + 1])) << 8);
    bits <<= 16;
    std::memcpy(&out[i], &bits, 4);
  }
  return out;
}

// The spec's int8 per-row algorithm, written out plainly.
void SpecInt8(const std::vector<float>& x, size_t rows, size_t cols, std::vector<int8_t>& q,
              std::vector<float>& s) {
  q.resize(rows * cols);
  s.resize(rows);
  for (size_t r = 0; r < rows; ++r) {
    float am = 0.0f;
    for (size_t i = 0; i < cols; ++i) am = std::max(am, std::fabs(x[r * cols + i]));
    float sc = am / 127.0f;
    if (sc < 1e-20f) sc = 1e-20f;
    float inv = 1.0f / sc;
    for (size_t i = 0; i < cols; ++i) {
      long v = lrintf(x[r * cols + i] * inv);
      q[r * cols + i] = int8_t(std::min(127L, std::max(-127L, v)));
    }
    s[r] = sc;
  }
}

void SpecInt4(const std::vector<float>& x, size_t rows, size_t cols, std::vector<uint8_t>& p,
              std::vector<float>& s) {
  p.assign(rows * cols / 2, 0);
  s.resize(rows * cols / 64);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < cols / 64; ++g) {
      float am = 0.0f;
      for (size_t i = 0; i < 64; ++i) am = std::max(am, std::fabs(x[r * cols + g * 64 + i]));
      float sc = am / 7.0f;
      if (sc < 1e-20f) sc = 1e-20f;
      float inv = 1.0f / sc;
      s[r * (cols / 64) + g] = sc;
      for (size_t i = 0; i < 64; ++i) {
        size_t col = g * 64 + i;
        long v = std::min(7L, std::max(-8L, lrintf(x[r * cols + col] * inv)));
        uint8_t nib = uint8_t(v + 8);
        p[r * cols / 2 + col / 2] |= (col % 2 == 0) ? nib : uint8_t(nib << 4);
      }
    }
  }
}

}  // namespace

TEST_CASE("quantizers reproduce the spec's bytes on the oracle's BF16 weights, every ISA") {
  const Isa saved = ActiveIsa();
  int int8_tensors = 0, int4_tensors = 0;
  for (Isa isa : k3::test::IsasToTest("quantizers on the oracle's weights")) {
  SetIsaForTesting(isa);
  for (const std::string& path : Shards()) {
    SafetensorsFile f = SafetensorsFile::OpenOrThrow(path);
    for (const TensorInfo& t : f.tensors()) {
      if (t.dtype != DType::kBF16 || t.shape.size() != 2) continue;
      const size_t rows = size_t(t.shape[0]), cols = size_t(t.shape[1]);
      std::vector<float> x = Bf16Rows(f, t);
      INFO(t.name << " [" << rows << "x" << cols << "] " << k3::test::IsaStr(isa));

      std::vector<int8_t> q_ref, q(rows * cols);
      std::vector<float> s_ref, s(rows);
      SpecInt8(x, rows, cols, q_ref, s_ref);
      QuantizeInt8Rows(x.data(), rows, cols, q.data(), s.data());
      CHECK(q == q_ref);
      CHECK(std::memcmp(s.data(), s_ref.data(), rows * 4) == 0);
      ++int8_tensors;

      if (!UsesInt4(4, cols)) continue;
      std::vector<uint8_t> p_ref, p(rows * cols / 2);
      std::vector<float> s4_ref, s4(rows * cols / 64);
      SpecInt4(x, rows, cols, p_ref, s4_ref);
      QuantizeInt4G64Rows(x.data(), rows, cols, p.data(), s4.data());
      CHECK(p == p_ref);
      CHECK(std::memcmp(s4.data(), s4_ref.data(), s4.size() * 4) == 0);
      ++int4_tensors;

      // §6.7 downcast of the int8 result, again written out from the text.
      std::vector<uint8_t> d_ref(rows * cols / 2, 0), d(rows * cols / 2);
      std::vector<float> ds_ref(rows * cols / 64), ds(rows * cols / 64);
      for (size_t r = 0; r < rows; ++r) {
        for (size_t g = 0; g < cols / 64; ++g) {
          int am = 0;
          for (size_t i = 0; i < 64; ++i) am = std::max(am, std::abs(int(q_ref[r * cols + g * 64 + i])));
          float sc = float(am) * s_ref[r] / 7.0f;
          if (sc < 1e-20f) sc = 1e-20f;
          float inv = s_ref[r] / sc;
          ds_ref[r * (cols / 64) + g] = sc;
          for (size_t i = 0; i < 64; ++i) {
            size_t col = g * 64 + i;
            long v = std::min(7L, std::max(-8L, lrintf(float(q_ref[r * cols + col]) * inv)));
            d_ref[r * cols / 2 + col / 2] |= (col % 2 == 0) ? uint8_t(v + 8) : uint8_t((v + 8) << 4);
          }
        }
      }
      DowncastInt8ToInt4G64(q.data(), s.data(), rows, cols, d.data(), ds.data());
      CHECK(d == d_ref);
      CHECK(std::memcmp(ds.data(), ds_ref.data(), ds.size() * 4) == 0);
    }
  }
  }
  SetIsaForTesting(saved);
  MESSAGE("oracle tensors checked: int8 " << int8_tensors << ", int4 " << int4_tensors);
  CHECK(int8_tensors >= 20);
  CHECK(int4_tensors >= 10);
}

TEST_CASE("the oracle's MXFP4 experts through every ISA's kernels") {
  const Isa saved = ActiveIsa();
  const std::vector<Isa> isas = k3::test::IsasToTest("the oracle's MXFP4 experts");
  int experts = 0;
  double worst = 0;
  for (const std::string& path : Shards()) {
    SafetensorsFile f = SafetensorsFile::OpenOrThrow(path);
    for (const TensorInfo& t : f.tensors()) {
      const std::string& n = t.name;
      if (n.size() < 14 || n.compare(n.size() - 14, 14, ".weight_packed") != 0) continue;
      const TensorInfo* st = f.Find(n.substr(0, n.size() - 14) + ".weight_scale");
      REQUIRE(st != nullptr);
      const size_t rows = size_t(t.shape[0]), cols = size_t(t.shape[1]) * 2;
      REQUIRE(st->nbytes() == rows * cols / 32);
      std::vector<uint8_t> packed(t.nbytes()), scales(st->nbytes());
      f.ReadOrThrow(t, std::as_writable_bytes(std::span(packed)));
      f.ReadOrThrow(*st, std::as_writable_bytes(std::span(scales)));
      WeightView w;
      w.format = WeightFormat::kMxfp4;
      w.rows = rows;
      w.cols = cols;
      w.data = packed.data();
      w.e8m0 = scales.data();
      std::vector<float> x(cols);
      for (size_t i = 0; i < cols; ++i) x[i] = std::sin(float(i) * 0.37f + float(experts));
      ActsQ8 a;
      QuantizeActs(x.data(), 1, cols, &a);
      // Double references: from f32 x, and from the quantised activations.
      std::vector<double> ref(rows), ref_q(rows), bound(rows), bound_q(rows);
      std::vector<float> row(cols);
      for (size_t o = 0; o < rows; ++o) {
        DequantizeRow(w, o, row.data());
        double s = 0, sa = 0, q = 0, qa = 0;
        for (size_t i = 0; i < cols; ++i) {
          double t1 = double(x[i]) * row[i];
          double t2 = double(a.q[i]) * a.scales[i / 32] * row[i];
          s += t1;
          sa += std::fabs(t1);
          q += t2;
          qa += std::fabs(t2);
        }
        ref[o] = s;
        ref_q[o] = q;
        bound[o] = (cols + 4) / 16777216.0 * sa + 1e-30;
        bound_q[o] = (cols + 6) / 16777216.0 * qa + 1e-30;
      }
      for (Isa isa : isas) {
        SetIsaForTesting(isa);
        std::vector<float> y(rows), yq(rows);
        MatMul(w, x.data(), 1, y.data());
        MatMulQ8(w, a, yq.data());
        for (size_t o = 0; o < rows; ++o) {
          INFO(n << " " << k3::test::IsaStr(isa) << " row " << o);
          const double e1 = std::fabs(y[o] - ref[o]) / bound[o];
          const double e2 = std::fabs(yq[o] - ref_q[o]) / bound_q[o];
          worst = std::max({worst, e1, e2});
          CHECK(e1 <= 1.0);
          CHECK(e2 <= 1.0);
        }
      }
      ++experts;
    }
  }
  SetIsaForTesting(saved);
  MESSAGE("oracle MXFP4 matrices: " << experts << ", worst err/bound " << worst);
  CHECK(experts > 0);
}
