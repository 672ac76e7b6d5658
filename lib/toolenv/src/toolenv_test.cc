// The tools' start-up configuration: each variable parsed as docs/environment.md
// says (defaults, accepted values, the errors for bad ones), and the config API
// it feeds (quant::ConfigureKernels, SetCrashPoint) changing what runs.
#include "k3/toolenv/toolenv.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/log.h"
#include "k3/quant/isa.h"
#include "k3/quant/quant.h"

using namespace k3;
using quant::Isa;
using quant::KernelConfig;

namespace {

// Sets (or, with nullptr, unsets) a variable for one scope and restores it.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvScope() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Restores the kernel configuration (the one the doctest main installed) at scope end.
struct KernelConfigGuard {
  KernelConfig saved = quant::CurrentKernelConfig();
  ~KernelConfigGuard() { quant::ConfigureKernels(saved); }
};

std::optional<Isa> UnsupportedIsa() {
  for (Isa i : quant::kAllIsas) {
    if (!quant::IsaSupported(i)) return i;
  }
  return std::nullopt;  // kAllIsas spans two architectures: never reached
}

// Runs `fn` in a forked child; returns its wait status.
template <typename Fn>
int InChild(Fn fn) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    fn();
    ::_exit(0);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return st;
}

// Runs a shell command and returns its exit status and stderr.
std::pair<int, std::string> Sh(const std::string& cmd) {
  const std::string err_path = "/tmp/k3_toolenv_test." + std::to_string(::getpid()) + ".err";
  const int st = std::system((cmd + " 2>" + err_path + " >/dev/null").c_str());
  std::string err;
  if (FILE* f = std::fopen(err_path.c_str(), "r")) {
    char buf[512];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) err.append(buf, n);
    std::fclose(f);
  }
  ::unlink(err_path.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), err};
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

TEST_CASE("K3_LOG: unset is info, the five names, anything else refused naming the variable") {
  {
    EnvScope e("K3_LOG", nullptr);
    CHECK(toolenv::LogLevelFromEnv() == LogLevel::kInfo);
  }
  {
    EnvScope e("K3_LOG", "");
    CHECK(toolenv::LogLevelFromEnv() == LogLevel::kInfo);
  }
  const std::pair<const char*, LogLevel> names[] = {{"debug", LogLevel::kDebug},
                                                    {"info", LogLevel::kInfo},
                                                    {"warn", LogLevel::kWarn},
                                                    {"error", LogLevel::kError},
                                                    {"quiet", LogLevel::kQuiet}};
  for (const auto& [name, level] : names) {
    EnvScope e("K3_LOG", name);
    CHECK(toolenv::LogLevelFromEnv() == level);
  }
  EnvScope e("K3_LOG", "verbose");
  try {
    toolenv::LogLevelFromEnv();
    FAIL("accepted");
  } catch (const Error& err) {
    CHECK(err.code() == ErrorCode::kInvalidArgument);
    CHECK(err.object() == "K3_LOG");
    CHECK(std::string(err.what()).find("verbose") != std::string::npos);
    CHECK(std::string(err.what()).find("quiet") != std::string::npos);
  }
}

TEST_CASE("K3_FORCE_ISA: a name this CPU runs, else the errors the tools have always given") {
  {
    EnvScope e("K3_FORCE_ISA", nullptr);
    CHECK_FALSE(toolenv::KernelConfigFromEnv(nullptr).forced_isa.has_value());
  }
  for (Isa i : quant::kAllIsas) {
    if (!quant::IsaSupported(i)) continue;
    EnvScope e("K3_FORCE_ISA", quant::IsaName(i));
    CHECK(toolenv::KernelConfigFromEnv(nullptr).forced_isa == i);
  }
  {
    EnvScope e("K3_FORCE_ISA", "avx1024");
    try {
      toolenv::KernelConfigFromEnv(nullptr);
      FAIL("accepted");
    } catch (const Error& err) {
      CHECK(err.code() == ErrorCode::kInvalidArgument);
      CHECK(std::string(err.what()) ==
            "K3_FORCE_ISA='avx1024' is not one of scalar, avx2, avx2vnni, avx512, neon, neondot "
            "[invalid-argument]");
    }
  }
  const std::optional<Isa> missing = UnsupportedIsa();
  REQUIRE(missing.has_value());
  EnvScope e("K3_FORCE_ISA", quant::IsaName(*missing));
  try {
    toolenv::KernelConfigFromEnv(nullptr);
    FAIL("accepted");
  } catch (const Error& err) {
    CHECK(err.code() == ErrorCode::kUnsupported);
    CHECK(std::string(err.what()) == std::string("K3_FORCE_ISA=") + quant::IsaName(*missing) +
                                         " but this CPU (or OS) cannot run it; best is " +
                                         quant::IsaName(quant::BestIsa()) + " [unsupported]");
  }
}

