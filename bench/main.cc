// k3-bench: benchmarks that print JSON lines (docs/PERFORMANCE.md). Each area
// lives in its own cmd_*.cc and registers its subcommand (command.h).
#include <cstdlib>

#include "command.h"
#include "k3/quant/isa_info.h"
#include "k3/toolenv/toolenv.h"

int main(int argc, char** argv) {
  CLI::App app{"k3-bench: k3 benchmarks (JSON lines with a same-run baseline ratio)"};
  k3::cli::InitApp(app, "k3-bench", k3::quant::KernelsVersionDetail);
  // K3_LOG and the kernel variables are checked and applied up front (a bad
  // value is a clean error for every area, also those that load no engine);
  // --help and --version do not choose, so they do not log, the kernels.
  return k3::cli::RunRegisteredCommands<k3::bench::BenchTag>(app, "k3-bench", argc, argv,
                                                             [] { k3::toolenv::ApplyFromEnv(); });
}
