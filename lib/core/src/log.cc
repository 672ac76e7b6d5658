#include "k3/core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "k3/core/sys.h"

namespace k3 {
namespace {

LogLevel& Level() {
  // A malformed K3_LOG cannot throw from here (any log line may be the first);
  // the tools validate it up front (ApplyLogLevelFromEnv).
  static LogLevel level = ParseLogLevel(std::getenv("K3_LOG") ? std::getenv("K3_LOG") : "")
                              .value_or(LogLevel::kInfo);
  return level;
}

std::mutex& Mutex() {
  static std::mutex m;
  return m;
}

void VLog(LogLevel level, const char* fmt, va_list ap) {
  static const char* kTags[] = {"debug", "info", "warn", "error", ""};
  char buf[4096];
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  std::lock_guard<std::mutex> lock(Mutex());
  std::fprintf(stderr, "k3 %s: %s\n", kTags[static_cast<int>(level)], buf);
}

}  // namespace

std::optional<LogLevel> ParseLogLevel(std::string_view s) {
  if (s == "debug") return LogLevel::kDebug;
  if (s == "info") return LogLevel::kInfo;
  if (s == "warn") return LogLevel::kWarn;
  if (s == "error") return LogLevel::kError;
  if (s == "quiet") return LogLevel::kQuiet;
  return std::nullopt;
}

LogLevel CurrentLogLevel() { return Level(); }
void SetLogLevel(LogLevel level) { Level() = level; }

void ApplyLogLevelFromEnv() {
  const std::string v = GetEnvChoice("K3_LOG", "info", {"debug", "info", "warn", "error", "quiet"});
  SetLogLevel(*ParseLogLevel(v));
}

void Log(LogLevel level, const char* fmt, ...) {
  if (level < Level()) return;
  va_list ap;
  va_start(ap, fmt);
  VLog(level, fmt, ap);
  va_end(ap);
}

void LogOnce(const void* key, LogLevel level, const char* fmt, ...) {
  static std::set<const void*> seen;
  {
    std::lock_guard<std::mutex> lock(Mutex());
    if (!seen.insert(key).second) return;
  }
  if (level < Level()) return;
  va_list ap;
  va_start(ap, fmt);
  VLog(level, fmt, ap);
  va_end(ap);
}

}  // namespace k3
