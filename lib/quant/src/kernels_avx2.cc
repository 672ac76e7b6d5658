// AVX2 + FMA kernels (placeholder: the scalar table until the SIMD code lands).
#include "kernels.h"

namespace k3::quant::internal {
const KernelTable& Avx2Kernels() noexcept { return ScalarKernels(); }
}  // namespace k3::quant::internal
