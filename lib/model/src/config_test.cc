#include "k3/model/config.h"

#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "k3/core/error.h"
#include "k3/core/file.h"

using namespace k3;

TEST_CASE("oracle config parses from text_config") {
  ModelConfig c = ModelConfig::LoadOrThrow(std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny");
  CHECK(c.hidden_size == 128);
  CHECK(c.num_hidden_layers == 8);
  CHECK(c.vocab_size == 2304);
  CHECK(c.kda_head_dim == 32);
  CHECK(c.rms_norm_eps == doctest::Approx(1e-5));
  CHECK(c.bos_token_id == 2048);
  REQUIRE(c.eos_token_ids.size() == 1);
  CHECK(c.eos_token_ids[0] == 2050);
  // kda_layers [1,2,3,5,6] are 1-based: MLA layers are 3, 6, 7.
  std::vector<bool> want = {true, true, true, false, true, true, false, false};
  CHECK(c.is_kda == want);
  CHECK(c.num_mla_layers() == 3);
  CHECK(c.num_moe_layers() == 7);
  CHECK(c.max_blocks() == 3);
  CHECK(c.shared_intermediate() == 128);
}

TEST_CASE("config errors name the key") {
  try {
    ModelConfig::ParseOrThrow(R"({"text_config":{"hidden_size":"x"}})", "cfg.json");
    FAIL("expected error");
  } catch (const Error& e) {
    CHECK(e.object() == "hidden_size");
    CHECK(e.path() == "cfg.json");
  }
  CHECK_THROWS_AS(ModelConfig::ParseOrThrow("{", "cfg.json"), Error);
  // An integer key given as a double: whole numbers in int64's range parse,
  // anything else (a fraction, 2e56, -1e300) is the key's error, never a cast
  // out of range (the fuzzer's find).
  for (const char* v : {"2e56", "-1e300", "64.5", "9.3e18"}) {
    try {
      ModelConfig::ParseOrThrow(std::string(R"({"text_config":{"hidden_size":)") + v + "}}", "cfg.json");
      FAIL("expected error for " << v);
    } catch (const Error& e) {
      CHECK_MESSAGE(e.object() == "hidden_size", v);
    }
  }
}

TEST_CASE("a config without bos/eos ids parses (no BOS, no EOS)") {
  std::string text =
      ReadFileOrThrow(std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny/config.json", 1 << 20);
  // Drop every bos/eos key, top level and text_config.
  for (const char* key : {"\"bos_token_id\": 2048,", "\"eos_token_id\": 2050,"}) {
    for (size_t p; (p = text.find(key)) != std::string::npos;) text.erase(p, std::strlen(key));
  }
  REQUIRE(text.find("bos_token_id") == std::string::npos);
  ModelConfig c = ModelConfig::ParseOrThrow(text, "config.json");
  CHECK(c.bos_token_id == -1);
  CHECK(c.eos_token_ids.empty());
}
