// k3-run generate / chat on the oracle's tiny model, as a user runs them:
// out-of-range flags and environment values refused with a message naming
// them, --ngen past the context length warned about with the numbers, --quiet,
// and NO_COLOR honoured by chat on a terminal.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "k3/core/file.h"

using namespace k3;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";
const std::string kRun = std::string(K3_BINARY_DIR) + "/bin/k3-run";

struct Result {
  int code = -1;
  std::string out, err;
};

// Runs `env k3-run args` through the shell; stdout and stderr captured apart.
Result Run(const std::string& env, const std::string& args) {
  const std::string base = "/tmp/k3_run_cli_" + std::to_string(::getpid());
  // One compute thread: OpenMP's spinning on a loaded 2-CPU machine costs 10x.
  const std::string cmd =
      "OMP_NUM_THREADS=1 " + env + " " + kRun + " " + args + " > " + base + ".out 2> " + base + ".err";
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFileOrThrow(base + ".out", 1 << 24);
  r.err = ReadFileOrThrow(base + ".err", 1 << 24);
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

const std::string kIds = "--ids 2048,2051,765,1888,786";

}  // namespace

TEST_CASE("k3-run refuses out-of-range flags, naming them") {
  struct Case {
    std::string args, message;
  };
  for (const Case& c : {
           Case{"generate " + kTiny + " " + kIds + " --top-p 2", "top-p must be in (0, 1]"},
           Case{"generate " + kTiny + " " + kIds + " --top-p 0", "top-p must be in (0, 1]"},
           Case{"generate " + kTiny + " " + kIds + " --temp nan", "temperature must be a finite number"},
           Case{"chat " + kTiny + " hi --temp -1", "temperature must be a finite number"},
           Case{"generate " + kTiny + " " + kIds + " --threads -3", "--threads"},
           Case{"generate " + kTiny + " " + kIds + " --seed -1", "--seed"},
           Case{"generate " + kTiny + " --ids 1,,2", "--ids: item 2 is empty"},
           Case{"generate " + kTiny + " --ids 1,2,", "--ids: item 3 is empty"},
           Case{"generate " + kTiny + " --ids 1,x", "--ids: 'x' (item 2) is not a token id"},
           // Refused before the model loads: a missing model is not reached.
           Case{"generate /nonexistent-k3-model --ids 1,,2", "--ids: item 2 is empty"},
       }) {
    CAPTURE(c.args);
    Result r = Run("K3_LOG=warn", c.args);
    // The --ids parser's k3::Error and CLI11's failed flag checks both exit 2
    // (invalid-argument; the tools map every usage error to it, docs/errors.md).
    CHECK(r.code == 2);
    CHECK(r.err.find(c.message) != std::string::npos);
    CHECK(r.out.empty());
  }
}

TEST_CASE("k3-run refuses out-of-range K3_* values with exit 2, naming the variable") {
  for (const std::string& env : {"K3_MMAP=2", "K3_TOPP=2", "K3_MAXT=-1", "K3_LOG=bogus",
                                 "K3_CHUNK=-1", "K3_EXPERT_GB=lots", "K3_PREFILL_GB=0"}) {
    CAPTURE(env);
    Result r = Run(env, "generate " + kTiny + " " + kIds + " --ngen 1");
    CHECK(r.code == 2);
    const std::string name = env.substr(0, env.find('='));
    CHECK(r.err.find(name) != std::string::npos);
    CHECK(r.err.find(env.substr(env.find('=') + 1)) != std::string::npos);
  }
  // K3_LOG is checked for every command, also those that load no model.
  Result t = Run("K3_LOG=bogus", "tokenize " + kTiny + " --text hi");
  CHECK(t.code == 2);
  CHECK(t.err.find("K3_LOG") != std::string::npos);
}

TEST_CASE("k3-run generate: --ngen past the context length is warned about and capped") {
  // K3_MAXT=25 stands in for max_position_embeddings (1,048,576 on this model).
  Result r = Run("K3_MAXT=25", "generate " + kTiny + " " + kIds + " --ngen 10000000 --json");
  REQUIRE(r.code == 0);
  CHECK(r.err.find("prompt 5 + --ngen 10000000 = 10000005 tokens exceeds the context length 25") !=
        std::string::npos);
  CHECK(r.err.find("generation stops after 20 tokens") != std::string::npos);
  CHECK(r.out.find("\"finish_reason\":\"length\"") != std::string::npos);
  CHECK(r.out.find("\"decode_steps\":19") != std::string::npos);
  // A prompt that fills the context is refused with both numbers.
  Result f = Run("K3_MAXT=5", "generate " + kTiny + " " + kIds + " --ngen 1");
  CHECK(f.code == 2);
  CHECK(f.err.find("the prompt has 5 tokens; the context limit is 5") != std::string::npos);
}

