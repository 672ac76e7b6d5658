// k3-bench subcommand registry. Each cmd_*.cc registers its subcommands with a
// static K3_REGISTER_BENCH(setup) where setup(CLI::App& root) adds one or more
// subcommands and their callbacks, so a new area needs no edit to main.cc or
// CMakeLists.txt. The machinery is shared with k3-run: k3/core/cli_registry.h.
#pragma once

#include "k3/core/cli_registry.h"

namespace k3::bench {

// Tags k3-bench's registry in k3::cli::CommandRegistry.
struct BenchTag {};

}  // namespace k3::bench

#define K3_REGISTER_BENCH(fn) K3_CLI_REGISTER(::k3::bench::BenchTag, fn)
