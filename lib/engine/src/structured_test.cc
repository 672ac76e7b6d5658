// Structured output on the random-weight tiny K3, whose unconstrained output is
// garbage: under a constraint every answer is compact JSON that parses (and
// meets the schema's rules checked here by hand), every forced call parses
// through the stream parser with a declared name, with greedy and top-p
// sampling, under tight max_tokens, with thinking on and off. The black-box
// check against an independent validator is tests/server/structured_test.py.
#include "k3/engine/structured.h"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <array>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/engine/engine.h"
#include "k3_engine_test_support.h"

using namespace k3;
using namespace k3::engine;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";

Engine& TinyEngine() {
  static std::unique_ptr<Engine> e = [] {
    EngineOptions o;
    o.model_dir = kTiny;
    o.progress = false;
    o.load.expert_cache_bytes = 0;
    o.threads = 1;
    return Engine::LoadOrThrow(o);
  }();
  return *e;
}

GenerateRequest ChatRequestFor(Engine& e, bool thinking, int64_t max_tokens, float temperature, uint64_t seed) {
  return test::ChatRequest(e, "Answer in JSON.", thinking, max_tokens, temperature, seed);
}

// Parses, and compact: no whitespace outside strings.
bool ParsesCompact(const std::string& text, simdjson::dom::element* out, simdjson::dom::parser& p) {
  if (p.parse(text).get(*out) != simdjson::SUCCESS) return false;
  bool in_string = false, escape = false;
  for (char c : text) {
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      return false;
    }
  }
  return true;
}

std::shared_ptr<StructuredOutput> JsonSpec(const std::string& schema) {
  auto s = std::make_shared<StructuredOutput>();
  s->response = constrain::Schema::CompileOrThrow(schema);
  return s;
}

}  // namespace

TEST_CASE("structured: json_schema answers parse, are compact and keep the schema's rules") {
  Engine& e = TinyEngine();
  const std::string schema =
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":18,"maximum":99},)"
      R"("tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3},"ok":{"type":"boolean"}},)"
      R"("required":["name","age"],"additionalProperties":false})";
  auto spec = JsonSpec(schema);
  int n = 0;
  for (bool thinking : {true, false}) {
    for (float temp : {0.0f, 1.0f}) {
      for (uint64_t seed : {1u, 2u, 3u}) {
        if (temp == 0 && seed > 1) continue;  // greedy: one run
        CAPTURE(thinking);
        CAPTURE(temp);
        CAPTURE(seed);
        GenerateRequest r = ChatRequestFor(e, thinking, 96, temp, seed);
        r.structured = spec;
        std::string streamed;
        Callbacks cb;
        cb.on_delta = [&](const Delta& d) {
          streamed += d.content;
          return true;
        };
        GenerateResult res = e.Generate(r, cb);
        CAPTURE(res.content);
        CHECK(res.finish == FinishReason::kStop);
        CHECK(res.tool_calls.empty());
        CHECK(streamed == res.content);
        simdjson::dom::parser p;
        simdjson::dom::element v;
        REQUIRE(ParsesCompact(res.content, &v, p));
        REQUIRE(v.is_object());
        int64_t age = 0;
        REQUIRE(v["age"].get_int64().get(age) == simdjson::SUCCESS);
        CHECK(age >= 18);
        CHECK(age <= 99);
        std::string_view name;
        REQUIRE(v["name"].get_string().get(name) == simdjson::SUCCESS);
        simdjson::dom::object fields;
        REQUIRE(v.get_object().get(fields) == simdjson::SUCCESS);
        for (auto [key, val] : fields) {
          CHECK((key == "name" || key == "age" || key == "tags" || key == "ok"));
        }
        if (thinking) CHECK(res.usage.reasoning_tokens <= (96 - 20) / 2 + 1);
        ++n;
      }
    }
  }
  CHECK(n == 8);
}

