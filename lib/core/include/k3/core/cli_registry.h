// Self-registering CLI11 subcommands for k3 tools; header-only, so k3::core does not link CLI11.
//
// A tool picks a tag type and, in each source file, registers setup functions:
//   struct MyToolTag {};
//   K3_CLI_REGISTER(MyToolTag, SetupFoo);  // SetupFoo(CLI::App& root) adds "foo"
// and its main calls RunRegisteredCommands<MyToolTag>(app, "my-tool", argc, argv).
// Callbacks throw k3::Error; RunRegisteredCommands maps it to an exit code
// (docs/errors.md). The includer must have CLI11 on its include path.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/tool.h"

namespace k3::cli {

using CommandSetup = std::function<void(CLI::App& root)>;

// The setups registered under `Tag`, in static-initialisation order.
template <typename Tag>
std::vector<CommandSetup>& CommandRegistry() {
  static std::vector<CommandSetup> registry;
  return registry;
}

template <typename Tag>
struct CommandRegistrar {
  explicit CommandRegistrar(CommandSetup setup) {
    CommandRegistry<Tag>().push_back(std::move(setup));
  }
};

// --version: prints "<VersionLine(tool)>; <detail()>" on stdout and exits 0.
inline void AddVersionFlag(CLI::App& app, const char* tool, std::function<std::string()> detail = {}) {
  app.set_version_flag(
      "--version",
      [tool, detail] {
        std::string line = VersionLine(tool);
        if (detail) line += "; " + detail();
        return line;
      },
      "print version, git sha, build type and kernel ISA, then exit");
}

// Adds every setup registered under `Tag` to `app`, requires exactly one
// subcommand, runs `preflight` (if any: start-up checks such as a valid
// K3_FORCE_ISA, so they fail as clean errors rather than later in a kernel),
// then parses and runs it. Returns the process exit code: CLI11's for parse
// errors, ExitCodeFor(code) for k3::Error, 1 for other exceptions; errors are
// printed as "<tool>: error: <what>". A failed write to stdout is an error too
// (FinishStdout).
template <typename Tag>
int RunRegisteredCommands(CLI::App& app, const char* tool, int argc, char** argv,
                          const std::function<void()>& preflight = {}) {
  app.require_subcommand(1);
  for (auto& setup : CommandRegistry<Tag>()) setup(app);
  try {
    if (preflight) preflight();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return FinishStdout(tool, app.exit(e));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return FinishStdout(tool, ExitCodeFor(e.code()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return FinishStdout(tool, 1);
  }
  return FinishStdout(tool, 0);
}

}  // namespace k3::cli

#define K3_CLI_CONCAT_INNER(a, b) a##b
#define K3_CLI_CONCAT(a, b) K3_CLI_CONCAT_INNER(a, b)
#define K3_CLI_REGISTER(tag, fn)                                                      \
  static ::k3::cli::CommandRegistrar<tag> K3_CLI_CONCAT(k3_cli_registrar_, __LINE__)( \
      fn)
