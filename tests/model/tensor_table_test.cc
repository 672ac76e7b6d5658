// One K3 tensor table (lib/model/tensor_table.h): the fixture generator writes
// exactly its entries, the weight loader reads exactly its entries, and a
// change of the table (here: of the config it is a function of) is seen by
// both. Runs several configs, not only the shared fixture's: the tiny preset,
// fewer layers and experts, no shared experts, a dense prefix of two layers,
// a conv kernel of 3 and a KDA head_dim that is not the MLA one.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "k3/container/snapshot.h"
#include "k3/core/error.h"
#include "k3/fixture/spec.h"
#include "k3/fixture/writer.h"
#include "k3/model/config.h"
#include "k3/model/expert_store.h"
#include "k3/model/tensor_table.h"
#include "k3/model/weights.h"
#include "k3_test_support.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

struct Variant {
  const char* what;
  fixture::Preset preset;
};

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  v.push_back({"tiny", fixture::PresetOrThrow("tiny")});
  fixture::Preset p = fixture::PresetOrThrow("tiny");
  fixture::OverrideDims(p, 5, 3);
  v.push_back({"tiny, 5 layers, 3 experts", p});
  p = fixture::PresetOrThrow("tiny");
  fixture::OverrideDims(p, 4, 4);
  p.dims.shared_experts = 0;
  v.push_back({"no shared experts", p});
  p = fixture::PresetOrThrow("tiny");
  fixture::OverrideDims(p, 4, 2);
  p.dims.first_k_dense = 2;
  p.dims.conv_kernel = 3;
  p.dims.kda_head_dim = 16;  // != MLA heads' dims, and A_log then pads to 16 > 4 heads
  p.dims.latent = 96;
  v.push_back({"dense prefix 2, conv 3, head_dim 16, latent 96", p});
  return v;
}

int64_t NonExpertEntries(const std::vector<TensorTableEntry>& table) {
  int64_t n = 0;
  for (const TensorTableEntry& t : table) n += t.kind != TensorKind::kExpert;
  return n;
}

model::LoadOptions Quiet() {
  model::LoadOptions o;
  o.bits = 8;
  o.progress = false;
  o.threads = 1;
  return o;
}

}  // namespace

TEST_CASE("the fixture's tensors, the loader's reads and the tensor table agree") {
  const std::string root = test::MakeTempDir("k3tt");
  const std::vector<Variant> variants = Variants();
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const Variant& v = variants[vi];
    CAPTURE(v.what);
    const fixture::ModelDims& d = v.preset.dims;
    const std::vector<TensorTableEntry> table = K3TensorTable(fixture::ToModelConfig(d));

    // 1. The generator's list is the table's, entry for entry.
    std::map<std::string, const TensorTableEntry*> by_name;
    for (const TensorTableEntry& t : table) CHECK(by_name.emplace(t.name, &t).second);
    const std::vector<fixture::TensorSpec> arch = fixture::ArchitectureTensors(d);
    REQUIRE(arch.size() == table.size());
    for (const fixture::TensorSpec& a : arch) {
      CAPTURE(a.name);
      auto it = by_name.find(a.name);
      REQUIRE(it != by_name.end());
      CHECK(a.shape == it->second->shape);
      CHECK(a.dtype == it->second->dtype);
      CHECK((a.role == fixture::Role::kExpert) == (it->second->kind == TensorKind::kExpert));
    }
    // Facts the table must state whatever its code (spec §3).
    const int64_t moe_layers = d.num_layers - std::min(d.first_k_dense, d.num_layers);
    CHECK(static_cast<int64_t>(table.size()) - NonExpertEntries(table) == moe_layers * d.experts * 6);
    CHECK(by_name.count("model.layers." + std::to_string(d.num_layers - 1) +
                        ".block_sparse_moe.shared_experts.gate_proj.weight") == (d.shared_experts > 0 ? 1u : 0u));
    CHECK(by_name.count("model.layers.0.mlp.gate_proj.weight") == 1);
    CHECK(by_name.count("model.layers." + std::to_string(d.first_k_dense) + ".mlp.gate_proj.weight") == 0);

    // 2. A fixture written for the variant loads: the config it states parses
    //    back to the same table, and the loader reads every non-expert entry.
    const std::string dir = root + "/" + std::to_string(vi);
    fixture::WriteOptions wo;
    wo.threads = 1;
    fs::create_directories(dir);
    fixture::WriteFixtureOrThrow(v.preset, dir, wo);
    Snapshot snap = Snapshot::OpenOrThrow(dir);
    const ModelConfig config = ModelConfig::LoadOrThrow(dir);
    const std::vector<TensorTableEntry> parsed = K3TensorTable(config);
    REQUIRE(parsed.size() == table.size());
    for (size_t i = 0; i < table.size(); ++i) {
      CHECK(parsed[i].name == table[i].name);
      CHECK(parsed[i].shape == table[i].shape);
    }
    CHECK(fixture::ArchitectureTensors(fixture::DimsFromConfig(config)).size() == arch.size());
    model::ModelWeights w = model::LoadWeightsOrThrow(snap, config, Quiet());
    CHECK(w.tensors_read == NonExpertEntries(table));
    model::ExpertTable experts(snap, config);
    for (int64_t l = d.first_k_dense; l < d.num_layers; ++l) {
      for (int64_t e = 0; e < d.experts; ++e) CHECK(experts.present(l, e));
    }
    uint64_t slot = 0;
    for (const ExpertPart& p : ExpertParts(config)) slot += static_cast<uint64_t>(p.rows * p.cols);
    CHECK(experts.slot_bytes() == slot);
  }
  fs::remove_all(root);
}

TEST_CASE("a change in the table is seen by the generator and by the loader") {
  const std::string root = test::MakeTempDir("k3tt");
  fixture::Preset a = fixture::PresetOrThrow("tiny");
  fixture::OverrideDims(a, 2, 2);
  fixture::Preset b = a;
  b.dims.conv_kernel = 3;  // one number of the config: the conv taps' shape in the table
  const auto find = [](const std::vector<fixture::TensorSpec>& v, const std::string& n) {
    for (const auto& t : v) {
      if (t.name == n) return t.shape;
    }
    return std::vector<int64_t>{};
  };
  const std::string conv = "model.layers.0.self_attn.q_conv1d.weight";
  CHECK(find(fixture::ArchitectureTensors(a.dims), conv) == std::vector<int64_t>{128, 1, 4});
  CHECK(find(fixture::ArchitectureTensors(b.dims), conv) == std::vector<int64_t>{128, 1, 3});
  fixture::WriteOptions wo;
  wo.threads = 1;
  fs::create_directories(root + "/a");
  fixture::WriteFixtureOrThrow(a, root + "/a", wo);
  Snapshot snap = Snapshot::OpenOrThrow(root + "/a");
  ModelConfig cb = ModelConfig::LoadOrThrow(root + "/a");
  cb.kda_conv_kernel = 3;
  // The loader expects the changed shape and names the tensor that lacks it.
  try {
    model::LoadWeightsOrThrow(snap, cb, Quiet());
    FAIL("a snapshot of conv kernel 4 loaded as conv kernel 3");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("q_conv1d.weight") != std::string::npos);
    CHECK(e.code() == ErrorCode::kCorrupt);
  }
  fs::remove_all(root);
}