TEST_CASE("structured: json_object and a top-level number close and end the message") {
  Engine& e = TinyEngine();
  auto obj = std::make_shared<StructuredOutput>();
  obj->response = constrain::Schema::JsonObject();
  auto num = JsonSpec(R"({"type":"number","minimum":-5,"maximum":5})");
  for (uint64_t seed : {4u, 5u}) {
    for (const auto& spec : {obj, num}) {
      GenerateRequest r = ChatRequestFor(e, true, 80, 1.0f, seed);
      r.structured = spec;
      GenerateResult res = e.Generate(r);
      CAPTURE(res.content);
      simdjson::dom::parser p;
      simdjson::dom::element v;
      REQUIRE(ParsesCompact(res.content, &v, p));
      if (spec == obj) {
        CHECK(v.is_object());
      } else {
        double x = 0;
        REQUIRE(v.get_double().get(x) == simdjson::SUCCESS);
        CHECK(x >= -5);
        CHECK(x <= 5);
      }
      CHECK(res.finish == FinishReason::kStop);
    }
  }
}

TEST_CASE("structured: tight max_tokens steers to the shortest completion") {
  Engine& e = TinyEngine();
  auto spec = JsonSpec(
      R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":{"type":"integer"},"minItems":2}},"required":["a","b"]})");
  // The shortest answer {"a":"","b":[1,1]} is 18 bytes, plus about 20 ids of
  // structure with thinking on (36 tokens are too few: see the length case).
  for (int64_t max_tokens : {44, 56, 80}) {
    for (bool thinking : {true, false}) {
      CAPTURE(max_tokens);
      CAPTURE(thinking);
      GenerateRequest r = ChatRequestFor(e, thinking, max_tokens, 1.0f, 11);
      r.structured = spec;
      GenerateResult res = e.Generate(r);
      CAPTURE(res.content);
      CHECK(res.usage.completion_tokens <= max_tokens);
      CHECK(res.finish == FinishReason::kStop);
      if (res.finish != FinishReason::kStop) {
        MESSAGE(e.tokenizer()->Decode(std::vector<tok::TokenId>(res.ids.begin(), res.ids.end())));
      }
      simdjson::dom::parser p;
      simdjson::dom::element v;
      CHECK(ParsesCompact(res.content, &v, p));
    }
  }
  // Too little room for any answer: finish "length", never an exception.
  GenerateRequest r = ChatRequestFor(e, false, 3, 1.0f, 1);
  r.structured = spec;
  GenerateResult res = e.Generate(r);
  CHECK(res.finish == FinishReason::kLength);
}

