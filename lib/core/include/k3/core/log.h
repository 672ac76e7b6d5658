// Minimal leveled logging to stderr. The threshold is info until SetLogLevel;
// the tools set it at start-up from K3_LOG=debug|info|warn|error|quiet
// (k3::toolenv; this library reads no environment). Thread-safe: each call
// writes one whole line.
#pragma once

#include <cstdarg>
#include <optional>
#include <string_view>

namespace k3 {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kQuiet = 4 };

// "debug", "info", "warn", "error", "quiet"; anything else is nullopt.
std::optional<LogLevel> ParseLogLevel(std::string_view s);
LogLevel CurrentLogLevel();
void SetLogLevel(LogLevel level);
void Log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Logs once per process per `key` (a string literal's address is a fine key).
void LogOnce(const void* key, LogLevel level, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

}  // namespace k3

#define K3_LOG_DEBUG(...) ::k3::Log(::k3::LogLevel::kDebug, __VA_ARGS__)
#define K3_LOG_INFO(...) ::k3::Log(::k3::LogLevel::kInfo, __VA_ARGS__)
#define K3_LOG_WARN(...) ::k3::Log(::k3::LogLevel::kWarn, __VA_ARGS__)
#define K3_LOG_ERROR(...) ::k3::Log(::k3::LogLevel::kError, __VA_ARGS__)
