// Prefill windows in the engine: the whole prompt in one window
// reads each routed expert once per layer; progress reports climb to the
// total; a cancel between layers or between experts of a window leaves an
// engine that answers as a fresh one, resuming from the checkpoints of the
// windows that finished; --ckpt-every checkpoints land inside one big window
// and resume to the same bits.
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <vector>

#include "k3/engine/engine.h"
#include "k3_engine_test_support.h"

using namespace k3;
using namespace k3::engine;
using k3::test::Greedy;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";
const std::vector<int32_t> kPrompt = {2048, 2051, 765,  1888, 786, 2053, 788,  2033, 691, 295,
                                      278,  603,  1682, 2052, 763, 2053, 2051, 2014, 428, 2053};

std::vector<int32_t> LongPrompt(int copies) {
  std::vector<int32_t> p;
  for (int i = 0; i < copies; ++i) p.insert(p.end(), kPrompt.begin(), kPrompt.end());
  return p;
}

EngineOptions Options(int chunk, int64_t ckpt_slots = 0, int64_t every = 0) {
  EngineOptions o;
  o.model_dir = kTiny;
  o.progress = false;
  o.threads = 1;
  o.load.bits = o.load.mla_bits = o.load.head_bits = 32;
  o.run.idot = false;
  o.run.chunk = chunk;
  o.prefill_budget_bytes = 1e9;  // the tiny model's prompts fit one window
  o.stream.budget_bytes = 0;     // one expert slot per layer: every pass reads its union
  o.stream.log_projection = false;
  o.checkpoints.ram_slots = ckpt_slots;
  o.checkpoint_every = every;
  return o;
}

}  // namespace

TEST_CASE("one window: each routed expert read once per layer; progress climbs to the total") {
  const std::vector<int32_t> prompt = LongPrompt(6);  // 120 tokens
  auto e = Engine::LoadOrThrow(Options(0));
  std::vector<PrefillProgress> seen;
  int64_t legacy = 0;
  Callbacks cb;
  cb.on_prefill = [&](const PrefillProgress& p) {
    seen.push_back(p);
    return true;
  };
  cb.on_prefill_progress = [&](int64_t, int64_t total) {
    CHECK(total == 120);
    ++legacy;
    return true;
  };
  GenerateResult r = e->Generate(Greedy(prompt, 1), cb);
  CHECK(r.timings.prefill_window == 120);
  CHECK(r.timings.prefill_windows == 1);
  const stream::StepStats& step = e->streaming().stream_stats().steps.at(0);
  // One pass over the distinct experts of each layer: every one a miss, read once.
  CHECK(step.misses == step.unique_experts);
  CHECK(step.hits == 0);
  CHECK(r.timings.prefill_expert_bytes == step.bytes_read);
  CHECK(r.timings.prefill_expert_bytes > 0);

  const int64_t L = e->config().num_hidden_layers;
  REQUIRE(!seen.empty());
  CHECK(legacy == L);  // on_prefill_progress: once per layer of the one window
  int64_t units = 0;
  bool inside_experts = false;
  for (const PrefillProgress& p : seen) {
    CHECK(p.prompt_tokens == 120);
    CHECK(p.cached_tokens == 0);
    CHECK(p.total == 120);
    CHECK(p.layers == L);
    CHECK(p.units_total == 120 * L);
    CHECK(p.window_tokens == 120);
    CHECK(p.units_done >= units);
    CHECK(p.units_done < p.units_total);
    CHECK(p.expert_bytes_read <= r.timings.prefill_expert_bytes);
    units = p.units_done;
    if (p.units_done % 120 != 0) inside_experts = true;
  }
  CHECK(inside_experts);  // polls between experts move the units inside a layer
  CHECK(seen.back().units_done >= 120 * (L - 1));

  // The same prompt in windows of 8 reads more (each window its own union).
  auto chunked = Engine::LoadOrThrow(Options(8));
  GenerateResult c = chunked->Generate(Greedy(prompt, 1));
  CHECK(c.timings.prefill_windows == 15);
  CHECK(c.timings.prefill_expert_bytes > r.timings.prefill_expert_bytes);
  CHECK(c.ids == r.ids);
}

