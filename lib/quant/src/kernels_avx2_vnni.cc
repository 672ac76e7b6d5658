// The AVX2 kernels built once more with AVX-VNNI (VEX vpdpbusd on ymm, Alder
// Lake / Sapphire Rapids and later, Zen 5): the IDOT dots use vpdpbusd in place
// of maddubs + madd. Integer lanes are exact either way, so this table gives the
// same bits as the plain AVX2 one (quant_test checks it).
#define K3_AVXVNNI 1
#include "kernels_avx2.cc"  // NOLINT(bugprone-suspicious-include)
