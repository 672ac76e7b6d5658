// Run-time ISA choice: CPUID on x86-64 (through libgcc's __builtin_cpu_supports,
// which also checks that the OS saves the wide registers), the kernel's
// AT_HWCAP bits on aarch64, the configured forced ISA (KernelConfig, which the
// tools fill from K3_FORCE_ISA), one log line per choice. Only the kernel files of
// the architecture being built exist, so every table reference is guarded.
//
// Per-CPU kernel preferences (kCpuRules): on a CPU where another ISA's kernel for
// one (format, batch class) was measured faster than the best ISA's (every ISA
// gives the one order's bits, so mixing changes none; quant_test.cc proves it),
// MatMulQ8 takes that kernel from the other table; everything else stays on the
// best ISA. A forced ISA (and SetIsaForTesting) force one table for everything.
#include "k3/quant/isa.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/quant/quant.h"
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

// What CPUID leaves 0 and 1 report (x86-64; empty elsewhere).
struct CpuIdent {
  std::string vendor;  // "AuthenticAMD", "GenuineIntel", ...
  int family = 0;      // display family (base + extended when base is 0xF)
  int model = 0;       // display model
};

CpuIdent ReadCpuIdent() {
  CpuIdent id;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return id;
  char v[13] = {};
  std::memcpy(v, &b, 4);
  std::memcpy(v + 4, &d, 4);
  std::memcpy(v + 8, &c, 4);
  id.vendor = v;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return id;
  const int base_family = static_cast<int>((a >> 8) & 0xF);
  const int base_model = static_cast<int>((a >> 4) & 0xF);
  id.family = base_family == 0xF ? base_family + static_cast<int>((a >> 20) & 0xFF) : base_family;
  id.model = base_family == 0xF || base_family == 6
                 ? base_model + (static_cast<int>((a >> 16) & 0xF) << 4)
                 : base_model;
#endif
  return id;
}

// One measured preference: on `vendor` CPUs of display family `family` whose
// best ISA is `best`, int8-weight MatMulQ8 at batch 1 (decode) comes from
// `decode` when the CPU runs it. Every ISA's int8 IDOT gives the one order's
// bits (kernels_scalar.cc; quant_test.cc "int8 IDOT: decode gives the batched
// bits, across every x86 ISA and scalar"), so a token decoded alone still gives
// the bits of the same token in a batched prefill.
struct CpuRule {
  const char* vendor;
  int family;
  Isa best;
  Isa decode;
  const char* why;
};

// None at present: on the CPUs measured, no other ISA's int8 kernel is faster
// than the best ISA's (docs/PERFORMANCE.md, "Kernels"; docs/quant.md §3.5).
constexpr std::array<CpuRule, 0> kCpuRules{};

struct Choice {
  const internal::KernelTable* table = nullptr;        // everything by default
  const internal::KernelTable* int8_decode = nullptr;  // int8 MatMulQ8 at batch 1, if not `table`
  const char* why = "";
  const char* int8_why = "";
};

// The choice without a forced ISA: the best ISA and the rules.
Choice DefaultChoice() {
  Choice c;
  const Isa best = BestIsa();
  c.table = &TableFor(best);
  c.why = "best this CPU runs";
  const CpuIdent id = ReadCpuIdent();
  for (const CpuRule& r : kCpuRules) {
    if (id.vendor == r.vendor && id.family == r.family && best == r.best &&
        IsaSupported(r.decode)) {
      c.int8_decode = &TableFor(r.decode);
      c.int8_why = r.why;
    }
  }
  return c;
}

std::string Describe(const Choice& c) {
  std::string s = std::string(IsaName(c.table->isa)) + " kernels (" + c.why + ")";
  if (c.int8_decode != nullptr) {
    s += "; int8 IDOT decode (batch 1): " + std::string(IsaName(c.int8_decode->isa)) + " (" +
         c.int8_why + ")";
  }
  return s;
}

// The installed configuration (ConfigureKernels) and the choice made from it.
// The choice is made at the first dispatch after each ConfigureKernels, under
// the mutex; dispatch reads it through one acquire load. Choices are kept (a
// kernel running on a replaced one still holds its pointer), and are few: one
// per ConfigureKernels.
struct DispatchState {
  std::mutex mu;
  KernelConfig config;      // guarded by mu
  std::deque<Choice> made;  // guarded by mu; never shrinks
  std::atomic<const Choice*> current{nullptr};
};

