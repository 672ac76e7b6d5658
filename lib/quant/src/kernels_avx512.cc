// AVX-512 (F/BW/VL/VNNI) kernels (placeholder: the scalar table until the SIMD code lands).
#include "kernels.h"

namespace k3::quant::internal {
const KernelTable& Avx512Kernels() noexcept { return ScalarKernels(); }
}  // namespace k3::quant::internal
