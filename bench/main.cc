// k3-bench: benchmarks that print JSON lines (docs/PERFORMANCE.md). Each area
// lives in its own cmd_*.cc and registers its subcommand (command.h).
#include "command.h"
#include "k3/quant/isa.h"

int main(int argc, char** argv) {
  CLI::App app{"k3-bench: k3 benchmarks (JSON lines with a same-run baseline ratio)"};
  return k3::cli::RunRegisteredCommands<k3::bench::BenchTag>(
      app, "k3-bench", argc, argv, [] { k3::quant::ActiveIsa(); });
}
