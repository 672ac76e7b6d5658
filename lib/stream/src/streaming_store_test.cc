// The streaming store against Moonshot's reference logits (k3-tiny.golden, f32
// weights) and bit for bit against the simple pread store, across every
// backend/option combination; plus injected I/O faults that must end in a
// clean k3::Error naming file and offset, or in identical logits.
#include <doctest/doctest.h>
#include <errno.h>
#include <fcntl.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/model/model.h"
#include "k3/stream/streaming_store.h"
#include "k3_test_support.h"

using namespace k3;
using k3::test::RelL2;
using k3::test::ReadF32File;
using namespace k3::model;
using namespace k3::stream;
namespace fs = std::filesystem;

namespace {

const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle";
const std::string kTiny = kOracle + "/k3-tiny";

std::vector<int32_t> PromptIds() {
  std::string text = ReadFileOrThrow(kOracle + "/k3-tiny.golden/greedy.json", 1 << 20);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(text).get(doc) == simdjson::SUCCESS);
  simdjson::dom::array arr;
  REQUIRE(doc["prompt_ids"].get_array().get(arr) == simdjson::SUCCESS);
  std::vector<int32_t> ids;
  for (auto v : arr) ids.push_back(static_cast<int32_t>(int64_t(v.get_int64().value_unsafe())));
  return ids;
}

LoadOptions F32() {
  LoadOptions o;
  o.bits = o.mla_bits = o.head_bits = 32;
  o.bits_explicit = true;
  o.progress = false;
  return o;
}

// Prompt logits at every position, then `ngen` greedy decode steps' logits.
std::vector<float> Run(Model& model, int chunk, int ngen = 4, float topp = 0.0f) {
  const std::vector<int32_t> prompt = PromptIds();
  const size_t V = static_cast<size_t>(model.config().vocab_size);
  std::vector<float> all(prompt.size() * V), last(V);
  RunOptions ro;
  ro.idot = false;
  ro.chunk = chunk;
  ro.topp = topp;
  Session s(model, ro, static_cast<int64_t>(prompt.size()) + ngen);
  ForwardOutputs out;
  out.logits_all = all.data();
  out.logits_last = last.data();
  s.Forward(prompt, out);
  for (int i = 0; i < ngen; ++i) {
    int32_t id = Sampler::Argmax(last);
    ForwardOutputs o2;
    o2.logits_last = last.data();
    s.Forward(std::span<const int32_t>(&id, 1), o2);
    all.insert(all.end(), last.begin(), last.end());
  }
  return all;
}

StreamOptions Quiet(StreamOptions o = {}) {
  o.log_projection = false;
  return o;
}

StreamingExpertStore& Install(Model& model, StreamOptions o) {
  auto store = std::make_unique<StreamingExpertStore>(model.snapshot(), model.config(), o);
  StreamingExpertStore& ref = *store;
  model.SetExpertStore(std::move(store));
  return ref;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// The simple store's logits, computed once: the bit-exact reference.
const std::vector<float>& Baseline() {
  static std::vector<float> base = [] {
    auto model = Model::LoadOrThrow(kTiny, F32());
    return Run(*model, 32);
  }();
  return base;
}

// Copies the tiny model to a fresh directory (shards writable, so tests can
// truncate them and split them over directories).
struct TempModel {
  fs::path root;
  fs::path dir;
  explicit TempModel(const std::string& name) {
    root = fs::temp_directory_path() / ("k3-stream-test-" + std::to_string(::getpid()) + "-" + name);
    fs::remove_all(root);
    dir = root / "a";
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(kTiny)) {
      fs::copy_file(e.path(), dir / e.path().filename());
      fs::permissions(dir / e.path().filename(), fs::perms::owner_read | fs::perms::owner_write);
    }
  }
  ~TempModel() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

}  // namespace