TEST_CASE("K3_PREFETCH: a byte count in [0, 1 MiB]; anything else is a warning and the defaults") {
  std::vector<std::string> warnings;
  {
    EnvScope e("K3_PREFETCH", nullptr);
    CHECK(toolenv::KernelConfigFromEnv(&warnings).prefetch_bytes == -1);
  }
  for (const char* ok : {"0", "8192", "1048576"}) {
    EnvScope e("K3_PREFETCH", ok);
    CHECK(toolenv::KernelConfigFromEnv(&warnings).prefetch_bytes == std::atoll(ok));
  }
  CHECK(warnings.empty());
  for (const char* bad : {"-1", "1048577", "4k", "nan"}) {
    CAPTURE(bad);
    EnvScope e("K3_PREFETCH", bad);
    warnings.clear();
    CHECK(toolenv::KernelConfigFromEnv(&warnings).prefetch_bytes == -1);
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0] ==
          "quant: K3_PREFETCH is not a byte count in [0, 1048576]; using the defaults");
  }
}

TEST_CASE("K3_CRASH_AT: NAME or NAME:N") {
  {
    EnvScope e("K3_CRASH_AT", nullptr);
    CHECK(toolenv::CrashAtFromEnv().name.empty());
  }
  {
    EnvScope e("K3_CRASH_AT", "before-rename");
    CHECK(toolenv::CrashAtFromEnv().name == "before-rename");
    CHECK(toolenv::CrashAtFromEnv().nth == 1);
  }
  EnvScope e("K3_CRASH_AT", "after-rename:3");
  CHECK(toolenv::CrashAtFromEnv().name == "after-rename");
  CHECK(toolenv::CrashAtFromEnv().nth == 3);
}

TEST_CASE("K3_STALL_AT: NAME:SECONDS, anything else refused naming the variable") {
  {
    EnvScope e("K3_STALL_AT", nullptr);
    CHECK(toolenv::StallAtFromEnv().name.empty());
  }
  {
    EnvScope e("K3_STALL_AT", "serve-load:2.5");
    CHECK(toolenv::StallAtFromEnv().name == "serve-load");
    CHECK(toolenv::StallAtFromEnv().seconds == 2.5);
  }
  for (const char* bad : {"serve-load", ":3", "serve-load:", "serve-load:0", "serve-load:-1",
                          "serve-load:3x", "serve-load:9999"}) {
    EnvScope e("K3_STALL_AT", bad);
    CAPTURE(bad);
    try {
      toolenv::StallAtFromEnv();
      FAIL("accepted");
    } catch (const Error& err) {
      CHECK(err.code() == ErrorCode::kInvalidArgument);
      CHECK(std::string(err.what()).find("K3_STALL_AT") != std::string::npos);
    }
  }
}

TEST_CASE("ToolEnv::FromEnv refuses before applying anything") {
  const LogLevel before = CurrentLogLevel();
  const KernelConfig kernels_before = quant::CurrentKernelConfig();
  EnvScope a("K3_LOG", before == LogLevel::kError ? "warn" : "error");
  EnvScope b("K3_FORCE_ISA", "bogus");
  CHECK_THROWS_AS(toolenv::ApplyFromEnv(), Error);
  CHECK(CurrentLogLevel() == before);
  CHECK(quant::CurrentKernelConfig().forced_isa == kernels_before.forced_isa);
}

TEST_CASE("ConfigureKernels: a forced ISA changes what is dispatched, also after kernels ran") {
  KernelConfigGuard guard;
  quant::ResetIsaForTesting();  // no test override: the configuration decides
  quant::ConfigureKernels(KernelConfig{});
  CHECK(quant::ActiveIsa() == quant::BestIsa());  // chosen (and logged) here
  CHECK(quant::DispatchDetail().find("; K3_FORCE_ISA overrides") != std::string::npos);
  for (Isa i : quant::kAllIsas) {
    if (!quant::IsaSupported(i)) continue;
    CAPTURE(quant::IsaName(i));
    quant::ConfigureKernels(KernelConfig{.forced_isa = i});
    CHECK(quant::ActiveIsa() == i);
    for (auto fmt : {quant::WeightFormat::kInt8, quant::WeightFormat::kInt4G64}) {
      for (size_t batch : {size_t{1}, size_t{8}}) CHECK(quant::Q8Isa(fmt, batch) == i);
    }
    CHECK(quant::DispatchDetail().find(std::string("; K3_FORCE_ISA=") + quant::IsaName(i) +
                                       " forces one ISA for everything") != std::string::npos);
  }
  quant::ConfigureKernels(KernelConfig{});
  CHECK(quant::ActiveIsa() == quant::BestIsa());
}

