// lib/quant tests: known answers for the quantizers, the kernels against a
// double-precision reference built from dequantised weights, parity of every ISA
// this machine runs against the scalar reference, and batch/thread invariance.
#include "k3/quant/quant.h"

#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "k3/quant/isa.h"
#include "k3/quant/ops.h"
#include "kernels.h"
#include "situ.h"
#include "k3/quant/roof.h"
#include "k3_isa_test_support.h"
#include "quant_test_bytes.h"

using namespace k3::quant;
using k3::test::IsasToTest;
using k3::test::IsaStr;

namespace {

constexpr double kU = 1.0 / (1 << 24);  // unit roundoff of f32

// Restores the start-up ISA choice when a test case ends.
struct IsaGuard {
  Isa saved = ActiveIsa();
  ~IsaGuard() { SetIsaForTesting(saved); }
};

// An owned matrix in one of the formats, plus its exact dequantised values.
struct Mat : OwnedWeight {
  std::vector<float> Dequant() const {
    std::vector<float> out(rows * cols);
    for (size_t r = 0; r < rows; ++r) DequantizeRow(View(), r, out.data() + r * cols);
    return out;
  }
};

Mat RandomMat(WeightFormat fmt, size_t rows, size_t cols, std::mt19937& rng) {
  Mat m;
  m.format = fmt;
  m.rows = rows;
  m.cols = cols;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  switch (fmt) {
    case WeightFormat::kF32: {
      m.data.resize(rows * cols * 4);
      auto* f = reinterpret_cast<float*>(m.data.data());
      for (size_t i = 0; i < rows * cols; ++i) f[i] = nd(rng);
      break;
    }
    case WeightFormat::kInt8: {
      std::uniform_int_distribution<int> q(-127, 127);
      m.data.resize(rows * cols);
      for (auto& b : m.data) b = static_cast<uint8_t>(static_cast<int8_t>(q(rng)));
      for (size_t r = 0; r < rows; ++r) m.scales.push_back(0.01f * (1.0f + std::fabs(nd(rng))));
      break;
    }
    case WeightFormat::kInt4G64:
      m.data.resize(rows * cols / 2);
      for (auto& b : m.data) b = static_cast<uint8_t>(byte(rng));
      for (size_t i = 0; i < rows * cols / 64; ++i) m.scales.push_back(0.1f * (1 + std::fabs(nd(rng))));
      break;
    case WeightFormat::kMxfp4: {
      std::uniform_int_distribution<int> e(115, 130);
      m.data.resize(rows * cols / 2);
      for (auto& b : m.data) b = static_cast<uint8_t>(byte(rng));
      for (size_t i = 0; i < rows * cols / 32; ++i) m.e8m0.push_back(static_cast<uint8_t>(e(rng)));
      break;
    }
  }
  return m;
}

std::vector<float> RandomVec(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Reference y and the error bound for any summation order: the recursive-sum
// bound gamma_k * sum|terms| with k = cols + 4 (products, group and scale steps).
struct Ref {
  std::vector<double> y;
  std::vector<double> bound;
};

Ref ReferenceF32(const Mat& m, const std::vector<float>& x, size_t batch) {
  std::vector<float> w = m.Dequant();
  Ref r;
  r.y.resize(batch * m.rows);
  r.bound.resize(batch * m.rows);
  const double gamma = (m.cols + 4) * kU;
  for (size_t b = 0; b < batch; ++b) {
    for (size_t o = 0; o < m.rows; ++o) {
      double s = 0, a = 0;
      for (size_t i = 0; i < m.cols; ++i) {
        double t = double(x[b * m.cols + i]) * double(w[o * m.cols + i]);
        s += t;
        a += std::fabs(t);
      }
      r.y[b * m.rows + o] = s;
      r.bound[b * m.rows + o] = gamma * a + 1e-30;
    }
  }
  return r;
}

// Same for the IDOT path from the quantised activations (the activation
// quantisation itself is the model's choice, not kernel error).
Ref ReferenceQ8(const Mat& m, const ActsQ8& a) {
  std::vector<float> w = m.Dequant();
  Ref r;
  r.y.resize(a.batch * m.rows);
  r.bound.resize(a.batch * m.rows);
  const size_t groups = m.cols / 32;
  const double gamma = (m.cols + 6) * kU;
  for (size_t b = 0; b < a.batch; ++b) {
    for (size_t o = 0; o < m.rows; ++o) {
      double s = 0, abs_sum = 0;
      for (size_t i = 0; i < m.cols; ++i) {
        double xv = double(a.q[b * m.cols + i]) * a.scales[b * groups + i / 32];
        double t = xv * w[o * m.cols + i];
        s += t;
        abs_sum += std::fabs(t);
      }
      r.y[b * m.rows + o] = s;
      r.bound[b * m.rows + o] = gamma * abs_sum + 1e-30;
    }
  }
  return r;
}

// err/bound over one output: `bad` counts every element whose ratio is not
// <= 1 (over the bound, or NaN from a NaN/inf output); `worst` is the largest
// finite ratio. (A running "if (!(r <= worst)) worst = r" lets a NaN in and the
// next finite ratio replace it: [2, NaN, 0.1] would end at 0.1.)
struct RatioScan {
  size_t bad = 0, first_bad = 0, worst_i = 0;
  double worst = 0;
  bool nan = false;
};

RatioScan ScanRatios(const Ref& ref, const std::vector<float>& y) {
  RatioScan s;
  for (size_t i = 0; i < y.size(); ++i) {
    const double ratio = std::fabs(double(y[i]) - ref.y[i]) / ref.bound[i];
    if (!(ratio <= 1.0) && s.bad++ == 0) s.first_bad = i;
    if (std::isnan(ratio)) {
      s.nan = true;
    } else if (ratio > s.worst) {
      s.worst = ratio;
      s.worst_i = i;
    }
  }
  return s;
}

// Checks |y - ref| <= bound everywhere; returns the worst err/bound ratio, +inf
// when one was NaN, so the callers' running max (std::max drops a NaN) shows it.
double CheckAgainst(const Ref& ref, const std::vector<float>& y, const std::string& what) {
  REQUIRE(y.size() == ref.y.size());
  const RatioScan s = ScanRatios(ref, y);
  INFO(what << ": worst element " << s.worst_i << " y=" << y[s.worst_i]
            << " ref=" << ref.y[s.worst_i] << " err/bound=" << s.worst);
  INFO(s.bad << " element(s) over the bound or NaN, the first " << s.first_bad
             << " y=" << y[s.first_bad] << " ref=" << ref.y[s.first_bad]);
  CHECK(s.bad == 0);
  return s.nan ? std::numeric_limits<double>::infinity() : s.worst;
}

std::string FmtName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kInt8: return "int8";
    case WeightFormat::kInt4G64: return "int4";
    case WeightFormat::kMxfp4: return "mxfp4";
  }
  return "?";
}

}  // namespace

TEST_CASE("the err/bound check fails on a NaN or any ratio over the bound") {
  Ref ref;
  ref.y = {0.0, 0.0, 0.0};
  ref.bound = {1.0, 1.0, 1.0};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  RatioScan s = ScanRatios(ref, {2.0f, nan, 0.1f});  // a last-ratio tracker would end at 0.1
  CHECK(s.bad == 2);
  CHECK(s.first_bad == 0);
  CHECK(s.nan);
  CHECK(s.worst == 2.0);
  s = ScanRatios(ref, {0.5f, nan, 0.1f});
  CHECK(s.bad == 1);
  CHECK(s.first_bad == 1);
  s = ScanRatios(ref, {0.5f, 0.25f, 1.5f});
  CHECK(s.bad == 1);
  CHECK(s.first_bad == 2);
  s = ScanRatios(ref, {0.5f, -1.0f, std::numeric_limits<float>::infinity()});
  CHECK(s.bad == 1);
  s = ScanRatios(ref, {0.5f, -1.0f, 0.1f});  // exactly on the bound passes
  CHECK(s.bad == 0);
  CHECK(s.worst == 1.0);
  CHECK(s.worst_i == 1);
}

TEST_CASE("E8M0 decodes by placing the byte in the exponent field") {
  CHECK(E8m0ToF32(127) == 1.0f);
  CHECK(E8m0ToF32(128) == 2.0f);
  CHECK(E8m0ToF32(120) == std::ldexp(1.0f, -7));
  CHECK(E8m0ToF32(1) == std::ldexp(1.0f, -126));
  CHECK(E8m0ToF32(254) == std::ldexp(1.0f, 127));
  CHECK(std::bit_cast<uint32_t>(E8m0ToF32(0)) == 0u);
  CHECK(std::isinf(E8m0ToF32(255)));
}