TEST_CASE(
    "cancel inside a window (between layers, between experts) resumes from finished windows") {
  const std::vector<int32_t> prompt = LongPrompt(6);  // 120 tokens
  auto ref = Engine::LoadOrThrow(Options(0));
  const std::vector<int32_t> expected = ref->Generate(Greedy(prompt, 5)).ids;

  struct Stop {
    int64_t window_begin;  // in the second window of 40 ...
    int64_t layer;         // ... at this layer
    bool between_experts;  // ... between its experts (else before the layer)
  };
  for (const Stop& stop :
       {Stop{40, 0, false}, Stop{40, 3, false}, Stop{40, 1, true}, Stop{80, 7, true}}) {
    CAPTURE(stop.window_begin);
    CAPTURE(stop.layer);
    CAPTURE(stop.between_experts);
    // Windows of 40; checkpoints every 16 land inside them (16, 32 | 48, 64 | ...).
    auto e = Engine::LoadOrThrow(Options(40, 16, 16));
    Callbacks cb;
    cb.on_prefill = [&](const PrefillProgress& p) {
      const int64_t in_window = p.units_done - p.done * p.layers;  // this window's token-layers
      const int64_t layer = in_window / p.window_tokens;
      const bool mid_layer = in_window % p.window_tokens != 0;  // between experts
      return !(p.done == stop.window_begin && layer == stop.layer &&
               mid_layer == stop.between_experts);
    };
    GenerateResult c = e->Generate(Greedy(prompt, 5), cb);
    CHECK(c.finish == FinishReason::kCancelled);
    CHECK(c.ids.empty());
    const std::vector<int32_t>& held = e->session_ids();
    // Stopped before a window's first layer: the finished windows stay; else reset.
    const bool kept = stop.layer == 0 && !stop.between_experts;
    CHECK(held.size() == (kept ? static_cast<size_t>(stop.window_begin) : 0u));
    // The follow-up resumes from the deepest checkpoint of a finished window
    // (every 16: the last one before the window that was cancelled).
    GenerateResult after = e->Generate(Greedy(prompt, 5));
    CHECK(after.ids == expected);
    const int64_t deepest = kept ? stop.window_begin : stop.window_begin / 16 * 16;
    CHECK(after.usage.cached_tokens == deepest);
  }
}

TEST_CASE("checkpoints every N land inside one big window and resume to the same bits") {
  const std::vector<int32_t> prompt = LongPrompt(6);  // 120 tokens
  auto e = Engine::LoadOrThrow(Options(0, 16, 16));
  GenerateResult first = e->Generate(Greedy(prompt, 3));
  CHECK(first.timings.prefill_windows == 1);
  // 16, 32, ..., 112, the retry point 119, and the turn's end.
  CHECK(e->checkpoint_stats().saves == 7 + 1 + 1);

  // A prompt that shares the first 100 ids: resumes from 96 (captured inside
  // the window), and answers as an engine that never checkpointed.
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 100);
  other.insert(other.end(), kPrompt.begin(), kPrompt.begin() + 10);
  e->ResetSession();
  GenerateResult resumed = e->Generate(Greedy(other, 5));
  CHECK(resumed.usage.cached_tokens == 96);
  auto fresh = Engine::LoadOrThrow(Options(0));
  CHECK(resumed.ids == fresh->Generate(Greedy(other, 5)).ids);
  // The retry point: the same prompt again, from 119 after a reset.
  e->ResetSession();
  GenerateResult retry = e->Generate(Greedy(prompt, 3));
  CHECK(retry.usage.cached_tokens == 119);
  CHECK(retry.ids == first.ids);
}
