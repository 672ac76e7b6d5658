// The NEON kernels built once more with the dot-product extension (armv8.2-a
// optional, armv8.4-a mandatory; AT_HWCAP's ASIMDDP): sdot in place of
// vmull_s8 + vpadalq_s16. Integer lanes are exact either way and the float
// steps are the same, so this table gives the same bits as the plain NEON one
// (and as the scalar reference; quant_test checks both).
#define K3_NEON_DOT 1
#include "kernels_neon.cc"  // NOLINT(bugprone-suspicious-include)