TEST_CASE("int8 row quantizer: hand-checked answers") {
  // absmax 127 -> s = 1, inv = 1; ties round to even; 127.4 rounds to 127.
  const float x[8] = {127.0f, -0.5f, 0.5f, 1.5f, 2.5f, -2.5f, 126.6f, -3.0f};
  int8_t q[8];
  float s;
  QuantizeInt8Rows(x, 1, 8, q, &s);
  CHECK(s == 1.0f);
  const int8_t expect[8] = {127, 0, 0, 2, 2, -2, 127, -3};
  CHECK(std::memcmp(q, expect, 8) == 0);
  // An all-zero row gets the 1e-20 floor and zeros.
  const float z[4] = {0, 0, -0.0f, 0};
  QuantizeInt8Rows(z, 1, 4, q, &s);
  CHECK(s == 1e-20f);
  CHECK(q[0] == 0);
  CHECK(q[2] == 0);
}

TEST_CASE("int4-g64 quantizer packs +8-biased nibbles, low nibble = even column") {
  std::vector<float> x(128, 0.0f);
  x[0] = 7.0f;   // group 0 absmax 7 -> s = 1
  x[1] = -8.0f;  // the absmax: s = 8/7, so -8 maps to -7
  x[64] = 3.5f;  // group 1: s = 0.5, 3.5/0.5 = 7
  x[65] = -1.25f;  // -2.5 -> -2 (half to even)
  std::vector<uint8_t> p(64);
  float s[2];
  QuantizeInt4G64Rows(x.data(), 1, 128, p.data(), s);
  CHECK(s[0] == 8.0f / 7.0f);
  const float inv0 = 1.0f / (8.0f / 7.0f);
  CHECK((p[0] & 15) == std::clamp(int(std::lrint(7.0f * inv0)), -8, 7) + 8);
  CHECK((p[0] >> 4) == std::clamp(int(std::lrint(-8.0f * inv0)), -8, 7) + 8);
  CHECK(p[1] == 0x88);      // zeros
  CHECK(s[1] == 0.5f);
  CHECK((p[32] & 15) == 15);
  CHECK((p[32] >> 4) == 6);
  CHECK(UsesInt4(4, 128));
  CHECK_FALSE(UsesInt4(4, 96));
  CHECK_FALSE(UsesInt4(8, 128));
}

TEST_CASE("int8 -> int4-g64 downcast follows §6.7") {
  std::mt19937 rng(7);
  std::vector<float> x = RandomVec(3 * 128, rng);
  std::vector<int8_t> q8(x.size());
  float s8[3];
  QuantizeInt8Rows(x.data(), 3, 128, q8.data(), s8);
  std::vector<uint8_t> p(3 * 64);
  std::vector<float> s4(6);
  DowncastInt8ToInt4G64(q8.data(), s8, 3, 128, p.data(), s4.data());
  for (size_t r = 0; r < 3; ++r) {
    for (size_t g = 0; g < 2; ++g) {
      int am = 0;
      for (int i = 0; i < 64; ++i) am = std::max(am, std::abs(int(q8[r * 128 + g * 64 + i])));
      float s = float(am) * s8[r] / 7.0f;
      if (s < 1e-20f) s = 1e-20f;
      CHECK(s4[r * 2 + g] == s);
      float inv = s8[r] / s;
      for (int i = 0; i < 64; ++i) {
        long v = std::clamp(std::lrint(float(q8[r * 128 + g * 64 + i]) * inv), -8L, 7L);
        size_t col = g * 64 + i;
        uint8_t byte = p[r * 64 + col / 2];
        CHECK(((col & 1) ? byte >> 4 : byte & 15) == v + 8);
      }
    }
  }
}

TEST_CASE("QuantizeActs: per-32 groups, reuses buffers") {
  std::mt19937 rng(3);
  std::vector<float> x = RandomVec(2 * 96, rng);
  x[5] = 0;
  for (int i = 32; i < 64; ++i) x[i] = 0;  // a zero group
  ActsQ8 a;
  QuantizeActs(x.data(), 2, 96, &a);
  CHECK(a.batch == 2);
  CHECK(a.cols == 96);
  for (size_t b = 0; b < 2; ++b) {
    for (size_t g = 0; g < 3; ++g) {
      float am = 0;
      for (int i = 0; i < 32; ++i) am = std::max(am, std::fabs(x[b * 96 + g * 32 + i]));
      float sc = std::max(am / 127.0f, 1e-20f);
      CHECK(a.scales[b * 3 + g] == sc);
      for (int i = 0; i < 32; ++i) {
        long v = std::clamp(std::lrint(x[b * 96 + g * 32 + i] * (1.0f / sc)), -127L, 127L);
        CHECK(a.q[b * 96 + g * 32 + i] == v);
      }
    }
  }
  const int8_t* before = a.q.data();
  QuantizeActs(x.data(), 1, 96, &a);
  CHECK(a.q.data() == before);
  CHECK(a.batch == 1);
}

TEST_CASE("MatMul matches the double reference on every ISA, all formats, odd shapes") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("MatMul vs the double reference");
  std::mt19937 rng(11);
  double worst = 0;
  struct Shape { size_t rows, cols; };
  for (WeightFormat fmt : {WeightFormat::kF32, WeightFormat::kInt8, WeightFormat::kInt4G64,
                           WeightFormat::kMxfp4}) {
    const size_t unit = fmt == WeightFormat::kInt4G64 ? 64 : fmt == WeightFormat::kMxfp4 ? 32 : 1;
    for (Shape sh : {Shape{1, unit}, Shape{7, 3 * unit}, Shape{33, 5 * unit + (unit == 1 ? 2 : 0)},
                     Shape{19, 112 * (unit == 1 ? 32 : unit) / (unit == 64 ? 2 : 1)}}) {
      Mat m = RandomMat(fmt, sh.rows, sh.cols, rng);
      for (size_t batch : {size_t{1}, size_t{3}}) {
        std::vector<float> x = RandomVec(batch * sh.cols, rng);
        Ref ref = ReferenceF32(m, x, batch);
        for (Isa isa : isas) {
          SetIsaForTesting(isa);
          std::vector<float> y(batch * sh.rows, -1.0f);
          MatMul(m.View(), x.data(), batch, y.data());
          worst = std::max(worst, CheckAgainst(ref, y,
                       "MatMul " + FmtName(fmt) + " " + std::to_string(sh.rows) + "x" +
                           std::to_string(sh.cols) + " b" + std::to_string(batch) + " " +
                           IsaStr(isa)));
        }
      }
    }
  }
  MESSAGE("MatMul worst err/bound over all cases: " << worst);
}

TEST_CASE("MatMulQ8 matches the reference from the quantised activations") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("MatMulQ8 vs the reference");
  std::mt19937 rng(12);
  double worst = 0;
  for (WeightFormat fmt : {WeightFormat::kInt8, WeightFormat::kInt4G64, WeightFormat::kMxfp4}) {
    const size_t unit = fmt == WeightFormat::kInt4G64 ? 64 : 32;
    for (size_t cols : {unit, 3 * unit, 7 * unit, 3584 / (64 / unit) * (64 / unit)}) {
      size_t rows = 21;
      Mat m = RandomMat(fmt, rows, cols, rng);
      for (size_t batch : {size_t{1}, size_t{5}}) {
        std::vector<float> x = RandomVec(batch * cols, rng);
        ActsQ8 a;
        QuantizeActs(x.data(), batch, cols, &a);
        Ref ref = ReferenceQ8(m, a);
        for (Isa isa : isas) {
          SetIsaForTesting(isa);
          std::vector<float> y(batch * rows, -1.0f);
          MatMulQ8(m.View(), a, y.data());
          worst = std::max(worst, CheckAgainst(ref, y,
                       "MatMulQ8 " + FmtName(fmt) + " cols " + std::to_string(cols) +
                           " b" + std::to_string(batch) + " " + IsaStr(isa)));
        }
      }
    }
  }
  MESSAGE("MatMulQ8 worst err/bound over all cases: " << worst);
}

TEST_CASE("RowDot equals the MatMul element; AddRow matches the reference") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("RowDot and AddRow");
  std::mt19937 rng(13);
  for (WeightFormat fmt : {WeightFormat::kF32, WeightFormat::kInt8, WeightFormat::kInt4G64,
                           WeightFormat::kMxfp4}) {
    const size_t rows = 9, cols = 576;
    Mat m = RandomMat(fmt, rows, cols, rng);
    std::vector<float> x = RandomVec(cols, rng);
    std::vector<float> deq = m.Dequant();
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      std::vector<float> y(rows);
      MatMul(m.View(), x.data(), 1, y.data());
      std::vector<float> acc(cols, 0.5f);
      for (size_t r = 0; r < rows; ++r) {
        CHECK(RowDot(m.View(), r, x.data()) == y[r]);
        AddRow(m.View(), r, 0.25f * float(r) - 1.0f, acc.data());
      }
      for (size_t i = 0; i < cols; ++i) {
        double ref = 0.5, a = 0.5;
        for (size_t r = 0; r < rows; ++r) {
          double t = (0.25 * double(r) - 1.0) * deq[r * cols + i];
          ref += t;
          a += std::fabs(t);
        }
        CHECK(std::fabs(acc[i] - ref) <= 3 * (rows + 2) * kU * a);
      }
    }
  }
}

