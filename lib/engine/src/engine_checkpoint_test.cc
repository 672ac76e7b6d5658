// Checkpoints wired into Engine::Generate: alternating
// conversations get tail-only prefills (usage.cached_tokens says how much was
// reused), a retry of the same prompt restores its last-id checkpoint, a
// prefill cancelled midway resumes from its K-token checkpoint; every answer
// equals the one of an engine with checkpoints off (whose own tokens equal
// Moonshot's reference in engine_test).
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "k3/engine/engine.h"
#include "k3_engine_test_support.h"

using namespace k3;
using namespace k3::engine;
using k3::test::Greedy;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";

EngineOptions Options(int64_t slots, int64_t every) {
  EngineOptions o;
  o.model_dir = kTiny;
  o.progress = false;
  o.load.expert_cache_bytes = 0;
  o.load.bits = 4;
  o.load.bits_explicit = true;
  o.run.chunk = 8;
  o.checkpoints.ram_slots = slots;
  o.checkpoint_every = every;
  return o;
}

std::vector<int32_t> Ids(int conv, int turn, size_t n) {
  std::vector<int32_t> v;
  for (size_t i = 0; i < n; ++i) v.push_back(static_cast<int32_t>((conv * 577 + turn * 89 + i * 37) % 2000));
  return v;
}

}  // namespace

TEST_CASE("engine: alternating conversations and retries are tail-only prefills, same answers") {
  auto on = Engine::LoadOrThrow(Options(6, 16));
  auto off = Engine::LoadOrThrow(Options(0, 16));
  CHECK(on->checkpoint_stats().saves == 0);
  std::vector<int32_t> hist[2];
  for (int turn = 0; turn < 3; ++turn) {
    for (int c = 0; c < 2; ++c) {
      INFO("turn " << turn << " conversation " << c);
      std::vector<int32_t> prompt = hist[c];
      if (prompt.empty()) prompt.push_back(2048);
      const std::vector<int32_t> add = Ids(c, turn, 11);
      prompt.insert(prompt.end(), add.begin(), add.end());
      GenerateResult a = on->Generate(Greedy(prompt, 4));
      GenerateResult b = off->Generate(Greedy(prompt, 4));
      CHECK(a.ids == b.ids);
      if (turn == 0) {
        CHECK(a.usage.cached_tokens == 0);
      } else {
        // The turn-end checkpoint holds the prompt and all generated ids but
        // the last (sampled, never fed).
        CHECK(a.usage.cached_tokens == static_cast<int64_t>(hist[c].size()) - 1);
        CHECK(b.usage.cached_tokens == 0);  // the other conversation was in between
      }
      hist[c] = prompt;
      hist[c].insert(hist[c].end(), a.ids.begin(), a.ids.end());
      // A retry of the same prompt (another conversation in between would
      // make no difference): restored up to the prompt's last id.
      GenerateResult again = on->Generate(Greedy(prompt, 4));
      CHECK(again.ids == a.ids);
      CHECK(again.usage.cached_tokens == static_cast<int64_t>(prompt.size()) - 1);
    }
  }
  const CheckpointCacheStats s = on->checkpoint_stats();
  CHECK(s.hits >= 10);
  CHECK(s.ram_checkpoints <= 6);
}

TEST_CASE("engine: a prefill cancelled midway resumes from the last K-token checkpoint") {
  auto on = Engine::LoadOrThrow(Options(4, 16));
  auto off = Engine::LoadOrThrow(Options(0, 16));
  std::vector<int32_t> prompt = {2048};
  const std::vector<int32_t> body = Ids(5, 0, 60);
  prompt.insert(prompt.end(), body.begin(), body.end());
  // Cancel once 40 of the 61 ids are fed: pieces end at 16 and 32 before that.
  Callbacks cb;
  cb.on_prefill_progress = [](int64_t done, int64_t) { return done < 40; };
  GenerateResult cut = on->Generate(Greedy(prompt, 4), cb);
  CHECK(cut.finish == FinishReason::kCancelled);
  CHECK(on->checkpoint_stats().saves >= 2);
  // Something else runs meanwhile, then the same request again.
  on->Generate(Greedy(Ids(6, 0, 9), 2));
  GenerateResult full = on->Generate(Greedy(prompt, 4));
  GenerateResult ref = off->Generate(Greedy(prompt, 4));
  CHECK(full.finish == FinishReason::kLength);
  CHECK(full.usage.cached_tokens == 32);
  CHECK(full.ids == ref.ids);
}

TEST_CASE("engine: checkpoint_at adds a boundary that an edited prompt restores") {
  auto on = Engine::LoadOrThrow(Options(4, 0));
  auto off = Engine::LoadOrThrow(Options(0, 0));
  std::vector<int32_t> prompt = {2048};
  const std::vector<int32_t> body = Ids(7, 0, 30);
  prompt.insert(prompt.end(), body.begin(), body.end());
  GenerateRequest r = Greedy(prompt, 3);
  r.checkpoint_at = 20;
  on->Generate(r);
  // An edit: the same first 20 ids, then others.
  std::vector<int32_t> edited(prompt.begin(), prompt.begin() + 20);
  const std::vector<int32_t> other = Ids(8, 1, 7);
  edited.insert(edited.end(), other.begin(), other.end());
  GenerateResult a = on->Generate(Greedy(edited, 4));
  GenerateResult b = off->Generate(Greedy(edited, 4));
  CHECK(a.usage.cached_tokens == 20);
  CHECK(a.ids == b.ids);
}

TEST_CASE("engine: checkpoint_stats() is safe to read from another thread while Generate runs") {
  // No K boundaries: each prompt leaves two checkpoints (before its last id,
  // the turn's end), so 6 slots hold all three conversations.
  auto on = Engine::LoadOrThrow(Options(6, 0));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reads{0}, bad{0};
  // A /metrics-like reader: every copy it gets must be one consistent state
  // (counters never go back; RAM within the slots; bytes only with checkpoints).
  std::thread reader([&] {
    CheckpointCacheStats last;
    while (!stop.load()) {
      const CheckpointCacheStats s = on->checkpoint_stats();
      if (s.saves < last.saves || s.hits < last.hits || s.misses < last.misses ||
          s.restored_tokens < last.restored_tokens || s.ram_checkpoints > 6 ||
          s.ram_checkpoints < 0 || (s.ram_checkpoints == 0) != (s.ram_bytes == 0)) {
        ++bad;
      }
      last = s;
      ++reads;
    }
  });
  int64_t expect_hits = 0;
  for (int turn = 0; turn < 6; ++turn) {
    std::vector<int32_t> prompt = {2048};
    const std::vector<int32_t> body = Ids(turn % 3, 0, 40);
    prompt.insert(prompt.end(), body.begin(), body.end());
    const GenerateResult g = on->Generate(Greedy(prompt, 3));
    if (g.usage.cached_tokens > 0) ++expect_hits;
  }
  stop = true;
  reader.join();
  CHECK(reads.load() > 0);
  CHECK(bad.load() == 0);
  const CheckpointCacheStats s = on->checkpoint_stats();
  CHECK(s.hits == expect_hits);
  CHECK(s.hits >= 3);  // the second round of the three prompts restores
  CHECK(s.ram_checkpoints == 6);
}
