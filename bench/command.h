// k3-bench subcommand registry. Each cmd_*.cc registers its subcommands with a
// static K3_REGISTER_BENCH(setup) where setup(CLI::App& root) adds one or more
// subcommands and their callbacks, so a new area needs no edit to main.cc or
// CMakeLists.txt. Callbacks throw k3::Error; main maps it to an exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace k3::bench {

using CommandSetup = std::function<void(CLI::App& root)>;
std::vector<CommandSetup>& CommandRegistry();

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSetup setup) { CommandRegistry().push_back(std::move(setup)); }
};

}  // namespace k3::bench

#define K3_BENCH_CONCAT_INNER(a, b) a##b
#define K3_BENCH_CONCAT(a, b) K3_BENCH_CONCAT_INNER(a, b)
#define K3_REGISTER_BENCH(fn) \
  static ::k3::bench::CommandRegistrar K3_BENCH_CONCAT(k3_bench_registrar_, __LINE__)(fn)