// MLA sums rows over a block of tokens with AddRows: its bits must be those of
// the AddRow loop it stands for, on every ISA (tiles of 6 (f32) and 4 tokens x
// 64 columns, a token tail, 16-column vectors and a scalar column tail; int4
// takes the loop). 29 tokens take AVX2's packed 16-column panels (24 and up).
TEST_CASE("AddRows gives the bits of the AddRow loop (per ISA)") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("AddRows");
  std::mt19937 rng(31);
  // The last three run past AddRows' 256 KiB row chunk (128 f32 rows of 512,
  // 64 int8 rows of 4096): a chunk boundary inside every token's sum.
  struct Case {
    WeightFormat fmt;
    size_t cols;
    size_t rows = 45;
    size_t nrows = 33;
  };
  for (Case cs :
       {Case{WeightFormat::kF32, 512}, Case{WeightFormat::kF32, 100},
        Case{WeightFormat::kInt8, 512}, Case{WeightFormat::kInt8, 136},
        Case{WeightFormat::kInt4G64, 128}, Case{WeightFormat::kF32, 512, 300, 290},
        Case{WeightFormat::kInt8, 4096, 160, 150}, Case{WeightFormat::kInt4G64, 1024, 300, 280}}) {
    for (size_t tokens : {size_t{11}, size_t{29}}) {
      const size_t rows = cs.rows, row0 = 6, nrows = cs.nrows, coef_ld = nrows + 7,
                   acc_ld = cs.cols + 3;
      Mat m = RandomMat(cs.fmt, rows, cs.cols, rng);
      const std::vector<float> coef = RandomVec(tokens * coef_ld, rng);
      const std::vector<float> start = RandomVec(tokens * acc_ld, rng);
      for (Isa isa : isas) {
        SetIsaForTesting(isa);
        std::vector<float> loop = start, tiled = start;
        for (size_t t = 0; t < tokens; ++t) {
          for (size_t j = 0; j < nrows; ++j)
            AddRow(m.View(), row0 + j, coef[t * coef_ld + j], loop.data() + t * acc_ld);
        }
        AddRows(m.View(), row0, nrows, coef.data(), coef_ld, tokens, tiled.data(), acc_ld);
        CHECK_MESSAGE(std::memcmp(loop.data(), tiled.data(), loop.size() * 4) == 0,
                      FmtName(cs.fmt)
                          << " cols " << cs.cols << " tokens " << tokens << " " << IsaStr(isa));
      }
    }
  }
}

TEST_CASE("DotSumSquares: the scalar lanes' bits on every ISA, the f64 sums within rounding") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("DotSumSquares");
  std::mt19937 rng(47);
  for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(40), size_t(255), size_t(7168)}) {
    std::vector<float> x = RandomVec(n, rng), w = RandomVec(n, rng);
    for (size_t i = 0; i < n; i += 7) x[i] *= 1e3f;  // magnitudes that make the order matter
    double ref_dot, ref_ss;
    internal::DotSumSquaresScalar(x.data(), w.data(), n, &ref_dot, &ref_ss);
    long double exact_dot = 0, exact_ss = 0, abs_dot = 0;
    for (size_t i = 0; i < n; ++i) {
      exact_dot += (long double)x[i] * w[i];
      abs_dot += std::fabs((long double)x[i] * w[i]);
      exact_ss += (long double)x[i] * x[i];
    }
    CHECK(std::fabs((long double)ref_dot - exact_dot) <= abs_dot * 1e-15L);
    CHECK(std::fabs((long double)ref_ss - exact_ss) <= exact_ss * 1e-15L);
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      double dot = -1, ss = -1;
      DotSumSquares(x.data(), w.data(), n, &dot, &ss);
      CHECK_MESSAGE(std::memcmp(&dot, &ref_dot, 8) == 0, "n " << n << " " << IsaStr(isa));
      CHECK_MESSAGE(std::memcmp(&ss, &ref_ss, 8) == 0, "n " << n << " " << IsaStr(isa));
    }
  }
}

