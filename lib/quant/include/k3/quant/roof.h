// Peak-throughput loops of the instruction each matrix path is bound by, so that
// a benchmark can measure the machine's compute roof in the same run as the
// kernels it rates against it (k3-bench kernels, k3-bench prefill).
#pragma once

#include <cstdint>

namespace k3::quant {

enum class RoofOp : uint8_t {
  // The IDOT path's int8 dot: vpdpbusd (avx512 zmm, avx2vnni ymm), the
  // maddubs + madd + add sequence (avx2), sdot (neondot), smull + sadalp (neon),
  // an int32 multiply-add (scalar).
  kIdot = 0,
  // The f32 path's multiply-add: vfmadd (avx512 zmm, avx2 ymm), fmla (neon), a
  // separate multiply and add (scalar; lib/quant builds with -ffp-contract=off).
  kFma = 1,
};

// Runs `iters` iterations of the active ISA's peak loop for `op` on the calling
// thread (independent accumulator chains, enough to cover the instruction's
// latency; operands in registers) and returns the multiply-adds it did: int8
// products for kIdot, f32 lanes for kFma. Call it from every thread of a
// parallel region for the all-thread roof. Thread-safe, noexcept, allocates
// nothing.
uint64_t RoofLoop(RoofOp op, uint64_t iters) noexcept;

}  // namespace k3::quant
