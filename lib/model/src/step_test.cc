// Steps over several sequences (Session::Step, continuous batching): every
// sequence gets, slice by slice, the bits it gets fed alone, whatever rides
// in the same step (other prompts' slices, other sequences' decode rows, a
// sequence with the same prefix and another tail), in any order, on any
// executor; bad steps are refused before any state moves.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/model/model.h"
#include "k3_test_support.h"
#include "test_models.h"

using namespace k3;
using namespace k3::model;

namespace {

const std::string& kTiny = test::kTinyModel;
using test::RandomIds;
using test::ScramblingExecutor;
LoadOptions Load(int bits) { return test::TinyLoad(bits); }

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("a step gives every sequence the bits it gets alone") {
  const std::string& shuffled = test::ShuffledTinyFixture();
  struct Variant {
    const char* what;
    std::string dir;
    int bits;
    bool idot;
    float topp;
    int threads;
    bool scramble;
  };
  const std::vector<Variant> variants = {
      {"oracle tiny, f32 weights and activations", kTiny, 32, false, 0.0f, 1, false},
      {"oracle tiny, int4 + IDOT, K3_TOPP 0.7, 2 threads", kTiny, 4, true, 0.7f, 2, false},
      {"fixture tiny (experts shuffled on disk), int8 + IDOT", shuffled, 8, true, 0.0f, 1, false},
      {"oracle tiny, int8, pairs delivered in any order", kTiny, 8, true, 0.0f, 1, true},
  };
  for (const Variant& v : variants) {
    CAPTURE(v.what);
    omp_set_num_threads(v.threads);
    auto m = Model::LoadOrThrow(v.dir, Load(v.bits));
    if (v.scramble) m->SetExpertExecutor(std::make_unique<ScramblingExecutor>(m->config()));
    const ModelConfig& c = m->config();
    const size_t V = static_cast<size_t>(c.vocab_size);
    RunOptions ro;
    ro.idot = v.idot;
    ro.topp = v.topp;
    std::mt19937_64 rng(v.bits * 31 + v.threads);
    // Five streams: a long prompt, short ones, and two that share a 50-id
    // prefix and differ after it (no sequence may see another's state).
    std::vector<std::vector<int32_t>> streams;
    for (size_t n : {130u, 9u, 64u, 1u}) streams.push_back(RandomIds(n, c.vocab_size, rng));
    streams.push_back(streams[0]);
    streams.back().resize(50);
    const std::vector<int32_t> tail = RandomIds(40, c.vocab_size, rng);
    streams.back().insert(streams.back().end(), tail.begin(), tail.end());

    // Alone: each stream in one Forward, logits at every position, routing recorded.
    std::vector<std::vector<float>> ref(streams.size());
    std::vector<std::vector<RoutingRecord>> ref_routing(streams.size());
    for (size_t i = 0; i < streams.size(); ++i) {
      ref[i].resize(streams[i].size() * V);
      Session s(*m, ro);
      s.RecordRouting(true);
      ForwardOutputs out;
      out.logits_all = ref[i].data();
      s.Forward(streams[i], out);
      ref_routing[i] = s.routing();
    }

    // Stepped: random subsets in random order, each a slice of 1..24 ids of
    // what its stream has left (a decode row when 1), over sessions that share one work space.
    std::vector<std::unique_ptr<Session>> seqs;
    for (size_t i = 0; i < streams.size(); ++i) {
      seqs.push_back(std::make_unique<Session>(*m, ro, 0, i == 0 ? nullptr : seqs[0].get()));
      seqs.back()->RecordRouting(true);
    }
    std::vector<size_t> done(streams.size(), 0);
    std::vector<std::vector<float>> got(streams.size(), std::vector<float>(V));
    int steps = 0, multi = 0;
    for (;;) {
      std::vector<size_t> live;
      for (size_t i = 0; i < streams.size(); ++i) {
        if (done[i] < streams[i].size()) live.push_back(i);
      }
      if (live.empty()) break;
      std::shuffle(live.begin(), live.end(), rng);
      live.resize(1 + rng() % live.size());
      std::vector<Session::StepSlice> slices;
      std::vector<size_t> ends;
      for (size_t i : live) {
        const size_t left = streams[i].size() - done[i];
        const size_t n = rng() % 3 == 0 ? 1 : std::min(left, 1 + rng() % 24);
        Session::StepSlice sl;
        sl.session = seqs[i].get();
        sl.ids = std::span<const int32_t>(streams[i].data() + done[i], n);
        sl.logits_last = got[i].data();
        slices.push_back(sl);
        ends.push_back(done[i] + n);
      }
      Session::Step(slices);
      ++steps;
      multi += slices.size() > 1;
      for (size_t k = 0; k < live.size(); ++k) {
        const size_t i = live[k];
        CAPTURE(i);
        CAPTURE(ends[k]);
        CHECK(seqs[i]->position() == static_cast<int64_t>(ends[k]));
        CHECK(SameBits(got[i].data(), ref[i].data() + (ends[k] - 1) * V, V));
        done[i] = ends[k];
      }
    }
    CHECK(multi > 5);
    for (size_t i = 0; i < streams.size(); ++i) {
      CHECK(seqs[i]->history() == streams[i]);
      const auto& r = seqs[i]->routing();
      REQUIRE(r.size() == ref_routing[i].size());
      // The same decisions, per (layer, position), whatever the step order.
      auto key = [](const RoutingRecord& a, const RoutingRecord& b) {
        return a.position != b.position ? a.position < b.position : a.layer < b.layer;
      };
      std::vector<RoutingRecord> a = r, b = ref_routing[i];
      std::stable_sort(a.begin(), a.end(), key);
      std::stable_sort(b.begin(), b.end(), key);
      for (size_t j = 0; j < a.size(); ++j) {
        CHECK(a[j].experts == b[j].experts);
        CHECK(a[j].weights == b[j].weights);
      }
    }
    // A sequence's next Forward alone continues it as if it had been fed alone.
    std::vector<float> last(V), want(V);
    const std::vector<int32_t> more = RandomIds(5, c.vocab_size, rng);
    ForwardOutputs out;
    out.logits_last = last.data();
    seqs[2]->Forward(more, out);
    Session alone(*m, ro);
    std::vector<int32_t> all = streams[2];
    all.insert(all.end(), more.begin(), more.end());
    ForwardOutputs o2;
    o2.logits_last = want.data();
    alone.Forward(all, o2);
    CHECK(SameBits(last.data(), want.data(), V));
  }
  omp_set_num_threads(1);
}

TEST_CASE("a bad step is refused before any state moves") {
  auto m = Model::LoadOrThrow(kTiny, Load(32));
  const ModelConfig& c = m->config();
  RunOptions ro;
  Session a(*m, ro), b(*m, ro, 0, &a);
  const std::vector<int32_t> ok = {1, 2, 3}, bad = {4, static_cast<int32_t>(c.vocab_size)};
  auto refused = [&](std::vector<Session::StepSlice> slices, const char* what) {
    CAPTURE(what);
    try {
      Session::Step(slices);
      FAIL("not refused");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kInvalidArgument);
    }
    CHECK(a.position() == 0);
    CHECK(b.position() == 0);
  };
  refused({{&a, ok, nullptr}, {&b, bad, nullptr}}, "an id outside the vocabulary");
  refused({{&a, ok, nullptr}, {&a, ok, nullptr}}, "one session twice");
  refused({{&a, ok, nullptr}, {&b, {}, nullptr}}, "an empty slice");
  RunOptions other = ro;
  other.idot = !ro.idot;
  Session d(*m, other);
  refused({{&a, ok, nullptr}, {&d, ok, nullptr}}, "two activation choices");
  Session::Step({});  // nothing: nothing happens
  Session::Step(std::vector<Session::StepSlice>{{&a, ok, nullptr}, {&b, ok, nullptr}});
  CHECK(a.position() == 3);
  CHECK(b.position() == 3);
}
