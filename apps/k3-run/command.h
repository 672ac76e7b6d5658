// k3-run subcommand registry. Each cmd_*.cc file registers its subcommands with a
// static K3_REGISTER_COMMAND(setup) where setup(CLI::App& root) adds one or more
// subcommands and their callbacks. Callbacks throw k3::Error; main maps it to an
// exit code (docs/errors.md).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace k3::run {

using CommandSetup = std::function<void(CLI::App& root)>;
std::vector<CommandSetup>& CommandRegistry();

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSetup setup) { CommandRegistry().push_back(std::move(setup)); }
};

}  // namespace k3::run

#define K3_CONCAT_INNER(a, b) a##b
#define K3_CONCAT(a, b) K3_CONCAT_INNER(a, b)
#define K3_REGISTER_COMMAND(fn) \
  static ::k3::run::CommandRegistrar K3_CONCAT(k3_command_registrar_, __LINE__)(fn)
