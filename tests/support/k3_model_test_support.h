// Model-option helpers shared by the suites that run the forward pass against
// the oracle (golden, checkpoint): explicit bits per class and run choices.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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

struct GreedyRun {
  std::vector<float> logits;  // [T][V]
  std::vector<int32_t> greedy;
};

// The prompt's logits at every position, then `ngen` greedy tokens, on a
// fresh session of `m` with `ro`.
inline GreedyRun RunGreedy(model::Model& m, const model::RunOptions& ro,
                           const std::vector<int32_t>& prompt, int ngen) {
  const size_t V = static_cast<size_t>(m.config().vocab_size);
  GreedyRun r;
  r.logits.resize(prompt.size() * V);
  std::vector<float> last(V);
  model::Session s(m, ro, static_cast<int64_t>(prompt.size()) + ngen);
  model::ForwardOutputs out;
  out.logits_all = r.logits.data();
  out.logits_last = last.data();
  s.Forward(prompt, out);
  for (int i = 0; i < ngen; ++i) {
    const int32_t id = model::Sampler::Argmax(last);
    r.greedy.push_back(id);
    if (i + 1 == ngen) break;
    model::ForwardOutputs o2;
    o2.logits_last = last.data();
    s.Forward(std::span<const int32_t>(&id, 1), o2);
  }
  return r;
}

}  // namespace k3::test
