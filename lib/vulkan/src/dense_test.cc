// The trunk on the device (label vulkan; lavapipe in CI): every placed matrix
// of each format (f32, int8 per-row, int4-g64) against the CPU kernels, the
// model with the shared experts and then every trunk matrix on the device
// against the CPU's K3_IDOT=0 run and the oracle, a K3_MMAP'd container, fault
// injection (allocation, submit, device lost) and the options.
// Exits 77 (ctest: skipped) only when no Vulkan loader exists.
#include "k3/vulkan/dense.h"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/fixture/spec.h"
#include "k3/fixture/writer.h"
#include "k3/model/model.h"
#include "k3/quant/ops.h"
#include "k3/quant/quant.h"
#include "k3/vulkan/device.h"
#include "k3_model_test_support.h"
#include "k3_repack_test_support.h"
#include "k3_test_json.h"
#include "k3_test_support.h"

using namespace k3;
using namespace k3::vulkan;
using k3::test::JsonIds;
using k3::test::RelL2;

namespace {

const bool kLoader = [] {
  if (!LoaderPresent()) {
    std::fprintf(stderr,
                 "vulkan_dense_test: SKIP: no Vulkan loader (libvulkan1) on this machine\n");
    const char* ci = std::getenv("CI");
    std::exit(ci != nullptr && std::string(ci) == "true" ? 1 : 77);
  }
  return true;
}();

const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle";
const std::string kTiny = kOracle + "/k3-tiny";

model::LoadOptions Bits(int bits, int mla_bits, int head_bits) {
  model::LoadOptions o = test::Bits(bits, mla_bits, head_bits);
  o.threads = 1;
  return o;
}
model::LoadOptions F32() { return Bits(32, 32, 32); }

TierOptions Dense(DenseMode mode) {
  TierOptions o;
  o.enabled = true;
  o.dense = mode;
  o.validate = true;
  return o;
}

using Run = test::GreedyRun;

// The prompt's logits at every position, then `ngen` greedy tokens, f32
// activations (K3_IDOT=0: the device's precision and the oracle's).
Run RunPrompt(model::Model& m, const std::vector<int32_t>& prompt, int ngen) {
  return test::RunGreedy(m, test::Run(/*idot=*/false, /*chunk=*/32), prompt, ngen);
}

// A fixture with shapes the oracle's coincidences would hide: hidden 192
// (three int4 groups, six int8 words... per row), MI != LT, one shared expert
// of 96 rows, a dense first layer.
std::string HiddenShapeFixture() {
  fixture::Preset p = fixture::PresetOrThrow("tiny");
  p.dims.hidden = 192;
  p.dims.moe_intermediate = 96;
  p.dims.latent = 160;
  p.dims.shared_experts = 1;
  p.dims.num_layers = 4;
  p.dims.is_kda = {true, true, false, false};
  const std::string dir = test::MakeTempDir("k3_vk_dense_shape");
  fixture::WriteOptions wo;
  wo.seed = 48;
  wo.force = true;
  wo.threads = 1;
  fixture::WriteFixtureOrThrow(p, dir, wo);
  return dir;
}

std::vector<int32_t> Ids(size_t n, int64_t vocab) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((100 + 37 * i) % vocab));
  return ids;
}

uint64_t OnDevice(const DenseStats& s, const char* cls) {
  for (const auto& [k, v] : s.classes) {
    if (k == cls) return v;
  }
  return 0;
}

