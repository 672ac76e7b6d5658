// Small helpers shared by the doctest suites: temp directories and f32 goldens.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

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

}  // namespace k3::test
