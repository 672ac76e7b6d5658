// Run-time ISA selection for the kernels: chosen at first use from CPUID (x86-64)
// or getauxval(AT_HWCAP) (aarch64), overridable through KernelConfig (which the
// tools fill from K3_FORCE_ISA=scalar|avx2|avx2vnni|avx512|neon|neondot and
// K3_PREFETCH at start-up: lib/toolenv; this library reads no environment),
// logged once per choice. Preference on x86-64: avx512 (F/BW/VL + VNNI) >
// avx2vnni (AVX2 + AVX-VNNI, e.g. Alder Lake and later client cores) > avx2 >
// scalar; on aarch64: neondot (ASIMD + the dot-product extension, sdot/udot) >
// neon (baseline armv8-a ASIMD) > scalar. The other architecture's ISAs are
// never supported (their kernels are not even compiled there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace k3::quant {

enum class WeightFormat : uint8_t;  // quant.h

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx2Vnni = 3, kNeon = 4, kNeonDot = 5 };
// Every ISA, in order of preference from lowest within each architecture; loop
// over this, not a hand list.
inline constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni,
                                   Isa::kAvx512, Isa::kNeon, Isa::kNeonDot};

// How the kernels are configured. The library never reads the environment:
// each program's main fills this (k3::toolenv::KernelConfigFromEnv, from
// K3_FORCE_ISA, K3_PREFETCH; docs/environment.md) and calls
// ConfigureKernels once at start-up. A program that never configures gets the
// defaults below, deterministically.
struct KernelConfig {
  // One kernel table for everything (no per-CPU rules); nullopt = the best
  // this CPU runs plus the rules.
  std::optional<Isa> forced_isa;
  // Software prefetch distance of the decode kernels, for all of them; -1 = each
  // kernel's own default (kernels.h, kernels_avx512.cc). 0 to 1 MiB.
  int64_t prefetch_bytes = -1;
};
inline constexpr int64_t kMaxPrefetchBytes = int64_t{1} << 20;

// Validates and installs `config`: a forced ISA this CPU cannot run is
// kUnsupported, a prefetch outside [-1, kMaxPrefetchBytes] kInvalidArgument
// (nothing is changed then). Allowed at any time, also after kernels ran: it is
// applied to every kernel call that starts afterwards (one already running
// finishes on the table it started with), and the next dispatch chooses and
// logs again. Thread-safe. A SetIsaForTesting override still takes precedence.
void ConfigureKernels(const KernelConfig& config);
// What ConfigureKernels installed last (the defaults if never called).
KernelConfig CurrentKernelConfig();
// An ISA by its IsaName ("avx512"); nullopt for anything else.
std::optional<Isa> ParseIsaName(std::string_view name);
// The best ISA this CPU runs (kAllIsas order).
Isa BestIsa();

Isa ActiveIsa();                 // the ISA the dispatched kernels use
// The ISA whose kernel MatMulQ8 runs for `format` weights at `batch` activation
// rows: ActiveIsa(), except where a measured per-CPU rule (isa.cc) takes one
// kernel from another ISA with identical bits (none at present; see isa.cc).
// A forced ISA (KernelConfig, K3_FORCE_ISA) and SetIsaForTesting force one ISA for all.
Isa Q8Isa(WeightFormat format, size_t batch);
// The start-up choice in words, without choosing or logging (for --version and
// `k3-run info`): "avx512 kernels (best this CPU runs); int8 IDOT decode ...",
// and what the configured forced ISA (K3_FORCE_ISA) does.
std::string DispatchDetail();
bool IsaSupported(Isa isa);      // what this CPU can run
const char* IsaName(Isa isa);
// Tests: switch the dispatch (must be supported). Not thread-safe w.r.t. running kernels.
void SetIsaForTesting(Isa isa);
// Tests and benchmarks: back to the start-up choice (per-CPU rules included).
void ResetIsaForTesting();
// Decode (batch 1) rows of the f32-activation path that share each activation
// load: 1, 2 or 4 (results do not depend on it), 0 = the built-in choice (by
// row width, see kernels.h). Tests and benchmarks (same-run A/B); not
// thread-safe w.r.t. running kernels.
void SetDecodeRowsForTesting(int rows);

}  // namespace k3::quant
