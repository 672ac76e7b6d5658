// Engine::Generate on the oracle's tiny K3: tokens equal Moonshot's greedy
// reference and what k3-run generate produced before the engine existed; prefix
// reuse; cancel mid-prefill (between chunks and inside one) and mid-decode
// leave an engine that gives the same answer afterwards; stop strings split
// over tokens; the context limit; bad requests refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/engine/engine.h"
#include "k3_engine_test_support.h"
#include "k3/model/model.h"
#include "k3/quant/isa.h"

using namespace k3;
using namespace k3::engine;
using k3::test::Greedy;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";
// tests/data/oracle/k3-tiny.golden/greedy.json (Moonshot's reference, f32).
const std::vector<int32_t> kPrompt = {2048, 2051, 765, 1888, 786,  2053, 788,  2033, 691,  295,
                                      278,  603,  1682, 2052, 763, 2053, 2051, 2014, 428,  2053};
const std::vector<int32_t> kGreedy = {860, 2302, 84,  2171, 594,  74,   1683, 1439,
                                      2176, 1046, 942, 231,  1259, 1277, 616,  1258};

EngineOptions Options(bool f32, int chunk = 32) {
  EngineOptions o;
  o.model_dir = kTiny;
  o.progress = false;
  o.load.expert_cache_bytes = 0;
  // One compute thread: on a loaded 2-CPU CI machine OpenMP's spinning barriers
  // make the tiny model 10x slower; results do not depend on the thread count.
  o.threads = 1;
  if (f32) {
    o.load.bits = o.load.mla_bits = o.load.head_bits = 32;
    o.run.idot = false;  // the configuration of the oracle goldens
  }
  o.run.chunk = chunk;
  return o;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("engine greedy tokens equal Moonshot's reference, for any prefill chunk") {
  for (int chunk : {32, 7, 1}) {
    CAPTURE(chunk);
    auto e = Engine::LoadOrThrow(Options(true, chunk));
    GenerateResult r = e->Generate(Greedy(kPrompt, 16));
    CHECK(r.ids == kGreedy);
    CHECK(r.finish == FinishReason::kLength);
    CHECK_FALSE(r.context_limited);
    CHECK(r.usage.prompt_tokens == 20);
    CHECK(r.usage.completion_tokens == 16);
    CHECK(r.usage.cached_tokens == 0);
    CHECK(r.timings.ttft_s > 0);
    CHECK(r.experts.hits + r.experts.misses > 0);
  }
}

TEST_CASE("engine sampled tokens equal the plain prefill-then-sample loop and the recorded ids") {
  // k3-run generate k3-tiny "Hello world" --ngen 24 --temp 0.8 --top-p 0.9 --seed 7
  // with the default quantization (int4/int8, IDOT).
  auto e = Engine::LoadOrThrow(Options(false));
  GenerateRequest r;
  r.prompt_ids = {2048, 72, 313, 108, 111, 267, 294, 605};
  r.max_tokens = 24;
  r.sampling = {0.8f, 0.9f, 7};
  GenerateResult g = e->Generate(r);
  // The plain loop, on any ISA: prefill, then sample + feed one token at a time.
  {
    model::Session s(e->model(), e->options().run);
    std::vector<float> logits(static_cast<size_t>(e->config().vocab_size));
    model::ForwardOutputs out;
    out.logits_last = logits.data();
    s.Forward(r.prompt_ids, out);
    model::Sampler sampler(0.8f, 0.9f, 7);
    std::vector<int32_t> old;
    for (int i = 0; i < 24; ++i) {
      old.push_back(sampler.Sample(logits));
      if (i + 1 < 24) s.Forward(std::span<const int32_t>(&old.back(), 1), out);
    }
    CHECK(g.ids == old);
  }
  // The ids k3-run generate printed for this command, recorded with the
  // AVX-512 kernels, so the engine's bits cannot drift (AVX2 gives the same; the scalar kernels' float sums round differently, and
  // sampling at 0.8 follows the logits' last bits).
  if (quant::ActiveIsa() != quant::Isa::kScalar) {
    CHECK(g.ids == std::vector<int32_t>{1123, 1052, 1086, 226, 658, 1563, 2217, 1394,
                                        511,  400,  296,  2033, 1505, 417, 793, 2043,
                                        1128, 1372, 289,  2170, 2185, 2016, 1174, 302});
    REQUIRE(e->tokenizer() != nullptr);
    CHECK(g.content.substr(0, 6) == "212...");
  }
}

TEST_CASE("prefix reuse: an extended prompt prefills only its tail, with the same answer") {
  auto e = Engine::LoadOrThrow(Options(true));
  GenerateResult first = e->Generate(Greedy(kPrompt, 6));
  REQUIRE(first.ids.size() == 6);
  // The session holds the prompt and every generated id but the last.
  CHECK(e->session_ids().size() == kPrompt.size() + 5);
  const std::vector<int32_t> next = Concat(Concat(kPrompt, first.ids), {765, 1888, 786});
  GenerateResult reused = e->Generate(Greedy(next, 8));
  CHECK(reused.usage.cached_tokens == static_cast<int64_t>(kPrompt.size() + 5));
  CHECK(reused.usage.prompt_tokens == static_cast<int64_t>(next.size()));
  e->ResetSession();
  GenerateResult fresh = e->Generate(Greedy(next, 8));
  CHECK(fresh.usage.cached_tokens == 0);
  CHECK(fresh.ids == reused.ids);
  // The same prompt again: the session holds more than it (the answer), so it restarts.
  GenerateResult again = e->Generate(Greedy(next, 8));
  CHECK(again.usage.cached_tokens == 0);
  CHECK(again.ids == fresh.ids);
  // After a prefill of exactly this prompt everything is cached and the kept
  // logits give the same answer.
  GenerateRequest pre = Greedy(next, 0);
  pre.prefill_only = true;
  CHECK(e->Generate(pre).ids.empty());
  GenerateResult same = e->Generate(Greedy(next, 8));
  CHECK(same.usage.cached_tokens == static_cast<int64_t>(next.size()));
  CHECK(same.ids == fresh.ids);
  // A prompt that diverges from the session resets it.
  std::vector<int32_t> other = next;
  other[3] = 100;
  GenerateResult diverged = e->Generate(Greedy(other, 2));
  CHECK(diverged.usage.cached_tokens == 0);
}

TEST_CASE("cancel mid-prefill leaves no half-fed state and the same answer afterwards") {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 6; ++i) prompt = Concat(prompt, kPrompt);  // 120 tokens, 15 chunks of 8
  auto ref = Engine::LoadOrThrow(Options(true, 8));
  const std::vector<int32_t> expected = ref->Generate(Greedy(prompt, 5)).ids;

  auto e = Engine::LoadOrThrow(Options(true, 8));
  // Between chunks: the session keeps the whole chunks already fed.
  Callbacks between;
  between.on_prefill_progress = [](int64_t done, int64_t total) {
    CHECK(total == 120);
    return done < 40;
  };
  GenerateResult c1 = e->Generate(Greedy(prompt, 5), between);
  CHECK(c1.finish == FinishReason::kCancelled);
  CHECK(c1.ids.empty());
  CHECK(e->session_ids() == std::vector<int32_t>(prompt.begin(), prompt.begin() + 40));
  GenerateResult after1 = e->Generate(Greedy(prompt, 5));
  CHECK(after1.usage.cached_tokens == 40);
  CHECK(after1.ids == expected);

  // Inside a chunk (the atomic flag, raised at a later layer): the session is reset.
  e->ResetSession();
  std::atomic<bool> cancel{false};
  int polls = 0;
  Callbacks inside;
  inside.cancel = &cancel;
  inside.on_prefill_progress = [&](int64_t, int64_t) {
    if (++polls == 8 * 2 + 3) cancel = true;  // chunk 2, layer 3
    return true;
  };
  GenerateResult c2 = e->Generate(Greedy(prompt, 5), inside);
  CHECK(c2.finish == FinishReason::kCancelled);
  CHECK(e->session_ids().empty());
  GenerateResult after2 = e->Generate(Greedy(prompt, 5));
  CHECK(after2.usage.cached_tokens == 0);
  CHECK(after2.ids == expected);
}