TEST_CASE("the simple store itself matches the oracle golden (f32)") {
  const std::vector<float> golden = ReadF32File(kOracle + "/k3-tiny.golden/logits.f32");
  const std::vector<float>& base = Baseline();
  std::vector<float> prompt_part(base.begin(), base.begin() + static_cast<ptrdiff_t>(golden.size()));
  CHECK(RelL2(prompt_part, golden) <= 1e-4);
}

TEST_CASE("streaming store: bit-identical logits for every backend, mode and budget") {
  const std::vector<float> golden = ReadF32File(kOracle + "/k3-tiny.golden/logits.f32");
  const std::vector<float>& base = Baseline();
  auto model = Model::LoadOrThrow(kTiny, F32());
  const uint64_t slot = ExpertTable::SlotBytesFor(model->config());
  const double layers = static_cast<double>(model->config().num_moe_layers());
  const double one_slot = static_cast<double>(slot) * layers;
  struct Variant {
    const char* name;
    StreamOptions o;
  };
  std::vector<Variant> variants;
  for (bool uring : {true, false}) {
    for (bool direct : {true, false}) {
      for (bool pipe : {true, false}) {
        StreamOptions o = Quiet();
        o.uring = uring;
        o.direct = direct;
        o.pipe = pipe;
        o.budget_bytes = one_slot * 3;
        variants.push_back({"backend/direct/pipe", o});
      }
    }
  }
  for (double slots : {0.0, 1.0, 2.0, 4.0, 7.0, 16.0, 1e6}) {
    StreamOptions o = Quiet();
    o.budget_bytes = one_slot * slots;
    variants.push_back({"budget", o});
  }
  for (int window : {1, 2, 5}) {
    for (int qd : {1, 3}) {
      StreamOptions o = Quiet();
      o.window = window;
      o.queue_depth = qd;
      o.io_threads = qd;
      o.budget_bytes = one_slot;
      variants.push_back({"window/qd", o});
      o.uring = false;
      variants.push_back({"window/threads", o});
    }
  }
  for (bool uring : {true, false}) {
    for (bool direct : {true, false}) {
      StreamOptions o = Quiet();
      o.uring = uring;
      o.direct = direct;
      o.read_chunk_bytes = 4096;  // a 6,528-byte slot in 2-3 pieces
      o.budget_bytes = one_slot;
      variants.push_back({"read chunks", o});
    }
  }
  for (const Variant& v : variants) {
    for (int chunk : {32, 5, 1}) {
      StreamingExpertStore& store = Install(*model, v.o);
      std::vector<float> got = Run(*model, chunk);
      INFO(std::string(v.name) << " uring " << v.o.uring << " direct " << v.o.direct << " pipe " << v.o.pipe
                  << " budget " << v.o.budget_bytes / one_slot << " slots, window " << v.o.window
                  << " qd " << v.o.queue_depth << " chunk " << chunk << " backend "
                  << store.backend());
      CHECK(SameBits(got, base));
      std::vector<float> prompt_part(got.begin(), got.begin() + static_cast<ptrdiff_t>(golden.size()));
      CHECK(RelL2(prompt_part, golden) <= 1e-4);
      CHECK(std::string(store.backend()) == (v.o.uring ? "io_uring" : "pread-pool"));
      CHECK(store.direct() == v.o.direct);
      const StreamStats& st = store.stream_stats();
      CHECK(st.total.misses > 0);
      CHECK(st.total.bytes_read >= st.total.misses * slot);
      CHECK(store.plan().slots_per_layer ==
            std::clamp<int64_t>(static_cast<int64_t>(v.o.budget_bytes / one_slot + 1e-9), 1,
                                model->config().num_experts));
    }
  }
}

