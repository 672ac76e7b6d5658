// Weight-loading paths must not change a bit: snapshot (quantized at load) ==
// prepared container (U8 + .qs) == K3_MMAP mapping of that container; and the
// loader's refusals and errors name what is wrong.
//
// The containers here are written by a small test-local builder that follows
// the k3-repack rules of spec §7.1-§7.3 (classification, U8 + `.qs` F32
// sidecar, experts by id), quantizing with lib/quant like k3-repack does.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "k3/container/safetensors.h"
#include "k3/container/snapshot.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/model/model.h"
#include "k3/quant/quant.h"

using namespace k3;
using namespace k3::model;
namespace fs = std::filesystem;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";
const std::vector<int32_t> kPrompt = {2048, 2051, 765,  1888, 786, 2053, 788,  2033, 691, 295,
                                      278,  603,  1682, 2052, 763, 2053, 2051, 2014, 428, 2053};

enum class Class { kDrop, kExpert, kBits, kMla, kHead, kPass };

std::string Leaf(const std::string& name) {
  size_t last = name.rfind('.');
  size_t prev = name.rfind('.', last - 1);
  return name.substr(prev + 1, last - prev - 1);
}

Class Classify(const std::string& n, const ModelConfig& c) {
  auto ends = [&](const char* s) { return n.ends_with(s); };
  if (n.starts_with("vision_tower") || n.starts_with("mm_projector")) return Class::kDrop;
  if (n.find(".block_sparse_moe.experts.") != std::string::npos) return Class::kExpert;
  if (n == "lm_head.weight") return Class::kHead;
  if (n.find(".self_attn.") != std::string::npos && ends(".weight")) {
    std::string leaf = Leaf(n);
    if (leaf == "q_a_proj" || leaf == "q_b_proj" || leaf == "kv_a_proj_with_mqa" ||
        leaf == "kv_b_proj") {
      return Class::kMla;
    }
    if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj") return Class::kBits;
    if (leaf == "o_proj" || leaf == "g_proj") {
      int layer = std::stoi(n.substr(std::string("model.layers.").size()));
      return c.is_kda[static_cast<size_t>(layer)] ? Class::kBits : Class::kMla;
    }
    return Class::kPass;
  }
  for (const char* s : {"routed_expert_down_proj.weight", "routed_expert_up_proj.weight",
                        "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight",
                        "shared_experts.down_proj.weight", "mlp.gate_proj.weight",
                        "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
    if (ends(s)) return Class::kBits;
  }
  return Class::kPass;
}

int ExpertId(const std::string& n) {
  size_t p = n.find(".experts.") + 9;
  return std::stoi(n.substr(p));
}

struct BuildOptions {
  int bits = 8, mla_bits = 8, head_bits = 8;
  std::string drop;     // a tensor to leave out (error tests)
  std::string reshape;  // a passthrough BF16 matrix whose shape is written transposed
};

// Writes a container of the tiny fixture into `dst` (no index: shards are found by listing).
void BuildContainer(const std::string& dst, const BuildOptions& bo) {
  fs::remove_all(dst);
  fs::create_directories(dst);
  fs::copy_file(kTiny + "/config.json", dst + "/config.json");
  Snapshot src = Snapshot::OpenOrThrow(kTiny);
  ModelConfig c = ModelConfig::ParseOrThrow(src.config_json(), "config.json");
  const std::string prefix = src.prefix();
  int shard_no = 0;
  for (const SafetensorsFile& f : src.shards()) {
    ++shard_no;
    std::vector<PlannedTensor> plan;
    std::vector<std::vector<std::byte>> data;
    std::vector<std::pair<int, size_t>> experts;  // (id, index into src tensors)
    std::vector<size_t> others;
    const auto& ts = f.tensors();
    for (size_t i = 0; i < ts.size(); ++i) {
      std::string n =
          ts[i].name.starts_with(prefix) ? ts[i].name.substr(prefix.size()) : ts[i].name;
      Class k = Classify(n, c);
      if (k == Class::kDrop || n == bo.drop) continue;
      if (k == Class::kExpert) {
        experts.push_back({ExpertId(n), i});
      } else {
        others.push_back(i);
      }
    }
    // Experts by id, each expert's six parts kept in source order (w1p..w3s).
    std::stable_sort(experts.begin(), experts.end(),
                     [](auto& a, auto& b) { return a.first < b.first; });
    auto emit_raw = [&](const TensorInfo& t, const std::string& n) {
      std::vector<std::byte> bytes(t.nbytes());
      f.ReadOrThrow(t, bytes);
      PlannedTensor pt{n, t.dtype, t.shape};
      if (n == bo.reshape && t.shape.size() == 2) std::swap(pt.shape[0], pt.shape[1]);
      plan.push_back(pt);
      data.push_back(std::move(bytes));
    };
    for (size_t i : others) {
      const TensorInfo& t = ts[i];
      std::string n = t.name.substr(t.name.starts_with(prefix) ? prefix.size() : 0);
      Class k = Classify(n, c);
      if (k == Class::kPass) {
        emit_raw(t, n);
        continue;
      }
      const int bits = k == Class::kBits ? bo.bits : k == Class::kMla ? bo.mla_bits : bo.head_bits;
      const size_t rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
      std::vector<float> x = f.ReadF32OrThrow(t);
      std::vector<std::byte> q, s;
      if (quant::UsesInt4(bits, cols)) {
        q.resize(rows * cols / 2);
        s.resize(4 * rows * (cols / 64));
        quant::QuantizeInt4G64Rows(x.data(), rows, cols, reinterpret_cast<uint8_t*>(q.data()),
                                   reinterpret_cast<float*>(s.data()));
        plan.push_back({n, DType::kU8, {t.shape[0], t.shape[1] / 2}});
        plan.push_back({n + ".qs", DType::kF32, {t.shape[0], t.shape[1] / 64}});
      } else {
        q.resize(rows * cols);
        s.resize(4 * rows);
        quant::QuantizeInt8Rows(x.data(), rows, cols, reinterpret_cast<int8_t*>(q.data()),
                                reinterpret_cast<float*>(s.data()));
        plan.push_back({n, DType::kU8, {t.shape[0], t.shape[1]}});
        plan.push_back({n + ".qs", DType::kF32, {t.shape[0]}});
      }
      data.push_back(std::move(q));
      data.push_back(std::move(s));
    }
    for (auto& [id, i] : experts) {
      const TensorInfo& t = ts[i];
      emit_raw(t, t.name.substr(t.name.starts_with(prefix) ? prefix.size() : 0));
    }
    if (plan.empty()) continue;
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-000009.safetensors", shard_no);
    SafetensorsWriter w(dst + "/" + name, plan);
    for (auto& d : data) w.Write(d);
    w.Commit();
  }
}

LoadOptions Bits(int bits, int mla, int head, bool explicit_bits, bool mmap = false) {
  LoadOptions o;
  o.bits = bits;
  o.mla_bits = mla;
  o.head_bits = head;
  o.bits_explicit = explicit_bits;
  o.mmap = mmap;
  o.progress = false;
  return o;
}

std::vector<float> Logits(const std::string& dir, const LoadOptions& lo, bool idot) {
  auto m = Model::LoadOrThrow(dir, lo);
  RunOptions ro;
  ro.idot = idot;
  ro.chunk = 8;
  Session s(*m, ro);
  std::vector<float> logits(kPrompt.size() * static_cast<size_t>(m->config().vocab_size));
  ForwardOutputs out;
  out.logits_all = logits.data();
  s.Forward(kPrompt, out);
  return logits;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

std::string TempDir(const char* tag) {
  return (fs::temp_directory_path() / ("k3_model_test_" + std::to_string(::getpid()) + "_" + tag))
      .string();
}

std::string ErrorText(const std::function<void()>& fn, ErrorCode* code = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("container == snapshot == mmap, bit for bit, at equal bits") {
  for (int bits : {8, 4}) {
    const std::string dir = TempDir(bits == 8 ? "c8" : "c4");
    BuildContainer(dir, {bits, 8, 8, "", ""});
    for (bool idot : {false, true}) {
      INFO("bits " << bits << " idot " << idot);
      std::vector<float> snap = Logits(kTiny, Bits(bits, 8, 8, true), idot);
      // Unset K3_BITS: the container's own bits are used whatever the options say.
      std::vector<float> cont = Logits(dir, Bits(32, 32, 32, false), idot);
      std::vector<float> mapped = Logits(dir, Bits(32, 32, 32, false, true), idot);
      CHECK(SameBits(snap, cont));
      CHECK(SameBits(cont, mapped));
    }
    fs::remove_all(dir);
  }
}

TEST_CASE("container int8 with K3_BITS=4 set downcasts; without it keeps int8; mmap refuses") {
  const std::string dir = TempDir("down");
  BuildContainer(dir, {8, 8, 8, "", ""});
  {
    auto m = Model::LoadOrThrow(dir, Bits(4, 8, 8, true));
    const LayerWeights& l0 = m->weights().layers[0];
    CHECK(l0.kda.q.format() == quant::WeightFormat::kInt4G64);  // class bits: downcast
    CHECK(l0.dense.down.format() == quant::WeightFormat::kInt4G64);
    CHECK(m->weights().layers[3].mla.q_a.format() == quant::WeightFormat::kInt8);  // mla: kept
    CHECK(m->weights().lm_head.format() == quant::WeightFormat::kInt8);
  }
  {
    auto m = Model::LoadOrThrow(dir, Bits(4, 8, 8, false));
    CHECK(m->weights().layers[0].kda.q.format() == quant::WeightFormat::kInt8);
  }
  ErrorCode code{};
  std::string what = ErrorText([&] { Model::LoadOrThrow(dir, Bits(4, 8, 8, true, true)); }, &code);
  CHECK(code == ErrorCode::kUnsupported);
  CHECK(what.find("K3_MMAP=1 cannot downcast") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("K3_MMAP=1 refuses a snapshot that needs conversion, naming the tensor") {
  ErrorCode code{};
  std::string what =
      ErrorText([&] { Model::LoadOrThrow(kTiny, Bits(4, 8, 8, true, true)); }, &code);
  CHECK(code == ErrorCode::kUnsupported);
  CHECK(what.find("K3_MMAP=1") != std::string::npos);
  CHECK(what.find("BF16") != std::string::npos);
  CHECK(what.find(".weight") != std::string::npos);  // names the tensor
}

TEST_CASE("a missing tensor is named; a wrong shape says expected vs found") {
  const std::string dir = TempDir("err");
  BuildContainer(dir, {8, 8, 8, "model.layers.2.self_attn.b_proj.weight", ""});
  ErrorCode code{};
  std::string what = ErrorText([&] { Model::LoadOrThrow(dir, Bits(8, 8, 8, false)); }, &code);
  CHECK(code == ErrorCode::kNotFound);
  CHECK(what.find("model.layers.2.self_attn.b_proj.weight") != std::string::npos);

  BuildContainer(dir, {8, 8, 8, "", "model.layers.1.self_attn.f_a_proj.weight"});
  what = ErrorText([&] { Model::LoadOrThrow(dir, Bits(8, 8, 8, false)); }, &code);
  CHECK(code == ErrorCode::kCorrupt);
  CHECK(what.find("f_a_proj") != std::string::npos);
  CHECK(what.find("shape [128,32], expected [32,128]") != std::string::npos);
  fs::remove_all(dir);

  // The index names the shard of a tensor that is missing from it.
  what = ErrorText([&] {
    Snapshot s = Snapshot::OpenOrThrow(kTiny);
    s.FindOrThrow("model.layers.0.self_attn.nonexistent.weight");
  });
  CHECK(what.find("nonexistent") != std::string::npos);
}

TEST_CASE("out-of-vocabulary ids are refused") {
  auto m = Model::LoadOrThrow(kTiny, Bits(8, 8, 8, true));
  Session s(*m, RunOptions{});
  std::vector<int32_t> bad = {5, static_cast<int32_t>(m->config().vocab_size)};
  ErrorCode code{};
  ErrorText([&] { s.Forward(bad, {}); }, &code);
  CHECK(code == ErrorCode::kInvalidArgument);
}

TEST_CASE("a missing expert is fatal only when touched, and then names the tensor") {
  const std::string dir = TempDir("noexpert");
  const std::string missing = "model.layers.1.block_sparse_moe.experts.3.w2.weight_scale";
  BuildContainer(dir, {8, 8, 8, missing, ""});
  auto m = Model::LoadOrThrow(dir, Bits(8, 8, 8, false));  // loads: experts are lazy
  CHECK_FALSE(m->experts().table().present(1, 3));
  CHECK(m->experts().table().present(1, 4));
  ErrorCode code{};
  std::string what = ErrorText([&] { m->experts().Acquire(1, 3); }, &code);
  CHECK(code == ErrorCode::kNotFound);
  CHECK(what.find(missing) != std::string::npos);
  // The oracle prompt routes layer 1 through expert 3, so the forward pass fails cleanly too.
  Session s(*m, RunOptions{});
  what = ErrorText([&] { s.Forward(kPrompt, {}); }, &code);
  CHECK(code == ErrorCode::kNotFound);
  CHECK(what.find("experts.3.") != std::string::npos);
  fs::remove_all(dir);
}
