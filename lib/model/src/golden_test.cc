// The K3 forward pass against Moonshot's reference outputs (oracle goldens of
// the k3-tiny fixture), plus the engine's own invariants: chunked prefill ==
// token-at-a-time bit for bit, IDOT top-1 agreement.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "k3/container/safetensors.h"
#include "k3/core/file.h"
#include "k3/model/model.h"
#include "k3/quant/isa.h"
#include "k3_isa_test_support.h"
#include "k3_model_test_support.h"
#include "k3_test_json.h"
#include "k3_test_support.h"

using namespace k3;
using k3::test::IsaStr;
using k3::test::kGoldenLayerRelL2;
using k3::test::kGoldenRelL2;
using k3::test::RelL2;
using k3::test::JsonIds;
using k3::test::ReadF32File;
using namespace k3::model;

namespace {

const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle";
const std::string kTiny = kOracle + "/k3-tiny";

struct RunResult {
  std::vector<float> logits, trace, final_hidden;
  std::vector<int32_t> greedy;
  std::vector<float> greedy_logits;  // [ngen][vocab]: the logits behind each greedy id
};

RunResult RunPrompt(Model& model, RunOptions ro, const std::vector<int32_t>& prompt, int ngen) {
  const ModelConfig& c = model.config();
  const size_t T = prompt.size();
  const size_t V = static_cast<size_t>(c.vocab_size);
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t L = static_cast<size_t>(c.num_hidden_layers);
  RunResult r;
  r.logits.resize(T * V);
  r.trace.resize(T * L * D);
  r.final_hidden.resize(T * D);
  std::vector<float> last(V);
  Session s(model, ro, static_cast<int64_t>(T) + ngen);
  ForwardOutputs out;
  out.logits_all = r.logits.data();
  out.logits_last = last.data();
  out.trace = r.trace.data();
  out.final_hidden = r.final_hidden.data();
  s.Forward(prompt, out);
  for (int i = 0; i < ngen; ++i) {
    int32_t id = Sampler::Argmax(last);
    r.greedy.push_back(id);
    r.greedy_logits.insert(r.greedy_logits.end(), last.begin(), last.end());
    if (i + 1 == ngen) break;
    ForwardOutputs o2;
    o2.logits_last = last.data();
    s.Forward(std::span<const int32_t>(&id, 1), o2);
  }
  return r;
}

// How a run compares with one golden directory.
struct GoldenStats {
  std::vector<double> layer;  // per-layer hidden rel-L2
  double final_rel = 0, logits_rel = 0;
  int agree = 0;  // prompt positions whose argmax matches the golden's
  size_t positions = 0;
  bool finite = true;  // every logit finite
};

// Compares a run with one golden directory and prints one line. strict: the
// f32-activation bounds (kGoldenLayerRelL2 / kGoldenRelL2, every argmax equal).
GoldenStats CompareWithGolden(const Model& model, const RunResult& r,
                              const std::string& golden_dir, bool strict) {
  const ModelConfig& c = model.config();
  const size_t V = static_cast<size_t>(c.vocab_size);
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t L = static_cast<size_t>(c.num_hidden_layers);
  const size_t T = r.logits.size() / V;
  std::vector<float> g_logits = ReadF32File(golden_dir + "/logits.f32");
  std::vector<float> g_hidden = ReadF32File(golden_dir + "/hidden.f32");
  std::vector<float> g_final = ReadF32File(golden_dir + "/final.f32");
  REQUIRE(g_logits.size() == T * V);
  REQUIRE(g_hidden.size() == T * L * D);
  REQUIRE(g_final.size() == T * D);
  GoldenStats st;
  st.positions = T;
  std::string line = golden_dir.substr(golden_dir.rfind('/') + 1) + " per-layer hidden rel-L2:";
  for (size_t l = 0; l < L; ++l) {
    std::vector<float> mine(T * D), gold(T * D);
    for (size_t t = 0; t < T; ++t) {
      std::memcpy(mine.data() + t * D, r.trace.data() + (t * L + l) * D, D * 4);
      std::memcpy(gold.data() + t * D, g_hidden.data() + (t * L + l) * D, D * 4);
    }
    double e = RelL2(mine.data(), gold.data(), T * D);
    st.layer.push_back(e);
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.2e", e);
    line += buf;
    if (strict) {
      INFO("layer " << l);
      CHECK(e <= kGoldenLayerRelL2);
    }
  }
  st.logits_rel = RelL2(r.logits.data(), g_logits.data(), T * V);
  st.final_rel = RelL2(r.final_hidden.data(), g_final.data(), T * D);
  for (float v : r.logits) st.finite = st.finite && std::isfinite(v);
  for (size_t t = 0; t < T; ++t) {
    std::span<const float> a(r.logits.data() + t * V, V), b(g_logits.data() + t * V, V);
    st.agree += Sampler::Argmax(a) == Sampler::Argmax(b);
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "; final %.2e; logits %.2e; argmax %d/%zu", st.final_rel,
                st.logits_rel, st.agree, T);
  line += buf;
  MESSAGE(line);
  std::fprintf(stderr, "%s\n", line.c_str());
  if (strict) {
    CHECK(st.finite);
    CHECK(st.logits_rel <= kGoldenRelL2);
    CHECK(st.final_rel <= kGoldenRelL2);
    CHECK(st.agree == static_cast<int>(T));
  }
  return st;
}

using k3::test::Bits;
using k3::test::Run;

}  // namespace