TEST_CASE("cancel mid-decode keeps a usable engine; the answer is the same afterwards") {
  auto e = Engine::LoadOrThrow(Options(true));
  int seen = 0;
  Callbacks cb;
  cb.on_delta = [&](const Delta&) { return ++seen < 4; };  // the client leaves
  GenerateResult c = e->Generate(Greedy(kPrompt, 16), cb);
  CHECK(c.finish == FinishReason::kCancelled);
  CHECK(c.ids.size() >= 4);
  CHECK(c.ids.size() < 16);
  CHECK(c.ids == std::vector<int32_t>(kGreedy.begin(), kGreedy.begin() + c.ids.size()));
  std::atomic<bool> flag{false};
  Callbacks cb2;
  cb2.cancel = &flag;
  cb2.on_delta = [&](const Delta&) {
    flag = true;
    return true;
  };
  GenerateResult c2 = e->Generate(Greedy(kPrompt, 16), cb2);
  CHECK(c2.finish == FinishReason::kCancelled);
  CHECK(c2.ids.size() >= 1);
  CHECK(c2.ids.size() < 16);
  GenerateResult full = e->Generate(Greedy(kPrompt, 16));
  CHECK(full.ids == kGreedy);
}

TEST_CASE("a stop string split over generated tokens ends the answer before it") {
  auto e = Engine::LoadOrThrow(Options(true));
  std::vector<std::string> pieces;  // one per delta: whole characters
  Callbacks collect;
  collect.on_delta = [&](const Delta& d) {
    if (!d.content.empty()) pieces.push_back(d.content);
    return true;
  };
  GenerateResult plain = e->Generate(Greedy(kPrompt, 16), collect);
  REQUIRE(pieces.size() >= 4);
  // The last character of delta 2 and the first of delta 3: two tokens' text.
  auto last_char = [](const std::string& s) {
    size_t i = s.size() - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    return s.substr(i);
  };
  auto first_char = [](const std::string& s) {
    size_t n = 1;
    while (n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) ++n;
    return s.substr(0, n);
  };
  const std::string stop = last_char(pieces[2]) + first_char(pieces[3]);
  const size_t at = plain.content.find(stop);
  REQUIRE(at != std::string::npos);
  GenerateRequest r = Greedy(kPrompt, 16);
  r.stop = {stop};
  std::string streamed;
  Callbacks cb;
  cb.on_delta = [&](const Delta& d) {
    streamed += d.content;
    return true;
  };
  GenerateResult s = e->Generate(r, cb);
  CHECK(s.finish == FinishReason::kStop);
  CHECK(s.stop_matched == stop);
  CHECK(s.content == plain.content.substr(0, at));
  CHECK(streamed == s.content);
  CHECK(s.ids.size() < plain.ids.size());
}

