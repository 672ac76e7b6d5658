// Replays the committed chat-request fuzz corpus (and any reproducers added to
// it) through the fuzz harness in the normal build, with any compiler.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "k3/core/file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

TEST_CASE("chat-request fuzz corpus replays cleanly") {
  const std::filesystem::path corpus =
      std::filesystem::path(K3_TEST_DATA_DIR) / ".." / ".." / "fuzz" / "corpus" / "chat_request";
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
