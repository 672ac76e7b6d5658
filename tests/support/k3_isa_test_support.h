// Per-ISA test loops: which kernel ISAs a test should run, and one visible line
// naming those that ran and those skipped. Include only from targets that link
// k3::quant (directly or through k3::model).
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "k3/quant/isa.h"

namespace k3::test {

// IsaName as a std::string: doctest streams a const char* as a pointer.
inline std::string IsaStr(quant::Isa isa) { return quant::IsaName(isa); }

// The ISAs a per-ISA loop covers: every one in kAllIsas this CPU runs, or only
// the one K3_FORCE_ISA names (scripts/test.sh reruns the suites once per ISA, so
// a forced run need not repeat the others).
inline std::vector<quant::Isa> IsasToTest() {
  // The configuration the doctest main installed from the environment (k3::toolenv).
  const std::optional<quant::Isa> forced = quant::CurrentKernelConfig().forced_isa;
  std::vector<quant::Isa> run;
  for (quant::Isa isa : quant::kAllIsas) {
    if (!quant::IsaSupported(isa)) continue;
    if (forced && *forced != isa) continue;
    run.push_back(isa);
  }
  REQUIRE_MESSAGE(!run.empty(), "K3_FORCE_ISA names no ISA this CPU runs");
  return run;
}

// The same, and one line saying which ran and which this CPU lacks, so a
// missing tier is never silent. Call once per test case.
inline std::vector<quant::Isa> IsasToTest(const std::string& what) {
  std::vector<quant::Isa> run = IsasToTest();
  std::string ran, skipped;
  for (quant::Isa isa : run) ran += " " + IsaStr(isa);
  for (quant::Isa isa : quant::kAllIsas) {
    if (!quant::IsaSupported(isa)) skipped += " " + IsaStr(isa);
  }
  MESSAGE(what << ": ISAs run:" << ran
               << (skipped.empty() ? std::string() : "; SKIPPED, not on this CPU:" + skipped));
  return run;
}

// For doctest::skip(): true when this CPU cannot run `isa`; says so on stderr
// (doctest's summary only counts skipped cases). Evaluated during static
// initialisation, hence the explicit CPU-feature init.
inline bool SkipUnlessCpuRuns(quant::Isa isa, const char* test) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // x86 only; aarch64 reads AT_HWCAP, valid from the start
#endif
  if (quant::IsaSupported(isa)) return false;
  std::fprintf(stderr, "SKIPPED: \"%s\": this CPU cannot run %s\n", test, quant::IsaName(isa));
  return true;
}

}  // namespace k3::test
