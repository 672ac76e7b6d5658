#include "k3/core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace k3 {
namespace {

LogLevel ParseLevel(const char* s) {
  if (s == nullptr) return LogLevel::kInfo;
  if (!std::strcmp(s, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(s, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(s, "error")) return LogLevel::kError;
  if (!std::strcmp(s, "quiet")) return LogLevel::kQuiet;
  return LogLevel::kInfo;
}

LogLevel& Level() {
  static LogLevel level = ParseLevel(std::getenv("K3_LOG"));
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

LogLevel CurrentLogLevel() { return Level(); }
void SetLogLevel(LogLevel level) { Level() = level; }

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
