// Process and machine facts: memory, environment variables, timing.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace k3 {

uint64_t PeakRssBytes();          // getrusage ru_maxrss
uint64_t CurrentRssBytes();       // /proc/self/statm
uint64_t MemAvailableBytes();     // /proc/meminfo MemAvailable (0 if unknown)
uint64_t AddressSpaceLimitBytes();  // RLIMIT_AS's soft limit (0 if unlimited)
int NumOnlineCpus();
// Asks for transparent huge pages over the whole pages of [p, p + bytes)
// (madvise MADV_HUGEPAGE; a hint: ignored where THP is off or unsupported).
// For large buffers whose first touch would otherwise take one fault per 4 KiB;
// the huge pages go to the 2 MiB-aligned stretches inside.
void AdviseHugePages(void* p, size_t bytes) noexcept;

// Scratch blocks this large are offered to transparent huge pages when they
// grow (a prefill window's layer scratch and activation layouts: 2048 rows x
// 12288 columns is 100 MB of floats).
inline constexpr size_t kHugeScratchBytes = size_t{8} << 20;

// Grows a scratch vector to at least n elements (never shrinks it). Contents do
// not survive a growth (every user writes what it reads, and a growth moves the
// block anyway): the old block is released first, and one of kHugeScratchBytes
// or more is advised for huge pages before its first touch: a VM that backs
// fresh 4 KiB pages lazily faults them in far below memory speed
// (docs/PERFORMANCE-history.md, twelfth prefill session).
template <typename V>
void GrowScratch(V& v, size_t n) {
  if (v.size() >= n) return;
  V().swap(v);
  v.reserve(n);
  const size_t bytes = n * sizeof(typename V::value_type);
  if (bytes >= kHugeScratchBytes) AdviseHugePages(v.data(), bytes);
  v.resize(n);
}

// Environment lookups: the one parser and the one strictness for every K3_*
// variable (docs/environment.md). Unset or empty = the fallback. A value that is
// malformed (trailing junk, not a number, NaN/inf) or outside [min, max] throws
// kInvalidArgument naming the variable, the value and the accepted range; nothing
// is clamped or ignored silently. Booleans accept 1/0, true/false, on/off, yes/no.
// The runtime reads its variables in one place (k3::engine::EngineOptions::FromEnv).
std::optional<std::string> GetEnv(const char* name);
int64_t GetEnvInt(const char* name, int64_t fallback, int64_t min = INT64_MIN,
                  int64_t max = INT64_MAX);
double GetEnvDouble(const char* name, double fallback, double min = -1.7976931348623157e308,
                    double max = 1.7976931348623157e308);
bool GetEnvBool(const char* name, bool fallback);
// One of `choices` (exact, case-sensitive); anything else throws listing them.
std::string GetEnvChoice(const char* name, const std::string& fallback,
                         std::initializer_list<const char*> choices);

// Monotonic seconds since an arbitrary epoch.
inline double NowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Human-readable byte count ("1.50 GB", decimal units).
std::string FormatBytes(uint64_t bytes);

}  // namespace k3