TEST_CASE("streaming store: an everything-resident cache reads each expert once") {
  auto model = Model::LoadOrThrow(kTiny, F32());
  StreamOptions o = Quiet();
  o.budget_bytes = 1e12;
  StreamingExpertStore& store = Install(*model, o);
  std::vector<float> a = Run(*model, 32);
  const uint64_t misses = store.stream_stats().total.misses;
  // Read-ahead off nothing and no eviction: the experts read are exactly the
  // distinct ones the run routed to, and the second run routes to no new one.
  const uint64_t distinct = store.stats().distinct_routed;
  CHECK(distinct == misses);
  std::vector<float> b = Run(*model, 32);
  CHECK(SameBits(a, Baseline()));
  CHECK(SameBits(b, Baseline()));
  CHECK(store.stream_stats().total.misses == misses);  // second run: all hits
  CHECK(store.stats().distinct_routed == distinct);
  CHECK(misses <= static_cast<uint64_t>(model->config().num_experts *
                                        model->config().num_moe_layers()));
  // Per-step stats: prefill chunk first, then one step per decode token.
  CHECK(store.stream_stats().steps.size() == 2 * (1 + 4));
}

TEST_CASE("streaming store: K3_DIRS split (shards in two directories)") {
  TempModel tm("dirs");
  fs::path other = tm.root / "b";
  fs::create_directories(other);
  int moved = 0;
  for (const auto& e : fs::directory_iterator(tm.dir)) {
    const std::string name = e.path().filename().string();
    // Every second shard moves to the second directory.
    if (name.find(".safetensors") != std::string::npos && name.find("index") == std::string::npos &&
        (name[10] - '0') % 2 == 0) {
      fs::rename(e.path(), other / name);
      ++moved;
    }
  }
  REQUIRE(moved >= 3);
  Snapshot::Options so;
  so.extra_dirs = SplitDirList(" " + other.string() + " ; /nonexistent-k3-dir");
  auto model = Model::LoadOrThrow(tm.dir.string(), F32(), so);
  for (bool uring : {true, false}) {
    StreamOptions o = Quiet();
    o.uring = uring;
    o.budget_bytes = 0;  // one slot: every layer streams
    StreamingExpertStore& store = Install(*model, o);
    CHECK(SameBits(Run(*model, 32), Baseline()));
    CHECK(store.stream_stats().total.misses > 0);
  }
}

TEST_CASE("K3_TOPP: the routing tail is never read; off (or p >= 1) changes no bit") {
  auto model = Model::LoadOrThrow(kTiny, F32());
  StreamOptions o = Quiet();
  o.budget_bytes = 0;
  StreamingExpertStore& full = Install(*model, o);
  CHECK(SameBits(Run(*model, 32, 4, 1.0f), Baseline()));
  const uint64_t unique_full = full.stream_stats().total.unique_experts;
  const uint64_t bytes_full = full.stream_stats().total.bytes_read;
  // Installing the next store destroys `full` (the model owns its store).
  StreamingExpertStore& cut = Install(*model, o);
  std::vector<float> got = Run(*model, 32, 4, 0.5f);
  const uint64_t unique_cut = cut.stream_stats().total.unique_experts;
  MESSAGE("unique experts per run: top-k " << unique_full << ", K3_TOPP=0.5 " << unique_cut);
  CHECK(unique_cut < unique_full);
  CHECK(cut.stream_stats().total.bytes_read < bytes_full);
  CHECK(cut.stream_stats().total.ahead_used + cut.stream_stats().total.ahead_unused == 0);
  CHECK_FALSE(SameBits(got, Baseline()));
  CHECK(std::all_of(got.begin(), got.end(), [](float v) { return std::isfinite(v); }));
  // The same cut through the simple store: the store never changes the math.
  auto simple = Model::LoadOrThrow(kTiny, F32());
  CHECK(SameBits(Run(*simple, 32, 4, 0.5f), got));
}

