// Placement: deterministic, every MoE layer balanced, shares proportional to
// capacity; a rank's share of a container: ranges, the hole check, and the
// sparse copy PrepareShareOrThrow writes.
#include "k3/cluster/placement.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "k3/cluster/cluster.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/fixture/spec.h"
#include "k3/fixture/writer.h"

using namespace k3;
using namespace k3::cluster;

namespace {

ModelConfig Shape(int64_t layers, int64_t experts) {
  fixture::Preset p = fixture::PresetOrThrow("tiny");
  fixture::OverrideDims(p, layers, experts);
  return fixture::ToModelConfig(p.dims);
}

}  // namespace

TEST_CASE("placement: one owner per routed (layer, expert), dense layers none, deterministic") {
  const ModelConfig c = Shape(8, 16);
  const Placement a = Placement::Compute(c, {1, 2}, {{}, {}});
  const Placement b = Placement::Compute(c, {1, 2}, {{}, {}});
  CHECK(a.fingerprint() == b.fingerprint());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      CHECK(a.owner(l, e) == b.owner(l, e));
      if (c.is_moe(l)) {
        CHECK((a.owner(l, e) == 1 || a.owner(l, e) == 2));
      } else {
        CHECK(a.owner(l, e) == -1);
      }
    }
  }
  // Other owners or capacities: another table and fingerprint.
  CHECK(Placement::Compute(c, {0, 1, 2}, {{}, {}, {}}).fingerprint() != a.fingerprint());
  CHECK(Placement::Compute(c, {1, 2}, {{4, 0}, {1, 0}}).fingerprint() != a.fingerprint());
  CHECK_THROWS_AS(Placement::Compute(c, {}, {}), Error);
  CHECK_THROWS_AS(Placement::Compute(c, {1, 2}, {{}}), Error);
}

TEST_CASE("placement: every layer balanced over the owners, the spare experts rotated") {
  for (auto [layers, experts, ranks] :
       {std::tuple{8, 16, 3}, {12, 64, 2}, {6, 7, 4}, {93, 896, 7}}) {
    const ModelConfig c = Shape(layers, experts);
    std::vector<int> owners;
    for (int r = 1; r <= ranks; ++r) owners.push_back(r);
    const Placement p = Placement::Compute(c, owners, std::vector<Capacity>(owners.size()));
    std::map<int, int64_t> total;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (!c.is_moe(l)) continue;
      for (int r : owners) {
        const int64_t n = p.CountOwned(r, l);
        CHECK(n >= experts / ranks);
        CHECK(n <= (experts + ranks - 1) / ranks);
        total[r] += n;
      }
    }
    // Over the layers the uneven remainders even out to within one layer's spare.
    int64_t lo = INT64_MAX, hi = 0;
    for (auto& [r, n] : total) {
      lo = std::min(lo, n);
      hi = std::max(hi, n);
    }
    CAPTURE(layers);
    CAPTURE(experts);
    CHECK(hi - lo <= 1);
  }
}

TEST_CASE("placement: shares proportional to capacity (RAM + 10 s of disk)") {
  const ModelConfig c = Shape(8, 64);
  // 3:1 by RAM; disk rate counts 10 s: 1 GB/s = 10 GB of RAM.
  const Placement p = Placement::Compute(c, {1, 2}, {{30'000'000'000, 0}, {0, 1'000'000'000}});
  for (int64_t l = 1; l < c.num_hidden_layers; ++l) {
    CHECK(p.CountOwned(1, l) == 48);
    CHECK(p.CountOwned(2, l) == 16);
  }
  // A rank offering nothing next to ones that do gets nothing.
  const Placement q = Placement::Compute(c, {1, 2, 3}, {{1000, 0}, {0, 0}, {1000, 0}});
  CHECK(q.CountOwned(2) == 0);
  CHECK(q.CountOwned(1) + q.CountOwned(3) == 64 * 7);
  // Experts of a rank are spread over the ids (hashed deal), not one block.
  const Placement eq = Placement::Compute(c, {1, 2}, {{}, {}});
  int switches = 0;
  for (int64_t e = 1; e < 64; ++e) switches += eq.owner(3, e) != eq.owner(3, e - 1);
  CHECK(switches > 16);
}

TEST_CASE("share: ranges, the hole check and the sparse copy of a rank's share") {
  const std::string dir = "/tmp/k3_cluster_share_" + std::to_string(::getpid());
  fixture::Preset preset = fixture::PresetOrThrow("tiny");
  fixture::WriteFixtureOrThrow(preset, dir + "/full", {});
  const Snapshot snap = Snapshot::OpenOrThrow(dir + "/full");
  const ModelConfig c = ModelConfig::ParseOrThrow(snap.config_json(), "config.json");
  const model::ExpertTable table(snap, c);
  const Placement p = Placement::Compute(c, {1, 2}, {{}, {}});
  uint64_t bytes = 0;
  for (int r : {1, 2}) {
    CHECK(CheckShare(table, p, r).empty());
    for (const ShareRange& s : ShareRanges(table, p, r)) bytes += s.length;
  }
  CHECK(bytes == table.slot_bytes() * static_cast<uint64_t>(c.num_moe_layers() * c.num_experts));

  PrepareShareOrThrow(dir + "/full", p, 1, dir + "/r1");
  const Snapshot s1 = Snapshot::OpenOrThrow(dir + "/r1");
  CHECK(ModelFingerprint(s1) == ModelFingerprint(snap));
  const model::ExpertTable t1(s1, c);
  CHECK(CheckShare(t1, p, 1).empty());
  // The other rank's experts are holes in rank 1's copy (when the file
  // system has holes; tmpfs and ext4 do).
  const std::string other = CheckShare(t1, p, 2);
  MESSAGE("rank 2 on rank 1's share: " << other);
  CHECK(other.find("hole") != std::string::npos);
  // Rank 1's bytes are the source's.
  std::vector<std::byte> a(table.slot_bytes()), b(table.slot_bytes());
  for (int64_t e = 0; e < c.num_experts; ++e) {
    if (p.owner(5, e) != 1) continue;
    table.ReadSlotOrThrow(5, e, a);
    t1.ReadSlotOrThrow(5, e, b);
    CHECK(a == b);
  }
  std::system(("rm -rf " + dir).c_str());
}