TEST_CASE("batch and thread count never change a bit (per ISA)") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("batch and thread invariance");
  std::mt19937 rng(14);
  const int saved_threads = omp_get_max_threads();
  struct Case { WeightFormat fmt; size_t cols; };
  // 448 = whole 64-column chunks; 96/160 end in a half chunk (MXFP4/int8 only).
  // 608 (19 groups) / 704: several 128-column steps and 16-group factor blocks,
  // ending in a partial step (the nibble IDOT kernels' tails).
  for (Case cs : {Case{WeightFormat::kF32, 448}, Case{WeightFormat::kInt8, 448},
                  Case{WeightFormat::kInt4G64, 448}, Case{WeightFormat::kMxfp4, 448},
                  Case{WeightFormat::kMxfp4, 96}, Case{WeightFormat::kInt8, 160},
                  Case{WeightFormat::kMxfp4, 608}, Case{WeightFormat::kInt4G64, 704},
                  // 34 groups: two whole 16-group GEMM blocks and a 2-group tail.
                  Case{WeightFormat::kMxfp4, 1088}, Case{WeightFormat::kInt4G64, 1088},
                  Case{WeightFormat::kF32, 101},
                  // f32 weights take the batch in L2-sized chunks (kF32WeightActBytes):
                  // at 5000 columns about 26 rows, so 37 rows are a chunk and a tail.
                  Case{WeightFormat::kF32, 5000}}) {
    const WeightFormat fmt = cs.fmt;
    const size_t rows = 70, cols = cs.cols, batch = 37;
    Mat m = RandomMat(fmt, rows, cols, rng);
    std::vector<float> x = RandomVec(batch * cols, rng);
    ActsQ8 a_all;
    if (fmt != WeightFormat::kF32) QuantizeActs(x.data(), batch, cols, &a_all);
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      omp_set_num_threads(2);
      std::vector<float> y_all(batch * rows), q_all(batch * rows);
      MatMul(m.View(), x.data(), batch, y_all.data());
      if (fmt != WeightFormat::kF32) MatMulQ8(m.View(), a_all, q_all.data());
      omp_set_num_threads(1);
      for (size_t b = 0; b < batch; ++b) {
        std::vector<float> y1(rows), q1(rows);
        // Decode runs 1, 2 or 4 rows per activation load (by row width): each
        // must give the batched bits (70 rows: blocks and a tail).
        for (int decode_rows : {1, 2, 4, 0}) {
          SetDecodeRowsForTesting(decode_rows);
          std::fill(y1.begin(), y1.end(), -1.0f);
          MatMul(m.View(), x.data() + b * cols, 1, y1.data());
          CHECK_MESSAGE(std::memcmp(y1.data(), y_all.data() + b * rows, rows * 4) == 0,
                        FmtName(fmt) << " cols " << cols << " b" << b << " decode rows "
                                     << decode_rows << " " << IsaStr(isa));
        }
        if (fmt != WeightFormat::kF32) {
          ActsQ8 a1;
          QuantizeActs(x.data() + b * cols, 1, cols, &a1);
          MatMulQ8(m.View(), a1, q1.data());
          CHECK(std::memcmp(q1.data(), q_all.data() + b * rows, rows * 4) == 0);
        }
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

// Prefill-sized element-wise work runs on every thread (well above the
// parallel threshold: 2^16 multiply-adds and 16 rows): the bits of one thread,
// on every ISA, with odd sizes so that ranges end mid-vector.
TEST_CASE("SiTU-GLU and QuantizeActs over threads give the one-thread bits (per ISA)") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("threaded element-wise ops");
  std::mt19937 rng(21);
  const int saved_threads = omp_get_max_threads();
  const size_t rows = 37, cols = 9632;  // 356,384 elements: over the threshold
  std::vector<float> g = RandomVec(rows * cols, rng), u = RandomVec(rows * cols, rng);
  for (size_t i = 0; i < g.size(); i += 97) g[i] *= 40.0f;  // the exp/tanh branches too
  for (Isa isa : isas) {
    SetIsaForTesting(isa);
    for (size_t n : {rows * cols, rows * cols - 13}) {
      omp_set_num_threads(1);
      std::vector<float> one(n), many(n);
      SituGlu(g.data(), u.data(), n, 4.0f, 25.0f, one.data());
      omp_set_num_threads(3);
      SituGlu(g.data(), u.data(), n, 4.0f, 25.0f, many.data());
      CHECK_MESSAGE(std::memcmp(one.data(), many.data(), n * 4) == 0, IsaStr(isa) << " n " << n);
      std::vector<float> inplace(g.begin(), g.begin() + static_cast<ptrdiff_t>(n));
      SituGlu(inplace.data(), u.data(), n, 4.0f, 25.0f, inplace.data());
      CHECK(std::memcmp(one.data(), inplace.data(), n * 4) == 0);
    }
    ActsQ8 a1, a3;
    omp_set_num_threads(1);
    QuantizeActs(g.data(), rows, cols, &a1);
    omp_set_num_threads(3);
    QuantizeActs(g.data(), rows, cols, &a3);
    CHECK(std::memcmp(a1.q.data(), a3.q.data(), rows * cols) == 0);
    CHECK(std::memcmp(a1.scales.data(), a3.scales.data(), rows * cols / 32 * 4) == 0);
  }
  omp_set_num_threads(saved_threads);
}

// The nibble GEMM walks the activations in chunks sized to L2 (128 rows at
// rows of one panel or more), each past every decoded row group, and rows of
// several panels panel by panel over superblocks of 4 row groups, the tile
// accumulators carried between panels. Several chunks and a partial one,
// several superblocks, row groups of 6 and a row tail, on one and two threads,
// must give each output the bits of a one-row call.
TEST_CASE("IDOT GEMM cache blocking never changes a bit (panels and chunks, per ISA)") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("IDOT GEMM blocking");
  std::mt19937 rng(23);
  const int saved_threads = omp_get_max_threads();
  // int8 too: AVX-512 runs it through the same block-layout GEMM. 7168
  // columns: 2 panels, 154 rows = 6 superblocks and one of a group and 4
  // single rows; 17408 columns = 34 blocks: 5 panels, the last of 2 blocks.
  // 153 activation rows: a whole chunk and a partial one of odd length.
  struct Case { WeightFormat fmt; size_t rows, cols; };
  for (Case cs : {Case{WeightFormat::kInt4G64, 154, 7168}, Case{WeightFormat::kMxfp4, 154, 7168},
                  Case{WeightFormat::kInt8, 154, 7168}, Case{WeightFormat::kInt4G64, 21, 17408},
                  Case{WeightFormat::kInt8, 21, 17408}}) {
    const WeightFormat fmt = cs.fmt;
    const size_t rows = cs.rows, cols = cs.cols, batch = 153;
    Mat m = RandomMat(fmt, rows, cols, rng);
    std::vector<float> x = RandomVec(batch * cols, rng);
    ActsQ8 a_all;
    QuantizeActs(x.data(), batch, cols, &a_all);
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      omp_set_num_threads(1);
      std::vector<std::vector<float>> one(batch, std::vector<float>(rows));
      for (size_t b = 0; b < batch; ++b) {
        ActsQ8 a1;
        QuantizeActs(x.data() + b * cols, 1, cols, &a1);
        MatMulQ8(m.View(), a1, one[b].data());
      }
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        std::vector<float> q_all(batch * rows, -1.0f);
        MatMulQ8(m.View(), a_all, q_all.data());
        for (size_t b = 0; b < batch; ++b) {
          CHECK_MESSAGE(std::memcmp(one[b].data(), q_all.data() + b * rows, rows * 4) == 0,
                        FmtName(fmt) << " cols " << cols << " b" << b << " threads " << threads
                                     << " " << IsaStr(isa));
        }
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

// The SIMD kernels lay out a call's activations once per thread and reuse them
// for that call's later row chunks (kernels.h t_call_id). A later call with the
// same buffers holding new values must never see the old layout.
TEST_CASE("a call never reuses the previous call's activations (same buffers, new values)") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("activation reuse across calls");
  std::mt19937 rng(15);
  const int saved_threads = omp_get_max_threads();
  const size_t rows = 70, cols = 448;  // 5 chunks of 16 rows at 2 threads
  for (WeightFormat fmt : {WeightFormat::kF32, WeightFormat::kInt8, WeightFormat::kInt4G64,
                           WeightFormat::kMxfp4}) {
    Mat m = RandomMat(fmt, rows, cols, rng);
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        std::vector<float> x(cols), y(rows);
        ActsQ8 a;
        for (int call = 0; call < 3; ++call) {
          const std::vector<float> v = RandomVec(cols, rng);
          std::copy(v.begin(), v.end(), x.begin());  // same buffers, new values
          QuantizeActs(x.data(), 1, cols, &a);
          const std::string what = FmtName(fmt) + " " + IsaStr(isa) + " t" +
                                   std::to_string(threads) + " call " + std::to_string(call);
          std::fill(y.begin(), y.end(), -1.0f);
          MatMul(m.View(), x.data(), 1, y.data());
          CheckAgainst(ReferenceF32(m, v, 1), y, "MatMul " + what);
          if (fmt == WeightFormat::kF32) continue;
          std::fill(y.begin(), y.end(), -1.0f);
          MatMulQ8(m.View(), a, y.data());
          CheckAgainst(ReferenceQ8(m, a), y, "MatMulQ8 " + what);
        }
      }
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST_CASE("ops: spec §4 definitions") {
  CHECK(Sigmoid(0.0f) == 0.5f);
  CHECK(Silu(0.0f) == 0.0f);
  CHECK(Sigmoid(2.0f) == 1.0f / (1.0f + std::exp(-2.0f)));
  float v[4] = {1.0f, 3.0f, 3.0f, -1.0f};
  Softmax(v, 4);  // shorter than the lanes: the tail in order
  float e0 = internal::SituExp(-2.0f), e3 = internal::SituExp(-4.0f);
  float s = ((e0 + 1.0f) + 1.0f) + e3;
  CHECK(v[0] == e0 / s);
  CHECK(v[1] == 1.0f / s);
  CHECK(v[3] == e3 / s);
  float x[3] = {1.0f, 2.0f, 2.0f}, w[3] = {1.0f, 0.5f, 2.0f}, o[3];
  RmsNorm(x, w, 3, 1e-6f, o);
  float r = 1.0f / std::sqrt(float(9.0 / 3.0) + 1e-6f);
  CHECK(o[1] == 2.0f * r * 0.5f);
  float g[2] = {0.5f, -3.0f}, u[2] = {2.0f, 40.0f}, out[2];
  SituGlu(g, u, 2, 4.0f, 25.0f, out);
  const double want = 4.0 * std::tanh(-3.0 / 4.0) / (1.0 + std::exp(3.0)) * 25.0 * std::tanh(40.0 / 25.0);
  CHECK(std::fabs(out[1] - want) <= std::fabs(want) * 1e-6);
}

namespace {
// Equal bits, or both NaN (a NaN's sign and payload follow operand order,
// which a vectorizer may swap in commutative operations).
bool SameFloats(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(a + i, b + i, 4) != 0) return false;
  }
  return true;
}
// Distance in ulps of float `got` from the f64 value `want` (the float grid at want).
double Ulps(float got, double want) {
  const float wf = float(want);
  const double ulp = double(std::nextafter(std::fabs(wf), INFINITY)) - double(std::fabs(wf));
  return std::fabs(double(got) - want) / ulp;
}
}  // namespace

TEST_CASE("SiTU-GLU: situ.h's exp and tanh within 1 and 1.5 ulp; every ISA gives the scalar bits") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> wide(-110.0f, 95.0f), mid(-12.0f, 12.0f);
  std::normal_distribution<float> tiny(0.0f, 1e-3f);
  double worst_exp = 0, worst_tanh = 0;
  for (int i = 0; i < 300000; ++i) {
    const float x = i % 3 == 0 ? wide(rng) : i % 3 == 1 ? mid(rng) : tiny(rng);
    const double e = std::exp(double(x));
    if (e > 1.2e-38 && e < 3.4e38) worst_exp = std::max(worst_exp, Ulps(internal::SituExp(x), e));
    const double t = std::tanh(double(x));
    if (t != 0) worst_tanh = std::max(worst_tanh, Ulps(internal::SituTanh(x), t));
  }
  MESSAGE("SituExp max " << worst_exp << " ulp, SituTanh max " << worst_tanh << " ulp");
  CHECK(worst_exp <= 1.0);
  CHECK(worst_tanh <= 1.5);
  CHECK(internal::SituExp(89.0f) == INFINITY);
  CHECK(internal::SituExp(-104.0f) == 0.0f);
  CHECK(internal::SituExp(-INFINITY) == 0.0f);
  CHECK(internal::SituExp(0.0f) == 1.0f);
  CHECK(internal::SituTanh(INFINITY) == 1.0f);
  CHECK(internal::SituTanh(-INFINITY) == -1.0f);
  CHECK(std::signbit(internal::SituTanh(-0.0f)));
  CHECK(std::isnan(internal::SituTanh(NAN)));
  CHECK(std::isnan(internal::SituExp(NAN)));

  // The whole element function against f64, and every ISA against the scalar
  // loop, over odd lengths (vector tails) and the edge values.
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("SituGlu");
  std::vector<float> g(4099), u(4099);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = i % 2 ? mid(rng) * 3 : wide(rng);
    u[i] = i % 3 ? mid(rng) * 8 : tiny(rng);
  }
  const float edges[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 88.7f, -88.7f, 103.9f, -103.9f, 1e30f, -1e30f,
                         INFINITY, -INFINITY, NAN, 0.5625f, -0.5625f, 0.56249994f};
  for (size_t i = 0; i < std::size(edges); ++i) {
    g[i] = edges[i];
    u[i + 20] = edges[i];
  }
  std::vector<float> ref(g.size());
  internal::SituGluScalar(g.data(), u.data(), g.size(), 4.0f, 25.0f, ref.data());
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i]) || !std::isfinite(u[i])) continue;
    const double gd = g[i], ud = u[i];
    const double want = 4.0 * std::tanh(gd / 4.0) / (1.0 + std::exp(-gd)) * 25.0 * std::tanh(ud / 25.0);
    if (std::fabs(want) > 1e-30) worst = std::max(worst, std::fabs(ref[i] - want) / std::fabs(want));
  }
  MESSAGE("SituGlu max relative error " << worst);
  CHECK(worst < 1e-6);
  for (Isa isa : isas) {
    SetIsaForTesting(isa);
    for (size_t n : {g.size(), size_t(1), size_t(7), size_t(17), size_t(33)}) {
      std::vector<float> out(n, -7.0f);
      SituGlu(g.data(), u.data(), n, 4.0f, 25.0f, out.data());
      CHECK_MESSAGE(SameFloats(out.data(), ref.data(), n), IsaStr(isa) << " n " << n);
    }
    std::vector<float> inplace = g;  // out == g, as the expert executor calls it
    SituGlu(inplace.data(), u.data(), g.size(), 4.0f, 25.0f, inplace.data());
    CHECK_MESSAGE(SameFloats(inplace.data(), ref.data(), g.size()), IsaStr(isa) << " in place");
  }
}

