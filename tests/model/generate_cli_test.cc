// k3-run generate end to end on the oracle fixture: --ids, --ngen, --json,
// --logits and --trace dumps compared with Moonshot's goldens, and the
// chunk size not changing a byte of the dumps.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "k3/core/file.h"
#include "k3_test_support.h"

using namespace k3;
using k3::test::RelL2;

namespace {

const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle";
const std::string kRun = std::string(K3_BINARY_DIR) + "/bin/k3-run";
const char* kIds =
    "2048,2051,765,1888,786,2053,788,2033,691,295,278,603,1682,2052,763,2053,2051,2014,428,2053";

std::vector<float> F32(const std::string& path) {
  std::string b = ReadFileOrThrow(path, 1 << 26);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

std::string Tmp(const std::string& tag) {
  return "/tmp/k3_generate_cli_" + std::to_string(::getpid()) + "_" + tag;
}

}  // namespace

TEST_CASE("k3-run generate reproduces the oracle (f32 weights, f32 activations)") {
  for (int chunk : {32, 1}) {
    const std::string tag = std::to_string(chunk);
    std::string cmd =
        "K3_LOG=warn K3_BITS=32 K3_MLA_BITS=32 K3_HEAD_BITS=32 K3_IDOT=0 K3_CHUNK=" + tag + " " +
        kRun + " generate " + kOracle + "/k3-tiny --ids " + kIds + " --ngen 16 --json --logits " +
        Tmp(tag + ".logits") + " --trace " + Tmp(tag + ".trace") + " > " + Tmp(tag + ".json") +
        " 2> " + Tmp(tag + ".err");
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::string json = ReadFileOrThrow(Tmp(tag + ".json"), 1 << 20);
    CHECK(json.find("\"generated_ids\":[860,2302,84,2171,594,74,1683,1439,2176,1046,942,231,1259,"
                    "1277,616,1258]") != std::string::npos);
    for (const char* key : {"\"load_s\"", "\"prefill_tok_per_s\"", "\"decode_s_per_token\"",
                            "\"expert_bytes_read\"", "\"expert_hit_rate\"", "\"peak_rss_bytes\""}) {
      CHECK(json.find(key) != std::string::npos);
    }
    // The f32 golden bounds (k3_test_support.h): the whole trace is held to the
    // per-layer bound, the logits to the logits bound.
    const double el = RelL2(F32(Tmp(tag + ".logits")), F32(kOracle + "/k3-tiny.golden/logits.f32"));
    const double et = RelL2(F32(Tmp(tag + ".trace")), F32(kOracle + "/k3-tiny.golden/hidden.f32"));
    MESSAGE("k3-run chunk " << tag << ": logits rel-L2 " << el << ", trace " << et);
    CHECK(el <= k3::test::kGoldenRelL2);
    CHECK(et <= k3::test::kGoldenLayerRelL2);
  }
  CHECK(ReadFileOrThrow(Tmp("32.logits"), 1 << 26) == ReadFileOrThrow(Tmp("1.logits"), 1 << 26));
  CHECK(ReadFileOrThrow(Tmp("32.trace"), 1 << 26) == ReadFileOrThrow(Tmp("1.trace"), 1 << 26));
  for (const char* tag : {"32", "1"}) {
    for (const char* ext : {".logits", ".trace", ".json", ".err"}) {
      std::remove((Tmp(tag) + ext).c_str());
    }
  }
}

TEST_CASE("k3-run generate: a text prompt is tokenized; bad ids fail with a message") {
  std::string out = Tmp("text.out");
  std::string cmd = "K3_LOG=warn " + kRun + " generate " + kOracle +
                    "/k3-tiny 'Hello world' --ngen 3 --json > " + out + " 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::string json = ReadFileOrThrow(out, 1 << 20);
  CHECK(json.find("\"prompt_ids\":[2048,") != std::string::npos);  // BOS prepended
  cmd = kRun + " generate " + kOracle + "/k3-tiny --ids 1,99999 --ngen 1 > " + out + " 2>&1";
  CHECK(std::system(cmd.c_str()) != 0);
  CHECK(ReadFileOrThrow(out, 1 << 20).find("outside the vocabulary") != std::string::npos);
  std::remove(out.c_str());
}
