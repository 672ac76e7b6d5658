// Replays every committed fuzz input (seed corpus and any crash reproducers added
// to it) through the fuzz harness in the normal build, with any compiler: the
// harness keeps compiling and fixed crashes stay fixed even where clang is absent.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "k3/core/file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// The corpus folder under fuzz/corpus/ (one replay test per harness).
#ifndef K3_FUZZ_CORPUS
#define K3_FUZZ_CORPUS "safetensors_header"
#endif

TEST_CASE("fuzz corpus replays cleanly through its harness") {
  const std::filesystem::path corpus =
      std::filesystem::path(K3_TEST_DATA_DIR) / ".." / ".." / "fuzz" / "corpus" / K3_FUZZ_CORPUS;
  REQUIRE(std::filesystem::is_directory(corpus));
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(corpus)) {
    std::string bytes = k3::ReadFileOrThrow(e.path().string(), 1 << 20);
    INFO(e.path().filename().string());
    CHECK(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == 0);
    ++n;
  }
  CHECK(n >= 5);
}