TEST_CASE("Softmax: within 2e-7 of f64, lanes folded by the tree; every ISA gives the scalar bits") {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("Softmax");
  // 32 elements, all e = 1 but one: the sum is the tree's, not the serial one
  // (exact here either way), and the max is found in any lane.
  {
    std::vector<float> v(37, 0.0f);
    v[21] = 3.0f;
    Softmax(v.data(), v.size());
    const float e = internal::SituExp(-3.0f);
    float lanes[16];
    for (size_t j = 0; j < 16; ++j) lanes[j] = e + e;
    lanes[5] = 1.0f + e;  // element 21 is lane 5 of the second block
    for (size_t half = 8; half > 0; half /= 2) {
      for (size_t j = 0; j < half; ++j) lanes[j] = lanes[j] + lanes[j + half];
    }
    float sum = lanes[0];
    for (int i = 0; i < 5; ++i) sum = sum + e;
    CHECK(v[21] == 1.0f / sum);
    CHECK(v[0] == e / sum);
    CHECK(v[36] == e / sum);
  }
  for (size_t n : {size_t(1), size_t(7), size_t(16), size_t(17), size_t(33), size_t(100), size_t(4099)}) {
    std::vector<float> x(n);
    for (auto& f : x) f = nd(rng);
    if (n > 20) {
      x[3] = -200.0f;  // exp underflows to 0
      x[n - 2] = 30.0f;  // the max in the tail or a lane
    }
    std::vector<float> ref = x;
    internal::SoftmaxScalar(ref.data(), n);
    // The reference from the same float differences v - m (their rounding is
    // the input's, not the softmax's).
    float m = x[0];
    for (float f : x) m = std::max(m, f);
    double sum = 0;
    for (float f : x) sum += std::exp(double(f - m));
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      const double want = std::exp(double(x[i] - m)) / sum;
      if (want > 1e-30) worst = std::max(worst, std::fabs(ref[i] - want) / want);
    }
    CHECK_MESSAGE(worst < 2e-7 * (1.0 + std::log2(double(n))), "n " << n << " worst " << worst);
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      std::vector<float> got = x;
      Softmax(got.data(), n);
      CHECK_MESSAGE(SameFloats(got.data(), ref.data(), n), IsaStr(isa) << " n " << n);
    }
  }
}

TEST_CASE("AttnScores: one FMA chain per pair, the same bits on every ISA, batch and thread split") {
  // The reference is the definition written out: per (query, key), fma from 0
  // over the first part's columns, then the second's, then times the scale.
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  IsaGuard guard;
  const int saved_threads = omp_get_max_threads();
  const std::vector<Isa> isas = IsasToTest("AttnScores");
  struct Shape {
    size_t da, db, nq, nk;
  };
  // K3's latent and rope widths; the tiny model's 32 + 8; widths off the
  // 16-lane grid; no second part; key counts around the 64-key group.
  for (const Shape sh : {Shape{512, 64, 13, 200}, Shape{32, 8, 7, 65}, Shape{37, 5, 6, 1},
                         Shape{21, 0, 1, 130}, Shape{48, 16, 12, 64}, Shape{512, 64, 96, 129}}) {
    CAPTURE(sh.da);
    CAPTURE(sh.db);
    CAPTURE(sh.nq);
    CAPTURE(sh.nk);
    std::vector<float> qa(sh.nq * sh.da), ka(sh.nk * sh.da), qb(sh.nq * sh.db), kb(sh.nk * sh.db);
    for (auto* v : {&qa, &ka, &qb, &kb}) {
      for (float& f : *v) f = nd(rng);
    }
    const float scale = 0.0721f;
    std::vector<float> want(sh.nq * sh.nk);
    double worst = 0;
    for (size_t q = 0; q < sh.nq; ++q) {
      for (size_t j = 0; j < sh.nk; ++j) {
        float acc = 0.0f;
        double exact = 0, mag = 0;
        for (size_t c = 0; c < sh.da; ++c) {
          acc = std::fma(qa[q * sh.da + c], ka[j * sh.da + c], acc);
          exact += double(qa[q * sh.da + c]) * ka[j * sh.da + c];
          mag += std::fabs(double(qa[q * sh.da + c]) * ka[j * sh.da + c]);
        }
        for (size_t c = 0; c < sh.db; ++c) {
          acc = std::fma(qb[q * sh.db + c], kb[j * sh.db + c], acc);
          exact += double(qb[q * sh.db + c]) * kb[j * sh.db + c];
          mag += std::fabs(double(qb[q * sh.db + c]) * kb[j * sh.db + c]);
        }
        want[q * sh.nk + j] = acc * scale;
        worst = std::max(worst, std::fabs(double(acc) - exact) / mag);
      }
    }
    CHECK(worst < 1e-6 * double(sh.da + sh.db));  // the chain is a plain f32 sum
    const float* pb = sh.db > 0 ? qb.data() : nullptr;
    const float* kbp = sh.db > 0 ? kb.data() : nullptr;
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        std::vector<float> got(sh.nq * sh.nk, -1.0f);
        AttnScores(qa.data(), ka.data(), sh.da, pb, kbp, sh.db, sh.nq, sh.nk, scale, got.data());
        CHECK_MESSAGE(SameFloats(got.data(), want.data(), got.size()), IsaStr(isa) << " threads " << threads);
      }
      omp_set_num_threads(1);
      // One query at a time and a prefix of the keys: each element's bits.
      const size_t q = sh.nq - 1, nk = (sh.nk + 1) / 2;
      std::vector<float> one(nk);
      AttnScores(qa.data() + q * sh.da, ka.data(), sh.da, sh.db > 0 ? pb + q * sh.db : nullptr, kbp, sh.db, 1,
                 nk, scale, one.data());
      CHECK_MESSAGE(SameFloats(one.data(), want.data() + q * sh.nk, nk), IsaStr(isa) << " one query");
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST_CASE("KDA sweeps: the forward pass's key-ordered mul-then-add bits on every ISA") {
  // The reference is the loop the forward pass ran inline before the sweeps
  // moved to lib/quant: per element, keys ascending, mul then add.
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> decay(0.5f, 1.0f);
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("KDA sweeps");
  for (size_t hd : {size_t(128), size_t(64), size_t(40), size_t(7), size_t(1)}) {
    std::vector<float> s0(hd * hd), alpha(hd), kn(hd), qn(hd), vt(hd);
    for (auto& v : s0) v = nd(rng);
    for (auto& v : alpha) v = decay(rng);
    for (size_t i = 0; i < hd; ++i) {
      kn[i] = nd(rng) * 0.1f;
      qn[i] = nd(rng) * 0.1f;
      vt[i] = nd(rng);
    }
    kn[0] = -0.0f;  // a signed zero through the sums
    std::vector<float> s_ref = s0, ks_ref(hd, 0.0f), oh_ref(hd, 0.0f);
    for (size_t kk = 0; kk < hd; ++kk) {
      for (size_t v = 0; v < hd; ++v) {
        s_ref[kk * hd + v] *= alpha[kk];
        ks_ref[v] += kn[kk] * s_ref[kk * hd + v];
      }
    }
    std::vector<float> s_ref2 = s_ref;
    for (size_t kk = 0; kk < hd; ++kk) {
      for (size_t v = 0; v < hd; ++v) {
        s_ref2[kk * hd + v] += kn[kk] * vt[v];
        oh_ref[v] += qn[kk] * s_ref2[kk * hd + v];
      }
    }
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      std::vector<float> s = s0, ks(hd, 7.0f), oh(hd, 7.0f);
      KdaDecay(s.data(), hd, alpha.data(), kn.data(), ks.data());
      CHECK_MESSAGE(SameFloats(s.data(), s_ref.data(), hd * hd), IsaStr(isa) << " decay S, hd " << hd);
      CHECK_MESSAGE(SameFloats(ks.data(), ks_ref.data(), hd), IsaStr(isa) << " ks, hd " << hd);
      KdaUpdate(s.data(), hd, kn.data(), vt.data(), qn.data(), oh.data());
      CHECK_MESSAGE(SameFloats(s.data(), s_ref2.data(), hd * hd), IsaStr(isa) << " update S, hd " << hd);
      CHECK_MESSAGE(SameFloats(oh.data(), oh_ref.data(), hd), IsaStr(isa) << " oh, hd " << hd);
    }
  }
}