TEST_CASE("f32 weights match Moonshot's reference (k3-tiny.golden)") {
  auto model = Model::LoadOrThrow(kTiny, Bits(32, 32, 32));
  std::vector<int32_t> prompt = JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
  std::vector<int32_t> greedy = JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "greedy_ids");
  RunResult r = RunPrompt(*model, Run(false, 32), prompt, static_cast<int>(greedy.size()));
  CompareWithGolden(*model, r, kOracle + "/k3-tiny.golden", true);
  CHECK(r.greedy == greedy);
  // Greedy logits (incremental path) against the reference's.
  std::vector<float> g = ReadF32File(kOracle + "/k3-tiny.golden/greedy_logits.f32");
  REQUIRE(g.size() == r.greedy_logits.size());
  double e = RelL2(r.greedy_logits.data(), g.data(), g.size());
  MESSAGE("greedy (incremental) logits rel-L2 " << e);
  CHECK(e <= kGoldenRelL2);
}

TEST_CASE("sampler: greedy takes the first maximum; seeded sampling is reproducible") {
  std::vector<float> l = {0.5f, 2.0f, 2.0f, -1.0f};
  CHECK(Sampler::Argmax(l) == 1);
  Sampler greedy(0.0f, 1.0f, 7);
  CHECK(greedy.Sample(l) == 1);
  Sampler a(1.0f, 1.0f, 42), b(1.0f, 1.0f, 42);
  std::vector<int32_t> da, db;
  int counts[4] = {};
  for (int i = 0; i < 2000; ++i) {
    da.push_back(a.Sample(l));
    db.push_back(b.Sample(l));
    ++counts[da.back()];
  }
  CHECK(da == db);
  // p ∝ exp(l): 0.5 -> 0.0914, 2.0 -> 0.4097 each, -1 -> 0.0204 (3-sigma bands).
  CHECK(counts[1] > 750);
  CHECK(counts[2] > 750);
  CHECK(counts[0] > 120);
  CHECK(counts[0] < 250);
  // A nucleus that the two top ids already fill never draws the others.
  Sampler nucleus(1.0f, 0.5f, 3);
  for (int i = 0; i < 500; ++i) {
    int32_t id = nucleus.Sample(l);
    CHECK((id == 1 || id == 2));
  }
}

TEST_CASE("f32 routing matches the reference's expert choices") {
  auto model = Model::LoadOrThrow(kTiny, Bits(32, 32, 32));
  std::vector<int32_t> prompt = JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
  Session s(*model, Run(false, 32));
  s.RecordRouting(true);
  s.Forward(prompt, {});
  std::string text = ReadFileOrThrow(kOracle + "/k3-tiny.golden/golden.json", 1 << 22);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(text).get(doc) == simdjson::SUCCESS);
  simdjson::dom::object per_layer;
  REQUIRE(doc["routing"]["per_layer"].get_object().get(per_layer) == simdjson::SUCCESS);
  int checked = 0, same = 0;
  for (const RoutingRecord& rr : s.routing()) {
    simdjson::dom::array toks;
    REQUIRE(per_layer[std::to_string(rr.layer)].get_array().get(toks) == simdjson::SUCCESS);
    simdjson::dom::array ex;
    REQUIRE(toks.at(static_cast<size_t>(rr.position))["experts"].get_array().get(ex) ==
            simdjson::SUCCESS);
    std::vector<int32_t> want;
    for (auto v : ex) want.push_back(static_cast<int32_t>(int64_t(v.get_int64().value_unsafe())));
    ++checked;
    same += want == rr.experts;
  }
  CHECK(checked == 7 * 20);
  CHECK(same == checked);
}

