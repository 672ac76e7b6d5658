// k3-run subcommand registry. Each cmd_*.cc file registers its subcommands with a
// static K3_REGISTER_COMMAND(setup) where setup(CLI::App& root) adds one or more
// subcommands and their callbacks. Callbacks throw k3::Error; main maps it to an
// exit code (docs/errors.md). The machinery is shared: k3/core/cli_registry.h.
#pragma once

#include "k3/core/cli_registry.h"

namespace k3::run {

// Tags k3-run's registry in k3::cli::CommandRegistry.
struct CommandTag {};

}  // namespace k3::run

#define K3_REGISTER_COMMAND(fn) K3_CLI_REGISTER(::k3::run::CommandTag, fn)
