// Small helpers shared by the doctest suites: temp dirs, f32 goldens, rel-L2.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "k3/core/file.h"

namespace k3::test {

// Bounds for an f32-activation forward pass (f32 weights, or int8/int4 weights
// against their own goldens) vs the oracle, as rel-L2. Measured 2026-12 on every
// ISA (scalar, avx2, avx2vnni, avx512): worst layer 5.9e-6 (int8 golden, layer 6,
// avx512), logits/final 3.3e-6, incremental greedy logits 4.5e-6. The oracle's
// 1e-4 is 20-35x above that and blind to the known near miss (the MLA LoRA-norm
// eps 1e-5 for 1e-6 reads 4e-6..1e-5), so these sit a few times above today.
inline constexpr double kGoldenLayerRelL2 = 1.5e-5;  // each layer of hidden.f32
inline constexpr double kGoldenRelL2 = 1e-5;         // logits.f32, final.f32, greedy logits

// True in CI (CI=true, as CI services and .ci/run set it): data that a user's
// clone may lack is mandatory there, so its tests fail instead of skipping.
inline bool InCi() {
  const char* v = std::getenv("CI");
  return v != nullptr && std::string(v) == "true";
}

// For doctest::skip(): true, with one line on stderr, when `dir` is absent and
// this is not CI (doctest's summary only counts skipped cases). In CI the case
// runs, and should REQUIRE the folder. Evaluated at static initialisation.
inline bool SkipWithoutDir(const std::string& dir, const char* test) {
  if (std::filesystem::is_directory(dir) || InCi()) return false;
  std::fprintf(stderr, "SKIPPED: \"%s\": %s is absent (a fresh clone; CI=true makes this fail)\n",
               test, dir.c_str());
  return true;
}

// For doctest::skip(): true, with one line on stderr, when the environment
// variable `var` is unset or empty.
inline bool SkipWithoutEnv(const char* var, const char* test) {
  const char* v = std::getenv(var);
  if (v != nullptr && *v != '\0') return false;
  std::fprintf(stderr, "SKIPPED: \"%s\": %s is not set\n", test, var);
  return true;
}

// Directories MakeTempDir made, removed with their contents when the test
// process exits normally (repeated suites had left hundreds in /tmp, and in
// /dev/shm, which is memory). The list is never destroyed, so the exit handler
// cannot outlive it.
inline void RemoveAtExit(const std::string& dir) {
  static std::mutex* mu = new std::mutex;
  static std::vector<std::string>* dirs = [] {
    auto* v = new std::vector<std::string>;
    std::atexit([] {
      std::lock_guard<std::mutex> lock(*mu);
      for (const std::string& d : *dirs) {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    });
    return v;
  }();
  std::lock_guard<std::mutex> lock(*mu);
  dirs->push_back(dir);
}

// Creates a fresh directory <parent>/<prefix>_XXXXXX and returns its path; the
// test fails (REQUIRE) when it cannot be made. Removed at exit (RemoveAtExit).
inline std::string MakeTempDir(const std::string& prefix, const std::string& parent = "/tmp") {
  std::string tmpl = parent + "/" + prefix + "_XXXXXX";
  char* d = ::mkdtemp(tmpl.data());
  REQUIRE(d != nullptr);
  RemoveAtExit(d);
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
