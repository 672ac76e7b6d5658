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
#include <cstdlib>
#include <exception>
#include <functional>
#include <new>
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

// CLI11's messages, made readable: an unknown flag is reported as unknown (CLI11
// checks required arguments first and would say "SRC is required"), and the
// open ends of its number validators are not printed as 1.79769e+308.
inline std::string ClearFailureMessage(const CLI::App* app, const CLI::Error& e) {
  std::string msg = e.what();
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
    std::vector<std::string> extra = app->remaining();
    if (!extra.empty()) {
      msg = "unknown option or extra argument: ";
      for (size_t i = 0; i < extra.size(); ++i) msg += (i ? " " : "") + extra[i];
    }
  }
  // "Value 0 not in range 0.000000 to 179769313486...000000" (a validator with
  // an open upper end, printed as DBL_MAX) -> "Value 0: must be > 0".
  const size_t at = msg.find(" not in range ");
  const size_t to = at == std::string::npos ? at : msg.find(" to ", at + 14);
  if (to != std::string::npos &&
      (msg.compare(to + 4, 12, "1.79769e+308") == 0 || msg.compare(to + 4, 18, "179769313486231570") == 0)) {
    const size_t value_at = msg.rfind(' ', at - 1) + 1;
    const double value = std::strtod(msg.c_str() + value_at, nullptr);
    std::string lo = msg.substr(at + 14, to - at - 14);
    const double lo_value = std::strtod(lo.c_str(), nullptr);
    if (lo.find('.') != std::string::npos) {
      while (lo.back() == '0') lo.pop_back();
      if (lo.back() == '.') lo.pop_back();
    }
    if (lo.starts_with("2.22507e-308")) lo = "0";
    size_t end = msg.find_first_not_of("0123456789.e+", to + 4);
    msg = msg.substr(0, at) + (value >= lo_value ? ": must be > " : ": must be >= ") + lo +
          (end == std::string::npos ? std::string() : msg.substr(end));
  }
  return msg + "\nRun with --help for more information.\n";
}

// Prints a parse error (or --help / --version) as CLI11 does and returns the
// exit code: 0 for --help / --version, 2 (invalid-argument, docs/errors.md) for
// every usage error, instead of CLI11's 101..115 that differ by kind.
inline int UsageExit(CLI::App& app, const CLI::ParseError& e) {
  const int rc = app.exit(e);
  return rc == 0 ? 0 : ExitCodeFor(ErrorCode::kInvalidArgument);
}

// --version and readable parse errors: what every k3 tool sets up first.
inline void InitApp(CLI::App& app, const char* tool, std::function<std::string()> detail = {}) {
  AddVersionFlag(app, tool, std::move(detail));
  app.failure_message(ClearFailureMessage);
}

// Adds every setup registered under `Tag` to `app`, requires exactly one
// subcommand, runs `preflight` (if any: start-up checks such as a valid
// K3_FORCE_ISA, so they fail as clean errors rather than later in a kernel),
// then parses and runs it. Returns the process exit code: 2 for usage errors
// (UsageExit), ExitCodeFor(code) for k3::Error, 70 (internal) for other exceptions; errors are
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
    return FinishStdout(tool, UsageExit(app, e));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return FinishStdout(tool, ExitCodeFor(e.code()));
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: internal error: out of memory\n", tool);
    return FinishStdout(tool, ExitCodeFor(ErrorCode::kInternal));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", tool, e.what());
    return FinishStdout(tool, ExitCodeFor(ErrorCode::kInternal));
  }
  return FinishStdout(tool, 0);
}

}  // namespace k3::cli

#define K3_CLI_CONCAT_INNER(a, b) a##b
#define K3_CLI_CONCAT(a, b) K3_CLI_CONCAT_INNER(a, b)
#define K3_CLI_REGISTER(tag, fn)                                                      \
  static ::k3::cli::CommandRegistrar<tag> K3_CLI_CONCAT(k3_cli_registrar_, __LINE__)( \
      fn)