// ---------------------------------------------------------------------------
// Exact domains: inputs chosen so that every product and every partial sum is
// exactly representable (small multiples of powers of two, normal range), so
// any summation order gives the same float: every ISA must match the exact
// answer bit for bit. This is how the integer/decode paths are tested exactly.

namespace {

// x_i in {-1, -0.5, 0, 0.5, 1, 1.5}: exact products with e2m1/int4/int8 values.
std::vector<float> ExactActs(size_t n, size_t seed) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = 0.5f * float(int((i * 7 + seed * 3) % 6) - 2);
  return x;
}

void ExpectExactOnAllIsas(const Mat& m, const std::vector<float>& x, const std::string& what) {
  std::vector<float> w = m.Dequant();
  std::vector<float> expect(m.rows);
  for (size_t o = 0; o < m.rows; ++o) {
    double s = 0;
    for (size_t i = 0; i < m.cols; ++i) s += double(x[i]) * w[o * m.cols + i];
    expect[o] = float(s);
    REQUIRE(double(expect[o]) == s);  // the domain really is exact
  }
  for (Isa isa : IsasToTest()) {
    SetIsaForTesting(isa);
    std::vector<float> y(m.rows);
    MatMul(m.View(), x.data(), 1, y.data());
    for (size_t o = 0; o < m.rows; ++o) {
      INFO(what << " " << IsaStr(isa) << " row " << o);
      CHECK(y[o] == expect[o]);
    }
  }
}

// Integer activations with group scale 1 (one |xq| = 127 per group) make the
// IDOT factors powers of two, so y is exact too.
ActsQ8 ExactActsQ8(size_t cols, size_t seed) {
  ActsQ8 a;
  a.batch = 1;
  a.cols = cols;
  a.q.resize(cols);
  a.scales.assign(cols / 32, 1.0f);
  for (size_t i = 0; i < cols; ++i) {
    a.q[i] = static_cast<int8_t>(int((i * 37 + seed * 11) % 255) - 127);
  }
  for (size_t g = 0; g < cols / 32; ++g) a.q[g * 32 + (g % 32)] = (g & 1) ? -127 : 127;
  return a;
}

void ExpectExactQ8OnAllIsas(const Mat& m, const ActsQ8& a, const std::string& what) {
  std::vector<float> w = m.Dequant();
  std::vector<float> expect(m.rows);
  for (size_t o = 0; o < m.rows; ++o) {
    double s = 0;
    for (size_t i = 0; i < m.cols; ++i) s += double(a.q[i]) * a.scales[i / 32] * w[o * m.cols + i];
    expect[o] = float(s);
    REQUIRE(double(expect[o]) == s);
  }
  for (Isa isa : IsasToTest()) {
    SetIsaForTesting(isa);
    std::vector<float> y(m.rows);
    MatMulQ8(m.View(), a, y.data());
    for (size_t o = 0; o < m.rows; ++o) {
      INFO(what << " " << IsaStr(isa) << " row " << o);
      CHECK(y[o] == expect[o]);
    }
  }
}

}  // namespace

TEST_CASE("exhaustive MXFP4: every e2m1 code x every usable E8M0 scale, exact on every ISA") {
  IsaGuard guard;
  IsasToTest("exhaustive MXFP4");  // the line; the helpers loop
  // One 32-column group per row; row r uses scale byte lo+r; column i holds code
  // (i + r) % 16 so every row sees all 16 codes in both nibble positions.
  // Scales 3..240 keep every lane partial and the result normal and finite
  // (0 and 255 are never in checkpoints; E8m0ToF32 is tested separately).
  for (size_t cols : {size_t{32}, size_t{96}}) {
    const int lo = 3, hi = cols == 32 ? 240 : 128;
    Mat m;
    m.format = WeightFormat::kMxfp4;
    m.cols = cols;
    m.rows = size_t(hi - lo + 1);
    m.data.resize(m.rows * cols / 2);
    for (size_t r = 0; r < m.rows; ++r) {
      for (size_t j = 0; j < cols / 2; ++j) {
        m.data[r * cols / 2 + j] = uint8_t(((2 * j + r) % 16) | (((2 * j + 1 + r) % 16) << 4));
      }
      // Multi-group rows keep their groups within 4 binades so sums stay exact.
      for (size_t g = 0; g < cols / 32; ++g) {
        m.e8m0.push_back(uint8_t(cols == 32 ? lo + int(r) : 100 + int(r % 20) + int(g)));
      }
    }
    ExpectExactOnAllIsas(m, ExactActs(cols, 1), "mxfp4 f32 cols " + std::to_string(cols));
    if (cols == 32) {
      // IDOT: |gi| <= 32*12*127, so scales up to 240 stay finite.
      ExpectExactQ8OnAllIsas(m, ExactActsQ8(cols, 2), "mxfp4 q8");
    } else {
      ExpectExactQ8OnAllIsas(m, ExactActsQ8(cols, 3), "mxfp4 q8 cols 96");
    }
  }
}

TEST_CASE("exhaustive int4: every nibble, power-of-two group scales, exact on every ISA") {
  IsaGuard guard;
  IsasToTest("exhaustive int4");  // the line; the helpers loop
  Mat m;
  m.format = WeightFormat::kInt4G64;
  m.rows = 16;
  m.cols = 192;
  m.data.resize(m.rows * m.cols / 2);
  for (size_t r = 0; r < m.rows; ++r) {
    for (size_t j = 0; j < m.cols / 2; ++j) {
      m.data[r * m.cols / 2 + j] = uint8_t(((2 * j + r) % 16) | (((2 * j + 1 + 3 * r) % 16) << 4));
    }
    for (size_t g = 0; g < 3; ++g) m.scales.push_back(std::ldexp(1.0f, int(r % 5) - 2 + int(g)));
  }
  ExpectExactOnAllIsas(m, ExactActs(m.cols, 4), "int4 f32");
  ExpectExactQ8OnAllIsas(m, ExactActsQ8(m.cols, 5), "int4 q8");
}

TEST_CASE("exhaustive int8: every value -127..127, exact on every ISA, odd tails") {
  IsaGuard guard;
  IsasToTest("exhaustive int8");  // the line; the helpers loop
  for (size_t cols : {size_t{32}, size_t{256}, size_t{288}}) {
    Mat m;
    m.format = WeightFormat::kInt8;
    m.rows = 5;
    m.cols = cols;
    for (size_t r = 0; r < m.rows; ++r) {
      for (size_t i = 0; i < cols; ++i) m.data.push_back(uint8_t(int8_t(int((i + 17 * r) % 255) - 127)));
      m.scales.push_back(std::ldexp(1.0f, int(r) - 9));
    }
    ExpectExactOnAllIsas(m, ExactActs(cols, 6), "int8 f32 cols " + std::to_string(cols));
    ExpectExactQ8OnAllIsas(m, ExactActsQ8(cols, 7), "int8 q8 cols " + std::to_string(cols));
  }
  // f32-activation tails that are not multiples of 8/16 (int8 and f32 only).
  for (size_t cols : {size_t{1}, size_t{7}, size_t{15}, size_t{17}, size_t{63}, size_t{65}}) {
    Mat m;
    m.format = WeightFormat::kInt8;
    m.rows = 3;
    m.cols = cols;
    for (size_t i = 0; i < 3 * cols; ++i) m.data.push_back(uint8_t(int8_t(int(i * 13 % 255) - 127)));
    m.scales = {0.25f, 1.0f, 2.0f};
    ExpectExactOnAllIsas(m, ExactActs(cols, 8), "int8 tail " + std::to_string(cols));
    Mat f;
    f.format = WeightFormat::kF32;
    f.rows = 2;
    f.cols = cols;
    f.data.resize(2 * cols * 4);
    auto* fp = reinterpret_cast<float*>(f.data.data());
    for (size_t i = 0; i < 2 * cols; ++i) fp[i] = 0.25f * float(int(i % 9) - 4);
    ExpectExactOnAllIsas(f, ExactActs(cols, 9), "f32 tail " + std::to_string(cols));
  }
}