TEST_CASE("k3-run generate --ngen 10000000: memory grows with the answer, nothing reserved for the request") {
  // Nothing is reserved for the request up front (the whole cache would be
  // 3.1 GB, then std::bad_alloc). Under a 400 MB address-space limit the
  // answer (greedy, ends at EOS after 1015 tokens) must still come.
  Result r = Run("K3_LOG=warn prlimit --as=400000000", "generate " + kTiny + " --ids 1,2,3 --ngen 10000000 --json");
  CHECK(r.code == 0);
  CHECK(r.out.find("\"finish_reason\":\"stop\"") != std::string::npos);
  CHECK(r.err.find("exceeds the context length 1048576") != std::string::npos);
}

TEST_CASE("k3-run generate --quiet: only the answer") {
  Result r = Run("", "generate " + kTiny + " " + kIds + " --ngen 3 --quiet");
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  CHECK_FALSE(r.out.empty());
  Result loud = Run("", "generate " + kTiny + " " + kIds + " --ngen 3");
  CHECK(loud.err.find("k3-run: load") != std::string::npos);
}

TEST_CASE("k3-run chat on a terminal: dim reasoning unless NO_COLOR") {
  // script(1) gives chat a pseudo-terminal as stdout.
  const std::string chat = kRun + " chat " + kTiny + " hi --max-tokens 8 --quiet";
  auto tty_run = [&](const std::string& env) {
    const std::string base = "/tmp/k3_run_cli_tty_" + std::to_string(::getpid());
    const std::string cmd = "OMP_NUM_THREADS=1 " + env + " script -qec '" + chat + "' /dev/null > " +
                            base + " 2>&1 < /dev/null";
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::string out = ReadFileOrThrow(base, 1 << 20);
    std::remove(base.c_str());
    return out;
  };
  const std::string colored = tty_run("env -u NO_COLOR");
  CHECK(colored.find("\x1b[2m") != std::string::npos);
  const std::string plain = tty_run("NO_COLOR=1");
  CHECK(plain.find("\x1b[") == std::string::npos);
  CHECK(plain.find("[think] ") != std::string::npos);
}

TEST_CASE(
    "k3-run generate: the prefill progress line on a terminal or with --progress, never "
    "otherwise") {
  const std::string first = "prefill 0/5 tokens · layer 1/8 · ";
  // stderr to a file: no line unless --progress (then one line per update).
  Result forced = Run("", "generate " + kTiny + " " + kIds + " --ngen 2 --progress");
  REQUIRE(forced.code == 0);
  CHECK(forced.err.find(first) != std::string::npos);
  CHECK(forced.err.find("ETA ") != std::string::npos);
  Result plain = Run("", "generate " + kTiny + " " + kIds + " --ngen 2");
  REQUIRE(plain.code == 0);
  CHECK(plain.err.find("prefill 0/") == std::string::npos);
  // On a terminal (script(1) gives a pseudo-terminal): redrawn in place with
  // \r and cleared before the answer; --no-progress turns it off.
  auto tty_run = [&](const std::string& flags) {
    const std::string base = "/tmp/k3_run_cli_ptty_" + std::to_string(::getpid());
    const std::string cmd = "OMP_NUM_THREADS=1 script -qec '" + kRun + " generate " + kTiny + " " +
                            kIds + " --ngen 2 " + flags + "' /dev/null > " + base +
                            " 2>&1 < /dev/null";
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::string out = ReadFileOrThrow(base, 1 << 20);
    std::remove(base.c_str());
    return out;
  };
  const std::string tty = tty_run("");
  CHECK(tty.find("\r" + first) != std::string::npos);
  CHECK(tty.find("\r\x1b[K") != std::string::npos);
  CHECK(tty_run("--no-progress").find("prefill 0/") == std::string::npos);
}
