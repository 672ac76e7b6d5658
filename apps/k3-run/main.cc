// k3-run: Kimi K3 inference — generate, chat, serve, tokenize, render.
// Subcommands live in cmd_*.cc and register themselves (command.h).
#include "command.h"

int main(int argc, char** argv) {
  CLI::App app{"k3-run: run Moonshot's Kimi K3 from an HF snapshot or a k3 container"};
  return k3::cli::RunRegisteredCommands<k3::run::CommandTag>(app, "k3-run", argc, argv);
}