TEST_CASE("cache plan: floor of one slot, ceiling of every expert, sized from the machine") {
  auto model = Model::LoadOrThrow(kTiny, F32());
  const ModelConfig& c = model->config();
  const double one = static_cast<double>(ExpertTable::SlotBytesFor(c)) *
                     static_cast<double>(c.num_moe_layers());
  StreamOptions o;
  o.budget_bytes = 0;
  CHECK(PlanCache(c, o, 0, 0).slots_per_layer == 1);
  o.budget_bytes = one * 3.5;
  CHECK(PlanCache(c, o, 0, 0).slots_per_layer == 3);
  o.budget_bytes = 1e15;
  CHECK(PlanCache(c, o, 0, 0).slots_per_layer == c.num_experts);
  o.budget_bytes = -1;  // from the machine: 0.88 x available - reserve
  o.reserve_bytes = 0;
  CachePlan p = PlanCache(c, o, 1000, static_cast<uint64_t>(one * 5 / 0.88) + 10);
  CHECK(p.slots_per_layer == 5);
  CHECK_FALSE(p.from_env);
  CHECK(p.cache_bytes == static_cast<uint64_t>(5 * one));
  o.budget_bytes = one * 10;  // explicit, but the machine holds only 5: lowered
  p = PlanCache(c, o, 1000, static_cast<uint64_t>(one * 5 / 0.88) + 10);
  CHECK(p.slots_per_layer == 5);
  CHECK(p.lowered);
  o.budget_bytes = -1;
  o.reserve_bytes = 1e18;  // nothing left: still one slot
  CHECK(PlanCache(c, o, 0, 1ull << 40).slots_per_layer == 1);
}

// ---------------------------------------------------------------------------
// Fault injection.
namespace {

class ScriptedFaults final : public IoFaultHook {
 public:
  using Fn = std::function<int64_t(const std::string&, uint64_t, uint64_t, bool, int64_t, int)>;
  explicit ScriptedFaults(Fn fn) : fn_(std::move(fn)) {}
  int64_t OnResult(const std::string& path, uint64_t offset, uint64_t len, bool direct,
                   int64_t res) override {
    std::lock_guard<std::mutex> lock(mu_);
    direct_calls_ += direct;
    return fn_(path, offset, len, direct, res, ++calls_);
  }
  int direct_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return direct_calls_;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  Fn fn_;
  int calls_ = 0;
  int direct_calls_ = 0;
};

}  // namespace

TEST_CASE("fault injection: short reads, EAGAIN, EINTR, EINVAL on O_DIRECT give identical logits") {
  auto model = Model::LoadOrThrow(kTiny, F32());
  struct Case {
    const char* name;
    ScriptedFaults::Fn fn;
  };
  std::vector<Case> cases = {
      {"short", [](const std::string&, uint64_t, uint64_t len, bool, int64_t res, int) -> int64_t {
         // Every read that could deliver more than a byte delivers about half.
         return res > 1 ? res / 2 + (len % 3 == 0 ? 1 : 0) : res;
       }},
      {"eagain", [](const std::string&, uint64_t, uint64_t, bool, int64_t res, int call) -> int64_t {
         return call % 2 == 1 ? -EAGAIN : res;
       }},
      {"eintr", [](const std::string&, uint64_t, uint64_t, bool, int64_t res, int call) -> int64_t {
         return call % 3 != 0 ? -EINTR : res;
       }},
      {"einval", [](const std::string&, uint64_t, uint64_t, bool direct, int64_t res, int) -> int64_t {
         // What FUSE does to O_DIRECT: open succeeds, reads are refused.
         return direct ? -EINVAL : res;
       }},
  };
  for (const Case& c : cases) {
    for (bool uring : {true, false}) {
      ScriptedFaults hook(c.fn);
      StreamOptions o = Quiet();
      o.uring = uring;
      o.budget_bytes = 0;
      o.fault_hook = &hook;
      StreamingExpertStore& store = Install(*model, o);
      INFO(std::string(c.name) << " uring " << uring);
      CHECK(SameBits(Run(*model, 7), Baseline()));
      CHECK(hook.calls() > 0);
      const StreamStats& st = store.stream_stats();
      if (std::string(c.name) == "short") CHECK(st.short_reads > 0);
      if (std::string(c.name) == "eagain" || std::string(c.name) == "eintr") CHECK(st.retries > 0);
      if (std::string(c.name) == "einval") {
        // Refused once per shard; from then on that shard is read buffered.
        const int before = hook.direct_calls();
        CHECK(before > 0);
        CHECK(SameBits(Run(*model, 7), Baseline()));
        CHECK(hook.direct_calls() == before);
      }
    }
  }
}

