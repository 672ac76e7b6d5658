// Every k3 tool as a command-line program (docs/errors.md): --version, failed writes
// to stdout (a full disk is an error, a closed pipe is quiet), --quiet, and
// --help without the kernel log line.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "helpers.h"

using namespace k3test;

namespace {

const char* kTools[] = {"k3-repack", "k3-verify", "k3-run", "k3-fixture", "k3-bench"};

// Runs `cmd` with sh; returns its exit status (128+N when killed by signal N).
int Sh(const std::string& cmd) {
  int st = std::system(cmd.c_str());
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return 128 + WTERMSIG(st);
}

std::string Git(const std::string& args) {
  std::string out;
  FILE* p = ::popen(("git -C '" K3_SOURCE_DIR "' " + args + " 2>/dev/null").c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// One start-up refusal per tool: each argv, run with `env`, exits 2 and its
// log holds every one of `expect`.
struct ToolCase {
  const char* what;
  std::vector<std::string> argv;
};
void CheckEveryToolRefuses(const TempDir& d, const std::vector<ToolCase>& cases, const std::string& env,
                           const std::vector<std::string>& expect) {
  for (const auto& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    const std::string log = d / "log";
    ::unlink(log.c_str());
    CHECK(Run(c.argv, {.env = {env}, .log = log}) == 2);
    const std::string e = ReadAll(log);
    for (const auto& x : expect) {
      CAPTURE(x);
      CHECK(e.find(x) != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("--version on every tool: version, git sha, build type, kernel ISA") {
  // A forced ISA is validated (and logged) up front by design; these cases are
  // about the output without it (scripts/test.sh reruns the suite with it set).
  ::unsetenv("K3_FORCE_ISA");
  TempDir d("k3cli");
  for (const char* tool : kTools) {
    CAPTURE(tool);
    const std::string log = d / (std::string(tool) + ".version");
    CHECK(Run({Bin(tool), "--version"}, {.log = log}) == 0);
    const std::string v = ReadAll(log);
    CHECK(v.rfind(std::string(tool) + " " K3_PROJECT_VERSION " (git ", 0) == 0);
    const std::string sha = Git("rev-parse --short=12 HEAD");
    if (!sha.empty()) {
      // The sha is the configure-time one; it must at least be a commit of this repository.
      size_t at = v.find("(git ") + 5;
      CHECK(Git("cat-file -t " + v.substr(at, 12)) == "commit");
    }
    CHECK(v.find(", Release)") != std::string::npos);
    CHECK(v.find("kernels: ") != std::string::npos);
    CHECK(v.find("k3 info") == std::string::npos);
  }
}

TEST_CASE("a failed write to stdout is an error; a closed pipe is quiet") {
  TempDir d("k3cli");
  const std::string tiny = TinySnapshot();
  struct Case {
    const char* what;
    std::string args;
  } cases[] = {
      {"k3-run tokenize", Bin("k3-run") + " tokenize '" + tiny + "' --text 'hello world'"},
      {"k3-verify", Bin("k3-verify") + " /nonexistent-dir --json"},
      {"k3-fixture presets", Bin("k3-fixture") + " presets"},
      {"k3-repack --help", Bin("k3-repack") + " --help"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    const std::string err = d / "err";
    int rc = Sh(c.args + " > /dev/full 2> '" + err + "'");
    const std::string e = ReadAll(err);
    if (std::string(c.what) == "k3-verify") {
      CHECK(rc == 3);  // its own error comes first; the write error does not hide it
    } else {
      CHECK(rc == 6);
      CHECK(e.find("error: writing to stdout: No space left on device") != std::string::npos);
    }
  }
  // SIGPIPE ignored (as under some supervisors): EPIPE exits 141 without a word.
  const std::string err = d / "err";
  std::string big(200000, 'a');
  std::ofstream(d / "big.txt") << big;
  int rc = Sh("bash -c \"trap '' PIPE; '" + Bin("k3-run") + "' tokenize '" + tiny + "' --text-file '" + (d / "big.txt") +
          "' 2> '" + err + "' | true; exit \\${PIPESTATUS[0]}\"");
  CHECK(rc == 141);
  CHECK(ReadAll(err).find("error") == std::string::npos);
}

TEST_CASE("--quiet: repack and verify print nothing on success; problems still shown") {
  TempDir d("k3cli");
  const std::string out = d / "out", log = d / "log";
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), out, "--quiet"}, {.log = log}) == 0);
  CHECK(ReadAll(log) == "");
  CHECK(Run({Bin("k3-verify"), out, "--quiet"}, {.log = log}) == 0);
  CHECK(ReadAll(log) == "");
  REQUIRE(::unlink((out + "/model-00002-of-000009.safetensors").c_str()) == 0);
  const std::string log2 = d / "log2";
  CHECK(Run({Bin("k3-verify"), out, "-q"}, {.log = log2}) == 3);
  CHECK(ReadAll(log2).find("PROBLEM ") != std::string::npos);
  CHECK(ReadAll(log2).find("problem(s)") == std::string::npos);
}

TEST_CASE("k3-bench --help does not log the kernel choice") {
  ::unsetenv("K3_FORCE_ISA");  // a forced ISA is checked, and logged, up front by design
  TempDir d("k3cli");
  const std::string log = d / "log";
  CHECK(Run({Bin("k3-bench"), "--help"}, {.log = log}) == 0);
  CHECK(ReadAll(log).find("Usage") != std::string::npos);
  CHECK(ReadAll(log).find("k3 info") == std::string::npos);
}

TEST_CASE("usage errors: readable, and exit 2 whatever their kind") {
  TempDir d("k3cli");
  struct Case {
    std::vector<std::string> argv;
    const char* says;
  } cases[] = {
      // CLI11 checks required positionals first; an unknown option must be named, not "SRC is required".
      {{Bin("k3-repack"), "--bogus"}, "unknown option or extra argument: --bogus"},
      {{Bin("k3-verify"), "--bogus"}, "unknown option or extra argument: --bogus"},
      {{Bin("k3-repack")}, "SRC is required"},
      {{Bin("k3-verify"), "a", "b"}, "not expected: b"},
      {{Bin("k3-fixture"), "--experts", "0"}, "--experts: Value 0 not in range 1 to 4096"},
      // An open upper end is not printed as 1797693134862315708145274237317043567980...
      {{Bin("k3-run"), "chat", TinySnapshot(), "--max-tokens", "0"}, "--max-tokens: Value 0: must be > 0\n"},
      {{Bin("k3-run"), "bogus"}, "bogus"},
      {{Bin("k3-repack"), TinySnapshot(), d / "x", "--bits", "6"}, "--bits 6: must be 4 (int4-g64) or 8 (int8)"},
      {{Bin("k3-repack"), TinySnapshot(), d / "x", "--mla-bits", "0"}, "--mla-bits 0: must be 4"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.argv.back());
    const std::string log = d / "log";
    ::unlink(log.c_str());
    CHECK(Run(c.argv, {.log = log}) == 2);
    CHECK(ReadAll(log).find(c.says) != std::string::npos);
    CHECK(ReadAll(log).find("179769313486") == std::string::npos);
  }
  CHECK(!Exists(d / "x"));
}

TEST_CASE("k3-run info: snapshot, container, incomplete container") {
  TempDir d("k3cli");
  const std::string log = d / "info";
  // The snapshot: counts the oracle's README and config state (11 shard files,
  // 890 tensors, 7 MoE layers x 16 experts, 2048 ranks).
  REQUIRE(Run({Bin("k3-run"), "info", TinySnapshot(), "--json"}, {.log = log}) == 0);
  std::string j = ReadAll(log);
  CHECK(j.find("\"kind\":\"snapshot\",\"status\":\"complete\",\"shards\":11,\"tensors\":890") != std::string::npos);
  CHECK(j.find("\"weights\":\"bf16 (not quantized)\"") != std::string::npos);
  CHECK(j.find("\"moe_layers\":7,\"experts_per_layer\":16,\"experts\":112") != std::string::npos);
  CHECK(j.find("\"tokenizer_ranks\":2048,\"tokenizer_config\":true") != std::string::npos);
  // A --bits 4 container: its fingerprint's parameters and shard counts.
  const std::string out = d / "c4";
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), out, "--bits", "4", "-q"}) == 0);
  const std::string log2 = d / "info2";
  REQUIRE(Run({Bin("k3-run"), "info", out}, {.log = log2}) == 0);
  std::string t = ReadAll(log2);
  CHECK(t.find("kind        k3 container (k3-repack output)\n") != std::string::npos);
  CHECK(t.find("weights     int4-g64 / int8 / int8 (bits 4, mla-bits 8, head-bits 8)\n") != std::string::npos);
  CHECK(t.find("fingerprint 9 output shards from 11 source shards\n") != std::string::npos);
  CHECK(t.find("experts     112 stored (16 per MoE layer)") != std::string::npos);
  // The kernel dispatch, as --version words it (ISA, per-CPU rules, override).
  CHECK(t.find("\nkernels     ") != std::string::npos);
  CHECK(t.find(" kernels (best this CPU runs)") != std::string::npos);
  // Incomplete: says so, with what to do.
  const std::string part = d / "part";
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), part, "--shards", "1,2", "-q"}) == 0);
  const std::string log3 = d / "info3";
  REQUIRE(Run({Bin("k3-run"), "info", part}, {.log = log3}) == 0);
  CHECK(ReadAll(log3).find("status      incomplete container: 2 of 9 shards; rerun k3-repack") != std::string::npos);
}

