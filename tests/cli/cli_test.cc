// Every k3 tool as a command-line program (issue 14): --version, failed writes
// to stdout (a full disk is an error, a closed pipe is quiet), --quiet, and
// --help without the kernel log line.
#include <doctest/doctest.h>

#include <cstdio>
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

}  // namespace

TEST_CASE("--version on every tool: version, git sha, build type, kernel ISA") {
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
      // CLI11 checks required positionals first and used to say "SRC is required".
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
