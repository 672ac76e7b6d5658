// constrain_drive: the generator half of the constrained-decoding property test
// (property_test.sh). For every schema of a schemas.json file it drives a
// TokenConstraint over a real tokenizer's vocabulary with a seeded random choice
// among the allowed tokens (the stand-in for a model whose output is garbage)
// until the output is accepting, and prints one JSON line per run:
//   {"name":..., "run":r, "ok":true, "text":"...", "steps":n}
// or "ok":false with "error". The checker (check_outputs.py) parses and
// validates every text with python3-jsonschema, an independent implementation.
//
//   constrain_drive MODEL_DIR SCHEMAS_JSON RUNS SEED [compact|python|relaxed]
//   constrain_drive --match CASES_JSON   (pattern acceptance; regex_property.py)
//   constrain_drive --accept CASES_JSON  (non-strict acceptance; corpus_test.py)
// (python: Format::python_separators, the spelling of XTML tool arguments;
// relaxed: compact, compiled non-strict, each line naming the relaxations)
#include <simdjson.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "k3/constrain/constrain.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/tokenizer/tokenizer.h"
#include "k3/toolenv/toolenv.h"

using namespace k3;

namespace {

// Uniform among allowed tokens for the first steps; later, tokens that close
// something (and open nothing) are preferred so that every run ends.
constexpr int kFreeSteps = 48;
constexpr int kMaxSteps = 5000;

std::string Drive(const constrain::CompiledSchema& schema, const constrain::Vocabulary& vocab,
                  constrain::Format format, std::mt19937_64& rng, int& steps) {
  constrain::TokenConstraint c(schema, vocab, format);
  std::vector<uint64_t> mask;
  std::vector<uint32_t> allowed, closers;
  for (steps = 0; steps < kMaxSteps; ++steps) {
    if (c.Accepting() && (c.Complete() || rng() % 4 == 0)) return c.text();
    c.AllowedMask(mask);
    allowed.clear();
    closers.clear();
    for (uint32_t id = 0; id < vocab.vocab_size(); ++id) {
      if (!((mask[id / 64] >> (id % 64)) & 1)) continue;
      if (!c.Allowed(id)) throw Error(ErrorCode::kInternal, "Allowed() disagrees with the mask for token " + std::to_string(id));
      allowed.push_back(id);
      std::string_view b = vocab.TokenBytes(id);
      if (b.find_first_of("\"]}") != std::string_view::npos && b.find_first_of("{[") == std::string_view::npos)
        closers.push_back(id);
    }
    if (allowed.empty()) {
      if (c.Accepting()) return c.text();
      throw Error(ErrorCode::kInternal, "dead end: no token allowed after '" + c.text() + "'");
    }
    // Inside a `pattern` string, later steps follow the shortest way to a
    // match (closers alone can loop: ^[A-Z].*[0-9]$ never ends on '"').
    if (steps >= kFreeSteps && c.PreferredByte() >= 0) {
      const char want = char(c.PreferredByte());
      for (uint32_t id : allowed)
        if (vocab.TokenBytes(id) == std::string_view(&want, 1)) {
          c.Advance(id);
          goto next;
        }
    }
    {
      const auto& pool = steps >= kFreeSteps && !closers.empty() ? closers : allowed;
      c.Advance(pool[rng() % pool.size()]);
    }
  next:;
  }
  throw Error(ErrorCode::kInternal, "no accepting output within " + std::to_string(kMaxSteps) + " tokens: '" +
                                        c.text().substr(0, 200) + "...'");
}

}  // namespace

// One JSON line per entry of the array in `path`: `fill` writes the entry's
// fields; a refusal of its schema becomes {"error": ...}.
template <typename Fill>
int ForEachCase(const char* path, Fill fill) {
  std::string text = ReadFileOrThrow(path, 64u << 20);
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::element doc = parser.parse(padded);
  for (simdjson::dom::element entry : doc.get_array()) {
    JsonWriter j;
    j.BeginObject();
    try {
      fill(entry, j);
    } catch (const Error& e) {
      j.Field("error", std::string(e.what()));
    }
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
  }
  return 0;
}

// "accepted": whether `s` takes each of `texts` as a whole value, over a
// vocabulary of the 256 single bytes.
void AppendAccepted(JsonWriter& j, const constrain::CompiledSchema& s, simdjson::dom::array texts) {
  static const constrain::Vocabulary vocab = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
    return constrain::Vocabulary(std::move(bytes), 256);
  }();
  j.Key("accepted");
  j.BeginArray();
  for (simdjson::dom::element t : texts) {
    constrain::TokenConstraint c(s, vocab);
    j.Bool(c.AdvanceBytes(std::string_view(t)) && c.Accepting());
  }
  j.EndArray();
}

