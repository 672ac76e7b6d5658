// k3-bench: benchmarks that print JSON lines (docs/PERFORMANCE.md). Each area
// lives in its own cmd_*.cc and registers its subcommand (command.h).
#include <cstdio>
#include <exception>

#include "command.h"
#include "k3/core/error.h"

namespace k3::bench {
std::vector<CommandSetup>& CommandRegistry() {
  static std::vector<CommandSetup> registry;
  return registry;
}
}  // namespace k3::bench

int main(int argc, char** argv) {
  CLI::App app{"k3-bench: k3 benchmarks (JSON lines with a same-run baseline ratio)"};
  app.require_subcommand(1);
  for (auto& setup : k3::bench::CommandRegistry()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "k3-bench: error: %s\n", e.what());
    return k3::ExitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
