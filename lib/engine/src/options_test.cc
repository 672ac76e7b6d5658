// EngineOptions::FromEnv: one parser, one strictness — every malformed or
// out-of-range K3_* value is refused naming the variable; and
// docs/environment.md lists exactly the variables the sources read.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/engine/engine.h"

using namespace k3;
using k3::engine::EngineOptions;

namespace {

// Sets one variable for the scope of a check.
struct EnvScope {
  EnvScope(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~EnvScope() { unsetenv(name_); }
  const char* name_;
};

void ExpectRefused(const char* name, const char* value) {
  CAPTURE(name);
  CAPTURE(value);
  EnvScope e(name, value);
  try {
    EngineOptions::FromEnv("/nonexistent");
    FAIL("accepted");
  } catch (const Error& err) {
    CHECK(err.code() == ErrorCode::kInvalidArgument);
    CHECK(err.object() == name);
    CHECK(std::string(err.what()).find(value) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("K3_* values out of range or malformed are refused, naming the variable") {
  ExpectRefused("K3_MMAP", "2");
  ExpectRefused("K3_MMAP", "maybe");
  ExpectRefused("K3_TOPP", "2");
  ExpectRefused("K3_TOPP", "-0.1");
  ExpectRefused("K3_TOPP", "nan");
  ExpectRefused("K3_MAXT", "-1");
  ExpectRefused("K3_MAXT", "12x");
  ExpectRefused("K3_LOG", "bogus");
  ExpectRefused("K3_CHUNK", "-1");
  ExpectRefused("K3_CHUNK", "16777217");
  ExpectRefused("K3_PREFILL_GB", "0");
  ExpectRefused("K3_PREFILL_GB", "lots");
  ExpectRefused("K3_BITS", "5");
  ExpectRefused("K3_HEAD_BITS", "16");
  ExpectRefused("K3_EXPERT_GB", "-1");
  ExpectRefused("K3_EXPERT_GB", "inf");
  ExpectRefused("K3_IO_THREADS", "17");
  ExpectRefused("K3_LOAD_THREADS", "-3");
  ExpectRefused("K3_QD", "0");
  ExpectRefused("K3_WINDOW", "4097");
  ExpectRefused("K3_READ_CHUNK_MB", "0.001");
  ExpectRefused("K3_LAYERS", "-1");
  ExpectRefused("K3_IDOT", "2");
}

TEST_CASE("K3_* values in range are read with one meaning each") {
  EngineOptions d = EngineOptions::FromEnv("/m");
  CHECK(d.model_dir == "/m");
  CHECK(d.load.bits == 4);
  CHECK_FALSE(d.load.bits_explicit);
  CHECK(d.stream.budget_bytes < 0);  // sized from the machine
  CHECK(d.load.expert_cache_bytes == 0);  // the load-time store is replaced at once
  CHECK(d.max_context == 0);
  CHECK(d.run.chunk == 0);            // windows sized per prompt
  CHECK(d.prefill_budget_bytes < 0);  // from MemAvailable at load
  {
    EnvScope a("K3_PREFILL_GB", "2.5"), b("K3_CHUNK", "4096");
    EngineOptions o = EngineOptions::FromEnv("/m");
    CHECK(o.prefill_budget_bytes == doctest::Approx(2.5e9));
    CHECK(o.run.chunk == 4096);  // past 512: windows of any size are allowed
  }
  // The default budget: what the expert cache's reserve rule leaves, at least 1.2 GB.
  stream::StreamOptions so;
  CHECK(engine::PrefillBudgetFor(so, 20'000'000'000, 4'000'000'000) ==
        doctest::Approx(0.88 * 20e9 - 2.5e9 - 4e9));
  CHECK(engine::PrefillBudgetFor(so, 2'000'000'000, 4'000'000'000) == doctest::Approx(1.2e9));
  {
    EnvScope a("K3_MMAP", "yes"), b("K3_TOPP", "0.9"), c("K3_MAXT", "4096"), e("K3_LOG", "warn"),
        f("K3_EXPERT_GB", "1.5"), g("K3_IO_THREADS", "2"), h("K3_LOAD_THREADS", "3"),
        i("K3_BITS", "8"), j("K3_CHUNK", "7"), k("K3_READ_CHUNK_MB", "4"), l("K3_IDOT", "off");
    EngineOptions o = EngineOptions::FromEnv("/m");
    CHECK(o.load.mmap);
    CHECK(o.run.topp == doctest::Approx(0.9));
    CHECK(o.max_context == 4096);
    CHECK(CurrentLogLevel() == LogLevel::kWarn);
    CHECK(o.stream.budget_bytes == doctest::Approx(1.5e9));
    CHECK(o.stream.io_threads == 2);  // the pread pool
    CHECK(o.load.threads == 3);       // the weight loader: a different variable now
    CHECK(o.load.bits == 8);
    CHECK(o.load.bits_explicit);
    CHECK(o.run.chunk == 7);
    CHECK(o.stream.read_chunk_bytes == 4u << 20);
    CHECK_FALSE(o.run.idot);
  }
  SetLogLevel(LogLevel::kInfo);
}

TEST_CASE("docs/environment.md lists every K3_* variable the sources read, and no other") {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(K3_TEST_DATA_DIR).parent_path().parent_path();
  const std::regex literal("\"(K3_[A-Z0-9_]+)\"");
  std::set<std::string> read;
  for (const char* dir : {"lib", "apps", "bench"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file() || name.find("_test.") != std::string::npos) continue;
      if (entry.path().extension() != ".cc" && entry.path().extension() != ".h") continue;
      std::ifstream in(entry.path());
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      for (std::sregex_iterator it(text.begin(), text.end(), literal), end; it != end; ++it) {
        read.insert((*it)[1].str());
      }
    }
  }
  std::ifstream doc(root / "docs" / "environment.md");
  REQUIRE(doc.good());
  std::set<std::string> documented;
  const std::regex row("^\\| `(K3_[A-Z0-9_]+)` \\|");
  for (std::string line; std::getline(doc, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) documented.insert(m[1].str());
  }
  CHECK(read.size() > 20);
  for (const std::string& v : read) {
    CAPTURE(v);
    CHECK(documented.count(v) == 1);
  }
  for (const std::string& v : documented) {
    CAPTURE(v);
    CHECK(read.count(v) == 1);
  }
}
