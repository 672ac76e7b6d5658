// k3-run generate --json with K3_VK=1 on the oracle fixture: the oracle's
// tokens, stats.vulkan, the summary line, the history file under
// $XDG_CACHE_HOME/k3 (never in the model folder), and a device lost mid-run
// announced once with the same tokens; with K3_VK_DENSE=all the trunk on the
// device (stats.vulkan_dense, its start-up and summary lines), auto placing
// nothing on a CPU device, and a lost device under the trunk.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "k3/core/file.h"
#include "k3/vulkan/device.h"
#include "k3_test_support.h"

using namespace k3;

namespace {

const bool kLoader = [] {
  if (!vulkan::LoaderPresent()) {
    std::fprintf(stderr, "vulkan_generate_cli_test: SKIP: no Vulkan loader on this machine\n");
    // CI=true (.ci/run) turns this skip into a failure, as for the other suites.
    const char* ci = std::getenv("CI");
    std::exit(ci != nullptr && std::string(ci) == "true" ? 1 : 77);
  }
  return true;
}();

const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle";
const std::string kRun = std::string(K3_BINARY_DIR) + "/bin/k3-run";
const char* kIds =
    "2048,2051,765,1888,786,2053,788,2033,691,295,278,603,1682,2052,763,2053,2051,2014,428,2053";
// The oracle's greedy continuation of kIds (generate_cli_test.cc checks the same).
const char* kGreedy =
    "\"generated_ids\":[860,2302,84,2171,594,74,1683,1439,2176,1046,942,231,1259,1277,616,1258]";

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

struct Result {
  std::string json, err;
};

Result Generate(const std::string& dir, const std::string& env) {
  const std::string cmd = "XDG_CACHE_HOME=" + dir + "/cache K3_VK=1 K3_LOG=warn K3_BITS=32 " +
                          "K3_MLA_BITS=32 K3_HEAD_BITS=32 K3_IDOT=0 " + env + " " + kRun +
                          " generate " + kOracle + "/k3-tiny --ids " + kIds +
                          " --ngen 16 --json > " + dir + "/out.json 2> " + dir + "/err.txt";
  REQUIRE(std::system(cmd.c_str()) == 0);
  return {ReadFileOrThrow(dir + "/out.json", 1 << 20), ReadFileOrThrow(dir + "/err.txt", 1 << 20)};
}

}  // namespace

TEST_CASE("k3-run generate with K3_VK=1: oracle tokens, stats.vulkan, history in the cache") {
  const std::string dir = test::MakeTempDir("k3_vk_cli");
  for (int run = 0; run < 2; ++run) {  // the second run warm-starts from the first's history
    CAPTURE(run);
    const Result r = Generate(dir, "");
    CHECK(r.json.find(kGreedy) != std::string::npos);
    for (const char* key :
         {"\"vulkan\":{\"device\":", "\"experts_resident\":", "\"pairs_on_device\":",
          "\"uploads\":", "\"upload_bytes\":", "\"device_ms\":", "\"active\":true"}) {
      CHECK_MESSAGE(r.json.find(key) != std::string::npos, key);
    }
    CHECK(Count(r.err, "k3-run: vulkan ") == 1);
    size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir + "/cache/k3")) {
      files += e.path().filename().string().rfind("vk-history-", 0) == 0;
    }
    CHECK(files == 1);
  }
  for (const auto& e : std::filesystem::directory_iterator(kOracle + "/k3-tiny")) {
    CHECK(e.path().filename().string().find("vk-history") == std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a device lost mid-run is announced once and the tokens do not change") {
  const std::string dir = test::MakeTempDir("k3_vk_cli_lost");
  // A warm history first, so the device has work from the first step on.
  Generate(dir, "");
  const Result r = Generate(dir, "K3_VK_FAULT=lost K3_VK_FAULT_AFTER=2");
  CHECK(r.json.find(kGreedy) != std::string::npos);
  CHECK(r.json.find("\"active\":false") != std::string::npos);
  CHECK(Count(r.err, "VK_ERROR_DEVICE_LOST") == 1);
  CHECK(Count(r.err, "continuing on the CPU") == 1);
  CHECK(r.err.find("fell back to the CPU") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("K3_VK_DENSE=all: the trunk on the device, the oracle's tokens, stats.vulkan_dense") {
  const std::string dir = test::MakeTempDir("k3_vk_cli_dense");
  const Result r = Generate(dir, "K3_LOG=info K3_VK_DENSE=all");
  CHECK(r.json.find(kGreedy) != std::string::npos);
  const size_t at = r.json.find("\"vulkan_dense\":{\"device\":");
  REQUIRE(at != std::string::npos);
  const std::string dense = r.json.substr(at);
  for (const char* key : {"\"mode\":\"all\"", "\"active\":true", "\"matrices_on_cpu\":0",
                          "\"classes_on_device\":{", "\"head\":1", "\"shared\":"}) {
    CHECK_MESSAGE(dense.find(key) != std::string::npos, key);
  }
  const size_t ms = dense.find("\"device_ms_per_token\":");
  REQUIRE(ms != std::string::npos);
  CHECK(std::strtod(dense.c_str() + ms + 22, nullptr) > 0);
  CHECK(Count(r.err, "vulkan dense: ") == 1);  // the start-up line
  CHECK(r.err.find("trunk matrices on the device") != std::string::npos);
  CHECK(Count(r.err, "k3-run: vulkan dense ") == 1);  // the summary line
  // The default (auto) on a CPU device places nothing and says why.
  const Result a = Generate(dir, "K3_LOG=info");
  CHECK(a.json.find(kGreedy) != std::string::npos);
  if (a.err.find("(cpu)") != std::string::npos) {
    CHECK(a.json.find("\"vulkan_dense\":null") != std::string::npos);
    CHECK(a.err.find("K3_VK_DENSE=auto places nothing") != std::string::npos);
  }
  // A device lost under the trunk: announced once, the same tokens.
  const Result f = Generate(dir, "K3_VK_DENSE=shared K3_VK_FAULT=lost K3_VK_FAULT_AFTER=3");
  CHECK(f.json.find(kGreedy) != std::string::npos);
  CHECK(Count(f.err, "the trunk continues on the CPU") == 1);
  const size_t line = f.err.find("k3-run: vulkan dense ");
  REQUIRE(line != std::string::npos);
  CHECK(f.err.substr(line, f.err.find('\n', line) - line).find("fell back to the CPU") !=
        std::string::npos);
  CHECK(f.json.find("\"vulkan_dense\":{") != std::string::npos);
  std::filesystem::remove_all(dir);
}