TEST_CASE("fault injection: EIO and endless EAGAIN are k3::Errors naming file and offset") {
  auto model = Model::LoadOrThrow(kTiny, F32());
  for (bool uring : {true, false}) {
    for (bool pipe : {true, false}) {
      std::string bad_path;
      uint64_t bad_offset = 0;
      ScriptedFaults eio([&](const std::string& path, uint64_t offset, uint64_t, bool,
                             int64_t res, int call) -> int64_t {
        if (call != 9) return res;
        bad_path = path;
        bad_offset = offset;
        return -EIO;
      });
      StreamOptions o = Quiet();
      o.uring = uring;
      o.pipe = pipe;
      o.budget_bytes = 0;
      o.fault_hook = &eio;
      Install(*model, o);
      INFO("uring " << uring << " pipe " << pipe);
      bool threw = false;
      try {
        Run(*model, 32);
      } catch (const Error& e) {
        threw = true;
        CHECK(e.code() == ErrorCode::kIo);
        CHECK(e.path() == bad_path);
        CHECK(e.offset() == static_cast<int64_t>(bad_offset));
        CHECK(std::string(e.what()).find("Input/output error") != std::string::npos);
        CHECK(e.object().find("block_sparse_moe.experts.") != std::string::npos);
      }
      CHECK(threw);
    }
  }
  // A store whose pass failed is usable again once the fault is gone.
  bool fail = true;
  ScriptedFaults once([&](const std::string&, uint64_t, uint64_t, bool, int64_t res,
                          int) -> int64_t {
    return fail ? -EIO : res;
  });
  StreamOptions o = Quiet();
  o.budget_bytes = 0;
  o.fault_hook = &once;
  Install(*model, o);
  CHECK_THROWS_AS(Run(*model, 32), Error);
  fail = false;
  CHECK(SameBits(Run(*model, 32), Baseline()));

  ScriptedFaults forever([](const std::string&, uint64_t, uint64_t, bool, int64_t,
                             int) -> int64_t {
    return -EAGAIN;
  });
  o.fault_hook = &forever;
  o.uring = true;
  Install(*model, o);
  try {
    Run(*model, 32);
    FAIL("endless EAGAIN must fail");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kIo);
    CHECK(e.path().find(".safetensors") != std::string::npos);
    CHECK(e.offset() >= 0);
  }
}

TEST_CASE("a shard truncated after load: kTruncated naming the shard and offset") {
  for (bool uring : {true, false}) {
    for (int mode = 0; mode < 3; ++mode) {
      const bool direct = mode != 1;
      TempModel tm("trunc");
      auto model = Model::LoadOrThrow(tm.dir.string(), F32());
      StreamOptions o = Quiet();
      o.uring = uring;
      o.direct = direct;
      o.read_chunk_bytes = mode == 2 ? 4096 : 0;  // pieces past the cut fail too
      o.budget_bytes = 0;
      StreamingExpertStore& store = Install(*model, o);
      // Cut layer 3's expert shard just after its first expert's first byte.
      const ExpertTable& t = store.table();
      const std::string victim = t.path(3, 0);
      uint64_t first = UINT64_MAX;
      for (int64_t e = 0; e < t.num_experts(); ++e) {
        first = std::min(first, t.offset(3, e, ExpertPart::kW1p));
      }
      REQUIRE(::truncate(victim.c_str(), static_cast<off_t>(first + 100)) == 0);
      INFO("uring " << uring << " mode " << mode);
      try {
        Run(*model, 32);
        FAIL("reading a truncated shard must fail");
      } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::kTruncated);
        CHECK(e.path() == victim);
        CHECK(e.offset() >= static_cast<int64_t>(first));
        CHECK(e.offset() <= static_cast<int64_t>(first + 100));
        CHECK(e.object().find("model.layers.3.") != std::string::npos);
      }
    }
  }
}