TEST_CASE("structured: a shortest answer longer than the greedy walk's cap is steered along its prefix") {
  // {"story":"..."} needs 100,000 characters: more than the 64 KiB the greedy
  // completion is walked. The answer is steered along the walked prefix and cut
  // by the budget: a valid JSON prefix and finish "length", never a stray id
  // (it once closed after '{"story":"' with a NUL and finish "stop").
  Engine& e = TinyEngine();
  auto spec = JsonSpec(R"({"type":"object","properties":{"story":{"type":"string","minLength":100000}},"required":["story"],"additionalProperties":false})");
  for (bool thinking : {false, true}) {
    CAPTURE(thinking);
    GenerateRequest r = ChatRequestFor(e, thinking, 200, 1.0f, 3);
    r.structured = spec;
    GenerateResult res = e.Generate(r);
    CAPTURE(res.content);
    CHECK(res.finish == FinishReason::kLength);
    REQUIRE(res.content.starts_with(R"({"story":")"));
    const std::string body = res.content.substr(10);
    CHECK(body.size() >= 100);
    CHECK(body.find_first_of(std::string("\"\\\0", 3)) == std::string::npos);
  }
}

TEST_CASE("structured: required and named tool calls parse, name declared tools and stream their arguments") {
  Engine& e = TinyEngine();
  auto spec = std::make_shared<StructuredOutput>();
  spec->tools.push_back({"get_weather", constrain::Schema::CompileOrThrow(
                                            R"({"type":"object","properties":{"city":{"type":"string"},)"
                                            R"("unit":{"enum":["c","f"]}},"required":["city","unit"]})")});
  spec->tools.push_back({"add", constrain::Schema::CompileOrThrow(
                                    R"({"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},)"
                                    R"("required":["x","y"],"additionalProperties":false})")});
  spec->calls = StructuredOutput::Calls::kRequired;
  auto named = std::make_shared<StructuredOutput>(*spec);
  named->only_tool = "add";
  std::set<std::string> seen;
  for (const auto& s : {spec, named}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      for (bool thinking : {true, false}) {
        CAPTURE(seed);
        CAPTURE(thinking);
        GenerateRequest r = ChatRequestFor(e, thinking, 120, seed == 4 ? 0.0f : 1.0f, seed);
        r.structured = s;
        std::vector<std::string> args;
        Callbacks cb;
        cb.on_delta = [&](const Delta& d) {
          for (const ToolCallDelta& t : d.tool_calls) {
            if (t.begin) args.resize(size_t(t.index) + 1);
            args[size_t(t.index)] += t.arguments;
          }
          return true;
        };
        GenerateResult res = e.Generate(r, cb);
        CHECK(res.finish == FinishReason::kToolCalls);
        REQUIRE(!res.tool_calls.empty());
        CHECK(res.warnings.empty());
        if (res.finish != FinishReason::kToolCalls) {
          MESSAGE(e.tokenizer()->Decode(std::vector<tok::TokenId>(res.ids.begin(), res.ids.end())));
        }
        REQUIRE(args.size() == res.tool_calls.size());
        for (size_t i = 0; i < res.tool_calls.size(); ++i) {
          const tok::ToolCall& c = res.tool_calls[i];
          CAPTURE(c.arguments_json);
          CHECK(args[i] == c.arguments_json);
          if (s == named) CHECK(c.name == "add");
          seen.insert(c.name);
          simdjson::dom::parser p;
          simdjson::dom::element v;
          REQUIRE(ParsesCompact(c.arguments_json, &v, p));
          if (c.name == "add") {
            int64_t x = 0;
            CHECK(v["x"].get_int64().get(x) == simdjson::SUCCESS);
            CHECK(v["y"].get_int64().get(x) == simdjson::SUCCESS);
          } else {
            REQUIRE(c.name == "get_weather");
            std::string_view u;
            REQUIRE(v["unit"].get_string().get(u) == simdjson::SUCCESS);
            CHECK((u == "c" || u == "f"));
          }
        }
      }
    }
  }
  CHECK(seen.count("get_weather") == 1);  // the required choice is the model's
}

TEST_CASE("structured: tool_choice none and auto never make a malformed call") {
  Engine& e = TinyEngine();
  auto spec = std::make_shared<StructuredOutput>();
  spec->tools.push_back({"f", constrain::Schema::CompileOrThrow(
                                  R"({"type":"object","properties":{"q":{"type":"string"}},"required":["q"]})")});
  for (auto calls : {StructuredOutput::Calls::kNone, StructuredOutput::Calls::kAuto}) {
    spec->calls = calls;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      GenerateRequest r = ChatRequestFor(e, seed % 2 == 0, 64, 1.0f, seed);
      r.structured = spec;
      GenerateResult res = e.Generate(r);
      if (calls == StructuredOutput::Calls::kNone) CHECK(res.tool_calls.empty());
      for (const tok::ToolCall& c : res.tool_calls) {
        CHECK(c.name == "f");
        if (res.finish == FinishReason::kToolCalls) {
          simdjson::dom::parser p;
          simdjson::dom::element v;
          CHECK(ParsesCompact(c.arguments_json, &v, p));
        }
      }
    }
  }
}

