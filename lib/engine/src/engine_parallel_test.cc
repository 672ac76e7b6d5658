// Many requests at once (EngineOptions::parallel, docs/engine.md "Steps"):
// shuffled concurrent runs of mixed requests -- raw and chat, greedy and
// seeded, tools and a JSON schema, a long prompt sliced across steps, two
// conversations with one prefix and other tails, ignore_eos, a cancel in the
// middle -- give every request the ids and text it gets alone on a
// one-at-a-time engine, byte for byte; admission refuses what can never fit
// and holds back what does not fit now.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "k3/core/error.h"
#include "k3/engine/engine.h"
#include "k3_engine_test_support.h"

using namespace k3;
using namespace k3::engine;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";

EngineOptions Options(int parallel, int64_t step_tokens) {
  EngineOptions o;
  o.model_dir = kTiny;
  o.progress = false;
  o.load.expert_cache_bytes = 0;
  o.threads = 1;
  o.parallel = parallel;
  o.step_tokens = step_tokens;
  return o;
}

std::vector<int32_t> RandomIds(size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(0, 2047);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = d(rng);
  return ids;
}

struct Case {
  std::string what;
  GenerateRequest req;
  int cancel_after = 0;  // deltas, then on_delta says the client is gone
};

GenerateRequest Chat(Engine& e, const std::string& user, bool thinking, int64_t max_tokens,
                     float temperature, uint64_t seed) {
  return test::ChatRequest(e, user, thinking, max_tokens, temperature, seed);
}

std::vector<Case> Cases(Engine& e) {
  std::mt19937_64 rng(2026);
  std::vector<Case> cs;
  auto raw = [&](std::string what, size_t prompt, int64_t max_tokens, float temp, uint64_t seed) {
    Case c;
    c.what = std::move(what);
    c.req.prompt_ids = RandomIds(prompt, rng);
    c.req.max_tokens = max_tokens;
    c.req.sampling.temperature = temp;
    c.req.sampling.top_p = temp > 0 ? 0.9f : 1.0f;
    c.req.sampling.seed = seed;
    return c;
  };
  cs.push_back(raw("raw greedy", 20, 24, 0.0f, 1));
  cs.push_back(raw("raw seeded sampling", 33, 30, 1.0f, 7));
  cs.push_back(raw("a long prompt (sliced across steps)", 300, 8, 0.0f, 1));
  Case ign = raw("ignore_eos, seeded", 12, 20, 0.8f, 3);
  ign.req.ignore_eos = true;
  cs.push_back(ign);
  // One prefix, two tails: neither may see the other's state.
  Case a = raw("shared prefix, tail A", 60, 16, 0.0f, 1);
  Case b = a;
  b.what = "shared prefix, tail B";
  const std::vector<int32_t> ta = RandomIds(9, rng), tb = RandomIds(14, rng);
  a.req.prompt_ids.insert(a.req.prompt_ids.end(), ta.begin(), ta.end());
  b.req.prompt_ids.insert(b.req.prompt_ids.end(), tb.begin(), tb.end());
  cs.push_back(a);
  cs.push_back(b);
  // Chat: a required tool call with a schema (seeded), a JSON schema answer (greedy),
  // thinking with a stop string.
  Case tools;
  tools.what = "chat, a required tool call";
  tools.req = Chat(e, "Weather in Paris?", true, 90, 1.0f, 2);
  auto spec = std::make_shared<StructuredOutput>();
  spec->tools.push_back(
      {"get_weather",
       constrain::Schema::CompileOrThrow(
           R"({"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},)"
           R"("required":["city","unit"]})")});
  spec->calls = StructuredOutput::Calls::kRequired;
  tools.req.structured = spec;
  cs.push_back(tools);
  Case json;
  json.what = "chat, a JSON schema answer";
  json.req = Chat(e, "Answer in JSON.", false, 60, 0.0f, 1);
  auto js = std::make_shared<StructuredOutput>();
  js->response = constrain::Schema::CompileOrThrow(
      R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  json.req.structured = js;
  cs.push_back(json);
  Case think;
  think.what = "chat, thinking, a stop string";
  think.req = Chat(e, "Say something.", true, 40, 1.0f, 11);
  think.req.stop = {"e"};
  cs.push_back(think);
  Case cancel = raw("cancelled after 5 deltas", 25, 200, 1.0f, 5);
  cancel.req.ignore_eos = true;
  cancel.cancel_after = 5;
  cs.push_back(cancel);
  return cs;
}

struct Got {
  GenerateResult res;
  std::string streamed;
  int deltas = 0;
};

Got RunOne(Engine& e, const Case& c) {
  Got g;
  Callbacks cb;
  cb.on_delta = [&](const Delta& d) {
    g.streamed += d.reasoning + "|" + d.content;
    for (const ToolCallDelta& t : d.tool_calls) g.streamed += "#" + t.name + t.arguments;
    return c.cancel_after == 0 || ++g.deltas < c.cancel_after;
  };
  g.res = e.Generate(c.req, cb);
  return g;
}

}  // namespace

