// The kernel ISA as --version reports it, without choosing (or logging) the
// dispatch: the best this CPU runs, the per-CPU rules, and the override if the
// configuration forces one (K3_FORCE_ISA, applied by the tool before --version).
#pragma once

#include <string>

#include "k3/quant/isa.h"

namespace k3::quant {

// "kernels: avx512 kernels (best this CPU runs); int8 IDOT decode (batch 1):
// avx2vnni (...); K3_FORCE_ISA overrides".
inline std::string KernelsVersionDetail() {
  return "kernels: " + DispatchDetail();
}

}  // namespace k3::quant