TEST_CASE("zeros and extremes") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("zeros and extremes");
  std::mt19937 rng(21);
  // All-zero activations give +0 or -0 everywhere; all-zero weights likewise.
  for (WeightFormat fmt : {WeightFormat::kF32, WeightFormat::kInt8, WeightFormat::kInt4G64,
                           WeightFormat::kMxfp4}) {
    Mat m = RandomMat(fmt, 9, 128, rng);
    std::vector<float> x(128, 0.0f);
    ActsQ8 a;
    QuantizeActs(x.data(), 1, 128, &a);
    CHECK(a.scales[0] == 1e-20f);
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      std::vector<float> y(9, 1.0f);
      MatMul(m.View(), x.data(), 1, y.data());
      for (float v : y) CHECK(v == 0.0f);
      if (fmt != WeightFormat::kF32) {
        std::fill(y.begin(), y.end(), 1.0f);
        MatMulQ8(m.View(), a, y.data());
        for (float v : y) CHECK(v == 0.0f);
      }
    }
  }
  // Activations near the top and bottom of the f32 range (the top so that the
  // true result, <= 64*3e30*6*8, stays finite) quantise to +-127 without
  // overflow; every ISA stays finite and within the bound.
  std::vector<float> x(64);
  for (size_t i = 0; i < 64; ++i) x[i] = (i & 1 ? -1 : 1) * (i % 3 == 0 ? 3e30f : 1e-38f);
  ActsQ8 a;
  QuantizeActs(x.data(), 1, 64, &a);
  for (size_t i = 0; i < 64; ++i) {
    CHECK(std::abs(int(a.q[i])) <= 127);
    if (i % 3 == 0) CHECK(std::abs(int(a.q[i])) == 127);
  }
  Mat m = RandomMat(WeightFormat::kMxfp4, 4, 64, rng);
  Ref ref = ReferenceQ8(m, a);
  for (Isa isa : isas) {
    SetIsaForTesting(isa);
    std::vector<float> y(4);
    MatMulQ8(m.View(), a, y.data());
    for (float v : y) CHECK(std::isfinite(v));
    CheckAgainst(ref, y, std::string("extreme acts ") + IsaStr(isa));
  }
}

// The benchmarks divide the multiply-adds RoofLoop reports by its time: the
// count must be per iteration, the same every iteration, and the ISA's width.
TEST_CASE("RoofLoop counts its multiply-adds on every ISA") {
  IsaGuard guard;
  for (Isa isa : IsasToTest("roof loops")) {
    SetIsaForTesting(isa);
    for (RoofOp op : {RoofOp::kIdot, RoofOp::kFma}) {
      const uint64_t one = RoofLoop(op, 1);
      CHECK(RoofLoop(op, 0) == 0);
      CHECK(RoofLoop(op, 1000) == 1000 * one);
      // Lanes x chains: a vector ISA does at least 4 lanes per chain.
      CHECK(one >= (isa == Isa::kScalar ? 8u : 32u));
    }
  }
}

TEST_CASE("K3_FORCE_ISA names and CPUID") {
  CHECK(IsaSupported(Isa::kScalar));
  CHECK(std::string(IsaName(Isa::kAvx512)) == "avx512");
  CHECK(std::string(IsaName(Isa::kAvx2Vnni)) == "avx2vnni");
  CHECK(std::string(IsaName(Isa::kNeon)) == "neon");
  CHECK(std::string(IsaName(Isa::kNeonDot)) == "neondot");
  if (IsaSupported(Isa::kAvx2Vnni)) CHECK(IsaSupported(Isa::kAvx2));
  if (IsaSupported(Isa::kNeonDot)) CHECK(IsaSupported(Isa::kNeon));
  CHECK(IsaSupported(ActiveIsa()));
  // Only the ISAs of the architecture this was built for can ever be chosen.
  const bool x86 = IsaSupported(Isa::kAvx2) || IsaSupported(Isa::kAvx512);
  const bool arm = IsaSupported(Isa::kNeon) || IsaSupported(Isa::kNeonDot);
  CHECK_FALSE((x86 && arm));
#if defined(__aarch64__)
  CHECK(arm);  // ASIMD is part of armv8-a
  CHECK_FALSE(x86);
#endif
#if defined(__x86_64__)
  CHECK_FALSE(arm);
#endif
  for (Isa i : kAllIsas) {
    if (!IsaSupported(i)) CHECK_THROWS(SetIsaForTesting(i));
  }
  IsasToTest("this machine");
  MESSAGE("active (start-up) ISA: " << IsaStr(ActiveIsa()));
}

// A CPU without NEON (every x86-64) reports this case as skipped, with a line on
// stderr; scripts/test-arm64.sh runs it under qemu (neon and neondot).
TEST_CASE("NEON IDOT is bit-identical to the scalar reference (both NEON builds)" *
          doctest::skip(k3::test::SkipUnlessCpuRuns(Isa::kNeon, "NEON IDOT == scalar bits"))) {
  // The NEON IDOT kernels add the per-group products in the scalar order (see
  // kernels_neon.cc), so not only the exact domains but random data, tails,
  // batch 1 and batched must equal the scalar bits; the sdot build likewise.
  std::vector<Isa> neon;
  for (Isa i : {Isa::kNeon, Isa::kNeonDot}) {
    if (IsaSupported(i)) neon.push_back(i);
  }
  IsaGuard guard;
  std::mt19937 rng(43);
  for (WeightFormat fmt : {WeightFormat::kInt8, WeightFormat::kInt4G64, WeightFormat::kMxfp4}) {
    // 32/96/160: 1, 3, 5 groups (the 4-group blocks' tails); 3584: a real row.
    for (size_t cols : {size_t{32}, size_t{128}, size_t{160}, size_t{448}, size_t{3584}}) {
      if (fmt == WeightFormat::kInt4G64 && cols % 64 != 0) continue;
      Mat m = RandomMat(fmt, 13, cols, rng);
      if (fmt == WeightFormat::kInt8) m.data[5] = 0x80;  // -128 is storable; products must not wrap
      for (size_t batch : {size_t{1}, size_t{6}}) {
        std::vector<float> x = RandomVec(batch * cols, rng);
        ActsQ8 a;
        QuantizeActs(x.data(), batch, cols, &a);
        std::vector<float> ys(batch * m.rows);
        SetIsaForTesting(Isa::kScalar);
        MatMulQ8(m.View(), a, ys.data());
        for (Isa isa : neon) {
          std::vector<float> yn(batch * m.rows, -1.0f);
          SetIsaForTesting(isa);
          MatMulQ8(m.View(), a, yn.data());
          INFO(FmtName(fmt) << " cols " << cols << " b" << batch << " " << IsaStr(isa));
          CHECK(std::memcmp(ys.data(), yn.data(), ys.size() * 4) == 0);
        }
      }
    }
  }
}

// A CPU without AVX-VNNI (e.g. AVX-512 VNNI only) reports this case as skipped,
// with a line on stderr, rather than passing it without running.
TEST_CASE("the AVX-VNNI build of the AVX2 kernels gives the AVX2 bits" *
          doctest::skip(k3::test::SkipUnlessCpuRuns(Isa::kAvx2Vnni, "AVX-VNNI == AVX2 bits"))) {
  // Same source, vpdpbusd in place of maddubs+madd: integer lanes are exact, so
  // every output must match bit for bit (tails, batch 1 and batched).
  IsaGuard guard;
  std::mt19937 rng(41);
  for (WeightFormat fmt : {WeightFormat::kInt8, WeightFormat::kInt4G64, WeightFormat::kMxfp4}) {
    for (size_t cols : {size_t{64}, size_t{448}, size_t{3584}}) {
      const size_t c = fmt == WeightFormat::kMxfp4 && cols == 64 ? 96 : cols;  // odd step count
      Mat m = RandomMat(fmt, 13, c, rng);
      for (size_t batch : {size_t{1}, size_t{6}}) {
        std::vector<float> x = RandomVec(batch * c, rng);
        ActsQ8 a;
        QuantizeActs(x.data(), batch, c, &a);
        std::vector<float> y2(batch * m.rows), yv(batch * m.rows);
        SetIsaForTesting(Isa::kAvx2);
        MatMulQ8(m.View(), a, y2.data());
        SetIsaForTesting(Isa::kAvx2Vnni);
        MatMulQ8(m.View(), a, yv.data());
        INFO(FmtName(fmt) << " cols " << c << " b" << batch);
        CHECK(std::memcmp(y2.data(), yv.data(), y2.size() * 4) == 0);
      }
    }
  }
}

