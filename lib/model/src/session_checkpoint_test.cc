// Session checkpoints: restoring a checkpoint and feeding the tail
// is bit-identical to feeding the whole prompt, on every ISA this CPU runs,
// chunk sizes 1, 7 and 32, f32 and quantized weights, IDOT on and off; and
// the restored path also matches Moonshot's reference (the oracle's
// incremental KimiDynamicCache logits), so the test does not only compare us
// with ourselves. A checkpoint of another model or other options is refused
// before any state moves; two checkpoints of one conversation share MLA rows.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <cstring>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/model/model.h"
#include "k3/model/session_state.h"
#include "k3/quant/isa.h"
#include "k3_model_test_support.h"
#include "k3_test_json.h"
#include "k3_test_support.h"

using namespace k3;
using namespace k3::model;
using k3::test::ReadF32File;
using k3::test::JsonIds;
using k3::test::RelL2;

namespace {

const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle";
const std::string kTiny = kOracle + "/k3-tiny";

using k3::test::Bits;
using k3::test::Run;

// The oracle prompt followed by its greedy continuation: 36 ids whose logits
// the oracle gives at positions 0..34.
std::vector<int32_t> OracleIds() {
  std::vector<int32_t> ids = JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "prompt_ids");
  std::vector<int32_t> g = JsonIds(kOracle + "/k3-tiny.golden/greedy.json", "greedy_ids");
  ids.insert(ids.end(), g.begin(), g.end());
  return ids;
}

// Logits at every position of `ids[from..]` fed into `s`.
std::vector<float> Feed(Session& s, const std::vector<int32_t>& ids, size_t from, size_t vocab) {
  std::vector<float> logits((ids.size() - from) * vocab);
  ForwardOutputs out;
  out.logits_all = logits.data();
  s.Forward(std::span<const int32_t>(ids).subspan(from), out);
  return logits;
}

bool SameBits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; }

}  // namespace

TEST_CASE("restore + tail == full prefill bit for bit: every ISA, chunks 1/7/32, f32 and int4") {
  const std::vector<int32_t> ids = OracleIds();
  const size_t T = ids.size();
  const std::vector<float> oracle_prompt = ReadF32File(kOracle + "/k3-tiny.golden/logits.f32");
  const std::vector<float> oracle_greedy =
      ReadF32File(kOracle + "/k3-tiny.golden/greedy_logits.f32");
  const quant::Isa saved = quant::ActiveIsa();
  int isas = 0;
  for (quant::Isa isa : quant::kAllIsas) {
    if (!quant::IsaSupported(isa)) continue;
    ++isas;
    quant::SetIsaForTesting(isa);
    for (int bits : {32, 4}) {
      auto model = Model::LoadOrThrow(kTiny, bits == 32 ? Bits(32, 32, 32) : Bits(4, 8, 8));
      const size_t V = static_cast<size_t>(model->config().vocab_size);
      REQUIRE(oracle_prompt.size() == 20 * V);
      REQUIRE(oracle_greedy.size() == 16 * V);
      for (bool idot : {false, true}) {
        if (bits == 32 && idot) continue;  // f32 weights never take int8 activations
        for (int chunk : {1, 7, 32}) {
          INFO("isa " << quant::IsaName(isa) << " bits " << bits << " idot " << idot << " chunk "
                      << chunk);
          const RunOptions ro = Run(idot, chunk);
          Session full(*model, ro, static_cast<int64_t>(T));
          const std::vector<float> ref = Feed(full, ids, 0, V);
          for (size_t p : {size_t{7}, size_t{20}, T - 1}) {
            INFO("checkpoint at " << p);
            Session a(*model, ro, 4);  // a small cache: the MLA rows grow past it
            a.Forward(std::span<const int32_t>(ids).first(p), {});
            auto ck = a.SaveCheckpoint();
            REQUIRE(ck->position == static_cast<int64_t>(p));
            // A session with other state in it: the restore must replace all of it.
            Session b(*model, ro, 0);
            b.Forward(std::span<const int32_t>(ids).last(5), {});
            b.RestoreCheckpoint(*ck);
            CHECK(b.position() == static_cast<int64_t>(p));
            CHECK(b.history() == std::vector<int32_t>(ids.begin(), ids.begin() + p));
            const std::vector<float> tail = Feed(b, ids, p, V);
            CHECK(SameBits(tail.data(), ref.data() + p * V, (T - p) * V));
            if (p == 20) {
              // Saving did not disturb the session it was taken from.
              const std::vector<float> cont = Feed(a, ids, p, V);
              CHECK(SameBits(cont.data(), ref.data() + p * V, (T - p) * V));
            }
            if (bits == 32) {
              // Moonshot's reference: prompt logits at positions < 20, then the
              // incremental cache's step logits at 19 + i.
              for (size_t t = p; t + 1 < T; ++t) {
                const float* g = t < 20 ? oracle_prompt.data() + t * V
                                        : oracle_greedy.data() + (t - 19) * V;
                CHECK(RelL2(tail.data() + (t - p) * V, g, V) <= 1e-4);
              }
            }
          }
        }
      }
    }
  }
  quant::SetIsaForTesting(saved);
  CHECK(isas >= 1);
}