TEST_CASE("shuffled concurrent requests give every request its alone answer, byte for byte") {
  auto alone = Engine::LoadOrThrow(Options(1, 512));
  const std::vector<Case> cases = Cases(*alone);
  std::vector<Got> ref;
  for (const Case& c : cases) ref.push_back(RunOne(*alone, c));
  // The cancelled request stopped where its client left.
  CHECK(ref.back().res.finish == FinishReason::kCancelled);

  for (int64_t step : {int64_t{64}, int64_t{7}}) {
    auto many = Engine::LoadOrThrow(Options(4, step));
    for (int round = 0; round < 2; ++round) {
      CAPTURE(step);
      CAPTURE(round);
      std::vector<size_t> order(cases.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::mt19937_64 rng(static_cast<uint64_t>(step * 10 + round));
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<Got> got(cases.size());
      std::vector<std::thread> threads;
      for (size_t k = 0; k < order.size(); ++k) {
        const size_t i = order[k];
        const int delay_ms = static_cast<int>(rng() % 30);
        threads.emplace_back([&, i, delay_ms] {
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          got[i] = RunOne(*many, cases[i]);
        });
      }
      for (std::thread& t : threads) t.join();
      for (size_t i = 0; i < cases.size(); ++i) {
        CAPTURE(cases[i].what);
        CHECK(got[i].res.ids == ref[i].res.ids);
        CHECK(got[i].streamed == ref[i].streamed);
        CHECK(got[i].res.content == ref[i].res.content);
        CHECK(got[i].res.reasoning == ref[i].res.reasoning);
        CHECK(got[i].res.finish == ref[i].res.finish);
        CHECK(got[i].res.stop_matched == ref[i].res.stop_matched);
        REQUIRE(got[i].res.tool_calls.size() == ref[i].res.tool_calls.size());
        for (size_t t = 0; t < got[i].res.tool_calls.size(); ++t) {
          CHECK(got[i].res.tool_calls[t].arguments_json == ref[i].res.tool_calls[t].arguments_json);
        }
      }
    }
    // They ran together: steps held several sequences, and prompt slices rode with decode rows.
    const Engine::StepStats st = many->step_stats();
    CHECK(st.parallel == 4);
    CHECK(st.max_sequences >= 2);
    CHECK(st.decode_rows < st.rows);
    CHECK(st.running == 0);
    CHECK(st.reserved_bytes == 0);
  }
}

TEST_CASE("parallel 0: as many sequences as the budget holds at 32768 positions, 1 to 4") {
  EngineOptions o = Options(0, 64);
  uint64_t per = 0;
  {
    auto probe = Engine::LoadOrThrow(Options(1, 64));
    const int64_t tokens = std::min(AutoParallel::kTokens, probe->context_limit());
    per = probe->RequestBytes(tokens - 1, 1);
  }
  for (const auto& [budget, want] :
       {std::pair{0.5, 1}, {1.0, 1}, {2.5, 2}, {3.99, 3}, {100.0, 4}}) {
    CAPTURE(budget);
    o.sequence_budget_bytes = budget * static_cast<double>(per);
    auto e = Engine::LoadOrThrow(o);
    CHECK(e->step_stats().parallel == want);
    CHECK(e->options().parallel == want);
    const AutoParallel a =
        AutoParallelFor(static_cast<uint64_t>(o.sequence_budget_bytes), per, 4096);
    CHECK(a.parallel == want);
    CHECK(a.why.find(std::to_string(want) + (want == 1 ? " sequence " : " sequences ")) == 0);
  }
  // One sequence is a one-at-a-time engine (prompts in windows, no steps).
  o.sequence_budget_bytes = 0.5 * static_cast<double>(per);
  auto one = Engine::LoadOrThrow(o);
  GenerateRequest r;
  r.prompt_ids = {1, 2, 3};
  r.max_tokens = 3;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  CHECK(one->Generate(r).ids.size() == 3);
  CHECK(one->step_stats().steps == 0);
}

TEST_CASE("admission: a request that can never fit is refused, one that does not fit now waits") {
  EngineOptions o = Options(2, 64);
  {
    auto probe = Engine::LoadOrThrow(o);
    // Room for one request of 40 + 40 positions, not two.
    o.sequence_budget_bytes = 1.5 * static_cast<double>(probe->RequestBytes(40, 40));
  }
  auto e = Engine::LoadOrThrow(o);
  GenerateRequest big;
  big.prompt_ids.assign(100, 5);
  big.max_tokens = 400;
  big.sampling.temperature = 0;
  try {
    e->Generate(big);
    FAIL("not refused");
  } catch (const Error& err) {
    CHECK(err.code() == ErrorCode::kNoSpace);
    CHECK(std::string(err.what()).find("sequence state") != std::string::npos);
  }
  std::mt19937_64 rng(1);
  GenerateRequest a, b;
  a.prompt_ids = RandomIds(40, rng);
  b.prompt_ids = RandomIds(40, rng);
  a.max_tokens = b.max_tokens = 40;
  a.sampling.temperature = b.sampling.temperature = 0;
  a.ignore_eos = b.ignore_eos = true;
  GenerateResult ra, rb;
  std::thread ta([&] { ra = e->Generate(a); });
  std::thread tb([&] { rb = e->Generate(b); });
  ta.join();
  tb.join();
  CHECK(ra.ids.size() == 40);
  CHECK(rb.ids.size() == 40);
  const Engine::StepStats st = e->step_stats();
  CHECK(st.admission_waits == 1);
  CHECK(st.max_sequences == 1);  // never together: the second waited for the first
  auto solo = Engine::LoadOrThrow(Options(1, 64));
  CHECK(solo->Generate(a).ids == ra.ids);
  CHECK(solo->Generate(b).ids == rb.ids);
}