DispatchState& State() {
  static DispatchState s;  // function-local: usable from other statics' initialisers
  return s;
}

// The kernels' copy of the prefetch setting, read on every kernel call.
std::atomic<int64_t> g_prefetch_bytes{-1};

const Choice& CurrentChoice() {
  DispatchState& st = State();
  if (const Choice* c = st.current.load(std::memory_order_acquire)) return *c;
  std::lock_guard<std::mutex> lock(st.mu);
  if (const Choice* c = st.current.load(std::memory_order_relaxed)) return *c;
  Choice c = DefaultChoice();
  if (st.config.forced_isa) {
    c = Choice{&TableFor(*st.config.forced_isa), nullptr, "K3_FORCE_ISA", ""};
  }
  K3_LOG_INFO("quant: %s", Describe(c).c_str());
  st.made.push_back(c);
  st.current.store(&st.made.back(), std::memory_order_release);
  return st.made.back();
}

const internal::KernelTable& ActiveTable() {
  if (const internal::KernelTable* t = g_test_override.load(std::memory_order_acquire)) return *t;
  return *CurrentChoice().table;
}

const internal::KernelTable& Q8Table(WeightFormat format, size_t batch) {
  if (const internal::KernelTable* t = g_test_override.load(std::memory_order_acquire)) return *t;
  const Choice& c = CurrentChoice();
  if (format == WeightFormat::kInt8 && batch == 1 && c.int8_decode != nullptr) {
    return *c.int8_decode;
  }
  return *c.table;
}

}  // namespace

void ConfigureKernels(const KernelConfig& config) {
  if (config.forced_isa && !IsaSupported(*config.forced_isa)) {
    throw Error(ErrorCode::kUnsupported, std::string("forced ISA ") + IsaName(*config.forced_isa) +
                                             " but this CPU (or OS) cannot run it; best is " +
                                             IsaName(BestIsa()));
  }
  if (config.prefetch_bytes < -1 || config.prefetch_bytes > kMaxPrefetchBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "prefetch distance must be -1 (the kernels' defaults) or 0 to " +
                    std::to_string(kMaxPrefetchBytes) + " bytes, not " +
                    std::to_string(config.prefetch_bytes));
  }
  DispatchState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  st.config = config;
  g_prefetch_bytes.store(config.prefetch_bytes, std::memory_order_relaxed);
  st.current.store(nullptr, std::memory_order_release);  // the next dispatch chooses again
}

KernelConfig CurrentKernelConfig() {
  DispatchState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.config;
}

std::optional<Isa> ParseIsaName(std::string_view name) {
  for (Isa i : kAllIsas) {
    if (name == IsaName(i)) return i;
  }
  return std::nullopt;
}

Isa BestIsa() {
  Isa best = Isa::kScalar;
  for (Isa i : kAllIsas) {
    if (IsaSupported(i)) best = i;
  }
  return best;
}

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

Isa ActiveIsa() { return ActiveTable().isa; }

Isa Q8Isa(WeightFormat format, size_t batch) { return Q8Table(format, batch).isa; }

std::string DispatchDetail() {
  std::string s = Describe(DefaultChoice());
  if (const std::optional<Isa> forced = CurrentKernelConfig().forced_isa) {
    return s + "; K3_FORCE_ISA=" + IsaName(*forced) + " forces one ISA for everything";
  }
  return s + "; K3_FORCE_ISA overrides";
}

void SetIsaForTesting(Isa isa) {
  if (!IsaSupported(isa)) {
    throw Error(ErrorCode::kUnsupported, std::string("ISA ") + IsaName(isa) + " not supported");
  }
  g_test_override.store(&TableFor(isa), std::memory_order_release);
}

void ResetIsaForTesting() { g_test_override.store(nullptr, std::memory_order_release); }

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

// No longer able to fail: ConfigureKernels validated the forced ISA.
const KernelTable& ActiveKernels() noexcept { return ActiveTable(); }

const KernelTable& Q8Kernels(WeightFormat format, size_t batch) noexcept {
  return Q8Table(format, batch);
}

size_t PrefetchBytes(size_t default_bytes) noexcept {
  const int64_t forced = g_prefetch_bytes.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<size_t>(forced) : default_bytes;
}

}  // namespace internal
}  // namespace k3::quant
