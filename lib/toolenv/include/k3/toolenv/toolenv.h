// k3::toolenv — what every k3 program reads from the environment at start-up
// besides the runtime's EngineOptions::FromEnv and vulkan::TierOptions::FromEnv:
// the log threshold (K3_LOG), the kernel configuration (K3_FORCE_ISA,
// K3_PREFETCH) and the test hooks (K3_CRASH_AT, K3_STALL_AT).
// The libraries read no environment (scripts/check-env-reads.sh); each main
// (apps/, bench/, the shared doctest main, the test drivers) calls
// ApplyFromEnv once, before its first log line or kernel. docs/environment.md.
//
// Failures: FromEnv throws k3::Error (kInvalidArgument for a malformed value,
// kUnsupported for an ISA this CPU cannot run) naming the variable, before
// anything is applied. Not thread-safe: call it before starting threads.
#pragma once

#include <string>
#include <vector>

#include "k3/core/log.h"
#include "k3/quant/isa.h"

namespace k3::toolenv {

// K3_CRASH_AT=NAME[:N] (k3/core/file.h CrashPoint); an empty name is off.
struct CrashAt {
  std::string name;
  long nth = 1;
};

// K3_STALL_AT=NAME:SECONDS (k3/core/file.h StallPoint); an empty name is off.
struct StallAt {
  std::string name;
  double seconds = 0;
};

struct ToolEnv {
  LogLevel log_level = LogLevel::kInfo;  // K3_LOG
  quant::KernelConfig kernels;           // K3_FORCE_ISA, K3_PREFETCH
  CrashAt crash_at;                      // K3_CRASH_AT
  StallAt stall_at;                      // K3_STALL_AT
  // Values that are not errors but are not used either (a bad K3_PREFETCH: the
  // kernels' defaults), logged as warnings by Apply once the level is set.
  std::vector<std::string> warnings;

  // Reads and validates every variable above; throws before returning anything.
  static ToolEnv FromEnv();
};

// K3_LOG: debug|info|warn|error|quiet; unset or empty = info; anything else is
// kInvalidArgument naming the variable and the choices.
LogLevel LogLevelFromEnv();
// K3_FORCE_ISA (an ISA name this CPU runs), K3_PREFETCH (a byte count in
// [0, quant::kMaxPrefetchBytes]; otherwise a warning appended to `warnings`
// and the defaults, as before this moved here).
quant::KernelConfig KernelConfigFromEnv(std::vector<std::string>* warnings);
// K3_CRASH_AT.
CrashAt CrashAtFromEnv();
// K3_STALL_AT: NAME:SECONDS, SECONDS in (0, 3600]; anything else is
// kInvalidArgument naming the variable.
StallAt StallAtFromEnv();

// SetLogLevel, the warnings, quant::ConfigureKernels (which neither chooses nor
// logs the kernels: the first dispatch does), SetCrashPoint, SetStallPoint.
void Apply(const ToolEnv& env);
// Apply(ToolEnv::FromEnv()).
void ApplyFromEnv();
// For a main that has no error handler around its start-up yet: ApplyFromEnv,
// and on k3::Error prints "<tool>: error: <what>" and returns the exit code
// (docs/errors.md); 0 when all is well.
int ApplyFromEnvOrReport(const char* tool);

}  // namespace k3::toolenv
