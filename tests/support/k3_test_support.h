// Small helpers shared by the doctest suites: temp dirs, f32 goldens, rel-L2.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "k3/core/file.h"

namespace k3::test {

// Creates a fresh directory /tmp/<prefix>_XXXXXX and returns its path; the test
// fails (REQUIRE) when it cannot be made. Callers remove it when they need to.
inline std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
  char* d = ::mkdtemp(tmpl.data());
  REQUIRE(d != nullptr);
  return d;
}

// A raw little-endian f32 file (oracle goldens, --logits dumps) as floats;
// trailing bytes short of a whole float are ignored.
inline std::vector<float> ReadF32File(const std::string& path, uint64_t max_bytes = 1ull << 30) {
  std::string bytes = ReadFileOrThrow(path, max_bytes);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// Relative L2 error ||a - golden|| / ||golden|| over the first n values, in double.
inline double RelL2(const float* a, const float* golden, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = static_cast<double>(a[i]) - golden[i];
    num += d * d;
    den += static_cast<double>(golden[i]) * golden[i];
  }
  return std::sqrt(num / den);
}

// The same over all of `golden`; `a` must hold at least golden.size() values.
inline double RelL2(const std::vector<float>& a, const std::vector<float>& golden) {
  return RelL2(a.data(), golden.data(), golden.size());
}

}  // namespace k3::test
