// Run-time ISA selection for the kernels: chosen once from CPUID, overridable
// with K3_FORCE_ISA=scalar|avx2|avx512 (an unavailable ISA is an error), logged once.
#pragma once

namespace k3::quant {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

Isa ActiveIsa();                 // the ISA the dispatched kernels use
bool IsaSupported(Isa isa);      // what this CPU can run
const char* IsaName(Isa isa);
// Tests: switch the dispatch (must be supported). Not thread-safe w.r.t. running kernels.
void SetIsaForTesting(Isa isa);

}  // namespace k3::quant