TEST_CASE("int8 weights (K3_BITS=8, f32 activations) match k3-tiny.int8.golden") {
  auto model = Model::LoadOrThrow(kTiny, Bits(8, 8, 8));
  std::vector<int32_t> prompt = JsonIds(kOracle + "/k3-tiny.int8.golden/greedy.json", "prompt_ids");
  std::vector<int32_t> greedy = JsonIds(kOracle + "/k3-tiny.int8.golden/greedy.json", "greedy_ids");
  RunResult r = RunPrompt(*model, Run(false, 32), prompt, static_cast<int>(greedy.size()));
  CompareWithGolden(*model, r, kOracle + "/k3-tiny.int8.golden", true);
  CHECK(r.greedy == greedy);
}

TEST_CASE("int4 weights (K3_BITS=4, MLA/head 8, f32 activations) match k3-tiny.int4.golden") {
  auto model = Model::LoadOrThrow(kTiny, Bits(4, 8, 8));
  std::vector<int32_t> prompt = JsonIds(kOracle + "/k3-tiny.int4.golden/greedy.json", "prompt_ids");
  std::vector<int32_t> greedy = JsonIds(kOracle + "/k3-tiny.int4.golden/greedy.json", "greedy_ids");
  RunResult r = RunPrompt(*model, Run(false, 32), prompt, static_cast<int>(greedy.size()));
  CompareWithGolden(*model, r, kOracle + "/k3-tiny.int4.golden", true);
  CHECK(r.greedy == greedy);
}

TEST_CASE("chunked prefill is bit-identical to token-at-a-time, on every ISA this CPU runs") {
  const quant::Isa saved = quant::ActiveIsa();
  for (quant::Isa isa : k3::test::IsasToTest("chunked prefill")) {
    quant::SetIsaForTesting(isa);
    for (int bits : {32, 4}) {
      for (bool idot : {false, true}) {
        auto model =
            Model::LoadOrThrow(kTiny, Bits(bits, bits == 32 ? 32 : 8, bits == 32 ? 32 : 8));
        std::vector<int32_t> prompt =
            JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
        RunResult one = RunPrompt(*model, Run(idot, 1), prompt, 4);
        for (int chunk : {32, 7, 3}) {
          RunResult many = RunPrompt(*model, Run(idot, chunk), prompt, 4);
          INFO("isa " << IsaStr(isa) << " bits " << bits << " idot " << idot << " chunk "
                      << chunk);
          CHECK(std::memcmp(one.logits.data(), many.logits.data(), one.logits.size() * 4) == 0);
          CHECK(std::memcmp(one.trace.data(), many.trace.data(), one.trace.size() * 4) == 0);
          CHECK(one.greedy == many.greedy);
        }
        if (bits == 32 && !idot) {
          // Every ISA's f32 path matches the reference, not just the default one.
          std::vector<float> g = ReadF32File(kOracle + "/k3-tiny.golden/logits.f32");
          INFO("isa " << IsaStr(isa));
          CHECK(RelL2(one.logits.data(), g.data(), g.size()) <= kGoldenRelL2);
        }
      }
    }
  }
  quant::SetIsaForTesting(saved);
}

TEST_CASE("IDOT (int8 activations, the default path) end to end: finite, with agreement floors") {
  // Quantizing activations moves a random-weight MoE's routing, so the goldens
  // are far away (the kernels themselves are bounded op by op in model_idot_test);
  // the floors sit just below what every ISA measures today (2026-12: argmax
  // 18/20, 11/20, 9-11/20; logits rel-L2 0.153, 0.386, 0.495-0.518), so a
  // regression of the default inference path fails here.
  struct Floor {
    int bits;
    const char* dir;
    int min_agree;
    double max_logits_rel;
  };
  for (Floor f : {Floor{32, "k3-tiny.golden", 17, 0.17}, Floor{8, "k3-tiny.int8.golden", 10, 0.42},
                  Floor{4, "k3-tiny.int4.golden", 8, 0.56}}) {
    auto model =
        Model::LoadOrThrow(kTiny, Bits(f.bits, f.bits == 4 ? 8 : f.bits, f.bits == 4 ? 8 : f.bits));
    std::vector<int32_t> prompt = JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
    RunResult r = RunPrompt(*model, Run(true, 32), prompt, 0);
    GoldenStats st = CompareWithGolden(*model, r, kOracle + "/" + f.dir, false);
    INFO(std::string(f.dir) << " with IDOT on " << IsaStr(quant::ActiveIsa()));
    CHECK(st.finite);
    CHECK(st.agree >= f.min_agree);
    CHECK(st.logits_rel <= f.max_logits_rel);
    CHECK(st.final_rel <= f.max_logits_rel);
  }
}