// Every matrix the placement holds, against quant::MatMul (the CPU's f32
// path): batch 1 (decode), 5 (a tile and a tail) and 37; and the MLP path.
void CheckEveryPlacedMatrix(model::Model& m, DenseTier& d, quant::WeightFormat want) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int checked = 0, of_format = 0;
  double worst = 0;
  for (const TrunkMatrix& t : ListTrunk(m.weights())) {
    if (!d.holds(*t.matrix)) continue;
    const quant::WeightView& v = t.matrix->view();
    of_format += v.format == want;
    for (size_t batch : {size_t{1}, size_t{5}, size_t{37}}) {
      std::vector<float> x(batch * v.cols), y(batch * v.rows, NAN), ref(batch * v.rows);
      for (float& f : x) f = nd(rng);
      REQUIRE(d.MatMul(*t.matrix, x.data(), batch, y.data()));
      quant::MatMul(v, x.data(), batch, ref.data());
      const double e = RelL2(y.data(), ref.data(), ref.size());
      worst = std::max(worst, e);
      const std::string cls = t.cls;
      CAPTURE(cls);
      CAPTURE(t.layer);
      CAPTURE(batch);
      CHECK(e <= 1e-5);
      ++checked;
    }
  }
  MESSAGE(checked << " (matrix, batch) cases, " << of_format
                  << " matrices of the format, worst rel-L2 " << worst);
  CHECK(of_format > 0);
  // The fused MLP (gate, up, SiTU-GLU, down) of the first layer with shared experts.
  const ModelConfig& c = m.config();
  for (const auto& L : m.weights().layers) {
    if (!L.is_moe || L.moe.shared.gate.empty()) continue;
    const model::MlpWeights& w = L.moe.shared;
    const size_t n = 6, in = w.gate.cols(), inter = w.gate.rows(), outc = w.down.rows();
    std::vector<float> x(n * in), g(n * inter), u(n * inter), ref(n * outc), y(n * outc);
    for (float& f : x) f = nd(rng);
    quant::MatMul(w.gate.view(), x.data(), n, g.data());
    quant::MatMul(w.up.view(), x.data(), n, u.data());
    quant::SituGlu(g.data(), u.data(), n * inter, c.situ_beta, c.situ_linear_beta, g.data());
    quant::MatMul(w.down.view(), g.data(), n, ref.data());
    REQUIRE(d.BeginMlp(w, x.data(), n, c.situ_beta, c.situ_linear_beta));
    REQUIRE(d.FinishMlp(y.data()));
    const double e = RelL2(y.data(), ref.data(), ref.size());
    MESSAGE("shared-expert MLP on the device: rel-L2 " << e);
    CHECK(e <= 1e-5);
    break;
  }
  CHECK(d.stats().validation_errors == 0);
}

}  // namespace

TEST_CASE("dense shaders: every placed matrix of each format matches the CPU kernels") {
  const std::string dir = HiddenShapeFixture();
  struct Case {
    const char* name;
    model::LoadOptions lo;
    quant::WeightFormat format;
  };
  const Case cases[] = {
      {"int4-g64 trunk, int8 MLA and head", Bits(4, 8, 8), quant::WeightFormat::kInt4G64},
      {"int8 everywhere", Bits(8, 8, 8), quant::WeightFormat::kInt8},
      {"f32 everywhere", F32(), quant::WeightFormat::kF32},
  };
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    auto m = model::Model::LoadOrThrow(dir, c.lo);
    TierOptions o = Dense(DenseMode::kAll);
    o.dense_slab_bytes = 64 << 10;  // the head (and others) split over several weight buffers
    auto d = std::make_unique<DenseTier>(*m, o);
    REQUIRE(d->nothing_placed_reason().empty());
    CHECK(d->stats().matrices_on_cpu == 0);
    CheckEveryPlacedMatrix(*m, *d, c.format);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the model with the shared experts, then every trunk matrix, on the device") {
  struct Case {
    const char* name;
    std::string dir;
    model::LoadOptions lo;
    std::vector<int32_t> prompt;
    int ngen;
    const std::vector<float>* golden;
  };
  const std::vector<int32_t> oracle_prompt =
      JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
  const std::vector<int32_t> oracle_greedy =
      JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "greedy_ids");
  const std::vector<float> oracle_logits =
      test::ReadF32File(kOracle + "/k3-tiny.golden/logits.f32");
  const std::string shape_dir = HiddenShapeFixture();
  const Case cases[] = {
      {"oracle k3-tiny, f32", kTiny, F32(), oracle_prompt, static_cast<int>(oracle_greedy.size()),
       &oracle_logits},
      {"hidden-shape fixture, int4-g64 + int8", shape_dir, Bits(4, 8, 8), Ids(12, 2304), 6,
       nullptr},
  };
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    auto cpu_model = model::Model::LoadOrThrow(c.dir, c.lo);
    const Run cpu = RunPrompt(*cpu_model, c.prompt, c.ngen);
    if (c.golden) CHECK(cpu.greedy == oracle_greedy);
    for (DenseMode mode : {DenseMode::kShared, DenseMode::kAll}) {
      const std::string mode_name = DenseModeName(mode);
      CAPTURE(mode_name);
      auto m = model::Model::LoadOrThrow(c.dir, c.lo);
      DenseTier* d = InstallDense(*m, Dense(mode));
      REQUIRE(d != nullptr);
      const Run r = RunPrompt(*m, c.prompt, c.ngen);
      const DenseStats s = d->stats();
      const double e = RelL2(r.logits, cpu.logits);
      MESSAGE(std::string(c.name) << ", K3_VK_DENSE=" << std::string(DenseModeName(mode)) << " on "
                                  << s.device << ": " << s.matrices_on_device
                                  << " matrices on the device, logits rel-L2 vs CPU " << e
                                  << ", device " << s.device_ms << " ms, CPU " << s.cpu_ms
                                  << " ms, " << s.mlps_on_device << " MLPs");
      CHECK(e <= 1e-4);
      CHECK(e > 0);  // the device computed (its sums are not the CPU's bits)
      CHECK(r.greedy == cpu.greedy);
      if (c.golden) CHECK(RelL2(r.logits, *c.golden) <= 1e-4);
      CHECK(s.active);
      CHECK(s.device_ms > 0);
      CHECK(s.calls_on_device > 0);
      CHECK(s.mlps_on_device > 0);
      CHECK(OnDevice(s, "shared") == 3 * static_cast<uint64_t>(m->config().num_moe_layers()));
      if (mode == DenseMode::kShared) {
        CHECK(s.classes.size() == 1);
        CHECK(s.matrices_on_cpu > 0);
        CHECK(s.cpu_ms > 0);
      } else {
        CHECK(s.matrices_on_cpu == 0);
        CHECK(OnDevice(s, "head") == 1);
        CHECK(OnDevice(s, "mla") > 0);
        CHECK(OnDevice(s, "kda") > 0);
        CHECK(OnDevice(s, "latent") > 0);
      }
      CHECK(s.validation_errors == 0);
    }
  }
  std::filesystem::remove_all(shape_dir);
}

