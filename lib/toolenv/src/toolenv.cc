// The tools' start-up environment: one of the three places K3_* variables are
// read (with EngineOptions::FromEnv and vulkan::TierOptions::FromEnv), all with
// core's one parser (k3/core/sys.h).
#include "k3/toolenv/toolenv.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/sys.h"

namespace k3::toolenv {

LogLevel LogLevelFromEnv() {
  const std::string v = GetEnvChoice("K3_LOG", "info", {"debug", "info", "warn", "error", "quiet"});
  return *ParseLogLevel(v);
}

quant::KernelConfig KernelConfigFromEnv(std::vector<std::string>* warnings) {
  quant::KernelConfig k;
  if (auto forced = GetEnv("K3_FORCE_ISA")) {
    const std::optional<quant::Isa> isa = quant::ParseIsaName(*forced);
    if (!isa) {
      std::string names;
      for (quant::Isa i : quant::kAllIsas) {
        names += names.empty() ? "" : ", ";
        names += quant::IsaName(i);
      }
      throw Error(ErrorCode::kInvalidArgument,
                  "K3_FORCE_ISA='" + *forced + "' is not one of " + names);
    }
    if (!quant::IsaSupported(*isa)) {
      throw Error(ErrorCode::kUnsupported, "K3_FORCE_ISA=" + *forced +
                                               " but this CPU (or OS) cannot run it; best is " +
                                               quant::IsaName(quant::BestIsa()));
    }
    k.forced_isa = isa;
  }
  // A bad K3_PREFETCH is a warning and the defaults, not an error;
  // docs/environment.md notes the exception.
  if (GetEnv("K3_PREFETCH")) {
    bool ok = false;
    try {
      const int64_t n = GetEnvInt("K3_PREFETCH", -1);
      if (n >= 0 && n <= quant::kMaxPrefetchBytes) {
        k.prefetch_bytes = n;
        ok = true;
      }
    } catch (const Error&) {
    }
    if (!ok && warnings != nullptr) {
      warnings->push_back("quant: K3_PREFETCH is not a byte count in [0, " +
                          std::to_string(quant::kMaxPrefetchBytes) + "]; using the defaults");
    }
  }
  return k;
}

CrashAt CrashAtFromEnv() {
  CrashAt c;
  const std::optional<std::string> spec = GetEnv("K3_CRASH_AT");
  if (!spec) return c;
  // A test hook: NAME, or NAME:N (atol; N <= 1 is the first pass).
  const size_t colon = spec->find(':');
  c.name = spec->substr(0, colon);
  if (colon != std::string::npos) c.nth = std::atol(spec->c_str() + colon + 1);
  return c;
}

StallAt StallAtFromEnv() {
  StallAt s;
  const std::optional<std::string> spec = GetEnv("K3_STALL_AT");
  if (!spec || spec->empty()) return s;
  const size_t colon = spec->find(':');
  char* end = nullptr;
  const double seconds =
      colon == std::string::npos ? 0 : std::strtod(spec->c_str() + colon + 1, &end);
  if (colon == 0 || colon == std::string::npos || end == nullptr || *end != '\0' ||
      !(seconds > 0 && seconds <= 3600)) {
    throw Error(ErrorCode::kInvalidArgument,
                "K3_STALL_AT='" + *spec + "' is not NAME:SECONDS with SECONDS in (0, 3600]");
  }
  s.name = spec->substr(0, colon);
  s.seconds = seconds;
  return s;
}

ToolEnv ToolEnv::FromEnv() {
  ToolEnv e;
  e.log_level = LogLevelFromEnv();
  e.kernels = KernelConfigFromEnv(&e.warnings);
  e.crash_at = CrashAtFromEnv();
  e.stall_at = StallAtFromEnv();
  return e;
}

void Apply(const ToolEnv& env) {
  SetLogLevel(env.log_level);
  for (const std::string& w : env.warnings) K3_LOG_WARN("%s", w.c_str());
  quant::ConfigureKernels(env.kernels);
  SetCrashPoint(env.crash_at.name, env.crash_at.nth);
  SetStallPoint(env.stall_at.name, env.stall_at.seconds);
}

void ApplyFromEnv() { Apply(ToolEnv::FromEnv()); }

int ApplyFromEnvOrReport(const char* tool) {
  try {
    ApplyFromEnv();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return ExitCodeFor(e.code());
  }
  return 0;
}

}  // namespace k3::toolenv
