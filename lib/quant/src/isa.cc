// Run-time ISA choice: CPUID on x86-64 (through libgcc's __builtin_cpu_supports,
// which also checks that the OS saves the wide registers), the kernel's
// AT_HWCAP bits on aarch64, K3_FORCE_ISA, one log line. Only the kernel files of
// the architecture being built exist, so every table reference is guarded.
#include "k3/quant/isa.h"

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "kernels.h"

namespace k3::quant {
namespace {

// Set by SetIsaForTesting; takes precedence over the start-up choice.
std::atomic<const internal::KernelTable*> g_test_override{nullptr};
// Set by SetDecodeRowsForTesting (0: the built-in choice).
std::atomic<int> g_decode_rows{0};

const internal::KernelTable& TableFor(Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case Isa::kAvx512:
      return internal::Avx512Kernels();
    case Isa::kAvx2:
      return internal::Avx2Kernels();
    case Isa::kAvx2Vnni:
      return internal::Avx2VnniKernels();
#endif
#if defined(__aarch64__)
    case Isa::kNeon:
      return internal::NeonKernels();
    case Isa::kNeonDot:
      return internal::NeonDotKernels();
#endif
    default:
      break;  // scalar, or an ISA of the other architecture (IsaSupported is false)
  }
  return internal::ScalarKernels();
}

Isa ParseIsa(const std::string& s) {
  std::string names;
  for (Isa i : kAllIsas) {
    if (s == IsaName(i)) return i;
    names += names.empty() ? "" : ", ";
    names += IsaName(i);
  }
  throw Error(ErrorCode::kInvalidArgument, "K3_FORCE_ISA='" + s + "' is not one of " + names);
}

Isa BestIsa() {
  Isa best = Isa::kScalar;
  for (Isa i : kAllIsas) {
    if (IsaSupported(i)) best = i;
  }
  return best;
}

std::optional<Isa> CheckForcedIsa() {
  auto forced = GetEnv("K3_FORCE_ISA");
  if (!forced || forced->empty()) return std::nullopt;
  Isa isa = ParseIsa(*forced);
  if (!IsaSupported(isa)) {
    throw Error(ErrorCode::kUnsupported, std::string("K3_FORCE_ISA=") + *forced +
                                             " but this CPU (or OS) cannot run it; best is " +
                                             IsaName(BestIsa()));
  }
  return isa;
}

const internal::KernelTable* ChooseOrThrow() {
  Isa isa = BestIsa();
  const char* why = "best this CPU runs";
  if (std::optional<Isa> forced = CheckForcedIsa()) {
    isa = *forced;
    why = "K3_FORCE_ISA";
  }
  K3_LOG_INFO("quant: %s kernels (%s)", IsaName(isa), why);
  return &TableFor(isa);
}

const internal::KernelTable& ActiveTableOrThrow() {
  if (const internal::KernelTable* t = g_test_override.load(std::memory_order_acquire)) return *t;
  // A throwing initialiser leaves the static unset, so every call reports the error.
  static const internal::KernelTable* chosen = ChooseOrThrow();
  return *chosen;
}

}  // namespace

std::optional<Isa> ForcedIsaOrThrow() { return CheckForcedIsa(); }

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
#if defined(__x86_64__)
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx2Vnni:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("avxvnni");
    case Isa::kAvx512:
      // VNNI is the point of this tier (IDOT dots); Skylake-X without it uses AVX2.
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("fma");
#endif
#if defined(__aarch64__)
    // ASIMD is part of armv8-a, but a kernel may still hide it; the dot-product
    // extension (armv8.2-a optional, v8.4-a mandatory) is what sdot/udot need.
    case Isa::kNeon:
      return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
    case Isa::kNeonDot:
      return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0 &&
             (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
    default:
      return false;  // the other architecture's ISAs
  }
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx2Vnni:
      return "avx2vnni";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kNeon:
      return "neon";
    case Isa::kNeonDot:
      return "neondot";
  }
  return "?";
}

Isa ActiveIsa() { return ActiveTableOrThrow().isa; }

void SetIsaForTesting(Isa isa) {
  if (!IsaSupported(isa)) {
    throw Error(ErrorCode::kUnsupported, std::string("ISA ") + IsaName(isa) + " not supported");
  }
  g_test_override.store(&TableFor(isa), std::memory_order_release);
}

void SetDecodeRowsForTesting(int rows) {
  if (rows != 0 && rows != 1 && rows != 2 && rows != 4) {
    throw Error(ErrorCode::kInvalidArgument,
                "decode rows must be 0 (built-in), 1, 2 or 4, not " + std::to_string(rows));
  }
  g_decode_rows.store(rows, std::memory_order_relaxed);
}

namespace internal {

int DecodeRowsF32(size_t act_bytes) noexcept {
  if (const int forced = g_decode_rows.load(std::memory_order_relaxed)) return forced;
  static const size_t l1 = [] {
    const long v = ::sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return v > 0 ? static_cast<size_t>(v) : size_t{32} << 10;
  }();
  return act_bytes < l1 ? 1 : 4;
}

const KernelTable& ActiveKernels() noexcept {
  try {
    return ActiveTableOrThrow();
  } catch (const std::exception& e) {
    // Kernels cannot throw; the apps call ActiveIsa() at start-up to get this as
    // a k3::Error, so reaching here means a caller skipped that check.
    K3_LOG_ERROR("quant: %s", e.what());
    std::abort();
  }
}

size_t PrefetchBytes(size_t default_bytes) noexcept {
  // -1: K3_PREFETCH unset. Kernels are noexcept: a bad value is a warning and the
  // kernels' defaults, not an error.
  static const int64_t forced = [] {
    if (!GetEnv("K3_PREFETCH")) return int64_t{-1};
    try {
      const int64_t n = GetEnvInt("K3_PREFETCH", int64_t(kDefaultPrefetchBytes));
      if (n >= 0 && n <= (int64_t{1} << 20)) return n;
    } catch (const std::exception&) {
    }
    K3_LOG_WARN("quant: K3_PREFETCH is not a byte count in [0, 1048576]; using the defaults");
    return int64_t{-1};
  }();
  return forced >= 0 ? static_cast<size_t>(forced) : default_bytes;
}

}  // namespace internal
}  // namespace k3::quant