TEST_CASE("a budget below the trunk: largest per-token bytes first, the rest on the CPU") {
  auto m = model::Model::LoadOrThrow(kTiny, F32());
  const std::vector<TrunkMatrix> trunk = ListTrunk(m->weights());
  uint64_t shared = 0, largest_other = 0;
  for (const TrunkMatrix& t : trunk) {
    if (std::string(t.cls) == "shared") {
      shared += t.matrix->resident_bytes();
    } else if (std::string(t.cls) != "dense_mlp") {
      largest_other = std::max(largest_other, t.matrix->resident_bytes());
    }
  }
  TierOptions o = Dense(DenseMode::kAll);
  o.dense_budget_bytes = shared + largest_other;  // the shared experts and the largest other
  auto d = std::make_unique<DenseTier>(*m, o);
  const DenseStats s = d->stats();
  CHECK(OnDevice(s, "shared") == 3 * static_cast<uint64_t>(m->config().num_moe_layers()));
  CHECK(s.bytes_on_device <= o.dense_budget_bytes);
  CHECK(s.matrices_on_cpu > 0);
  // The largest non-shared matrix is on the device (the head on k3-tiny).
  bool largest_placed = false;
  for (const TrunkMatrix& t : trunk) {
    if (std::string(t.cls) != "shared" && t.matrix->resident_bytes() == largest_other) {
      largest_placed = largest_placed || d->holds(*t.matrix);
    }
  }
  CHECK(largest_placed);
  // /metrics (k3-run serve) shows the same placement.
  const std::string metrics = RenderVulkanMetrics(nullptr, d.get());
  CHECK(metrics.find("k3_vk_dense_matrices{where=\"device\"} " +
                     std::to_string(s.matrices_on_device) + "\n") != std::string::npos);
  CHECK(metrics.find("k3_vk_dense_matrices{where=\"cpu\"} " + std::to_string(s.matrices_on_cpu) +
                     "\n") != std::string::npos);
  CHECK(metrics.find("# TYPE k3_vk_dense_seconds_total counter") != std::string::npos);
  CHECK(RenderVulkanMetrics(nullptr, nullptr).empty());
}

TEST_CASE("K3_MMAP=1 on a k3-repack container: the trunk uploads from the mapping") {
  const std::string dst = test::MakeTempDir("k3_vk_dense_mmap");
  const std::string container = test::RepackInt8(kTiny, dst + "/c");
  model::LoadOptions lo;
  lo.mmap = true;
  lo.progress = false;
  auto m = model::Model::LoadOrThrow(container, lo);
  REQUIRE(m->weights().lm_head.mapped());
  DenseTier* d = InstallDense(*m, Dense(DenseMode::kAll));
  REQUIRE(d != nullptr);
  const std::string golden = kOracle + "/k3-tiny.int8.golden";
  const std::vector<int32_t> prompt = JsonIds(golden + "/greedy.json", "prompt_ids");
  const std::vector<int32_t> greedy = JsonIds(golden + "/greedy.json", "greedy_ids");
  const Run r = RunPrompt(*m, prompt, static_cast<int>(greedy.size()));
  const double e = RelL2(r.logits, test::ReadF32File(golden + "/logits.f32"));
  MESSAGE("mmap'd int8 container, trunk on the device: logits rel-L2 " << e);
  CHECK(e <= 1e-4);
  CHECK(r.greedy == greedy);
  CHECK(d->stats().matrices_on_cpu == 0);
  CHECK(d->stats().device_ms > 0);
  m.reset();
  std::filesystem::remove_all(dst);
}

