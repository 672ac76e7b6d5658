// The shared doctest entry point for all k3 unit-test executables. Each one
// configures itself from the environment like a tool (k3::toolenv: K3_LOG,
// K3_FORCE_ISA, ...), so that scripts/test.sh can rerun the suites under
// K3_FORCE_ISA=... and a bad value fails as it does for the tools.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "k3/toolenv/toolenv.h"

int main(int argc, char** argv) {
  if (const int rc = k3::toolenv::ApplyFromEnvOrReport(argc > 0 ? argv[0] : "k3 test")) return rc;
  doctest::Context context(argc, argv);
  return context.run();
}