namespace {

// Copies k3-tiny to `dir` with every MLA layer's LoRA-norm inputs scaled by
// 2^-steps: all of q_a_proj and the first kv_lora_rank rows of
// kv_a_proj_with_mqa (the rope rows after them are not normalised). Scaling a
// normal BF16 by a power of two is exact (exponent steps), and RMSNorm(x c; eps)
// = RMSNorm(x; eps / c^2), so nothing else in the model moves: the copy runs the
// fixture with its LoRA-norm eps times 4^steps.
void WriteScaledLoraCopy(const std::string& dir, int steps) {
  namespace fs = std::filesystem;
  fs::copy(kTiny, dir, fs::copy_options::recursive);
  const ModelConfig c = ModelConfig::LoadOrThrow(dir);
  int scaled = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_kda[static_cast<size_t>(l)]) continue;
    const std::string p = "language_model.model.layers." + std::to_string(l) + ".self_attn.";
    for (auto [name, rows] : {std::pair{p + "q_a_proj.weight", int64_t{-1}},
                              std::pair{p + "kv_a_proj_with_mqa.weight", c.kv_lora_rank}}) {
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".safetensors") continue;
        SafetensorsFile f = SafetensorsFile::OpenOrThrow(e.path().string());
        const TensorInfo* t = f.Find(name);
        if (!t) continue;
        REQUIRE(t->dtype == DType::kBF16);
        REQUIRE(t->shape.size() == 2);
        const uint64_t n = static_cast<uint64_t>(rows < 0 ? t->shape[0] : rows) *
                           static_cast<uint64_t>(t->shape[1]);
        std::vector<uint16_t> v(n);
        std::fstream io(e.path(), std::ios::in | std::ios::out | std::ios::binary);
        io.seekg(static_cast<std::streamoff>(f.AbsoluteOffset(*t)));
        io.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 2));
        for (uint16_t& b : v) {
          const unsigned exponent = (b >> 7) & 0xffu;
          if ((b & 0x7fffu) == 0) continue;  // +-0 stays
          REQUIRE(exponent > unsigned(steps));  // normal, and stays normal
          b = static_cast<uint16_t>(b - 0x80u * unsigned(steps));
        }
        io.seekp(static_cast<std::streamoff>(f.AbsoluteOffset(*t)));
        io.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * 2));
        REQUIRE(io.good());
        ++scaled;
      }
    }
  }
  REQUIRE(scaled == 2 * c.num_mla_layers());
}

}  // namespace