TEST_CASE("ConfigureKernels refuses bad values and keeps the configuration") {
  KernelConfigGuard guard;
  quant::ConfigureKernels(
      KernelConfig{.forced_isa = std::nullopt, .prefetch_bytes = 8192});
  const std::optional<Isa> missing = UnsupportedIsa();
  REQUIRE(missing.has_value());
  try {
    quant::ConfigureKernels(KernelConfig{.forced_isa = *missing});
    FAIL("accepted");
  } catch (const Error& err) {
    CHECK(err.code() == ErrorCode::kUnsupported);
    CHECK(std::string(err.what()).find(quant::IsaName(*missing)) != std::string::npos);
  }
  for (int64_t bad : {int64_t{-2}, quant::kMaxPrefetchBytes + 1}) {
    CAPTURE(bad);
    try {
      quant::ConfigureKernels(KernelConfig{.forced_isa = std::nullopt, .prefetch_bytes = bad});
      FAIL("accepted");
    } catch (const Error& err) {
      CHECK(err.code() == ErrorCode::kInvalidArgument);
      CHECK(std::string(err.what()).find(std::to_string(bad)) != std::string::npos);
    }
  }
  const KernelConfig now = quant::CurrentKernelConfig();
  CHECK_FALSE(now.forced_isa.has_value());
  CHECK(now.prefetch_bytes == 8192);
}

TEST_CASE("SetCrashPoint: the N-th pass through the named point kills with SIGKILL") {
  // Disarmed (the default, and an empty name): every point is free.
  int st = InChild([] {
    SetCrashPoint("");
    for (int i = 0; i < 3; ++i) CrashPoint("p");
  });
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  // Armed for the 3rd pass of "p": other names and the first two passes survive.
  int passes = 0;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  st = InChild([&] {
    SetCrashPoint("p", 3);
    for (int i = 0; i < 5; ++i) {
      CrashPoint("q");
      CrashPoint("p");
      const char one = 1;
      if (::write(fds[1], &one, 1) != 1) ::_exit(3);
    }
  });
  ::close(fds[1]);
  char c;
  while (::read(fds[0], &c, 1) == 1) ++passes;
  ::close(fds[0]);
  CHECK(WIFSIGNALED(st));
  CHECK(WTERMSIG(st) == SIGKILL);
  CHECK(passes == 2);
  // Through the environment as the tools apply it.
  st = InChild([] {
    ::setenv("K3_CRASH_AT", "x:2", 1);
    toolenv::ApplyFromEnv();
    CrashPoint("x");
    CrashPoint("x");
  });
  CHECK(WIFSIGNALED(st));
}

TEST_CASE("the doctest main configures from the environment like a tool") {
  // In this process: what scripts/test.sh's K3_FORCE_ISA reruns rely on.
  const char* forced = std::getenv("K3_FORCE_ISA");
  const std::optional<Isa> configured = quant::CurrentKernelConfig().forced_isa;
  if (forced != nullptr && *forced != '\0') {
    REQUIRE(configured.has_value());
    CHECK(std::string(quant::IsaName(*configured)) == forced);
  } else {
    CHECK_FALSE(configured.has_value());
  }
  if (std::getenv("K3_TOOLENV_CHILD") != nullptr) return;  // the runs below, not again
  // Natively the binary itself; in a cross build the emulator ctest runs it under.
  const std::string emulator = K3_TEST_EMULATOR;
  const std::string self = (emulator.empty() ? "" : emulator + " ") + "'" + SelfExe() + "'";
  const std::string only = " -tc='the doctest main configures*'";
  // Forced to scalar: this case passes in the child (it checks the configuration).
  auto [rc, err] = Sh("K3_TOOLENV_CHILD=1 K3_FORCE_ISA=scalar " + self + only);
  CHECK(rc == 0);
  // A bad value: the tool's message and exit code, before any test runs.
  std::tie(rc, err) = Sh("K3_TOOLENV_CHILD=1 K3_FORCE_ISA=bogus " + self + only);
  CHECK(rc == 2);
  CHECK(err.find("error: K3_FORCE_ISA='bogus' is not one of") != std::string::npos);
  std::tie(rc, err) = Sh("K3_TOOLENV_CHILD=1 K3_LOG=loud " + self + only);
  CHECK(rc == 2);
  CHECK(err.find("'K3_LOG'") != std::string::npos);
}
