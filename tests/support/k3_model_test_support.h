// Model-option helpers shared by the suites that run the forward pass against
// the oracle (golden, checkpoint): explicit bits per class and run choices.
#pragma once

#include "k3/model/model.h"
#include "k3/model/weights.h"

namespace k3::test {

// Load options with every class's bits set explicitly and progress lines off.
inline model::LoadOptions Bits(int bits, int mla, int head) {
  model::LoadOptions o;
  o.bits = bits;
  o.mla_bits = mla;
  o.head_bits = head;
  o.bits_explicit = true;
  o.progress = false;
  return o;
}

inline model::RunOptions Run(bool idot, int chunk) {
  model::RunOptions r;
  r.idot = idot;
  r.chunk = chunk;
  return r;
}

}  // namespace k3::test