TEST_CASE("K3_LOG=bogus is refused by every tool at start-up, naming the variable") {
  // The logger cannot fail, so only a start-up check keeps a typo from being
  // ignored; k3-run's commands are covered in tests/engine/run_cli_test.cc.
  TempDir d("k3cli");
  const std::string dst = d / "dst";
  CheckEveryToolRefuses(d, {
      {"k3-repack", {Bin("k3-repack"), TinySnapshot(), dst, "-q"}},
      {"k3-verify", {Bin("k3-verify"), TinySnapshot()}},
      {"k3-fixture presets", {Bin("k3-fixture"), "presets"}},
      {"k3-fixture check", {Bin("k3-fixture"), "check", TinySnapshot()}},
      {"k3-fixture generate", {Bin("k3-fixture"), "--preset", "tiny", "--out", d / "fx"}},
      {"k3-bench kernels", {Bin("k3-bench"), "kernels"}},
      {"k3-bench io", {Bin("k3-bench"), "io"}},
      {"k3-bench tokenizer", {Bin("k3-bench"), "tokenizer"}},
      {"k3-run tokenize", {Bin("k3-run"), "tokenize", TinySnapshot(), "--text", "hi"}},
  }, "K3_LOG=bogus", {": error: 'K3_LOG'", "bogus", "quiet"});  // "quiet": the accepted values are listed
  CHECK(!Exists(dst));  // nothing written before the check
  CHECK(!Exists(d / "fx"));
  // The accepted values still work (a valid K3_LOG is no error).
  CHECK(Run({Bin("k3-fixture"), "presets"}, {.env = {"K3_LOG=quiet"}}) == 0);
}