TEST_CASE("ignore_eos: an answer that ended on EOS runs to max_tokens with no EOS drawn") {
  auto e = Engine::LoadOrThrow(Options(true));
  const std::vector<int64_t>& eos = e->config().eos_token_ids;
  REQUIRE(!eos.empty());
  auto is_eos = [&](int32_t id) { return std::find(eos.begin(), eos.end(), int64_t{id}) != eos.end(); };
  // A sampled answer that the model ends itself (the tiny model ends most
  // within a few hundred tokens; the first such seed is used).
  GenerateRequest r;
  r.prompt_ids = kPrompt;
  r.max_tokens = 400;
  r.sampling.temperature = 1;
  GenerateResult ended;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    r.sampling.seed = seed;
    ended = e->Generate(r);
    if (ended.finish == FinishReason::kStop) break;
  }
  REQUIRE(ended.finish == FinishReason::kStop);
  REQUIRE(is_eos(ended.ids.back()));
  r.ignore_eos = true;
  r.max_tokens = static_cast<int64_t>(ended.ids.size()) + 24;
  GenerateResult ran = e->Generate(r);
  CHECK(ran.finish == FinishReason::kLength);
  CHECK(static_cast<int64_t>(ran.ids.size()) == r.max_tokens);
  CHECK(std::none_of(ran.ids.begin(), ran.ids.end(), is_eos));
  // Not with structured output: its decoder decides where an answer ends.
  GenerateRequest s = r;
  auto st = std::make_shared<StructuredOutput>();
  st->think_budget = 4;
  s.structured = st;
  const std::vector<int32_t> held = e->session_ids();
  try {
    e->Generate(s);
    FAIL("accepted");
  } catch (const Error& err) {
    CHECK(err.code() == ErrorCode::kInvalidArgument);
    CHECK(std::string(err.what()).find("ignore_eos") != std::string::npos);
  }
  CHECK(e->session_ids() == held);
}