TEST_CASE("MLA LoRA-norm eps: the engine's effective eps, measured against the golden") {
  // The oracle's one documented near miss: q_a/kv_a norms with eps 1e-5 instead
  // of 1e-6 move hidden.f32 by only 4e-6..1e-5 rel-L2, inside any sane bound on
  // the whole model. Here the eps dominates. With f the model as a function of
  // that eps, the engine's error vs the golden is r = f(eps) - golden ~
  // f' (eps - 1e-6); the copy above gives d = f(k eps) - f(eps) ~ f' (k - 1) eps
  // (k = 64; f is linear there: k = 16..256 read the same). Projecting,
  // alpha = <r,d>/<d,d> ~ (eps - 1e-6) / ((k - 1) eps), so the engine's eps reads
  // 1e-6 / (1 - (k - 1) alpha); rounding noise mostly drops out. Measured 2026-12
  // over the first MLA layer's block: 0.73e-6 (avx512) .. 1.10e-6 (scalar);
  // engines mutated to eps 1e-5 read 7.6e-6 .. 1.3e-5.
  constexpr int kSteps = 3;
  const double k = std::pow(4.0, kSteps);
  auto model = Model::LoadOrThrow(kTiny, Bits(32, 32, 32));
  const std::string tmp = k3::test::MakeTempDir("k3_lora_eps");
  WriteScaledLoraCopy(tmp + "/k3-tiny", kSteps);
  auto scaled = Model::LoadOrThrow(tmp + "/k3-tiny", Bits(32, 32, 32));
  std::vector<int32_t> prompt = JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
  RunResult a = RunPrompt(*model, Run(false, 32), prompt, 0);
  RunResult b = RunPrompt(*scaled, Run(false, 32), prompt, 0);
  std::filesystem::remove_all(tmp);
  std::vector<float> g = ReadF32File(kOracle + "/k3-tiny.golden/hidden.f32");
  REQUIRE(g.size() == a.trace.size());
  // Layers from the first MLA layer up to the next one: later layers add the
  // second MLA's rounding on top and only blur the estimate.
  const ModelConfig& c = model->config();
  const size_t L = static_cast<size_t>(c.num_hidden_layers);
  const size_t D = static_cast<size_t>(c.hidden_size);
  size_t l0 = 0;
  while (l0 < L && c.is_kda[l0]) ++l0;
  size_t l1 = l0 + 1;
  while (l1 < L && c.is_kda[l1]) ++l1;
  REQUIRE(l0 < L);
  double rd = 0, dd = 0, gg = 0;
  for (size_t t = 0; t < prompt.size(); ++t) {
    for (size_t i = (t * L + l0) * D; i < (t * L + l1) * D; ++i) {
      const double r = double(a.trace[i]) - g[i], d = double(b.trace[i]) - a.trace[i];
      rd += r * d;
      dd += d * d;
      gg += double(g[i]) * g[i];
    }
  }
  const double alpha = rd / dd, eps_seen = 1e-6 / (1.0 - (k - 1) * alpha);
  MESSAGE("on " << IsaStr(quant::ActiveIsa()) << ", layers " << l0 << "-" << l1 - 1
                << ": eps direction rel-L2 " << std::sqrt(dd / gg)
                << ", alpha " << alpha << ": effective LoRA-norm eps " << eps_seen);
  CHECK(std::sqrt(dd / gg) >= 1e-5);  // the scaled copy moves the model (2.9e-5): eps > 0
  CHECK(eps_seen >= 0.4e-6);          // within a factor 2.5 of 1e-6
  CHECK(eps_seen <= 2.5e-6);
}

TEST_CASE("K3_LAYERS truncation: the first layers still match the reference") {
  LoadOptions lo = Bits(32, 32, 32);
  lo.max_layers = 3;
  auto model = Model::LoadOrThrow(kTiny, lo);
  CHECK(model->config().num_hidden_layers == 3);
  std::vector<int32_t> prompt = JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
  const size_t T = prompt.size(), D = 128;
  std::vector<float> trace(T * 3 * D);
  Session s(*model, Run(false, 32));
  ForwardOutputs out;
  out.trace = trace.data();
  s.Forward(prompt, out);
  std::vector<float> g = ReadF32File(kOracle + "/k3-tiny.golden/hidden.f32");
  for (size_t l = 0; l < 3; ++l) {
    std::vector<float> mine, gold;
    for (size_t t = 0; t < T; ++t) {
      mine.insert(mine.end(), trace.begin() + (t * 3 + l) * D, trace.begin() + (t * 3 + l + 1) * D);
      gold.insert(gold.end(), g.begin() + (t * 8 + l) * D, g.begin() + (t * 8 + l + 1) * D);
    }
    CHECK(RelL2(mine.data(), gold.data(), mine.size()) <= kGoldenLayerRelL2);
  }
}

TEST_CASE("prefix reuse: feeding the tail to a kept session equals a fresh full prefill") {
  auto model = Model::LoadOrThrow(kTiny, Bits(32, 32, 32));
  std::vector<int32_t> prompt = JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
  const size_t V = static_cast<size_t>(model->config().vocab_size);
  std::vector<float> fresh(V), reused(V);
  Session a(*model, Run(false, 32));
  ForwardOutputs oa;
  oa.logits_last = fresh.data();
  a.Forward(prompt, oa);
  Session b(*model, Run(false, 32));
  std::span<const int32_t> all(prompt);
  b.Forward(all.first(12), {});
  CHECK(b.history() == std::vector<int32_t>(prompt.begin(), prompt.begin() + 12));
  ForwardOutputs ob;
  ob.logits_last = reused.data();
  b.Forward(all.subspan(12), ob);
  CHECK(b.history() == prompt);
  CHECK(std::memcmp(fresh.data(), reused.data(), V * 4) == 0);
  b.Reset();
  CHECK(b.history().empty());
  CHECK(b.position() == 0);
}