// A CPU without AVX2 reports this case as skipped, with a line on stderr.
TEST_CASE("int8 IDOT: decode gives the batched bits, across every x86 ISA and scalar" *
          doctest::skip(k3::test::SkipUnlessCpuRuns(Isa::kAvx2, "x86 int8 IDOT bits"))) {
  // Every ISA sums in the one order (kernels.h): exact int32 per 32-column
  // group, group g into lane BlockLane(g) by fma(cvt(gi), xs_g, lane), the
  // 16-lane tree, then the row scale. So the dispatch may take int8 IDOT from
  // any ISA for decode and from any other for batches (isa.cc), and a token
  // decoded alone gives the bits of the same token inside a chunked prefill.
  std::vector<Isa> x86 = {Isa::kScalar};
  for (Isa i : {Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512}) {
    if (IsaSupported(i)) x86.push_back(i);
  }
  MESSAGE("x86 int8 IDOT bits: " << x86.size() - 1 << " SIMD ISA(s) on this CPU, and scalar");
  IsaGuard guard;
  std::mt19937 rng(47);
  // 32/96/160: 1, 3, 5 groups (odd: half chunks, partial 16-group blocks);
  // 1056: 33 groups; 1536: 3 whole blocks; 12288: the kda_o row.
  for (size_t cols : {size_t{32}, size_t{96}, size_t{160}, size_t{448}, size_t{1056},
                      size_t{1536}, size_t{12288}}) {
    Mat m = RandomMat(WeightFormat::kInt8, 11, cols, rng);
    m.data[3] = 0x80;  // -128 is storable: no ISA may wrap or saturate on it
    const size_t batch = 9;
    std::vector<float> x = RandomVec(batch * cols, rng);
    ActsQ8 all;
    QuantizeActs(x.data(), batch, cols, &all);
    std::vector<std::vector<float>> batched(x86.size());
    for (size_t k = 0; k < x86.size(); ++k) {
      SetIsaForTesting(x86[k]);
      batched[k].assign(batch * m.rows, -1.0f);
      MatMulQ8(m.View(), all, batched[k].data());
    }
    for (size_t b = 0; b < batch; ++b) {
      ActsQ8 one;
      QuantizeActs(x.data() + b * cols, 1, cols, &one);
      for (size_t k = 0; k < x86.size(); ++k) {
        SetIsaForTesting(x86[k]);
        std::vector<float> y(m.rows, -1.0f);
        MatMulQ8(m.View(), one, y.data());
        for (size_t j = 0; j < x86.size(); ++j) {
          INFO("cols " << cols << " b" << b << ": decode " << IsaStr(x86[k]) << " vs batched "
                       << IsaStr(x86[j]));
          CHECK(std::memcmp(y.data(), batched[j].data() + b * m.rows, m.rows * 4) == 0);
        }
      }
    }
  }
}

TEST_CASE("the start-up dispatch (per-CPU rules) gives the bits of its base ISA") {
  // Whatever table the start-up choice takes each kernel from (isa.cc's
  // kCpuRules, e.g. a rule taking int8 decode from avx2vnni), MatMulQ8 and
  // MatMul must give exactly the bits of the ISA it reports as active, at batch 1
  // and batched; only int8 MatMulQ8 at batch 1 may name another kernel ISA.
  IsaGuard guard;
  ResetIsaForTesting();
  const Isa base = ActiveIsa();
  MESSAGE("dispatch: " << DispatchDetail());
  for (WeightFormat fmt : {WeightFormat::kInt4G64, WeightFormat::kMxfp4}) {
    for (size_t batch : {size_t{1}, size_t{2}, size_t{32}}) CHECK(Q8Isa(fmt, batch) == base);
  }
  for (size_t batch : {size_t{2}, size_t{32}}) CHECK(Q8Isa(WeightFormat::kInt8, batch) == base);
  const Isa decode = Q8Isa(WeightFormat::kInt8, 1);
  CHECK(IsaSupported(decode));
  MESSAGE("int8 IDOT decode kernel: " << IsaStr(decode) << ", base " << IsaStr(base));
  std::mt19937 rng(53);
  for (WeightFormat fmt : {WeightFormat::kInt8, WeightFormat::kInt4G64, WeightFormat::kMxfp4}) {
    const size_t rows = 37, cols = 1536;
    Mat m = RandomMat(fmt, rows, cols, rng);
    for (size_t batch : {size_t{1}, size_t{7}}) {
      std::vector<float> x = RandomVec(batch * cols, rng);
      ActsQ8 a;
      QuantizeActs(x.data(), batch, cols, &a);
      std::vector<float> yd(batch * rows, -1.0f), yb(batch * rows, -2.0f);
      std::vector<float> fd(batch * rows, -1.0f), fb(batch * rows, -2.0f);
      ResetIsaForTesting();
      MatMulQ8(m.View(), a, yd.data());
      MatMul(m.View(), x.data(), batch, fd.data());
      SetIsaForTesting(base);
      CHECK(Q8Isa(fmt, batch) == base);  // a forced ISA runs everything
      MatMulQ8(m.View(), a, yb.data());
      MatMul(m.View(), x.data(), batch, fb.data());
      INFO(FmtName(fmt) << " b" << batch << " base " << IsaStr(base));
      CHECK(std::memcmp(yd.data(), yb.data(), yd.size() * 4) == 0);
      CHECK(std::memcmp(fd.data(), fb.data(), fd.size() * 4) == 0);
    }
  }
}

TEST_CASE("quantizers produce identical bytes on every ISA (ties, NaN, inf, zeros, subnormals)") {
  IsaGuard guard;
  const std::vector<Isa> isas = IsasToTest("quantizer bytes");
  std::mt19937 rng(31);
  const size_t rows = 9, cols = 448;  // 7 int4 groups, 14 act groups, 28 zmm chunks
  std::vector<float> x = RandomVec(rows * cols, rng, 3.0f);
  // Row 0: absmax 127 -> s = 1, so k + 0.5 are exact ties (round half to even).
  for (size_t i = 0; i < cols; ++i) x[i] = float(int(i % 254) - 127) + 0.5f;  // |x| <= 126.5
  x[0] = 127.0f;
  // Row 1: absmax 7 in every int4 group -> ties at k + 0.5 for int4 too.
  for (size_t i = 0; i < cols; ++i) x[cols + i] = (i % 64 == 0) ? 7.0f : float(int(i % 15) - 7) * 0.5f;
  // Row 2: zeros and a negative zero; row 3: subnormals only; row 4: NaN and inf.
  for (size_t i = 0; i < cols; ++i) x[2 * cols + i] = (i % 3 == 0) ? -0.0f : 0.0f;
  for (size_t i = 0; i < cols; ++i) x[3 * cols + i] = float(int(i % 7) - 3) * 1e-41f;
  x[4 * cols + 5] = std::nanf("");
  x[4 * cols + 70] = INFINITY;
  x[4 * cols + 200] = -INFINITY;
  x[4 * cols + 300] = std::nanf("");
  // Row 5: huge values (x*inv stays within +-qmax by construction).
  for (size_t i = 0; i < cols; ++i) x[5 * cols + i] = float(int(i % 11) - 5) * 6e37f;

  using Out = test::QuantizerBytes;
  auto run = [&](Isa isa) {
    SetIsaForTesting(isa);
    return test::QuantizeAll(x.data(), rows, cols);
  };
  const Out ref = run(Isa::kScalar);
  CHECK(ref.q8[0] == 127);
  CHECK(ref.q8[1] == -126);  // -125.5 -> -126 (even)
  CHECK(ref.q8[2] == -124);  // -124.5 -> -124 (even)
  // Row 4 has an inf, so s = inf and inv = 0: finite x give 0, NaN and inf·0 =
  // NaN give lo on every architecture (lrint's own NaN answer differs between
  // x86-64 and aarch64; containers must not).
  CHECK(ref.q8[4 * cols + 5] == -127);
  CHECK(ref.q8[4 * cols + 70] == -127);
  CHECK(ref.q8[4 * cols + 6] == 0);
  CHECK((ref.p4[(4 * cols + 5) / 2] >> 4) == 0);  // int4: NaN -> -8, nibble 0 (odd column)
  CHECK(ref.acts.q[4 * cols + 5] == -127);       // its act group has no inf: NaN alone
  for (Isa isa : isas) {
    const Out o = run(isa);
    INFO("ISA " << IsaStr(isa));
    CHECK(o.q8 == ref.q8);
    CHECK(std::memcmp(o.s8.data(), ref.s8.data(), rows * 4) == 0);
    CHECK(o.p4 == ref.p4);
    CHECK(std::memcmp(o.s4.data(), ref.s4.data(), o.s4.size() * 4) == 0);
    CHECK(o.d4 == ref.d4);
    CHECK(std::memcmp(o.ds4.data(), ref.ds4.data(), o.ds4.size() * 4) == 0);
    CHECK(o.acts.q == ref.acts.q);
    CHECK(std::memcmp(o.acts.scales.data(), ref.acts.scales.data(), o.acts.scales.size() * 4) == 0);
  }
  // Odd row lengths for the int8 row quantizer (masked tails).
  for (size_t n : {size_t{1}, size_t{15}, size_t{17}, size_t{100}}) {
    std::vector<float> xs = RandomVec(3 * n, rng);
    std::vector<int8_t> qa(3 * n), qb(3 * n);
    float sa[3], sb[3];
    SetIsaForTesting(Isa::kScalar);
    QuantizeInt8Rows(xs.data(), 3, n, qa.data(), sa);
    for (Isa isa : isas) {
      SetIsaForTesting(isa);
      QuantizeInt8Rows(xs.data(), 3, n, qb.data(), sb);
      CHECK(qa == qb);
      CHECK(std::memcmp(sa, sb, sizeof sa) == 0);
    }
  }
}