namespace {

// The MXFP4 bytes behind a view (packed nibbles and E8M0 scales of w1, w2, w3).
std::vector<uint8_t> ViewBytes(const ExpertView& v) {
  std::vector<uint8_t> out;
  for (const quant::WeightView* w : {&v.w1, &v.w2, &v.w3}) {
    const auto* d = static_cast<const uint8_t*>(w->data);
    const auto* g = static_cast<const uint8_t*>(w->e8m0);
    out.insert(out.end(), d, d + w->rows * w->cols / 2);
    out.insert(out.end(), g, g + w->rows * w->cols / 32);
  }
  return out;
}

// One pass of `experts` over `layer`, each compared with the simple store's bytes.
void CheckPass(ExpertStore& store, SimpleExpertStore& ref, int64_t layer,
               const std::vector<int32_t>& experts) {
  store.BeginLayer(layer, experts);
  for (int32_t e : experts) {
    CHECK(ViewBytes(store.Acquire(layer, e)) == ViewBytes(ref.Acquire(layer, e)));
    store.Release(layer, e);
    ref.Release(layer, e);
  }
  store.EndLayer(layer);
}

std::vector<int64_t> MoeLayers(const Model& model) {
  std::vector<int64_t> out;
  const auto& layers = model.weights().layers;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].is_moe) out.push_back(static_cast<int64_t>(l));
  }
  return out;
}

}  // namespace

TEST_CASE("read-ahead: a large window reads its MoE layers ahead; no bit changes") {
  auto model = Model::LoadOrThrow(kTiny, F32());
  const int64_t E = model->config().num_experts;
  const uint64_t slot = ExpertTable::SlotBytesFor(model->config());
  const double one_slot = static_cast<double>(slot) * static_cast<double>(model->config().num_moe_layers());
  for (double slots : {1e6, 5.0, 1.0}) {
    for (bool uring : {true, false}) {
      StreamOptions o = Quiet();
      o.budget_bytes = one_slot * slots;
      o.uring = uring;
      o.ahead = false;
      StreamingExpertStore& off = Install(*model, o);
      CHECK(SameBits(Run(*model, 32), Baseline()));
      const StepStats a = off.stream_stats().total;
      CHECK(a.ahead_used == 0);
      CHECK(a.ahead_unused == 0);
      o.ahead = true;
      StreamingExpertStore& on = Install(*model, o);
      INFO("slots " << slots << " uring " << uring);
      CHECK(SameBits(Run(*model, 32), Baseline()));
      const StepStats b = on.stream_stats().total;
      // The prompt window (> 11 tokens of 4 in 16 experts) reads ahead into
      // each MoE layer's free capacity; the decode steps (one token) do not.
      const int64_t room = std::min<int64_t>(on.plan().slots_per_layer, E);
      CHECK(b.ahead_used > 0);
      CHECK(b.ahead_used + b.ahead_unused <= static_cast<uint64_t>(room * static_cast<int64_t>(MoeLayers(*model).size())));
      // Every read is counted, the unused ones included; a used one is a miss
      // like any other, and nothing is read twice that was not before.
      // (O_DIRECT reads the 4 KiB-aligned superset of a slot: up to 8 KiB more.)
      CHECK(b.misses == a.misses);
      const double extra = static_cast<double>(b.bytes_read) - static_cast<double>(a.bytes_read) -
                           static_cast<double>(b.ahead_unused * slot);
      CHECK(std::abs(extra) <= static_cast<double>((b.misses + b.ahead_unused) * 8192));
      CHECK(on.stream_stats().steps.front().ahead_used == b.ahead_used);  // all in the prompt's step
    }
  }
}

