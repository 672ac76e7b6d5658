// lib/quant parity on adversarial inputs: every kernel whose contract is the
// scalar reference's bits (docs/quant.md §2, §3.4, §3.7) is run per ISA on
// inputs built to reach its edges — magnitudes from subnormal to near overflow
// in one group, exact rounding ties at many scales, ±0, ±inf, NaN, int8 −128,
// every E8M0 byte, negative and subnormal group scales, lengths off every
// vector width — and compared with memcmp (NaN as NaN).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "k3/quant/isa.h"
#include "k3/quant/ops.h"
#include "k3/quant/quant.h"
#include "k3_isa_test_support.h"
#include "kernels.h"
#include "quant_test_bytes.h"

using namespace k3::quant;
using k3::test::IsasToTest;
using k3::test::IsaStr;

namespace {

struct IsaRestore {
  Isa saved = ActiveIsa();
  ~IsaRestore() { SetIsaForTesting(saved); }
};

// Index of the first element whose bits differ (NaN equals NaN), or n.
size_t FirstDiff(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(a + i, b + i, 4) != 0) return i;
  }
  return n;
}

// One adversarial float: mostly ordinary values at a random binary scale, and
// now and then an edge value.
float EdgeFloat(std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 15), exp2(-140, 120);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  switch (pick(rng)) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return std::ldexp(nd(rng), -130);  // subnormal
    case 3: return std::ldexp(nd(rng), exp2(rng) > 0 ? 120 : -120);
    case 4: return float(int(rng() % 255) - 127) + 0.5f;  // ties when s = 1
    default: return std::ldexp(nd(rng), exp2(rng) / 8);
  }
}

// Activation rows whose groups each hit one kind of edge (ties at a power-of-two
// scale, one huge value among tiny ones, subnormals only, signed zeros, a NaN or
// an inf, plain random), `cols` a multiple of 64.
std::vector<float> AdversarialRows(size_t rows, size_t cols, std::mt19937& rng) {
  std::vector<float> x(rows * cols);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < cols / 32; ++g) {
      float* p = x.data() + r * cols + g * 32;
      const int kind = int((r * 7 + g * 3) % 9);
      const float s = std::ldexp(1.0f, int(rng() % 40) - 20);
      for (size_t i = 0; i < 32; ++i) {
        switch (kind) {
          case 0: p[i] = (float(int(rng() % 254) - 127) + 0.5f) * s; break;  // ties
          case 1: p[i] = nd(rng) * 1e-6f; break;
          case 2: p[i] = std::ldexp(nd(rng), -135); break;
          case 3: p[i] = (i & 1) ? -0.0f : 0.0f; break;
          case 4: p[i] = nd(rng) * 3e37f; break;
          default: p[i] = EdgeFloat(rng); break;
        }
      }
      if (kind == 0) p[rng() % 32] = 127.0f * s;  // absmax 127·s: s exact, ties exact
      if (kind == 1) p[rng() % 32] = 1e30f;
      if (kind == 6) p[rng() % 32] = std::numeric_limits<float>::quiet_NaN();
      if (kind == 7) p[rng() % 32] = (rng() & 1) ? INFINITY : -INFINITY;
    }
  }
  return x;
}

}  // namespace

TEST_CASE("quantizers: the scalar bytes on every ISA for adversarial rows") {
  IsaRestore restore;
  const std::vector<Isa> isas = IsasToTest("adversarial quantizer bytes");
  std::mt19937 rng(101);
  for (size_t cols : {size_t{64}, size_t{192}, size_t{448}, size_t{1088}}) {
    const size_t rows = 11;
    const std::vector<float> x = AdversarialRows(rows, cols, rng);
    using Out = k3::quant::test::QuantizerBytes;
    auto run = [&](Isa isa) {
      SetIsaForTesting(isa);
      return k3::quant::test::QuantizeAll(x.data(), rows, cols);
    };
    const Out ref = run(Isa::kScalar);
    for (Isa isa : isas) {
      const Out o = run(isa);
      INFO(IsaStr(isa) << " cols " << cols);
      CHECK(o.q8 == ref.q8);
      CHECK(FirstDiff(o.s8.data(), ref.s8.data(), rows) == rows);
      CHECK(o.p4 == ref.p4);
      CHECK(FirstDiff(o.s4.data(), ref.s4.data(), o.s4.size()) == o.s4.size());
      CHECK(o.d4 == ref.d4);
      CHECK(FirstDiff(o.ds4.data(), ref.ds4.data(), o.ds4.size()) == o.ds4.size());
      CHECK(o.acts.q == ref.acts.q);
      CHECK(FirstDiff(o.acts.scales.data(), ref.acts.scales.data(), o.acts.scales.size()) ==
            o.acts.scales.size());
    }
  }
}