// --match CASES_JSON: for each {"pattern": P, "texts": [JSON string texts]}
// prints {"accepted": [...]}: whether {"type":"string","pattern":P} accepts
// each text as a whole value (the pattern side of regex_property.py), or
// {"error": ...} when the schema does not compile.
int MatchMode(const char* path) {
  return ForEachCase(path, [](simdjson::dom::element entry, JsonWriter& j) {
    std::string schema = "{\"type\":\"string\",\"pattern\":";
    AppendJsonString(schema, std::string_view(entry["pattern"]), InvalidUtf8::kPassThrough);
    schema += "}";
    AppendAccepted(j, constrain::Schema::CompileOrThrow(schema), entry["texts"].get_array());
  });
}

void AppendRelaxations(JsonWriter& j, const constrain::CompiledSchema& s) {
  j.Key("relaxations");
  j.BeginArray();
  for (const constrain::Relaxation& r : s.relaxations()) {
    j.BeginObject();
    j.Field("keyword", r.keyword);
    j.Field("pointer", r.pointer);
    j.Field("what", r.what);
    j.EndObject();
  }
  j.EndArray();
}

// --accept CASES_JSON: for each {"schema": S, "texts": [compact JSON texts]}
// prints {"accepted": [...], "relaxations": [...]}: whether S compiled
// non-strict accepts each text as a whole value, or {"error": ...}.
int AcceptMode(const char* path) {
  return ForEachCase(path, [](simdjson::dom::element entry, JsonWriter& j) {
    constrain::CompiledSchema s =
        constrain::Schema::CompileOrThrow(simdjson::minify(entry["schema"]), {.strict = false});
    AppendAccepted(j, s, entry["texts"].get_array());
    AppendRelaxations(j, s);
  });
}

int main(int argc, char** argv) {
  if (const int rc = k3::toolenv::ApplyFromEnvOrReport("constrain_drive")) return rc;
  if (argc == 3 &&
      (std::string_view(argv[1]) == "--match" || std::string_view(argv[1]) == "--accept")) {
    try {
      return std::string_view(argv[1]) == "--match" ? MatchMode(argv[2]) : AcceptMode(argv[2]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "constrain_drive: %s\n", e.what());
      return 1;
    }
  }
  if (argc != 5 && argc != 6) {
    std::fprintf(
        stderr,
        "usage: constrain_drive MODEL_DIR SCHEMAS_JSON RUNS SEED [compact|python|relaxed]\n");
    return 2;
  }
  constrain::Format format;
  bool relaxed = false;
  if (argc == 6) {
    std::string mode = argv[5];
    if (mode != "compact" && mode != "python" && mode != "relaxed") {
      std::fprintf(stderr, "constrain_drive: mode must be compact, python or relaxed\n");
      return 2;
    }
    format.python_separators = mode == "python";
    relaxed = mode == "relaxed";
  }
  try {
    tok::Tokenizer tokenizer = tok::Tokenizer::LoadDirOrThrow(argv[1]);
    constrain::Vocabulary vocab = constrain::Vocabulary::FromTokenizer(tokenizer);
    std::string text = ReadFileOrThrow(argv[2], 64u << 20);
    int runs = std::atoi(argv[3]);
    uint64_t seed = std::strtoull(argv[4], nullptr, 10);
    simdjson::dom::parser parser;
    simdjson::padded_string padded(text);
    simdjson::dom::element doc = parser.parse(padded);
    int failures = 0;
    for (simdjson::dom::element entry : doc.get_array()) {
      std::string name{std::string_view(entry["name"])};
      simdjson::dom::element sch = entry["schema"];
      for (int r = 0; r < runs; ++r) {
        JsonWriter j;
        j.BeginObject();
        j.Field("name", name);
        j.Field("run", int64_t{r});
        try {
          constrain::CompiledSchema schema =
              sch.is_null()
                  ? constrain::Schema::JsonObject()
                  : constrain::Schema::CompileOrThrow(simdjson::minify(sch), {.strict = !relaxed});
          if (relaxed) AppendRelaxations(j, schema);
          std::mt19937_64 rng(seed * 1000003u + std::hash<std::string>{}(name) + uint64_t(r));
          int steps = 0;
          std::string out = Drive(schema, vocab, format, rng, steps);
          j.Field("ok", true);
          j.Key("text");
          std::string quoted;
          AppendJsonString(quoted, out, InvalidUtf8::kPassThrough);
          j.Raw(quoted);
          j.Field("steps", int64_t{steps});
        } catch (const Error& e) {
          ++failures;
          j.Field("ok", false);
          j.Field("error", std::string(e.what()));
        }
        j.EndObject();
        std::printf("%s\n", j.str().c_str());
      }
    }
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "constrain_drive: %s\n", e.what());
    return 1;
  }
}
