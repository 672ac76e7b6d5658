#include "k3/core/sys.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "k3/core/error.h"

namespace k3 {

uint64_t PeakRssBytes() {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

uint64_t CurrentRssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  if (n != 2) return 0;
  return static_cast<uint64_t>(resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t MemAvailableBytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  uint64_t kb = 0;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "MemAvailable:", 13) == 0) {
      kb = std::strtoull(line + 13, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kb * 1024;
}

uint64_t AddressSpaceLimitBytes() {
  struct rlimit rl;
  if (::getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<uint64_t>(rl.rlim_cur);
}

int NumOnlineCpus() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

void AdviseHugePages(void* p, size_t bytes) noexcept {
#ifdef MADV_HUGEPAGE
  // madvise wants page-aligned ranges: advise the whole pages inside (a
  // malloc'd block starts a few bytes past a page).
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr || bytes < page) return;
  const uintptr_t lo = (b + page - 1) / page * page, hi = (b + bytes) / page * page;
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

std::optional<std::string> GetEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

namespace {

[[noreturn]] void ThrowEnv(const char* name, const std::string& value, const std::string& want) {
  throw Error(ErrorCode::kInvalidArgument, "expected " + want + ", got '" + value + "'", {},
              Error::kNoOffset, name);
}

std::string NumberText(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

}  // namespace

int64_t GetEnvInt(const char* name, int64_t fallback, int64_t min, int64_t max) {
  auto v = GetEnv(name);
  if (!v) return fallback;
  const std::string want = min == INT64_MIN && max == INT64_MAX
                               ? std::string("an integer")
                               : "an integer in [" + std::to_string(min) + ", " +
                                     std::to_string(max) + "]";
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || errno == ERANGE || x < min || x > max) {
    ThrowEnv(name, *v, want);
  }
  return x;
}

double GetEnvDouble(const char* name, double fallback, double min, double max) {
  auto v = GetEnv(name);
  if (!v) return fallback;
  const bool bounded = min > -1.7976931348623157e308 || max < 1.7976931348623157e308;
  const std::string want = bounded ? "a number in [" + NumberText(min) + ", " + NumberText(max) + "]"
                                   : std::string("a finite number");
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0' || !std::isfinite(x) || x < min || x > max) {
    ThrowEnv(name, *v, want);
  }
  return x;
}

bool GetEnvBool(const char* name, bool fallback) {
  auto v = GetEnv(name);
  if (!v) return fallback;
  const std::string& s = *v;
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  ThrowEnv(name, s, "a boolean (1/0, true/false, on/off, yes/no)");
}

std::string GetEnvChoice(const char* name, const std::string& fallback,
                         std::initializer_list<const char*> choices) {
  auto v = GetEnv(name);
  if (!v) return fallback;
  std::string list;
  for (const char* c : choices) {
    if (*v == c) return *v;
    list += list.empty() ? "" : ", ";
    list += c;
  }
  ThrowEnv(name, *v, "one of " + list);
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000.0 && u < 5) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
}

}  // namespace k3
