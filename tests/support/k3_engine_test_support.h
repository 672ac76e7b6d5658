// Request helpers shared by the suites that drive k3::engine::Engine on the
// oracle's tiny model (engine_test, ckpt_engine_test).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "k3/engine/engine.h"

namespace k3::test {

// A greedy (temperature 0) request for `n` tokens after `prompt`.
inline engine::GenerateRequest Greedy(std::vector<int32_t> prompt, int64_t n) {
  engine::GenerateRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = n;
  r.sampling.temperature = 0;
  return r;
}

}  // namespace k3::test
