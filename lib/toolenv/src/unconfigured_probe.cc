// A program that uses lib/quant and lib/core without k3::toolenv (as a fuzzer
// or any library user does): whatever the environment says, it must get the
// defaults, also from a static initialiser that dispatches before main. Run by
// ctest (toolenv_unconfigured) with K3_FORCE_ISA, K3_LOG and K3_PREFETCH set;
// exits 1 naming what was not the default.
#include <cstdio>

#include "k3/core/log.h"
#include "k3/quant/isa.h"

namespace {

// Dispatches during static initialisation, before main runs.
const k3::quant::Isa kStaticIsa = k3::quant::ActiveIsa();

}  // namespace

int main() {
  using namespace k3::quant;
  int bad = 0;
  auto expect = [&bad](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "toolenv_unconfigured: not the default: %s\n", what);
      bad = 1;
    }
  };
  expect(kStaticIsa == BestIsa(), "the ISA chosen by a static initialiser");
  expect(ActiveIsa() == BestIsa(), "the ISA chosen in main");
  const KernelConfig c = CurrentKernelConfig();
  expect(!c.forced_isa.has_value(), "forced_isa");
  expect(c.prefetch_bytes == -1, "prefetch_bytes");
  expect(k3::CurrentLogLevel() == k3::LogLevel::kInfo, "the log level");
  if (bad == 0) std::printf("toolenv_unconfigured: defaults, whatever the environment says\n");
  return bad;
}