TEST_CASE("fault injection: allocation, submit and device lost fall back to the CPU's answers") {
  const std::vector<int32_t> prompt =
      JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
  const std::vector<int32_t> greedy =
      JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "greedy_ids");
  auto cpu_model = model::Model::LoadOrThrow(kTiny, F32());
  const Run cpu = RunPrompt(*cpu_model, prompt, static_cast<int>(greedy.size()));
  struct Case {
    const char* name;
    Fault fault;
    int after;
    bool starts;
  };
  const Case cases[] = {
      {"alloc of the first weight buffer", Fault::kAlloc, 0, false},
      {"alloc of an I/O buffer", Fault::kAlloc, 1, false},
      {"submit of the first matmul", Fault::kSubmit, 0, true},
      {"submit later", Fault::kSubmit, 7, true},
      {"device lost at the first wait", Fault::kDeviceLost, 0, true},
      {"device lost later", Fault::kDeviceLost, 9, true},
  };
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    auto m = model::Model::LoadOrThrow(kTiny, F32());
    TierOptions o = Dense(DenseMode::kAll);
    o.fault = c.fault;
    o.fault_after = c.after;
    DenseTier* d = InstallDense(*m, o);
    CHECK((d != nullptr) == c.starts);
    CHECK((m->dense_executor() != nullptr) == c.starts);
    const Run r = RunPrompt(*m, prompt, static_cast<int>(greedy.size()));
    CHECK(r.greedy == greedy);
    CHECK(RelL2(r.logits, cpu.logits) <= 1e-4);
    if (d) {
      const DenseStats s = d->stats();
      CHECK_FALSE(s.active);  // the fault fired and the placement stood down
      CHECK(s.cpu_ms > 0);
      if (c.after == 0) {
        // Nothing was computed on the device: the CPU's bits exactly.
        CHECK(std::memcmp(r.logits.data(), cpu.logits.data(), r.logits.size() * 4) == 0);
      }
    }
  }
}

TEST_CASE("K3_VK_DENSE: parsing, auto on a CPU device, and K3_VK=0") {
  ::setenv("K3_VK_DENSE", "sometimes", 1);
  CHECK_THROWS_AS(TierOptions::FromEnv(), Error);
  for (auto [v, mode] : {std::pair{"0", DenseMode::kNone}, std::pair{"none", DenseMode::kNone},
                         std::pair{"shared", DenseMode::kShared}, std::pair{"all", DenseMode::kAll},
                         std::pair{"auto", DenseMode::kAuto}}) {
    ::setenv("K3_VK_DENSE", v, 1);
    CHECK(TierOptions::FromEnv().dense == mode);
  }
  ::unsetenv("K3_VK_DENSE");
  CHECK(TierOptions::FromEnv().dense == DenseMode::kAuto);

  auto m = model::Model::LoadOrThrow(kTiny, F32());
  TierOptions off = Dense(DenseMode::kAll);
  off.enabled = false;  // K3_VK=0: the device is never opened
  CHECK(InstallDense(*m, off) == nullptr);
  CHECK(InstallDense(*m, Dense(DenseMode::kNone)) == nullptr);
  DenseTier probe(*m, Dense(DenseMode::kAuto));
  if (Device::OpenOrThrow({})->info().type != "discrete") {
    // lavapipe (and integrated GPUs): auto places nothing, and says why.
    CHECK_FALSE(probe.nothing_placed_reason().empty());
    CHECK(InstallDense(*m, Dense(DenseMode::kAuto)) == nullptr);
    CHECK(m->dense_executor() == nullptr);
  } else {
    CHECK(probe.nothing_placed_reason().empty());
  }
  JsonWriter j;
  j.BeginObject();
  WriteDenseStatsJson(nullptr, 0, j);
  j.EndObject();
  CHECK(j.str() == "{\"vulkan_dense\":null}");
}