TEST_CASE("structured: required calls with no such tool are refused before any work") {
  Engine& e = TinyEngine();
  auto spec = std::make_shared<StructuredOutput>();
  spec->tools.push_back({"f", constrain::Schema::JsonObject()});
  spec->calls = StructuredOutput::Calls::kRequired;
  spec->only_tool = "g";
  GenerateRequest r = ChatRequestFor(e, false, 16, 1.0f, 1);
  r.structured = spec;
  CHECK_THROWS_AS(e.Generate(r), Error);
  r.structured = nullptr;
  CHECK(e.Generate(r).usage.completion_tokens > 0);  // still usable
}

TEST_CASE("structured: the greedy completion closes every kind of open value") {
  const constrain::Vocabulary vocab = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
    return constrain::Vocabulary(bytes, 256);
  }();
  struct Case {
    const char* schema;
    const char* prefix;
    const char* completion;  // the greedy one, or a bound ("<N")
  } cases[] = {
      {R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})", "", R"({"a":""})"},
      {R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})", R"({"a":"xy)", R"("})"},
      {R"({"type":"array","items":{"type":"integer","minimum":20},"minItems":2})", "[", "<12"},
      {R"({"type":"object"})", R"({"k":[{"z":"\u00)", R"(00"}]})"},
      {R"({"enum":["alpha","beta"]})", R"("be)", R"(ta")"},
      {R"({"type":"number","exclusiveMinimum":0})", "", "1"},
      {R"({"type":"string","minLength":3})", "", R"("aaa")"},
      // pattern strings follow the constraint's hint (the fixed order would add 'a' forever)
      {R"({"type":"string","pattern":"^a*b$"})", R"("aa)", R"(b")"},
      {R"({"type":"object","properties":{"d":{"type":"string","pattern":"^\\d{4}-\\d{2}$"}},"required":["d"]})", "",
       R"({"d":"0000-00"})"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.schema);
    CAPTURE(c.prefix);
    constrain::TokenConstraint t(constrain::Schema::CompileOrThrow(c.schema), vocab);
    REQUIRE(t.AdvanceBytes(c.prefix));
    auto g = GreedyCompletion(t, 4096);
    REQUIRE(g);
    if (c.completion[0] == '<') CHECK(g->size() < size_t(std::atoi(c.completion + 1)));
    else CHECK(*g == c.completion);
    CHECK(t.text() == c.prefix);  // the probe is a copy
    constrain::TokenConstraint done = t.Clone();
    CHECK(done.AdvanceBytes(*g));
    CHECK(done.Accepting());
  }
}


TEST_CASE("structured: a think cap alone (Messages budget_tokens) closes the think channel, the answer stays free") {
  Engine& e = TinyEngine();
  constexpr int64_t kMaxTokens = 160, kBudget = 24;
  for (uint64_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    // Without a cap the random-weight model thinks past the budget (usually
    // until max_tokens): that is what makes the cap observable.
    GenerateRequest free_run = ChatRequestFor(e, true, kMaxTokens, 1.0f, seed);
    const GenerateResult uncapped = e.Generate(free_run);
    CHECK(uncapped.usage.reasoning_tokens > kBudget + 8);

    GenerateRequest r = ChatRequestFor(e, true, kMaxTokens, 1.0f, seed);
    auto spec = std::make_shared<StructuredOutput>();
    spec->think_budget = kBudget;
    CHECK(spec->active());
    r.structured = spec;
    const GenerateResult res = e.Generate(r);
    // The cap counts think tokens before the forced "<|close|>think<|sep|>"
    // (whose ids count as reasoning too); then the response channel.
    const int64_t close_ids = int64_t(e.tokenizer()->Encode("think", false).size()) + 2;
    CHECK(res.usage.reasoning_tokens == kBudget + close_ids);
    CHECK(res.usage.completion_tokens > res.usage.reasoning_tokens);
    CHECK(res.tool_calls.empty());
  }
}

