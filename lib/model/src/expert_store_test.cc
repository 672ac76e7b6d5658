// ExpertTable / SimpleExpertStore on the oracle fixture: the slot holds exactly
// the six tensors' bytes, DiskOrder reproduces the shard's (shuffled) on-disk
// expert order, the LRU counts hits and misses as documented.
#include "k3/model/expert_store.h"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "k3/container/snapshot.h"
#include "k3/core/file.h"
#include "k3/model/config.h"

using namespace k3;
using namespace k3::model;

namespace {
const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle";
const std::string kTiny = kOracle + "/k3-tiny";
}  // namespace

TEST_CASE("slots hold the six expert tensors byte for byte") {
  Snapshot snap = Snapshot::OpenOrThrow(kTiny);
  ModelConfig c = ModelConfig::ParseOrThrow(snap.config_json(), "config.json");
  ExpertTable table(snap, c);
  CHECK(table.slot_bytes() == ExpertTable::SlotBytesFor(c));
  std::vector<std::byte> slot(table.slot_bytes());
  for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l) {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      CHECK(table.present(l, e));
      CHECK(table.contiguous(l, e));
      CHECK(table.ReadSlotOrThrow(l, e, slot) == table.slot_bytes());
      for (int p = 0; p < kExpertParts; ++p) {
        auto part = static_cast<ExpertPart>(p);
        TensorRef r = snap.FindOrThrow(table.TensorName(l, e, part));
        std::vector<std::byte> direct(r.info->nbytes());
        r.file->ReadOrThrow(*r.info, direct);
        CHECK(std::memcmp(direct.data(), slot.data() + table.part_offset_in_slot(part),
                          direct.size()) == 0);
      }
      ExpertView v = table.ViewOfSlot(slot.data());
      CHECK(v.w1.rows == static_cast<size_t>(c.moe_intermediate_size));
      CHECK(v.w1.cols == static_cast<size_t>(c.routed_expert_hidden_size));
      CHECK(v.w2.rows == static_cast<size_t>(c.routed_expert_hidden_size));
      CHECK(v.w2.cols == static_cast<size_t>(c.moe_intermediate_size));
      CHECK(v.w3.format == quant::WeightFormat::kMxfp4);
    }
  }
}

TEST_CASE("DiskOrder sorts a layer's experts into the shard's on-disk order") {
  Snapshot snap = Snapshot::OpenOrThrow(kTiny);
  ModelConfig c = ModelConfig::ParseOrThrow(snap.config_json(), "config.json");
  SimpleExpertStore store(snap, c);
  std::string text = ReadFileOrThrow(kOracle + "/k3-tiny.golden/golden.json", 1 << 22);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(text).get(doc) == simdjson::SUCCESS);
  for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l) {
    std::vector<int32_t> ids(static_cast<size_t>(c.num_experts));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    std::sort(ids.begin(), ids.end(),
              [&](int32_t a, int32_t b) { return store.DiskOrder(l, a) < store.DiskOrder(l, b); });
    simdjson::dom::array want;
    REQUIRE(doc["shard_expert_order"][std::to_string(l)].get_array().get(want) ==
            simdjson::SUCCESS);
    std::vector<int32_t> w;
    for (auto v : want) w.push_back(static_cast<int32_t>(int64_t(v.get_int64().value_unsafe())));
    CHECK(ids == w);
  }
}

TEST_CASE("SimpleExpertStore: per-layer LRU hits, misses and bytes") {
  Snapshot snap = Snapshot::OpenOrThrow(kTiny);
  ModelConfig c = ModelConfig::ParseOrThrow(snap.config_json(), "config.json");
  SimpleExpertStore store(snap, c, {.slots_per_layer = 2});
  const uint64_t slot = store.table().slot_bytes();
  auto use = [&](int64_t layer, int32_t e) {
    store.BeginLayer(layer, std::span<const int32_t>(&e, 1));
    ExpertView v = store.Acquire(layer, e);
    CHECK(v.w1.data != nullptr);
    store.Release(layer, e);
    store.EndLayer(layer);
  };
  use(1, 0);  // miss
  use(1, 1);  // miss
  use(1, 0);  // hit
  use(1, 2);  // miss, evicts 1 (least recently used)
  use(1, 1);  // miss
  use(2, 0);  // miss: layers have their own caches
  use(1, 2);  // hit
  ExpertStoreStats s = store.stats();
  CHECK(s.hits == 2);
  CHECK(s.misses == 5);
  CHECK(s.bytes_read == 5 * slot);
  CHECK(s.hit_rate() == doctest::Approx(2.0 / 7.0));
  // (1,0), (1,1), (1,2), (2,0): a re-read of (1,1) is a miss, not a new expert.
  CHECK(s.distinct_routed == 4);

  // Holding more experts than slots at once still works (temporary extra slots).
  std::vector<int32_t> all = {3, 4, 5, 6};
  store.BeginLayer(3, all);
  std::vector<const void*> data;
  for (int32_t e : all) data.push_back(store.Acquire(3, e).w1.data);
  std::sort(data.begin(), data.end());
  CHECK(std::unique(data.begin(), data.end()) == data.end());  // distinct buffers
  for (int32_t e : all) store.Release(3, e);
  store.EndLayer(3);
  CHECK(store.stats().distinct_routed == 8);
}
