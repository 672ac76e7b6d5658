// What lib/model's window and step tests share: the oracle's tiny model, the
// fixture "tiny" preset with its experts shuffled on disk (so disk order is
// not id order and the combine must hold outputs), load options per weight
// bits, random ids, and an executor that delivers pairs in a scrambled order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "k3/fixture/spec.h"
#include "k3/fixture/writer.h"
#include "k3/model/expert_executor.h"
#include "k3/model/model.h"
#include "k3_test_support.h"

namespace k3::test {

inline const std::string kTinyModel = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";

inline std::vector<int32_t> RandomIds(size_t n, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = d(rng);
  return ids;
}
inline std::vector<int32_t> RandomIds(size_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return RandomIds(n, vocab, rng);
}

// The fixture's "tiny" preset in a temporary directory, written once per
// process and removed at exit.
inline const std::string& ShuffledTinyFixture() {
  struct Dir {
    std::string path;
    Dir() : path(MakeTempDir("k3tiny")) {
      fixture::WriteOptions wo;
      wo.threads = 1;
      fixture::WriteFixtureOrThrow(fixture::PresetOrThrow("tiny"), path, wo);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir d;
  return d.path;
}

// One load thread, `bits` for every quantized matrix, a 1 GB expert cache.
inline model::LoadOptions TinyLoad(int bits) {
  model::LoadOptions lo;
  lo.progress = false;
  lo.threads = 1;
  lo.bits = lo.mla_bits = lo.head_bits = bits;
  lo.expert_cache_bytes = 1e9;
  return lo;
}

// Computes a batch with the CPU executor, then delivers its pairs in a
// scrambled order (kAnyOrder).
class ScramblingExecutor final : public model::ExpertExecutor {
 public:
  explicit ScramblingExecutor(const ModelConfig& c, uint64_t seed = 7) : cpu_(c), rng_(seed) {}
  void Run(const model::ExpertBatch& b, model::ExpertStore& store) override {
    std::vector<float> rows(b.num_tokens * b.top_k * b.latent_dim);
    model::ExpertBatch own = b;
    own.sink = nullptr;
    own.out = rows.data();
    cpu_.Run(own, store);
    std::vector<uint32_t> pairs;
    for (int32_t e : b.experts) {
      for (uint32_t p : (*b.users)[static_cast<size_t>(e)]) pairs.push_back(p);
    }
    std::shuffle(pairs.begin(), pairs.end(), rng_);
    for (uint32_t p : pairs) b.Emit(p, rows.data() + static_cast<size_t>(p) * b.latent_dim);
  }
  model::PairOrder pair_order() const override { return model::PairOrder::kAnyOrder; }

 private:
  model::CpuExpertExecutor cpu_;
  std::mt19937_64 rng_;
};

}  // namespace k3::test