TEST_CASE("structured: tight max_tokens with pattern fields still closes") {
  Engine& e = TinyEngine();
  auto spec = JsonSpec(R"({"type":"object","properties":{"id":{"type":"string","pattern":"^[A-Z]{2}-\\d{3,}$"},)"
                       R"("tag":{"type":"string","pattern":"^a*b$"}},"required":["id","tag"]})");
  for (int64_t max_tokens : {48, 64}) {
    for (bool thinking : {true, false}) {
      CAPTURE(max_tokens);
      CAPTURE(thinking);
      GenerateRequest r = ChatRequestFor(e, thinking, max_tokens, 1.0f, 5);
      r.structured = spec;
      GenerateResult res = e.Generate(r);
      CAPTURE(res.content);
      CHECK(res.usage.completion_tokens <= max_tokens);
      CHECK(res.finish == FinishReason::kStop);
      simdjson::dom::parser p;
      simdjson::dom::element v;
      REQUIRE(ParsesCompact(res.content, &v, p));
      // The rules, checked by hand: two capitals, '-', three or more digits; a's then one b.
      const std::string id{std::string_view(v["id"])}, tag{std::string_view(v["tag"])};
      REQUIRE(id.size() >= 6);
      CHECK((id[0] >= 'A' && id[0] <= 'Z' && id[1] >= 'A' && id[1] <= 'Z' && id[2] == '-'));
      CHECK(id.find_first_not_of("0123456789", 3) == std::string::npos);
      REQUIRE(!tag.empty());
      CHECK(tag.back() == 'b');
      CHECK(tag.find_first_not_of('a') == tag.size() - 1);
    }
  }
}

namespace {

// Runs `d` alone over random logits (an LCG seeded by `rng`, sampled at
// temperature 1 by `seed`) until the end or `budget` tokens; after every token
// the decoder's kept completion must equal a fresh GreedyCompletion.
std::vector<int32_t> DecodeAlone(StructuredDecoder& d, int64_t budget, uint64_t seed, int32_t end_id,
                                 std::vector<float>& logits, uint64_t& rng, int64_t* steps, int64_t* cached) {
  model::Sampler sampler(1.0f, 1.0f, seed);
  std::vector<int32_t> ids;
  while (int64_t(ids.size()) < budget && (ids.empty() || ids.back() != end_id)) {
    for (float& x : logits) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      x = float(rng >> 40) / float(1 << 24) * 8.0f;
    }
    int32_t id = d.Prepare(logits, budget - int64_t(ids.size()));
    if (id < 0) {
      for (int tries = 0;; ++tries) {
        id = sampler.Sample(logits);
        if (d.Allowed(id)) break;
        logits[size_t(id)] = -std::numeric_limits<float>::infinity();
        if (tries == 8) {
          id = d.Fallback();
          REQUIRE(id >= 0);
          break;
        }
      }
    }
    d.Accept(id);
    ids.push_back(id);
    ++*steps;
    if (std::optional<std::string> c = d.CachedCompletion()) {
      ++*cached;
      std::optional<std::string> fresh = d.FreshCompletion();
      REQUIRE(fresh);
      REQUIRE(*c == *fresh);
    }
  }
  return ids;
}

}  // namespace

