// Process and machine facts: memory, environment variables, timing.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace k3 {

uint64_t PeakRssBytes();          // getrusage ru_maxrss
uint64_t CurrentRssBytes();       // /proc/self/statm
uint64_t MemAvailableBytes();     // /proc/meminfo MemAvailable (0 if unknown)
int NumOnlineCpus();

// Environment lookups. Malformed values throw kInvalidArgument naming the variable.
std::optional<std::string> GetEnv(const char* name);
int64_t GetEnvInt(const char* name, int64_t fallback);
double GetEnvDouble(const char* name, double fallback);
bool GetEnvBool(const char* name, bool fallback);  // 1/0, true/false, on/off, yes/no

// Monotonic seconds since an arbitrary epoch.
inline double NowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Human-readable byte count ("1.50 GB", decimal units).
std::string FormatBytes(uint64_t bytes);

}  // namespace k3