TEST_CASE("K3_DIRECT is read by k3-repack and k3-verify at start-up: a bad value is exit 2, 0 still converts") {
  TempDir d("k3cli");
  const std::string dst = d / "dst";
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{Bin("k3-repack"), TinySnapshot(), dst, "-q"},
        std::vector<std::string>{Bin("k3-verify"), TinySnapshot()}}) {
    CAPTURE(argv[0]);
    const std::string log = d / "log";
    CHECK(Run(argv, {.env = {"K3_DIRECT=bogus"}, .log = log}) == 2);
    const std::string e = ReadAll(log);
    CHECK(e.find(": error: 'K3_DIRECT'") != std::string::npos);
    CHECK(e.find("bogus") != std::string::npos);
  }
  CHECK(!Exists(dst));
  // Buffered I/O throughout gives the same container as the direct default.
  const std::string buffered = d / "buffered";
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), dst, "-q"}) == 0);
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), buffered, "-q"}, {.env = {"K3_DIRECT=0"}}) == 0);
  CHECK(Run({Bin("k3-verify"), buffered, "--full", "--source", TinySnapshot()}, {.env = {"K3_DIRECT=0"}}) == 0);
  for (const char* f : {"model.safetensors.index.json", "checksums.xxh128"}) {
    CAPTURE(f);
    CHECK(ReadAll(dst + "/" + f) == ReadAll(buffered + "/" + f));
  }
}

TEST_CASE("K3_FORCE_ISA: every tool refuses a bad name up front; --version reports a forced ISA") {
  // The kernel variables are read by each main (k3::toolenv), not inside
  // lib/quant: the same messages and exit codes as when the library read them.
  TempDir d("k3cli");
  const std::string dst = d / "dst";
  CheckEveryToolRefuses(d, {
      {"k3-repack", {Bin("k3-repack"), TinySnapshot(), dst, "-q"}},
      {"k3-verify", {Bin("k3-verify"), TinySnapshot()}},
      {"k3-fixture presets", {Bin("k3-fixture"), "presets"}},
      {"k3-bench kernels", {Bin("k3-bench"), "kernels"}},
      {"k3-run tokenize", {Bin("k3-run"), "tokenize", TinySnapshot(), "--text", "hi"}},
  }, "K3_FORCE_ISA=avx1024", {": error: K3_FORCE_ISA='avx1024' is not one of scalar, avx2"});
  CHECK(!Exists(dst));
  for (const char* tool : kTools) {
    CAPTURE(tool);
    const std::string log = d / "version";
    CHECK(Run({Bin(tool), "--version"}, {.env = {"K3_FORCE_ISA=scalar"}, .log = log}) == 0);
    CHECK(ReadAll(log).find("; K3_FORCE_ISA=scalar forces one ISA for everything") != std::string::npos);
    CHECK(ReadAll(log).find("k3 info") == std::string::npos);  // reported, not chosen
  }
  // The choice itself: the kernel log line of a tool that dispatches.
  const std::string log = d / "log";
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), dst}, {.env = {"K3_FORCE_ISA=scalar"}, .log = log}) == 0);
  CHECK(ReadAll(log).find("k3 info: quant: scalar kernels (K3_FORCE_ISA)") != std::string::npos);
}