TEST_CASE("read-ahead: the store protocol (adopt, settle, ignore inside a pass)") {
  auto model = Model::LoadOrThrow(kTiny, F32());
  const std::vector<int64_t> moe = MoeLayers(*model);
  REQUIRE(moe.size() >= 2);
  const int32_t E = static_cast<int32_t>(model->config().num_experts);
  REQUIRE(E >= 8);
  SimpleExpertStore ref(model->snapshot(), model->config());
  for (bool uring : {true, false}) {
    StreamOptions o = Quiet();
    o.budget_bytes = 1e12;
    o.uring = uring;
    StreamingExpertStore store(model->snapshot(), model->config(), o);
    INFO("uring " << uring);
    // Layer A: read ahead 0..5, the pass uses 3..7 (so 3 adopted, 3 unused,
    // 2 ordinary misses), in an order of its own.
    const int64_t A = moe[0], B = moe[1];
    std::vector<int32_t> ahead = {0, 1, 2, 3, 4, 5};
    store.Prefetch(A, ahead);
    std::vector<int32_t> pass = {7, 3, 5, 6, 4};
    store.BeginLayer(A, pass);
    store.Prefetch(B, ahead);  // inside a pass: ignored
    CHECK(store.stream_stats().total.ahead_unused == 3);  // only A's own three so far
    for (int32_t e : pass) {
      CHECK(ViewBytes(store.Acquire(A, e)) == ViewBytes(ref.Acquire(A, e)));
      store.Release(A, e);
      ref.Release(A, e);
    }
    store.EndLayer(A);
    StepStats s = store.stream_stats().total;
    CHECK(s.ahead_used == 3);
    CHECK(s.ahead_unused == 3);
    CHECK(s.misses == 5);
    CHECK(s.bytes_read >= 8 * store.table().slot_bytes());
    CHECK(s.bytes_read <= 8 * (store.table().slot_bytes() + 8192));
    // Layer A again: the adopted experts went into the cache like any miss.
    store.BeginLayer(A, std::vector<int32_t>{3, 4, 5, 6, 7});
    for (int32_t e : {3, 4, 5, 6, 7}) {
      store.Acquire(A, e);
      store.Release(A, e);
    }
    store.EndLayer(A);
    CHECK(store.stream_stats().total.hits == 5);
    // A read-ahead of B, then one of another layer before B's pass: B's
    // reads are settled (waited for, counted unused), the cached ones skipped.
    store.Prefetch(B, std::vector<int32_t>{0, 1});
    store.Prefetch(A, std::vector<int32_t>{0, 1, 2, 3});  // 3 is cached: skipped
    s = store.stream_stats().total;
    CHECK(s.ahead_unused == 5);
    CheckPass(store, ref, A, {2, 3});
    s = store.stream_stats().total;
    CHECK(s.ahead_used == 4);
    CHECK(s.ahead_unused == 7);  // 0 and 1 of the second read-ahead of A
  }
}

TEST_CASE("read-ahead: a failed read-ahead read is the pass's error; unused, it is dropped") {
  auto model = Model::LoadOrThrow(kTiny, F32());
  const int64_t A = MoeLayers(*model).at(0);
  std::atomic<bool> fail{true};
  std::string bad_path;
  ScriptedFaults eio([&](const std::string& path, uint64_t, uint64_t, bool, int64_t res,
                         int) -> int64_t {
    if (!fail.load()) return res;
    bad_path = path;
    return -EIO;
  });
  StreamOptions o = Quiet();
  o.budget_bytes = 1e12;
  o.fault_hook = &eio;
  StreamingExpertStore store(model->snapshot(), model->config(), o);
  store.Prefetch(A, std::vector<int32_t>{1, 2});
  // Expert 2 unused: its error is never seen. Expert 1 used: the pass fails
  // naming the shard and the expert.
  store.BeginLayer(A, std::vector<int32_t>{1});
  try {
    store.Acquire(A, 1);
    FAIL("the read-ahead's EIO must surface");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kIo);
    CHECK(e.path() == bad_path);
    CHECK(e.object().find("block_sparse_moe.experts.1.") != std::string::npos);
  }
  CHECK(store.stream_stats().total.ahead_unused == 1);  // expert 2, waited for and dropped
  fail.store(false);
  // The store is usable again: the next pass reads afresh.
  SimpleExpertStore ref(model->snapshot(), model->config());
  CheckPass(store, ref, A, {1, 2});
}