TEST_CASE("structured: inside a pattern string a token may lengthen the shortest completion; tight budgets still close") {
  // After 'b' the shortest match of ^(a|b{20})$ is 19 characters longer than
  // after nothing: near the budget such a token must be probed, not waved
  // through as "stays inside the string".
  const tok::Tokenizer tok = tok::Tokenizer::LoadDirOrThrow(kTiny);
  const constrain::Vocabulary vocab = constrain::Vocabulary::FromTokenizer(tok);
  const int32_t end_id = int32_t(tok.SpecialIdOrThrow("<|end_of_msg|>"));
  const std::vector<int64_t> eos = {end_id};
  std::vector<float> logits(tok.vocab_size());
  uint64_t rng = 99;
  int64_t steps = 0, cached = 0, answers = 0;
  for (const char* js : {R"({"type":"object","properties":{"s":{"type":"string","pattern":"^(a|b{20})$"}},"required":["s"]})",
                         R"({"type":"object","properties":{"t":{"type":"string","pattern":"^(xy|z{9}w{9})$"},"n":{"type":"integer"}},"required":["t","n"]})"}) {
    CAPTURE(js);
    const constrain::CompiledSchema schema = constrain::Schema::CompileOrThrow(js);
    StructuredOutput spec;
    spec.response = schema;
    const int64_t shortest =
        StructuredDecoder(spec, tok, vocab, eos, tok::ChatStreamParser::Start::kResponse, 1 << 20).MinRemaining();
    for (int64_t extra = 0; extra <= 8; ++extra) {
      for (uint64_t seed = 0; seed < 12; ++seed) {
        CAPTURE(extra);
        CAPTURE(seed);
        StructuredDecoder d(spec, tok, vocab, eos, tok::ChatStreamParser::Start::kResponse, shortest + extra);
        const std::vector<int32_t> ids = DecodeAlone(d, shortest + extra, seed, end_id, logits, rng, &steps, &cached);
        REQUIRE(!ids.empty());
        CHECK(ids.back() == end_id);  // closed within the budget
        ++answers;
      }
    }
  }
  CHECK(answers == 2 * 9 * 12);
}

