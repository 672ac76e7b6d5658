// k3-run: Kimi K3 inference — generate, chat, serve, tokenize, render.
// Subcommands live in cmd_*.cc and register themselves (command.h).
#include <cstdio>
#include <exception>

#include "command.h"
#include "k3/core/error.h"

namespace k3::run {
std::vector<CommandSetup>& CommandRegistry() {
  static std::vector<CommandSetup> registry;
  return registry;
}
}  // namespace k3::run

int main(int argc, char** argv) {
  CLI::App app{"k3-run: run Moonshot's Kimi K3 from an HF snapshot or a k3 container"};
  app.require_subcommand(1);
  for (auto& setup : k3::run::CommandRegistry()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "k3-run: error: %s\n", e.what());
    return k3::ExitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3-run: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
