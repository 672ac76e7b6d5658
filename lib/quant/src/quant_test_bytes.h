// The bytes of all four quantizers on one input, for quant_test's per-ISA
// comparisons (quant_test.cc, quant_parity_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "k3/quant/quant.h"

namespace k3::quant::test {

struct QuantizerBytes {
  std::vector<int8_t> q8;
  std::vector<float> s8;
  std::vector<uint8_t> p4, d4;
  std::vector<float> s4, ds4;
  ActsQ8 acts;
};

// QuantizeInt8Rows, QuantizeInt4G64Rows, DowncastInt8ToInt4G64 (of the int8
// result) and QuantizeActs of x [rows x cols] on the active ISA; cols % 64 == 0.
inline QuantizerBytes QuantizeAll(const float* x, size_t rows, size_t cols) {
  QuantizerBytes o;
  o.q8.resize(rows * cols);
  o.s8.resize(rows);
  o.p4.resize(rows * cols / 2);
  o.s4.resize(rows * cols / 64);
  o.d4.resize(rows * cols / 2);
  o.ds4.resize(rows * cols / 64);
  QuantizeInt8Rows(x, rows, cols, o.q8.data(), o.s8.data());
  QuantizeInt4G64Rows(x, rows, cols, o.p4.data(), o.s4.data());
  DowncastInt8ToInt4G64(o.q8.data(), o.s8.data(), rows, cols, o.d4.data(), o.ds4.data());
  QuantizeActs(x, rows, cols, &o.acts);
  return o;
}

}  // namespace k3::quant::test
