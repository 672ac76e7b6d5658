// The kernel ISA as --version reports it, without choosing (or logging) the
// dispatch: the best this CPU runs, and the override if K3_FORCE_ISA names one.
#pragma once

#include <string>

#include "k3/quant/isa.h"

namespace k3::quant {

// "kernels: avx512 (best this CPU runs)".
inline std::string KernelsVersionDetail() {
  Isa best = Isa::kScalar;
  for (Isa i : kAllIsas) {
    if (IsaSupported(i)) best = i;
  }
  return std::string("kernels: ") + IsaName(best) + " (best this CPU runs; K3_FORCE_ISA overrides)";
}

}  // namespace k3::quant