namespace {

// An adversarial weight matrix: int8 with -128 in one byte in seven and scales
// from subnormal to huge; int4 with negative, zero and subnormal group scales;
// MXFP4 with every E8M0 byte but 255; f32 from EdgeFloat.
OwnedWeight AdversarialWeight(WeightFormat fmt, size_t rows, size_t cols, std::mt19937& rng) {
  OwnedWeight w;
  w.format = fmt;
  w.rows = rows;
  w.cols = cols;
  if (fmt == WeightFormat::kF32) {
    w.data.resize(rows * cols * 4);
    for (size_t i = 0; i < rows * cols; ++i) {
      const float v = EdgeFloat(rng);
      std::memcpy(w.data.data() + 4 * i, &v, 4);
    }
  } else if (fmt == WeightFormat::kInt8) {
    w.data.resize(rows * cols);
    for (auto& b : w.data) b = uint8_t(rng() % 7 == 0 ? 0x80 : rng());
    for (size_t r = 0; r < rows; ++r) w.scales.push_back(std::fabs(EdgeFloat(rng)));
  } else {
    w.data.resize(rows * cols / 2);
    for (auto& b : w.data) b = uint8_t(rng());
    if (fmt == WeightFormat::kInt4G64) {
      for (size_t i = 0; i < rows * cols / 64; ++i) w.scales.push_back(EdgeFloat(rng));
    } else {
      for (size_t i = 0; i < rows * cols / 32; ++i) w.e8m0.push_back(uint8_t(rng() % 255));
    }
  }
  return w;
}

std::string FmtStr(WeightFormat fmt) {
  switch (fmt) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kInt8: return "int8";
    case WeightFormat::kInt4G64: return "int4";
    case WeightFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

// Runs `f` with the scalar table, then with every ISA's and with the start-up
// dispatch (which may take a kernel from another table, isa.cc), comparing the
// floats it returns with memcmp (NaN as NaN).
template <typename F>
void CheckScalarBits(const std::vector<Isa>& isas, const std::string& what, F&& f) {
  SetIsaForTesting(Isa::kScalar);
  const std::vector<float> ref = f();
  auto check = [&](const std::vector<float>& y, const std::string& who) {
    const size_t d = FirstDiff(y.data(), ref.data(), y.size());
    std::string at = std::to_string(d) + " of " + std::to_string(y.size());
    if (d < y.size()) at += " (" + std::to_string(y[d]) + " vs " + std::to_string(ref[d]) + ")";
    CHECK_MESSAGE(d == y.size(), what << " " << who << ": first diff at " << at);
  };
  for (Isa isa : isas) {
    SetIsaForTesting(isa);
    check(f(), IsaStr(isa));
  }
  ResetIsaForTesting();
  check(f(), "start-up dispatch");
}

}  // namespace

// The one order (docs/quant.md §3): the matrix kernels of every ISA give the
// scalar reference's bits -- the IDOT path and the f32-activation path, batch 1
// (decode kernels) and batched (GEMM kernels), RowDot, AddRow and AddRows -- so
// a row's bits depend on neither the ISA nor the batch. Lengths: plain rows off
// every vector width; groups not a multiple of a 16-group block.
TEST_CASE("matrix kernels: the scalar bits on every ISA (IDOT and f32 paths, decode and batched)") {
  IsaRestore restore;
  const std::vector<Isa> isas = IsasToTest("matrix kernel bits");
  std::mt19937 rng(103);
  for (WeightFormat fmt : {WeightFormat::kF32, WeightFormat::kInt8, WeightFormat::kInt4G64,
                           WeightFormat::kMxfp4}) {
    std::vector<size_t> widths = {64, 128, 192, 320, 1088, 4160};
    if (fmt == WeightFormat::kF32 || fmt == WeightFormat::kInt8) {
      for (size_t c : {size_t{1}, size_t{7}, size_t{33}, size_t{100}, size_t{517}}) widths.push_back(c);
    }
    for (size_t cols : widths) {
      const size_t rows = 19;
      const OwnedWeight w = AdversarialWeight(fmt, rows, cols, rng);
      const std::string tag = FmtStr(fmt) + " cols " + std::to_string(cols);
      for (size_t batch : {size_t{1}, size_t{5}, size_t{37}}) {
        const std::vector<float> x = cols % 64 == 0 ? AdversarialRows(batch, cols, rng) : [&] {
          std::vector<float> v(batch * cols);
          for (auto& f : v) f = EdgeFloat(rng);
          return v;
        }();
        const std::string bt = tag + " batch " + std::to_string(batch);
        CheckScalarBits(isas, "MatMul " + bt, [&] {
          std::vector<float> y(batch * rows, -1.0f);
          MatMul(w.View(), x.data(), batch, y.data());
          return y;
        });
        if (fmt != WeightFormat::kF32 && cols % 32 == 0) {
          ActsQ8 a;
          SetIsaForTesting(Isa::kScalar);
          QuantizeActs(x.data(), batch, cols, &a);
          CheckScalarBits(isas, "MatMulQ8 " + bt, [&] {
            std::vector<float> y(batch * rows, -1.0f);
            MatMulQ8(w.View(), a, y.data());
            return y;
          });
        }
      }
      const std::vector<float> x1 = [&] {
        std::vector<float> v(cols);
        for (auto& f : v) f = EdgeFloat(rng);
        return v;
      }();
      CheckScalarBits(isas, "RowDot " + tag, [&] {
        std::vector<float> y(rows);
        for (size_t r = 0; r < rows; ++r) y[r] = RowDot(w.View(), r, x1.data());
        return y;
      });
      std::vector<float> coef(rows);
      for (auto& c : coef) c = EdgeFloat(rng);
      CheckScalarBits(isas, "AddRow " + tag, [&] {
        std::vector<float> acc = x1;
        for (size_t r = 0; r < rows; ++r) AddRow(w.View(), r, coef[r], acc.data());
        return acc;
      });
      const size_t tokens = 7, nrows = rows - 3;
      std::vector<float> tc(tokens * rows);
      for (auto& c : tc) c = EdgeFloat(rng);
      CheckScalarBits(isas, "AddRows " + tag, [&] {
        std::vector<float> acc(tokens * cols);
        for (size_t t = 0; t < tokens; ++t) std::copy(x1.begin(), x1.end(), acc.begin() + t * cols);
        AddRows(w.View(), 2, nrows, tc.data(), rows, tokens, acc.data(), cols);
        return acc;
      });
    }
  }
}

TEST_CASE("element-wise kernels: the scalar bits on every ISA for adversarial values") {
  IsaRestore restore;
  const std::vector<Isa> isas = IsasToTest("adversarial element-wise kernels");
  std::mt19937 rng(107);
  const size_t n = 4133;
  std::vector<float> g(n), u(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = EdgeFloat(rng);
    u[i] = EdgeFloat(rng);
  }
  std::vector<float> ref(n);
  internal::SituGluScalar(g.data(), u.data(), n, 4.0f, 25.0f, ref.data());
  std::vector<float> sm(n);
  std::normal_distribution<float> nd(0.0f, 30.0f);
  for (auto& f : sm) f = nd(rng);
  for (Isa isa : isas) {
    SetIsaForTesting(isa);
    for (size_t len : {n, size_t{3}, size_t{29}}) {
      std::vector<float> out(len, -7.0f);
      SituGlu(g.data(), u.data(), len, 4.0f, 25.0f, out.data());
      CHECK_MESSAGE(FirstDiff(out.data(), ref.data(), len) == len, IsaStr(isa) << " SituGlu " << len);
      std::vector<float> a(sm.begin(), sm.begin() + len), b = a;
      Softmax(a.data(), len);
      internal::SoftmaxScalar(b.data(), len);
      CHECK_MESSAGE(FirstDiff(a.data(), b.data(), len) == len, IsaStr(isa) << " Softmax " << len);
    }
  }
}