TEST_CASE("checkpoints of one conversation share their MLA rows; a chain restores exactly") {
  auto model = Model::LoadOrThrow(kTiny, Bits(4, 8, 8));
  const std::vector<int32_t> ids = OracleIds();
  const size_t T = ids.size();
  const size_t V = static_cast<size_t>(model->config().vocab_size);
  const RunOptions ro = Run(true, 7);
  Session full(*model, ro, 0);
  const std::vector<float> ref = Feed(full, ids, 0, V);

  Session a(*model, ro, 0);
  a.Forward(std::span<const int32_t>(ids).first(10), {});
  auto c10 = a.SaveCheckpoint();
  a.Forward(std::span<const int32_t>(ids).subspan(10, 12), {});
  auto c22 = a.SaveCheckpoint();
  const StateLayout lay = StateLayout::For(model->config());
  REQUIRE(c22->mla.size() == 2);
  CHECK(c22->mla[0].get() == c10->mla[0].get());  // shared, not copied
  CHECK(c22->mla[1]->begin == 10);
  CHECK(c22->mla[1]->bytes() == 12 * lay.mla_bytes_per_token());
  CHECK(c22->kda_bytes() == lay.kda_bytes());
  CHECK(c22->mla_bytes() == 22 * lay.mla_bytes_per_token());

  // Restore the first, feed a different branch, checkpoint: the branch must not
  // reuse c22's second segment.
  Session b(*model, ro, 0);
  b.RestoreCheckpoint(*c10);
  std::vector<int32_t> branch(ids.begin(), ids.begin() + 10);
  branch.insert(branch.end(), {5, 6, 7});
  b.Forward(std::span<const int32_t>(branch).subspan(10), {});
  auto cb = b.SaveCheckpoint();
  REQUIRE(cb->mla.size() == 2);
  CHECK(cb->mla[0].get() == c10->mla[0].get());
  CHECK(cb->mla[1].get() != c22->mla[1].get());
  CHECK(cb->mla[1]->ids == std::vector<int32_t>{5, 6, 7});

  // Chain: restore c22 into a third session, feed 5, checkpoint, restore that
  // into a fourth, feed the rest: still the full prefill's bits.
  Session c(*model, ro, 0);
  c.RestoreCheckpoint(*c22);
  c.Forward(std::span<const int32_t>(ids).subspan(22, 5), {});
  auto c27 = c.SaveCheckpoint();
  CHECK(c27->mla.size() == 3);
  CHECK(c27->mla[1].get() == c22->mla[1].get());
  Session d(*model, ro, 0);
  d.RestoreCheckpoint(*c27);
  const std::vector<float> tail = Feed(d, ids, 27, V);
  CHECK(SameBits(tail.data(), ref.data() + 27 * V, (T - 27) * V));
  for (int64_t r = 0; r < 27; ++r) {
    // Row lookup across segments agrees with the segment that holds it.
    CHECK(c27->MlaRow(0, r) != nullptr);
  }
  // After a Reset, segments are reused only as far as the new ids agree with
  // them (the same ids give the same rows): c10's, not c22's second one.
  c.Reset();
  c.Forward(std::span<const int32_t>(branch).first(11), {});
  auto fresh = c.SaveCheckpoint();
  REQUIRE(fresh->mla.size() == 2);
  CHECK(fresh->mla[0].get() == c10->mla[0].get());
  CHECK(fresh->mla[1]->begin == 10);
  CHECK(fresh->mla[1]->end == 11);
  c.Reset();
  c.Forward(std::span<const int32_t>(branch).subspan(1, 4), {});
  auto other = c.SaveCheckpoint();
  REQUIRE(other->mla.size() == 1);
  CHECK(other->mla[0].get() != c10->mla[0].get());
}

TEST_CASE("a checkpoint of another model or other options is refused before any state moves") {
  auto m4 = Model::LoadOrThrow(kTiny, Bits(4, 8, 8));
  auto m8 = Model::LoadOrThrow(kTiny, Bits(8, 8, 8));
  const std::vector<int32_t> ids = OracleIds();
  Session a(*m4, Run(true, 32), 0);
  a.Forward(std::span<const int32_t>(ids).first(12), {});
  auto ck = a.SaveCheckpoint();
  CHECK(ck->fingerprint.model.size() == 32);
  CHECK(ck->fingerprint.options.find("idot=1 chunk=32") == 0);

  auto refused = [&](Session& s, const char* what) {
    const int64_t pos = s.position();
    try {
      s.RestoreCheckpoint(*ck);
      FAIL("restored a checkpoint of " << what);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kInvalidArgument);
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
    CHECK(s.position() == pos);
  };
  Session other_bits(*m8, Run(true, 32), 0);
  other_bits.Forward(std::span<const int32_t>(ids).first(3), {});
  refused(other_bits, "another model");
  Session other_idot(*m4, Run(false, 32), 0);
  refused(other_idot, "other options");
  Session other_chunk(*m4, Run(true, 7), 0);
  refused(other_chunk, "other options");
  RunOptions topp = Run(true, 32);
  topp.topp = 0.5f;
  Session other_topp(*m4, topp, 0);
  refused(other_topp, "other options");

  // Same model loaded twice: same identity, so the restore is accepted.
  auto m4b = Model::LoadOrThrow(kTiny, Bits(4, 8, 8));
  Session same(*m4b, Run(true, 32), 0);
  same.RestoreCheckpoint(*ck);
  CHECK(same.position() == 12);

  // A tampered layout is refused too.
  SessionCheckpoint bad = *ck;
  bad.kda.pop_back();
  Session s(*m4, Run(true, 32), 0);
  CHECK_THROWS_AS(s.RestoreCheckpoint(bad), Error);
  CHECK(s.position() == 0);
}