TEST_CASE("structured: one token far from the budget may lengthen the shortest completion past it; still closes") {
  // After `[` the shortest completion of {"todos":[...]} is `]}`; after `{"`
  // it is an item with three required keys, ~40 bytes longer: more than the
  // fixed look-ahead before steering (tests/server's hand-13 schema, which
  // the tiny model can cut at max_tokens). With a second, cheap tool, budgets
  // from the shortest answer up must all close, each of the 1,208 answers.
  const tok::Tokenizer tok = tok::Tokenizer::LoadDirOrThrow(kTiny);
  const constrain::Vocabulary vocab = constrain::Vocabulary::FromTokenizer(tok);
  const int32_t end_id = int32_t(tok.SpecialIdOrThrow("<|end_of_msg|>"));
  const std::vector<int64_t> eos = {end_id};
  std::vector<float> logits(tok.vocab_size());
  StructuredOutput spec;
  spec.tools.push_back({"todo", constrain::Schema::CompileOrThrow(
                                    R"({"type":"object","properties":{"todos":{"type":"array","items":{"type":"object",)"
                                    R"("properties":{"id":{"type":"string"},"content":{"type":"string","minLength":1},)"
                                    R"("status":{"enum":["pending","in_progress","completed"]},"priority":{"enum":["high","medium","low"]}},)"
                                    R"("required":["id","content","status"],"additionalProperties":false},"maxItems":3}},)"
                                    R"("required":["todos"],"additionalProperties":false})")});
  spec.tools.push_back({"other", constrain::Schema::CompileOrThrow(
                                     R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})")});
  spec.calls = StructuredOutput::Calls::kRequired;
  const int64_t shortest =
      StructuredDecoder(spec, tok, vocab, eos, tok::ChatStreamParser::Start::kResponse, 1 << 20).MinRemaining();
  uint64_t rng = 25;
  int64_t steps = 0, cached = 0, answers = 0;
  for (int64_t extra = 0; extra <= 150; extra += 1) {
    for (uint64_t seed = 0; seed < 8; ++seed) {
      CAPTURE(extra);
      CAPTURE(seed);
      StructuredDecoder d(spec, tok, vocab, eos, tok::ChatStreamParser::Start::kResponse, shortest + extra);
      const std::vector<int32_t> ids = DecodeAlone(d, shortest + extra, seed, end_id, logits, rng, &steps, &cached);
      REQUIRE(!ids.empty());
      CHECK(ids.back() == end_id);  // closed within the budget
      ++answers;
    }
  }
  CHECK(answers == 151 * 8);
}

TEST_CASE("structured: the cached greedy completion equals a fresh one after every token; tight budgets close") {
  // The decoder alone (random logits, no model) over the tiny vocabulary, for
  // the 251 schemas of the constrain property test as a response_format and as
  // a required call, with budgets from exactly the shortest answer up: after
  // every step the completion the decoder keeps (a prefix-advanced one, the
  // one Allowed probed, or a refresh) is compared with GreedyCompletion of the
  // constraint's state, and every answer must close within the budget.
  const tok::Tokenizer tok = tok::Tokenizer::LoadDirOrThrow(kTiny);
  const constrain::Vocabulary vocab = constrain::Vocabulary::FromTokenizer(tok);
  const int32_t close_id = int32_t(tok.SpecialIdOrThrow("<|close|>"));
  const int32_t end_id = int32_t(tok.SpecialIdOrThrow("<|end_of_msg|>"));
  const std::vector<int64_t> eos = {end_id};
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.load(std::string(K3_TEST_DATA_DIR) + "/../constrain/schemas.json").get(doc) == simdjson::SUCCESS);
  std::vector<std::string> schemas;
  for (simdjson::dom::element e : doc.get_array()) schemas.push_back(simdjson::minify(e["schema"]));  // null: json_object
  REQUIRE(schemas.size() >= 250);
  std::vector<float> logits(tok.vocab_size());
  uint64_t rng = 16;
  int64_t cached = 0, steps = 0, answers = 0;
  for (size_t i = 0; i < schemas.size(); ++i) {
    CAPTURE(schemas[i]);
    const constrain::CompiledSchema schema =
        schemas[i] == "null" ? constrain::Schema::JsonObject() : constrain::Schema::CompileOrThrow(schemas[i]);
    for (bool call : {false, true}) {
      StructuredOutput spec;
      if (call) {
        spec.tools.push_back({"f", schema});
        spec.calls = StructuredOutput::Calls::kRequired;
      } else {
        spec.response = schema;
      }
      const int64_t shortest =
          StructuredDecoder(spec, tok, vocab, eos, tok::ChatStreamParser::Start::kResponse, 1 << 20).MinRemaining();
      const int64_t extra = std::array<int64_t, 4>{0, 3, 12, 40}[(i + call) % 4];
      const int64_t budget = shortest + extra;
      CAPTURE(call);
      CAPTURE(budget);
      StructuredDecoder d(spec, tok, vocab, eos, tok::ChatStreamParser::Start::kResponse, budget);
      const std::vector<int32_t> ids = DecodeAlone(d, budget, 1000 + i, end_id, logits, rng, &steps, &cached);
      REQUIRE(!ids.empty());
      CHECK(ids.back() == end_id);  // closed within the budget
      // The JSON (a response's starts at once; a call's after its header) validates.
      size_t from = 0;
      if (call) {
        // <|close|>response<|sep|><|open|>tools<|sep|><|open|>call ...<|sep|><|open|>json ...<|sep|>
        const int32_t sep = int32_t(tok.SpecialIdOrThrow("<|sep|>"));
        size_t seps = 0;
        while (from < ids.size() && seps < 4) seps += ids[from++] == sep;
      }
      std::string json;
      for (size_t k = from; k < ids.size() && ids[k] != close_id; ++k) json += tok.TokenBytes(tok::TokenId(ids[k]));
      CAPTURE(json);
      constrain::TokenConstraint check(schema, vocab);
      CHECK(check.AdvanceBytes(json));
      CHECK(check.Accepting());
      ++answers;
    }
  }
  CHECK(answers == int64_t(2 * schemas.size()));
  // Most steps inside the JSON keep an exact completion without a recompute.
  MESSAGE("steps " << steps << ", cached completions checked " << cached);
  CHECK(cached > steps / 6);
}
