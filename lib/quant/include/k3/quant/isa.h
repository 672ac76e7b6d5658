// Run-time ISA selection for the kernels: chosen once from CPUID (x86-64) or
// getauxval(AT_HWCAP) (aarch64), overridable with
// K3_FORCE_ISA=scalar|avx2|avx2vnni|avx512|neon|neondot (an ISA this CPU cannot
// run is an error), logged once. Preference on x86-64: avx512 (F/BW/VL + VNNI) >
// avx2vnni (AVX2 + AVX-VNNI, e.g. Alder Lake and later client cores) > avx2 >
// scalar; on aarch64: neondot (ASIMD + the dot-product extension, sdot/udot) >
// neon (baseline armv8-a ASIMD) > scalar. The other architecture's ISAs are
// never supported (their kernels are not even compiled there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace k3::quant {

enum class WeightFormat : uint8_t;  // quant.h

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx2Vnni = 3, kNeon = 4, kNeonDot = 5 };
// Every ISA, in order of preference from lowest within each architecture; loop
// over this, not a hand list.
inline constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx2Vnni,
                                   Isa::kAvx512, Isa::kNeon, Isa::kNeonDot};

Isa ActiveIsa();                 // the ISA the dispatched kernels use
// The ISA whose kernel MatMulQ8 runs for `format` weights at `batch` activation
// rows: ActiveIsa(), except where a measured per-CPU rule (isa.cc) takes one
// kernel from another ISA with identical bits (none at present; see isa.cc).
// K3_FORCE_ISA and SetIsaForTesting force one ISA for all.
Isa Q8Isa(WeightFormat format, size_t batch);
// The start-up choice in words, without choosing or logging (for --version and
// `k3-run info`): "avx512 kernels (best this CPU runs); int8 IDOT decode ...",
// and what K3_FORCE_ISA does.
std::string DispatchDetail();
bool IsaSupported(Isa isa);      // what this CPU can run
// K3_FORCE_ISA checked (a name this CPU runs, else k3::Error) without choosing
// the kernels or logging: for a tool's start-up check, before its flags (e.g.
// --quiet) are applied. nullopt when unset.
std::optional<Isa> ForcedIsaOrThrow();
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
