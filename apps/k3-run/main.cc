// k3-run: Kimi K3 inference — generate, chat, serve, tokenize, render.
// Subcommands live in cmd_*.cc and register themselves (command.h).
#include <cstdlib>

#include "command.h"
#include "k3/core/sys.h"
#include "k3/quant/isa_info.h"
#include "k3/toolenv/toolenv.h"

int main(int argc, char** argv) {
  CLI::App app{"k3-run: run Moonshot's Kimi K3 from an HF snapshot or a k3 container"};
  k3::cli::InitApp(app, "k3-run", k3::quant::KernelsVersionDetail);
  // A bad K3_LOG or K3_FORCE_ISA fails every command up front. The kernels are
  // configured, not chosen: the tokenizer commands never touch a kernel and
  // should not log the kernel choice, and --quiet is not applied yet.
  return k3::cli::RunRegisteredCommands<k3::run::CommandTag>(app, "k3-run", argc, argv,
                                                             [] { k3::toolenv::ApplyFromEnv(); });
}