TEST_CASE("the context limit ends generation; a prompt that fills it is refused") {
  EngineOptions o = Options(true);
  o.max_context = 25;
  auto e = Engine::LoadOrThrow(o);
  CHECK(e->context_limit() == 25);
  GenerateResult r = e->Generate(Greedy(kPrompt, 0));  // 0: up to the limit
  CHECK(r.ids == std::vector<int32_t>(kGreedy.begin(), kGreedy.begin() + 5));
  CHECK(r.finish == FinishReason::kLength);
  CHECK(r.context_limited);
  GenerateResult capped = e->Generate(Greedy(kPrompt, 1000));
  CHECK(capped.ids.size() == 5);
  CHECK(capped.context_limited);
  std::vector<int32_t> long_prompt = Concat(kPrompt, {1, 2, 3, 4, 5});
  try {
    e->Generate(Greedy(long_prompt, 1));
    FAIL("accepted");
  } catch (const Error& err) {
    CHECK(err.code() == ErrorCode::kInvalidArgument);
    CHECK(std::string(err.what()).find("25 tokens; the context limit is 25") != std::string::npos);
  }
  // The model's own length when K3_MAXT is not set.
  auto d = Engine::LoadOrThrow(Options(true));
  CHECK(d->context_limit() == 1048576);
}

TEST_CASE("bad requests are refused before any state moves") {
  auto e = Engine::LoadOrThrow(Options(true));
  e->Generate(Greedy(kPrompt, 2));
  const std::vector<int32_t> held = e->session_ids();
  auto refused = [&](GenerateRequest r) {
    CHECK_THROWS_AS(e->Generate(r), Error);
    CHECK(e->session_ids() == held);
  };
  GenerateRequest r = Greedy(kPrompt, 2);
  r.sampling.temperature = std::nanf("");
  refused(r);
  r = Greedy(kPrompt, 2);
  r.sampling.top_p = 0;
  refused(r);
  r.sampling.top_p = 2;
  refused(r);
  r = Greedy({1, 99999}, 2);
  refused(r);
  r = Greedy({}, 2);
  refused(r);
  r = Greedy(kPrompt, 2);
  r.stop = {""};
  refused(r);
  r = Greedy(kPrompt, -1);
  refused(r);
  CHECK(e->Generate(Greedy(kPrompt, 16)).ids == kGreedy);
}

TEST_CASE("expert stats: per request, and cumulative since load") {
  auto e = Engine::LoadOrThrow(Options(true));
  CHECK(e->expert_stats().hits + e->expert_stats().misses == 0);
  GenerateResult a = e->Generate(Greedy(kPrompt, 4));
  GenerateResult b = e->Generate(Greedy(kPrompt, 4));
  const model::ExpertStoreStats total = e->expert_stats();
  CHECK(total.hits == a.experts.hits + b.experts.hits);
  CHECK(total.misses == a.experts.misses + b.experts.misses);
  CHECK(total.bytes_read == a.experts.bytes_read + b.experts.bytes_read);
  CHECK(b.experts.misses < a.experts.misses);  // the cache is warm the second time
  CHECK(a.prefill_steps == 1);  // 20 tokens, one chunk
}

TEST_CASE("sampling defaults come from generation_config.json") {
  auto e = Engine::LoadOrThrow(Options(true));
  CHECK(e->default_sampling().temperature == 1.0f);
  CHECK(e->default_sampling().top_p == 1.0f);
}
