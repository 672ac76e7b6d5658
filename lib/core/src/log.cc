#include "k3/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace k3 {
namespace {

// The threshold: info until a program sets it (the tools do at start-up from
// K3_LOG, k3::toolenv); this library reads no environment.
std::atomic<LogLevel>& Level() {
  static std::atomic<LogLevel> level{LogLevel::kInfo};
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

LogLevel CurrentLogLevel() { return Level().load(std::memory_order_relaxed); }
void SetLogLevel(LogLevel level) { Level().store(level, std::memory_order_relaxed); }

void Log(LogLevel level, const char* fmt, ...) {
  if (level < CurrentLogLevel()) return;
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
  if (level < CurrentLogLevel()) return;
  va_list ap;
  va_start(ap, fmt);
  VLog(level, fmt, ap);
  va_end(ap);
}

}  // namespace k3
