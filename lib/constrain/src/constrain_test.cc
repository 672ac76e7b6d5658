// lib/constrain unit tests. Acceptance is checked against JSON's grammar (RFC
// 8259) and JSON Schema's rules written out by hand here; the token masks are
// checked against running every token's bytes through the automaton directly,
// on a byte vocabulary, a hand-made vocabulary whose tokens split JSON tokens,
// and the k3-tiny tokenizer. (tests/constrain validates generated outputs with
// an independent validator, python3-jsonschema.)
#include "k3/constrain/constrain.h"

#include <doctest/doctest.h>

#include <cerrno>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/tokenizer/tokenizer.h"
#include "schema_internal.h"  // kMaxRefRecursion

using k3::constrain::CompiledSchema;
using k3::constrain::Schema;
using k3::constrain::TokenConstraint;
using k3::constrain::Vocabulary;

namespace {

Vocabulary ByteVocab() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, char(b));
  return Vocabulary(std::move(t), 256 + 4);  // four "specials" past the ranks
}

const Vocabulary& Bytes() {
  static Vocabulary v = ByteVocab();
  return v;
}

const k3::tok::Tokenizer& Tiny() {
  static k3::tok::Tokenizer t = k3::tok::Tokenizer::LoadDirOrThrow(K3_TEST_DATA_DIR "/oracle/k3-tiny");
  return t;
}

// Whole text is a complete valid value.
bool Accepts(const CompiledSchema& s, std::string_view text) {
  TokenConstraint c(s, Bytes());
  return c.AdvanceBytes(text) && c.Accepting();
}
// Text is a valid prefix (may be complete).
bool Prefix(const CompiledSchema& s, std::string_view text) {
  TokenConstraint c(s, Bytes());
  return c.AdvanceBytes(text);
}
bool Accepts(std::string_view schema, std::string_view text) { return Accepts(Schema::CompileOrThrow(schema), text); }
bool Prefix(std::string_view schema, std::string_view text) { return Prefix(Schema::CompileOrThrow(schema), text); }

k3::Error CompileError(std::string_view schema) {
  try {
    Schema::CompileOrThrow(schema);
  } catch (const k3::Error& e) {
    return e;
  }
  FAIL("schema compiled but should not: " << schema);
  return k3::Error(k3::ErrorCode::kOk, "");
}

bool Bit(const std::vector<uint64_t>& m, uint32_t id) { return (m[id / 64] >> (id % 64)) & 1; }

// The mask must equal "this token's bytes keep the output a valid prefix",
// computed by a second constraint that never builds a mask.
void CheckMaskAgainstDirect(const CompiledSchema& s, const Vocabulary& v, const std::string& text,
                            TokenConstraint& c, k3::constrain::Format format = {}) {
  std::vector<uint64_t> mask;
  c.AllowedMask(mask);
  REQUIRE(mask.size() == (v.vocab_size() + 63) / 64);
  TokenConstraint direct(s, v, format);
  REQUIRE(direct.AdvanceBytes(text));
  for (uint32_t id = 0; id < v.vocab_size(); ++id) {
    bool want = direct.Allowed(id);
    if (Bit(mask, id) != want) {
      FAIL_CHECK("token " << id << " '" << std::string(v.TokenBytes(id)) << "' after '" << text
                          << "': mask " << Bit(mask, id) << " direct " << want);
      return;
    }
  }
}

// All 256 bytes plus distinct random strings of 2..max_len bytes drawn from
// `alphabet`, up to `size` tokens: tokens that straddle whatever the alphabet
// holds (quotes, escapes, separators, pieces of characters).
Vocabulary RandomVocab(const std::string& alphabet, size_t size, size_t max_len, uint64_t seed) {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, char(b));
  std::mt19937_64 rng(seed);
  std::set<std::string> seen(t.begin(), t.end());
  while (t.size() < size) {
    std::string s;
    size_t len = 2 + rng() % (max_len - 1);
    for (size_t i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
    if (seen.insert(s).second) t.push_back(s);
  }
  return Vocabulary(std::move(t), uint32_t(size));
}

// Schemas for random walks: objects with bounds and enums, arrays, strings,
// uniqueItems, property counts, free keys, recursion and an overlapping union.
const std::vector<const char*>& WalkSchemas() {
  static const std::vector<const char*> v = {
      R"({"type":"object"})",
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"n":{"type":"integer","minimum":-5,"maximum":300},
          "tags":{"type":"array","items":{"enum":["a","bb","c d"]},"maxItems":3},"ok":{"type":"boolean"}},"required":["name","n"]})",
      R"({"type":"array","items":{"type":"number","minimum":0,"maximum":1},"maxItems":4})",
      R"({"type":"string","minLength":3})",
      R"({"type":"array","items":{"enum":["x","xy",1,12,true]},"uniqueItems":true})",
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["c"],"minProperties":2,"maxProperties":2})",
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":4},"nm":{"type":"integer"}},"required":["nm"],
          "additionalProperties":{"type":"integer","minimum":0,"maximum":9},"maxProperties":4})",
      R"({"$defs":{"t":{"type":"object","properties":{"v":{"enum":[1,2,30],"maximum":9},"kids":{"type":"array","items":{"$ref":"#/$defs/t"},
          "maxItems":2}},"required":["v"]}},"$ref":"#/$defs/t"})",
      R"({"type":"array","maxItems":5,"items":{"anyOf":[{"type":"object","properties":{"k":{"type":"integer"},"v":{"type":"string","maxLength":5}},"required":["k"]},
          {"type":"object","properties":{"k":{"type":"string"},"w":{"enum":["p","q"]}},"required":["w"]},{"enum":["k","kk"]},{"type":"string","maxLength":2}]}})",
  };
  return v;
}

}  // namespace

TEST_CASE("compact JSON only: no whitespace between tokens") {
  auto s = Schema::JsonObject();
  CHECK(Accepts(s, R"({"a":1,"b":[true,null,"x"]})"));
  CHECK_FALSE(Prefix(s, R"({ "a":1})"));
  CHECK_FALSE(Prefix(s, "{\"a\":1,\n"));
  CHECK_FALSE(Prefix(s, "{\"a\"\t:1}"));
  CHECK_FALSE(Prefix(s, "[1]"));   // json_object: an object, not any value
  CHECK_FALSE(Accepts(s, R"({"a":1})x"));
  CHECK(Accepts(s, "{}"));
  CHECK(Accepts(s, R"({"a b":" spaces inside strings are content "})"));
}

TEST_CASE("strings: escapes, UTF-8 and surrogates") {
  const char* str = R"({"type":"string"})";
  CHECK(Accepts(str, R"("plain")"));
  CHECK(Accepts(str, R"("q\"b\\s\/\b\f\n\r\t")"));
  CHECK(Accepts(str, R"("\u00e9\u4F60")"));
  CHECK(Accepts(str, R"("\ud83d\ude00")"));       // a surrogate pair
  CHECK_FALSE(Prefix(str, R"("\ud83d")"));        // high surrogate must be followed by a low one
  CHECK_FALSE(Prefix(str, R"("\ud83d\u1)"));      // ... whose first digit is D
  CHECK_FALSE(Prefix(str, R"("\ud83d\ud8)"));     // ... then C..F
  CHECK(Prefix(str, R"("\ud83d\uDc)"));
  CHECK_FALSE(Prefix(str, R"("\ude00)"));         // lone low surrogate
  CHECK_FALSE(Prefix(str, R"("\x")"));            // no such escape
  CHECK_FALSE(Prefix(str, R"("\u12G)"));
  CHECK_FALSE(Prefix(str, "\"a\nb\""));           // raw control character
  CHECK_FALSE(Prefix(str, "\"\x1f\""));
  CHECK(Accepts(str, "\"\x7f\""));                // DEL needs no escape
  CHECK(Accepts(str, "\"h\xc3\xa9 \xe4\xbd\xa0 \xf0\x9f\x98\x80\""));  // é 你 😀
  CHECK_FALSE(Prefix(str, "\"\xc0\xaf"));         // overlong
  CHECK_FALSE(Prefix(str, "\"\xe0\x80"));         // overlong 3-byte
  CHECK_FALSE(Prefix(str, "\"\xed\xa0"));         // UTF-16 surrogate in UTF-8
  CHECK_FALSE(Prefix(str, "\"\xf4\x90"));         // above U+10FFFF
  CHECK_FALSE(Prefix(str, "\"\xf5"));
  CHECK_FALSE(Prefix(str, "\"\x80"));             // stray continuation
  CHECK(Prefix(str, "\"\xe4\xbd"));               // a split character is a valid prefix
  CHECK_FALSE(Accepts(str, "\"\xe4\xbd\""));      // but may not end there
}

TEST_CASE("string length bounds count code points") {
  const char* s = R"({"type":"string","minLength":2,"maxLength":3})";
  CHECK_FALSE(Accepts(s, R"("a")"));
  CHECK(Accepts(s, R"("ab")"));
  CHECK(Accepts(s, "\"\xe4\xbd\xa0\xe5\xa5\xbd\""));  // two characters, six bytes
  CHECK(Accepts(s, R"("\ud83d\ude00ab")"));            // the pair is one character
  CHECK(Accepts(s, R"("a\nb")"));
  CHECK_FALSE(Prefix(s, R"("abcd)"));
  CHECK_FALSE(Prefix(s, "\"ab\xf0\x9f\x98\x80x"));
}

TEST_CASE("numbers: the JSON grammar") {
  const char* n = R"({"type":"number"})";
  for (const char* ok : {"0", "-0", "12", "-12.5", "0.25", "1e5", "1E+5", "2.5e-3", "-0.0"})
    CHECK_MESSAGE(Accepts(n, ok), ok);
  for (const char* bad : {"01", "+1", ".5", "1.", "1e", "1e+", "-", "--1", "1.5.2", "0x1", "1,"})
    CHECK_MESSAGE(!Accepts(n, bad), bad);
  CHECK(Prefix(n, "1."));   // prefixes of valid numbers
  CHECK(Prefix(n, "-"));
  CHECK(Prefix(n, "1e"));
  const char* i = R"({"type":"integer"})";
  CHECK(Accepts(i, "-42"));
  CHECK_FALSE(Prefix(i, "4.")); // integers never take a fraction or exponent
  CHECK_FALSE(Prefix(i, "4e"));
  // Digit limits (docs/constrain.md): 15 integer digits.
  CHECK(Accepts(i, "123456789012345"));
  CHECK_FALSE(Prefix(i, "1234567890123456"));
}

TEST_CASE("number bounds: prefixes that cannot reach the range are refused") {
  const char* s = R"({"type":"integer","minimum":20,"maximum":99})";
  CHECK(Accepts(s, "20"));
  CHECK(Accepts(s, "99"));
  CHECK_FALSE(Prefix(s, "1"));   // 1, 1x and 1xx all miss [20, 99]
  CHECK_FALSE(Prefix(s, "-"));
  CHECK_FALSE(Accepts(s, "100"));
  CHECK(Prefix(s, "5"));
  CHECK_FALSE(Accepts(s, "5"));  // a prefix, not yet in range
  const char* e = R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})";
  CHECK_FALSE(Accepts(e, "0"));
  CHECK(Accepts(e, "1"));
  CHECK(Accepts(e, "9"));
  CHECK_FALSE(Prefix(e, "10"));
  const char* f = R"({"type":"number","minimum":-1.5,"exclusiveMaximum":0.3})";
  CHECK(Accepts(f, "-1.5"));
  CHECK_FALSE(Prefix(f, "-1.6"));
  CHECK(Accepts(f, "0.29"));
  CHECK_FALSE(Accepts(f, "0.3"));
  CHECK_FALSE(Prefix(f, "0.4"));
  CHECK_FALSE(Prefix(f, "1"));
  CHECK(Accepts(f, "-0"));
  CHECK_FALSE(Prefix(f, "1e"));   // bounded numbers take no exponent
}

TEST_CASE("objects: properties, required, order, additionalProperties") {
  const char* s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},
                      "required":["b"],"additionalProperties":false})";
  CHECK(Accepts(s, R"({"b":"x"})"));
  CHECK(Accepts(s, R"({"a":1,"b":"x"})"));
  CHECK(Accepts(s, R"({"b":"x","a":1})"));   // any order
  CHECK_FALSE(Accepts(s, R"({"a":1})"));     // b is required
  CHECK_FALSE(Prefix(s, R"({"a":1,"a")"));   // no key twice
  CHECK_FALSE(Prefix(s, R"({"c")"));         // undeclared
  CHECK_FALSE(Prefix(s, R"({"a":"x")"));     // wrong type
  CHECK_FALSE(Prefix(s, R"({"b":"x",})"));   // nothing left to add after the comma? a remains
  CHECK(Prefix(s, R"({"b":"x",)"));
  CHECK_FALSE(Prefix(s, R"({"a":1,"b":"x",)"));  // every key used: only '}' remains
  // Keys that need escapes are matched in their compact escaped form.
  const char* k = R"({"type":"object","properties":{"q\"k":{"type":"null"},"q\\":{"type":"null"}},"required":["q\"k"]})";
  CHECK(Accepts(k, R"({"q\"k":null})"));
  CHECK(Accepts(k, R"({"q\\":null,"q\"k":null})"));
  // A map: free keys, each value follows additionalProperties.
  const char* m = R"({"type":"object","additionalProperties":{"type":"integer"}})";
  CHECK(Accepts(m, R"({"x":1,"y \u00e9":2})"));
  CHECK_FALSE(Prefix(m, R"({"x":"s")"));
  // Required but undeclared: generated with any value.
  CHECK(Accepts(R"({"type":"object","required":["z"]})", R"({"z":[1,{"q":null}]})"));
}

TEST_CASE("minProperties and maxProperties") {
  const char* s = R"({"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"},"c":{"type":"null"},
                      "r":{"type":"null"}},"required":["r"],"minProperties":2,"maxProperties":3})";
  CHECK_FALSE(Accepts(s, R"({"r":null})"));
  CHECK(Accepts(s, R"({"r":null,"a":null})"));
  CHECK(Accepts(s, R"({"a":null,"r":null,"c":null})"));
  CHECK_FALSE(Prefix(s, R"({"a":null,"b":null,"c")"));  // r must still fit: only it may come third
  CHECK(Prefix(s, R"({"a":null,"b":null,"r")"));
  CHECK_FALSE(Prefix(s, R"({"a":null,"r":null,"c":null,)"));
  const char* m = R"({"type":"object","additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":2})";
  CHECK_FALSE(Accepts(m, "{}"));
  CHECK(Accepts(m, R"({"x":1,"y":2})"));
  CHECK_FALSE(Prefix(m, R"({"x":1,"y":2,)"));
  CHECK(CompileError(R"({"type":"object","additionalProperties":{"type":"integer"},"minProperties":2})").object() ==
        "minProperties");
  CHECK(CompileError(R"({"type":"object","properties":{"a":{}},"additionalProperties":false,"minProperties":2})").code() ==
        k3::ErrorCode::kInvalidArgument);
  CHECK(CompileError(R"({"type":"object","properties":{"a":{},"b":{}},"required":["a","b"],"maxProperties":1})").code() ==
        k3::ErrorCode::kInvalidArgument);
}

TEST_CASE("arrays: items and counts") {
  const char* s = R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2})";
  CHECK_FALSE(Accepts(s, "[]"));
  CHECK(Accepts(s, "[true]"));
  CHECK(Accepts(s, "[true,false]"));
  CHECK_FALSE(Prefix(s, "[true,false,"));
  CHECK_FALSE(Prefix(s, "[1"));
  CHECK(Accepts(R"({"type":"array"})", R"([1,"a",[],{}])"));
}

TEST_CASE("uniqueItems over enum items") {
  const char* s = R"({"type":"array","items":{"enum":["a","b",1,12]},"uniqueItems":true,"minItems":1})";
  CHECK(Accepts(s, R"(["a","b",1,12])"));
  CHECK(Accepts(s, R"([12,1])"));
  CHECK_FALSE(Prefix(s, R"(["a","a")"));
  CHECK_FALSE(Prefix(s, R"([1,1])"));
  CHECK(Prefix(s, R"([1,12)"));             // 12 is not 1
  CHECK_FALSE(Prefix(s, R"(["a","b",1,12,)")); // every value used: no comma
  CHECK_FALSE(Accepts(s, "[]"));
  CHECK(CompileError(R"({"type":"array","items":{"type":"string"},"uniqueItems":true})").object() == "uniqueItems");
  CHECK(CompileError(R"({"type":"array","items":{"enum":[{"a":1}]},"uniqueItems":true})").object() == "uniqueItems");
  CHECK(CompileError(R"({"type":"array","items":{"enum":["a"]},"uniqueItems":true,"minItems":2})").code() ==
        k3::ErrorCode::kInvalidArgument);
  CHECK(Accepts(R"({"type":"array","items":{"type":"string"},"uniqueItems":false})", R"(["x","x"])"));
}

TEST_CASE("enum and const, literals that prefix each other") {
  const char* s = R"({"enum":["red","green",1,12,null,{"k":[1,2]}]})";
  for (const char* ok : {R"("red")", R"("green")", "1", "12", "null", R"({"k":[1,2]})"})
    CHECK_MESSAGE(Accepts(s, ok), ok);
  CHECK(Prefix(s, "1"));
  CHECK_FALSE(Accepts(s, "123"));
  CHECK_FALSE(Accepts(s, R"("re")"));
  CHECK_FALSE(Accepts(s, R"({"k":[1]})"));
  CHECK(Accepts(R"({"const":"x"})", R"("x")"));
  // type filters the literals
  CHECK_FALSE(Accepts(R"({"type":"string","enum":["a",1]})", "1"));
  // inside an object, a number literal ends at the next byte
  CHECK(Accepts(R"({"type":"object","properties":{"v":{"enum":[1,12]}},"required":["v"]})", R"({"v":1})"));
}

TEST_CASE("anyOf, oneOf and type lists") {
  const char* s = R"({"anyOf":[{"type":"string","maxLength":2},{"type":"null"},{"type":"array","items":{"type":"integer"}}]})";
  CHECK(Accepts(s, R"("ab")"));
  CHECK(Accepts(s, "null"));
  CHECK(Accepts(s, "[1,2]"));
  CHECK_FALSE(Prefix(s, "1"));
  CHECK(Accepts(R"({"type":["integer","boolean"]})", "true"));
  CHECK(Accepts(R"({"oneOf":[{"enum":["a"]},{"enum":["b"]}]})", R"("b")"));  // literals merge
  // Alternatives that start alike are followed in parallel until they part.
  const char* objs = R"({"anyOf":[
      {"type":"object","properties":{"a":{"type":"integer"},"n":{"type":"string"}},"required":["a"],"additionalProperties":false},
      {"type":"object","properties":{"b":{"type":"string"},"n":{"type":"boolean"}},"required":["b"],"additionalProperties":false}]})";
  CHECK(Accepts(objs, R"({"a":1})"));
  CHECK(Accepts(objs, R"({"b":"x"})"));
  CHECK(Accepts(objs, R"({"n":"s","a":2})"));   // "n" is a string: only the first shape is left
  CHECK(Accepts(objs, R"({"n":true,"b":"y"})"));
  CHECK_FALSE(Prefix(objs, R"({"n":"s","b")"));
  CHECK_FALSE(Prefix(objs, R"({"a":"x")"));
  CHECK_FALSE(Accepts(objs, R"({"n":true})"));  // b missing
  CHECK_FALSE(Accepts(objs, "{}"));
  const char* mixed = R"({"anyOf":[{"enum":["long-value","zz"]},{"type":"string","maxLength":3}]})";
  CHECK(Accepts(mixed, R"("long-value")"));
  CHECK(Accepts(mixed, R"("ab")"));
  CHECK(Accepts(mixed, R"("zz")"));
  CHECK_FALSE(Accepts(mixed, R"("long")"));
  CHECK_FALSE(Prefix(mixed, R"("abcd)"));
  const char* nums = R"({"anyOf":[{"type":"integer","minimum":10,"maximum":20},{"type":"number","minimum":0.5,"maximum":0.75}]})";
  CHECK(Accepts(nums, "15"));
  CHECK(Accepts(nums, "0.6"));
  CHECK_FALSE(Accepts(nums, "5"));
  CHECK_FALSE(Prefix(nums, "15."));
  // oneOf: exactly one may match, so overlapping alternatives need a discriminator.
  const char* disc = R"({"oneOf":[
      {"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind","x"]},
      {"type":"object","properties":{"kind":{"const":"b"},"y":{"type":"string"}},"required":["kind","y"]}]})";
  CHECK(Accepts(disc, R"({"kind":"a","x":1})"));
  CHECK(Accepts(disc, R"({"y":"s","kind":"b"})"));
  CHECK_FALSE(Prefix(disc, R"({"kind":"a","y")"));
  auto e = CompileError(R"({"oneOf":[{"type":"object"},{"type":"object","properties":{"a":{}}}]})");
  CHECK(e.code() == k3::ErrorCode::kUnsupported);
  CHECK(e.object() == "oneOf");
  CHECK(CompileError(R"({"oneOf":[{"enum":["a","b"]},{"enum":["b"]}]})").object() == "oneOf");
  CHECK(CompileError(R"({"oneOf":[{"type":"string"},{"enum":["x"]}]})").object() == "oneOf");
}

TEST_CASE("additionalProperties as a schema beside properties: free keys") {
  const char* s = R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"},"gone":false},
                      "required":["name"],"additionalProperties":{"type":"boolean"}})";
  CHECK(Accepts(s, R"({"name":"x"})"));
  CHECK(Accepts(s, R"({"name":"x","extra":true})"));
  CHECK(Accepts(s, R"({"name":"x","extra":false,"n":3,"more":true})"));  // declared keys still fit after free ones
  CHECK(Accepts(s, R"({"name":"x","na":true,"names":false,"":true})"));  // prefixes and extensions are free keys
  CHECK(Accepts(s, "{\"name\":\"x\",\"\xc3\xa9\":true}"));                // UTF-8 in a free key
  CHECK_FALSE(Prefix(s, R"({"e)"));                                // free keys only once the required ones are in
  CHECK(Prefix(s, R"({"n":1,"name":"x","e)"));
  CHECK_FALSE(Prefix(s, R"({"name":"x","extra":1)"));              // free values follow additionalProperties
  CHECK_FALSE(Prefix(s, R"({"name":"x","name")"));                 // a declared key never comes back as a free key
  CHECK(Prefix(s, R"({"name":"x","name)"));                        // ... though "names" may follow
  CHECK_FALSE(Prefix(s, R"({"name":"x","n":true)"));               // "n" is declared: an integer
  CHECK_FALSE(Prefix(s, R"({"name":"x","gone")"));                 // schema false: never written, not even free
  CHECK_FALSE(Prefix(s, R"({"name":"x","e\u0078)"));               // free keys are written without escapes
  CHECK_FALSE(Prefix(s, R"({"name":"x","\u006e")"));               // (which could spell a declared key)
  // maxProperties / minProperties count free keys too.
  const char* m = R"({"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"}},"required":["a"],
                      "additionalProperties":{"type":"null"},"minProperties":2,"maxProperties":2})";
  CHECK_FALSE(Accepts(m, R"({"a":null})"));
  CHECK(Accepts(m, R"({"a":null,"x":null})"));
  CHECK(Accepts(m, R"({"b":null,"a":null})"));
  CHECK_FALSE(Prefix(m, R"({"b":null,"x)"));                       // a is still missing
  CHECK_FALSE(Prefix(m, R"({"a":null,"x":null,)"));                // maxProperties reached
  // minProperties can count one free key only (free keys may repeat).
  const char* one = R"({"type":"object","properties":{"a":{"type":"null"}},"additionalProperties":{"type":"null"},"minProperties":2})";
  CHECK(Accepts(one, R"({"a":null,"x":null})"));
  CHECK(Accepts(one, R"({"a":null,"x":null,"x":null})"));
  CHECK_FALSE(Prefix(one, R"({"x)"));                              // x and a second x would be one key
  CHECK(CompileError(R"({"type":"object","properties":{"a":{}},"additionalProperties":{"type":"null"},"minProperties":3})")
            .object() == "minProperties");
  // A required key outside properties is a declared key whose value follows additionalProperties.
  const char* r = R"({"type":"object","required":["z"],"additionalProperties":{"type":"integer"}})";
  CHECK(Accepts(r, R"({"z":2,"q":1})"));
  CHECK_FALSE(Prefix(r, R"({"q)"));
  CHECK_FALSE(Prefix(r, R"({"z":1,"z")"));
  // Python separators (XTML arguments) spell free keys the same way.
  k3::constrain::Format py;
  py.python_separators = true;
  TokenConstraint c(Schema::CompileOrThrow(s), Bytes(), py);
  CHECK(c.AdvanceBytes(R"({"name": "x", "extra": true})"));
  CHECK(c.Accepting());
}

TEST_CASE("enum and const filtered by the other keywords") {
  const char* b = R"({"type":"integer","enum":[1,5,50,100],"minimum":2,"maximum":50})";
  CHECK(Accepts(b, "5"));
  CHECK(Accepts(b, "50"));
  CHECK_FALSE(Accepts(b, "1"));
  CHECK_FALSE(Accepts(b, "100"));
  CHECK_FALSE(Prefix(b, "10"));
  const char* l = R"({"type":"string","enum":["a","bb","ccc","dddd"],"minLength":2,"maxLength":3})";
  CHECK(Accepts(l, R"("bb")"));
  CHECK(Accepts(l, R"("ccc")"));
  CHECK_FALSE(Accepts(l, R"("a")"));
  CHECK_FALSE(Accepts(l, R"("dddd")"));
  // const with enum: the value must be both.
  CHECK(Accepts(R"({"const":"x","enum":["x","y"]})", R"("x")"));
  CHECK_FALSE(Accepts(R"({"const":"x","enum":["x","y"]})", R"("y")"));
  CHECK(CompileError(R"({"const":"z","enum":["x","y"]})").code() == k3::ErrorCode::kInvalidArgument);
  // Beside a $ref, or object values against properties.
  const char* r = R"({"$defs":{"s":{"type":"string","maxLength":2}},"enum":["ab","abc",7],"$ref":"#/$defs/s"})";
  CHECK(Accepts(r, R"("ab")"));
  CHECK_FALSE(Accepts(r, R"("abc")"));
  CHECK_FALSE(Accepts(r, "7"));
  const char* o = R"({"type":"object","properties":{"k":{"type":"integer","maximum":3}},"enum":[{"k":1},{"k":5}]})";
  CHECK(Accepts(o, R"({"k":1})"));
  CHECK_FALSE(Accepts(o, R"({"k":5})"));
  CHECK(Accepts(R"({"const":0.5,"exclusiveMinimum":0})", "0.5"));
  // Every value dropped: nothing can match.
  auto e = CompileError(R"({"type":"number","enum":[1,2],"minimum":10})");
  CHECK(e.code() == k3::ErrorCode::kInvalidArgument);
  CHECK(std::string(e.what()).find("other keywords") != std::string::npos);
  // A pattern filters them too.
  const char* p = R"({"type":"string","enum":["a1","b2","ab"],"pattern":"^[a-z]\\d$"})";
  CHECK(Accepts(p, R"("a1")"));
  CHECK(Accepts(p, R"("b2")"));
  CHECK_FALSE(Accepts(p, R"("ab")"));
  // What the other keywords may not be is still refused.
  CHECK(CompileError(R"j({"type":"string","enum":["a"],"pattern":"(?=a)"})j").object() == "pattern");
}

TEST_CASE("$ref to local definitions; recursion unrolled to a bound") {
  const char* s = R"({"$defs":{"p":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}},
                      "type":"array","items":{"$ref":"#/$defs/p"}})";
  CHECK(Accepts(s, R"([{"x":1},{"x":2}])"));
  // A linked list: past kMaxRefRecursion re-entries the optional child is not offered.
  const char* list = R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"next":{"$ref":"#/$defs/n"}},
                         "required":["v"]}},"$ref":"#/$defs/n"})";
  std::string deep = R"({"v":0)", close = "}";
  for (int i = 1; i <= k3::constrain::kMaxRefRecursion; ++i) {
    deep += R"(,"next":{"v":)" + std::to_string(i);
    close += "}";
  }
  CHECK(Accepts(list, deep + close));
  CHECK(Prefix(list, R"({"v":0,"next":{"v":1,"next")"));
  CHECK_FALSE(Prefix(list, deep + ","));  // the deepest copy has no "next"
  // A tree through "#" (the root), and mutual recursion through anyOf.
  const char* tree = R"({"type":"object","properties":{"name":{"type":"string"},"kids":{"type":"array","items":{"$ref":"#"}}},
                         "required":["name"]})";
  CHECK(Accepts(tree, R"({"name":"a","kids":[{"name":"b","kids":[]},{"name":"c","kids":[{"name":"d"}]}]})"));
  const char* expr = R"({"$defs":{"e":{"anyOf":[{"type":"integer"},{"$ref":"#/$defs/op"}]},
      "op":{"type":"object","properties":{"op":{"enum":["+","*"]},"args":{"type":"array","items":{"$ref":"#/$defs/e"},
            "minItems":2,"maxItems":2}},"required":["op","args"],"additionalProperties":false}},"$ref":"#/$defs/e"})";
  CHECK(Accepts(expr, "3"));
  CHECK(Accepts(expr, R"({"op":"+","args":[1,{"op":"*","args":[2,3]}]})"));
  std::string nest = "1", open;
  for (int i = 0; i < k3::constrain::kMaxRefRecursion; ++i) {
    nest = R"({"op":"+","args":[1,)" + nest + "]}";
    open += R"({"op":"+","args":[1,)";
  }
  CHECK(Accepts(expr, nest));  // each reference is expanded inside itself kMaxRefRecursion times
  CHECK(Prefix(expr, open + "2"));
  CHECK_FALSE(Prefix(expr, open + "{"));  // one more op would expand e a sixth time
  // No finite value within the bound: kInvalidArgument naming the reference.
  auto e = CompileError(R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}},"required":["next"]}},
                           "$ref":"#/$defs/n"})");
  CHECK(e.code() == k3::ErrorCode::kInvalidArgument);
  CHECK(std::string(e.what()).find("#/$defs/n") != std::string::npos);
  // Too many nodes at the full bound: fewer levels are unrolled.
  std::string wide = R"({"$defs":{"w":{"type":"object","properties":{"next":{"$ref":"#/$defs/w"})";
  for (int i = 0; i < 63; ++i) {
    wide += ",\"o" + std::to_string(i) + R"(":{"type":"object","properties":{)";
    for (int j = 0; j < 64; ++j) wide += std::string(j ? "," : "") + "\"s" + std::to_string(j) + R"(":{"type":"string"})";
    wide += "}}";
  }
  wide += R"(}}},"$ref":"#/$defs/w"})";
  CHECK_NOTHROW(Schema::CompileOrThrow(wide));
  CHECK(Prefix(wide, R"({"next":{"next":{)"));
}

TEST_CASE("unsupported keywords are refused with the keyword and its JSON pointer") {
  struct Case { const char* schema; const char* keyword; const char* pointer; };
  const Case cases[] = {
      {R"({"type":"string","pattern":"a\\b"})", "pattern", "/"},
      {R"({"type":"object","properties":{"a":{"type":"number","multipleOf":0.5}}})", "multipleOf",
       "/properties/a"},
      {R"({"type":"array","items":{"not":{"type":"null"}}})", "not", "/items"},
      {R"({"type":"array","uniqueItems":true})", "uniqueItems", "/"},  // items not an enum
      {R"({"if":{},"then":{}})", "if", "/"},
      {R"({"type":"array","contains":{}})", "contains", "/"},
      {R"({"type":"object","properties":{"a/b":{"minProperties":2}}})", "minProperties",
       "/properties/a~1b"},
      {R"({"allOf":[{"properties":{"a":{}},"patternProperties":{"x":{}}},{"properties":{"b":{}}}]})",
       "allOf", "/"},
      {R"({"$ref":"https://example.com/s.json"})", "$ref", "/"},
      {R"({"type":"integer","exclusiveMinimum":true})", "exclusiveMinimum", "/"},
      {R"({"frobnicate":1})", "frobnicate", "/"},
  };
  for (const Case& c : cases) {
    auto e = CompileError(c.schema);
    CHECK_MESSAGE(e.code() == k3::ErrorCode::kUnsupported, c.schema);
    CHECK_MESSAGE(e.object() == c.keyword, e.what());
    CHECK_MESSAGE(std::string(e.what()).find(std::string("at ") + c.pointer) != std::string::npos, e.what());
  }
  // The two refusals real tool schemas hit most say what to change.
  auto big = CompileError(R"({"type":"integer","minimum":1e20})");
  CHECK(big.object() == "minimum");
  CHECK(std::string(big.what()).find("1e+20 lies beyond +-(1e18 - 1)") != std::string::npos);
  CHECK(std::string(CompileError(R"({"type":"string","pattern":"(a)\\1"})").what()).find("backreferences") !=
        std::string::npos);
  CHECK(CompileError("{").code() == k3::ErrorCode::kCorrupt);
  // Caps that keep a hostile schema from making every mask slow.
  std::string many = R"({"anyOf":[)";
  for (int i = 0; i <= k3::constrain::kMaxAlternatives; ++i)
    many += std::string(i ? "," : "") + R"({"type":"object","properties":{"k)" + std::to_string(i) + R"(":{}}})";
  CHECK(CompileError(many + "]}").object() == "anyOf");
  // 64 x 64 x 6 leaves: more nodes than kMaxNodes, in well under kMaxSchemaBytes.
  auto object_of = [](int n, const std::string& child) {
    std::string o = R"({"type":"object","properties":{)";
    for (int i = 0; i < n; ++i) o += std::string(i ? "," : "") + "\"p" + std::to_string(i) + "\":" + child;
    return o + "}}";
  };
  std::string wide = object_of(64, object_of(64, object_of(6, R"({"type":"string"})")));
  REQUIRE(wide.size() < k3::constrain::kMaxSchemaBytes);
  CHECK(CompileError(wide).object() == "schema");
  CHECK(CompileError(std::string(k3::constrain::kMaxSchemaBytes + 1, ' ')).code() == k3::ErrorCode::kInvalidArgument);
  CHECK(CompileError(R"({"type":"strin"})").code() == k3::ErrorCode::kCorrupt);
  CHECK(CompileError(R"({"type":"string","minLength":3,"maxLength":2})").code() == k3::ErrorCode::kInvalidArgument);
  CHECK(CompileError(R"({"enum":[]})").code() == k3::ErrorCode::kInvalidArgument);
  CHECK(CompileError(R"({"type":"integer","minimum":1.5,"maximum":1.7})").code() == k3::ErrorCode::kInvalidArgument);
  // Annotations are accepted and ignored.
  CHECK(Accepts(
      R"({"title":"t","description":"d","format":"color","default":"x","x-k":1,"type":"string"})",
      R"("x")"));
}

TEST_CASE("deep nesting") {
  std::string schema = R"({"type":"integer"})", text = "7";
  for (int i = 0; i < 40; ++i) {
    schema = i % 2 ? R"({"type":"array","items":)" + schema + R"(,"minItems":1,"maxItems":1})"
                   : R"({"type":"object","properties":{"k":)" + schema + R"(},"required":["k"]})";
    text = i % 2 ? "[" + text + "]" : R"({"k":)" + text + "}";
  }
  CHECK(Accepts(schema, text));
  CHECK_FALSE(Accepts(schema, text.substr(0, text.size() - 1)));
  // json_object: 64 open containers at most, then only closing is possible.
  auto obj = Schema::JsonObject();
  std::string deep = "{";
  for (int i = 1; i < k3::constrain::kMaxDepth; ++i) deep += R"("a":{)";
  CHECK(Prefix(obj, deep));
  CHECK_FALSE(Prefix(obj, deep + R"("a":{)"));
  CHECK(Prefix(obj, deep + R"("a":[)") == false);
  CHECK(Prefix(obj, deep + R"("a":1)"));
  // A schema that needs more nested containers than the matcher allows is
  // refused at compile time (never a dead end while generating).
  std::string too_deep = R"({"type":"integer"})", fits = too_deep;
  for (int i = 0; i < k3::constrain::kMaxDepth + 1; ++i)
    too_deep = R"({"type":"array","minItems":1,"items":)" + too_deep + "}";
  for (int i = 0; i < k3::constrain::kMaxDepth - 1; ++i)
    fits = R"({"type":"array","minItems":1,"items":)" + fits + "}";
  CHECK(CompileError(too_deep).code() == k3::ErrorCode::kUnsupported);
  CHECK(CompileError(too_deep).object() == "schema");
  std::string fits_text = std::string(size_t(k3::constrain::kMaxDepth - 1), '[') + "1" +
                     std::string(size_t(k3::constrain::kMaxDepth - 1), ']');
  CHECK(Accepts(fits, fits_text));
}

TEST_CASE("Accepting, Complete, Advance errors") {
  auto s = Schema::CompileOrThrow(R"({"type":"integer"})");
  TokenConstraint c(s, Bytes());
  CHECK_FALSE(c.Accepting());
  c.Advance('4');
  CHECK(c.Accepting());
  CHECK_FALSE(c.Complete());  // more digits may follow a top-level number
  CHECK_THROWS_AS(c.Advance('x'), k3::Error);
  CHECK(c.text() == "4");     // a refused token changes nothing
  CHECK_THROWS_AS(c.Advance(257), k3::Error);  // a special
  c.Advance('2');
  CHECK(c.text() == "42");
  auto o = Schema::JsonObject();
  TokenConstraint d(o, Bytes());
  REQUIRE(d.AdvanceBytes("{}"));
  CHECK(d.Accepting());
  CHECK(d.Complete());
  std::vector<uint64_t> m;
  d.AllowedMask(m);
  for (uint64_t w : m) CHECK(w == 0);
  d.Reset();
  CHECK(d.text().empty());
  CHECK_FALSE(d.Accepting());
}

TEST_CASE("tokens that split JSON tokens, keys and characters") {
  // A hand-made vocabulary: tokens straddle quotes, key/value boundaries and the
  // middle of a UTF-8 character.
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, char(b));
  for (const char* x : {"{\"", "na", "me", "\":\"", "\":", "\"}", "\",\"", "hello", "\xe4\xbd", "\xa0\"}",
                        "\\u00", "e9", "12", "3,", "0}", "true}", "\"na", "\",\"age\":", ",\"", "\"age", "  "})
    t.emplace_back(x);
  Vocabulary v(std::move(t), uint32_t(256 + 21 + 3));
  auto id = [&](std::string_view s) {
    for (uint32_t i = 256; i < v.num_ranks(); ++i)
      if (v.TokenBytes(i) == s) return i;
    FAIL("no token " << std::string(s));
    return 0u;
  };
  auto s = Schema::CompileOrThrow(R"({"type":"object","properties":{"name":{"type":"string"},
      "age":{"type":"integer","minimum":0,"maximum":130}},"required":["name","age"],"additionalProperties":false})");
  TokenConstraint c(s, v);
  std::vector<uint64_t> m;
  c.AllowedMask(m);
  CHECK(Bit(m, id("{\"")));
  CHECK_FALSE(Bit(m, id("  ")));
  c.Advance(id("{\""));
  c.AllowedMask(m);
  CHECK(Bit(m, id("na")));
  CHECK_FALSE(Bit(m, id("me")));
  CHECK_FALSE(Bit(m, id("hello")));
  c.Advance(id("na"));
  c.Advance(id("me"));
  c.AllowedMask(m);
  CHECK(Bit(m, id("\":\"")));
  CHECK(Bit(m, id("\":")));
  c.Advance(id("\":\""));
  c.Advance(id("\xe4\xbd"));   // first two bytes of 你
  c.AllowedMask(m);
  CHECK(Bit(m, id("\xa0\"}")) == false);  // completes the character but '}' comes too early (age missing)
  CHECK_FALSE(Bit(m, id("hello")));       // a continuation byte must come first
  CHECK(Bit(m, 0xa0));
  c.Advance(0xa0);
  c.AllowedMask(m);
  CHECK(Bit(m, id("\",\"age\":")));
  CHECK(Bit(m, id("\\u00")));
  CHECK(Bit(m, id("hello")));
  c.Advance(id("\",\"age\":"));
  c.AllowedMask(m);
  CHECK(Bit(m, id("12")));
  CHECK_FALSE(Bit(m, id("3,")));          // nothing may follow age
  c.Advance(id("12"));
  c.AllowedMask(m);
  CHECK(Bit(m, id("0}")));                // 120 is within [0, 130]
  CHECK_FALSE(Bit(m, id("3,")));
  CHECK(Bit(m, '}'));
  c.Advance(id("0}"));
  CHECK(c.Accepting());
  CHECK(c.Complete());
  CHECK(c.text() == "{\"name\":\"\xe4\xbd\xa0\",\"age\":120}");
  for (uint32_t sp = v.num_ranks(); sp < v.vocab_size(); ++sp) CHECK_FALSE(c.Allowed(sp));
}

TEST_CASE("mask equals the direct check along random walks (byte-split and tiny vocabularies)") {
  const k3::tok::Tokenizer& tiny = Tiny();
  Vocabulary tv = Vocabulary::FromTokenizer(tiny);
  CHECK(tv.vocab_size() == tiny.vocab_size());
  const std::vector<const char*>& schemas = WalkSchemas();
  std::mt19937_64 rng(16);
  for (const char* js : schemas) {
    auto s = Schema::CompileOrThrow(js);
    for (const Vocabulary* v : std::vector<const Vocabulary*>{&tv, &Bytes()}) {
      TokenConstraint c(s, *v);
      std::vector<uint64_t> m;
      for (int step = 0; step < 40 && !c.Complete(); ++step) {
        CheckMaskAgainstDirect(s, *v, c.text(), c);
        c.AllowedMask(m);
        std::vector<uint32_t> ok;
        for (uint32_t id = 0; id < v->vocab_size(); ++id)
          if (Bit(m, id)) ok.push_back(id);
        REQUIRE_MESSAGE(!ok.empty(), "dead end after '" << c.text() << "'");
        // Prefer closing tokens later on so that the walk finishes.
        uint32_t pick = ok[rng() % ok.size()];
        if (step > 20) {
          for (uint32_t id : ok) {
            std::string_view b = v->TokenBytes(id);
            if (b.find_first_of("\"]}") != std::string_view::npos && rng() % 3 == 0) { pick = id; break; }
          }
        }
        c.Advance(pick);
      }
    }
  }
}

TEST_CASE("inside escapes and split characters the mask equals the direct check") {
  // A vocabulary of short random strings over the bytes that matter in strings
  // and escapes, so that tokens straddle \u digits, surrogate pairs, quotes
  // and UTF-8 sequences.
  Vocabulary v = RandomVocab("\\\"uUdDcCeEfF0189ab{}[],: x\xc3\xa9\xe4\xbd\xa0\xf0\x9f\x98\x80", 6000, 6, 7);
  const char* prefixes[] = {"\"", "\"\\", "\"\\u", "\"\\uD", "\"\\ud8", "\"\\uD83", "\"\\uD83D",
                            "\"\\uD83D\\", "\"\\uD83D\\u", "\"\\uD83D\\uD", "\"\\uD83D\\uDE", "\"\\uD83D\\uDE0",
                            "\"\\u0", "\"\\u00", "\"\\u00e", "\"\\uDB", "\"ab\xe4", "\"\xe4\xbd", "\"\xf0",
                            "\"\xf0\x9f", "\"\xf0\x9f\x98", "\"\xe0", "\"\xed", "\"\xf4"};
  for (const char* js : {R"({"type":"string"})", R"({"type":"string","minLength":2,"maxLength":4})",
                         R"({"type":"array","items":{"type":"string"}})"}) {
    auto s = Schema::CompileOrThrow(js);
    for (const char* p : prefixes) {
      std::string text(std::string_view(js).find("array") != std::string_view::npos ? "[" : "");
      text.append(p);
      TokenConstraint c(s, v);
      REQUIRE_MESSAGE(c.AdvanceBytes(text), text);
      CheckMaskAgainstDirect(s, v, text, c);
    }
  }
  CHECK_THROWS_AS(Vocabulary({"a", "b", "a"}, 3), k3::Error);  // same bytes twice
}

TEST_CASE("length-limited strings with long tokens: the mask equals the direct check") {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, char(b));
  for (int k = 2; k <= 40; ++k) {
    t.push_back(std::string(size_t(k), 'x'));
    t.push_back(std::string(size_t(k - 1), 'y') + "\"");
    std::string cjk;
    for (int i = 0; i < k; ++i) cjk += "\xe4\xbd\xa0";
    t.push_back(cjk);
  }
  Vocabulary v(std::move(t), uint32_t(256 + 39 * 3));
  auto s = Schema::CompileOrThrow(R"({"type":"array","items":{"type":"string","minLength":3,"maxLength":30}})");
  for (int fill : {0, 1, 2, 13, 14, 15, 16, 17, 29, 30}) {
    std::string text = "[\"" + std::string(size_t(fill), 'a');
    TokenConstraint c(s, v);
    REQUIRE(c.AdvanceBytes(text));
    CheckMaskAgainstDirect(s, v, text, c);
    std::vector<uint64_t> m;
    c.AllowedMask(m);
    uint32_t x_tokens = 0;
    for (uint32_t id = 256; id < v.num_ranks(); ++id)
      if (Bit(m, id) && v.TokenBytes(id)[0] == 'x') ++x_tokens;
    CHECK(x_tokens == uint32_t(std::max(0, std::min(39, 30 - fill - 1))));  // "xx".. up to 30 - fill characters
  }
}

namespace {
bool AcceptsFmt(std::string_view schema, std::string_view text, k3::constrain::Format f) {
  TokenConstraint c(Schema::CompileOrThrow(schema), Bytes(), f);
  return c.AdvanceBytes(text) && c.Accepting();
}
bool PrefixFmt(std::string_view schema, std::string_view text, k3::constrain::Format f) {
  TokenConstraint c(Schema::CompileOrThrow(schema), Bytes(), f);
  return c.AdvanceBytes(text);
}
}  // namespace

TEST_CASE("Format: Python json.dumps separators (XTML non-string arguments)") {
  k3::constrain::Format py;
  py.python_separators = true;
  const char* s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"array","items":{"enum":[{"k":[1,2]},"x"]}}},"required":["a"]})";
  CHECK(AcceptsFmt(s, R"({"a": 1, "b": [{"k": [1, 2]}, "x"]})", py));
  CHECK(AcceptsFmt(s, R"({"b": [], "a": -3})", py));
  CHECK_FALSE(PrefixFmt(s, R"({"a":1)", py));
  CHECK_FALSE(PrefixFmt(s, R"({"a": 1,"b")", py));
  CHECK_FALSE(PrefixFmt(s, R"({"a":  1)", py));
  CHECK_FALSE(PrefixFmt(s, R"({"a": 1, "b": [{"k":[1,2]})", py));  // literals in Python spelling too
  CHECK_FALSE(PrefixFmt(s, R"({ "a": 1})", py));
  CHECK(AcceptsFmt(R"({"type":"array"})", R"([1, {"x": [true, null]}, "a, b: c"])", py));
  CHECK(Accepts(s, R"({"a":1,"b":[{"k":[1,2]}]})"));  // the default stays compact
}

TEST_CASE("Format: raw top-level strings (XTML string arguments)") {
  k3::constrain::Format raw;
  raw.raw_top_string = true;
  const char* s = R"({"type":"string","maxLength":6})";
  CHECK(AcceptsFmt(s, "a\"b\\c\n", raw));          // quotes, backslashes, newlines are content
  CHECK(AcceptsFmt(s, "\xe4\xbd\xa0\xe5\xa5\xbd", raw));
  CHECK(AcceptsFmt(s, "", raw));                     // empty, minLength 0
  CHECK_FALSE(AcceptsFmt(R"({"type":"string","minLength":1})", "", raw));
  CHECK_FALSE(PrefixFmt(s, "abcdefg", raw));
  CHECK_FALSE(PrefixFmt(s, "a\x01", raw));
  CHECK_FALSE(PrefixFmt(s, "\xc0\xaf", raw));
  CHECK(PrefixFmt(s, "\xe4\xbd", raw));
  CHECK_FALSE(AcceptsFmt(s, "\xe4\xbd", raw));      // a split character is not an end
  const char* e = R"({"enum":["ab","abc","a\"q"]})";
  CHECK(AcceptsFmt(e, "ab", raw));
  CHECK(AcceptsFmt(e, "abc", raw));
  CHECK(AcceptsFmt(e, "a\"q", raw));
  CHECK_FALSE(AcceptsFmt(e, "a", raw));
  CHECK_FALSE(PrefixFmt(e, "abd", raw));
  CHECK_FALSE(PrefixFmt(e, "\"ab\"", raw));
  CHECK_THROWS_AS(TokenConstraint(Schema::CompileOrThrow(R"({"type":"integer"})"), Bytes(), raw), k3::Error);
  CHECK_THROWS_AS(TokenConstraint(Schema::CompileOrThrow(R"({"enum":["a",1]})"), Bytes(), raw), k3::Error);
}

TEST_CASE("Format: masks equal the direct check in raw and Python modes") {
  Vocabulary v = RandomVocab("\\\":, []{}ax1\n\x01\xe4\xbd\xa0", 4000, 7, 9);
  struct Case { const char* schema; bool raw; const char* prefixes[4]; };
  const Case cases[] = {
      {R"({"type":"string"})", true, {"", "a", "a\xe4", "a\"\\"}},
      {R"({"type":"string","maxLength":5})", true, {"", "abc", "ab\xe4\xbd", "abcde"}},
      {R"({"enum":["a, b","a\n","xx"]})", true, {"", "a", "a,", "x"}},
      {R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},"b":{"type":"string"}}})", false,
       {"{", "{\"a\": [1", "{\"a\": [1,", "{\"a\": [1], \"b\": \"x"}},
  };
  for (const Case& c : cases) {
    k3::constrain::Format f;
    f.raw_top_string = c.raw;
    f.python_separators = !c.raw;
    auto s = Schema::CompileOrThrow(c.schema);
    for (const char* p : c.prefixes) {
      TokenConstraint tc(s, v, f);
      REQUIRE_MESSAGE(tc.AdvanceBytes(p), p);
      CheckMaskAgainstDirect(s, v, p, tc, f);
    }
  }
}

// ---- pattern ----
// Expected results are JSON Schema's (ECMA-262 search semantics, the same as
// Python's re.search on these patterns), written out by hand.

TEST_CASE("pattern: unanchored search, anchors at the ends, alternation") {
  const char* az = R"({"type":"string","pattern":"^[a-z]+$"})";
  CHECK(Accepts(az, R"("abc")"));
  CHECK_FALSE(Accepts(az, R"("")"));
  CHECK_FALSE(Accepts(az, R"("aBc")"));
  CHECK(Prefix(az, R"("ab)"));
  CHECK_FALSE(Prefix(az, R"("ab1)"));
  CHECK_FALSE(Prefix(az, R"("ab")") == false);  // complete
  const char* ab = R"({"type":"string","pattern":"ab"})";  // anywhere
  CHECK(Accepts(ab, R"("xxabyy")"));
  CHECK(Accepts(ab, R"("ab")"));
  CHECK_FALSE(Accepts(ab, R"("a")"));
  CHECK_FALSE(Accepts(ab, R"("xb")"));
  CHECK(Prefix(ab, R"("zzz)"));
  CHECK_FALSE(Prefix(ab, R"("a")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^ab"})", R"("abz")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^ab"})", R"("zab")"));
  CHECK(Accepts(R"({"type":"string","pattern":"ab$"})", R"("zab")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"ab$"})", R"("abz")"));
  const char* alt = R"({"pattern":"^a$|^b$|c"})";  // no type: a string
  CHECK(Accepts(alt, R"("a")"));
  CHECK(Accepts(alt, R"("b")"));
  CHECK(Accepts(alt, R"("xcx")"));
  CHECK_FALSE(Accepts(alt, R"("ab")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^(?:ab|cd)+$"})", R"("abcdab")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^(?:ab|cd)+$"})", R"("abc")"));
  CHECK(Accepts(R"({"type":"string","pattern":""})", R"("anything")"));
}

TEST_CASE("pattern: classes, shorthands and the dot") {
  const char* email = R"({"type":"string","pattern":"^[\\w.-]+@[a-z]+\\.com$"})";
  CHECK(Accepts(email, R"("a.b-c_9@x.com")"));
  CHECK_FALSE(Accepts(email, R"("a@x.co")"));
  CHECK_FALSE(Accepts(email, R"("a@xycom")"));
  const char* not_digit = R"({"type":"string","pattern":"^[^0-9]{2}$"})";
  CHECK(Accepts(not_digit, R"("ab")"));
  CHECK(Accepts(not_digit, "\"\xc3\xa9x\""));  // é
  CHECK_FALSE(Accepts(not_digit, R"("a1")"));
  // \d is ASCII: Python's re would also take U+0663 (ARABIC-INDIC DIGIT THREE), ECMA-262 not.
  CHECK(Accepts(R"({"type":"string","pattern":"^\\d\\d$"})", R"("42")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^\\d$"})", "\"\xd9\xa3\""));
  CHECK(Accepts(R"({"type":"string","pattern":"^\\D$"})", R"("a")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^\\D$"})", "\"\xc3\xa9\""));  // either engine might not agree
  CHECK(Accepts(R"({"type":"string","pattern":"^\\s\\S$"})", R"(" x")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^\\S+$"})", "\"\xc3\xa9t\xc3\xa9\""));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^\\S+$"})", R"("a b")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^\\S$"})", "\"\xc2\xa0\""));  // NBSP is \s in both
  CHECK(Accepts(R"({"type":"string","pattern":"^.$"})", R"("x")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^.$"})", "\"\xe4\xbd\xa0\""));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^.$"})", R"("\n")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^.$"})", R"("\r")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^[\\t\\x41\\u0042-]+$"})", R"("\tAB-")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^[a\\-z]$"})", R"("-")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^[a\\-z]$"})", R"("b")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^[\\b]$"})", R"("\b")"));  // backspace in a class
}

TEST_CASE("pattern: quantifier bounds") {
  const char* a23 = R"({"type":"string","pattern":"^a{2,3}$"})";
  CHECK_FALSE(Accepts(a23, R"("a")"));
  CHECK(Accepts(a23, R"("aa")"));
  CHECK(Accepts(a23, R"("aaa")"));
  CHECK_FALSE(Accepts(a23, R"("aaaa")"));
  CHECK_FALSE(Prefix(a23, R"("aaaa)"));
  CHECK(Accepts(R"({"type":"string","pattern":"^(ab){2}$"})", R"("abab")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^(ab){2}$"})", R"("ab")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^x?y*$"})", R"("")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^x?y*$"})", R"("xyyy")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^x?y*$"})", R"("xx")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^a{2,}$"})", R"("aaaaaaa")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^a{2,}$"})", R"("a")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^a+?b??$"})", R"("aa")"));  // lazy: same language
  CHECK(Accepts(R"({"type":"string","pattern":"^\\d{4}-\\d{2}-\\d{2}$"})", R"("2026-12-01")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^\\d{4}-\\d{2}-\\d{2}$"})", R"("2026-1-01")"));
}

TEST_CASE("pattern: the decoded value, through escapes and multi-byte characters") {
  // Pattern a\.b: the dot is literal.
  const char* dot = R"({"type":"string","pattern":"^a\\.b$"})";
  CHECK(Accepts(dot, R"("a.b")"));
  CHECK_FALSE(Accepts(dot, R"("axb")"));
  // A quote in the pattern: the value "x" spelled with escapes.
  const char* quote = R"({"type":"string","pattern":"^\"x\"$"})";
  CHECK(Accepts(quote, R"("\"x\"")"));
  CHECK(Accepts(quote, R"("\u0022x\"")"));
  CHECK_FALSE(Accepts(quote, R"("x")"));
  // A backslash.
  CHECK(Accepts(R"({"type":"string","pattern":"^\\\\$"})", R"("\\")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^\\\\$"})", R"("\/")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^/$"})", R"("\/")"));
  // é raw or as \u00e9 in the schema and in the output.
  const char* e_acute = R"({"type":"string","pattern":"^\u00e9$"})";
  CHECK(Accepts(e_acute, "\"\xc3\xa9\""));
  CHECK(Accepts(e_acute, R"("\u00e9")"));
  CHECK(Accepts(e_acute, R"("\u00E9")"));
  CHECK_FALSE(Accepts(e_acute, R"("e")"));
  CHECK_FALSE(Prefix(e_acute, R"("\u00f)"));  // no completion of \u00f. is é
  CHECK(Prefix(e_acute, R"("\u00)"));
  CHECK_FALSE(Prefix(e_acute, R"("\u01)"));
  CHECK(Prefix(e_acute, "\"\xc3"));
  CHECK_FALSE(Prefix(e_acute, "\"\xc4"));
  // Outside the BMP: a surrogate pair is one code point.
  const char* grin = "{\"type\":\"string\",\"pattern\":\"^\xf0\x9f\x98\x80$\"}";  // U+1F600
  CHECK(Accepts(grin, "\"\xf0\x9f\x98\x80\""));
  CHECK(Accepts(grin, R"("\ud83d\ude00")"));
  CHECK(Prefix(grin, R"("\ud83d\ude0)"));
  CHECK_FALSE(Prefix(grin, R"("\ud83d\ude1)"));
  CHECK_FALSE(Prefix(grin, R"("\ud83c)"));
  CHECK(Prefix(grin, R"("\ud)"));
  CHECK_FALSE(Prefix(grin, R"("\ue)"));
  CHECK(Prefix(grin, "\"\xf0\x9f\x98"));
  CHECK_FALSE(Prefix(grin, "\"\xf0\x9f\x99"));
  CHECK_FALSE(Accepts(grin, R"("\ud83d\ude01")"));
  // A class of Greek letters.
  const char* greek = R"({"type":"string","pattern":"^[α-ω]{2}$"})";
  CHECK(Accepts(greek, "\"\xce\xb1\xce\xb2\""));
  CHECK_FALSE(Accepts(greek, R"("ab")"));
  CHECK(Prefix(greek, "\"\xce"));
  CHECK_FALSE(Prefix(greek, "\"\xd0"));  // Cyrillic
  CHECK(Prefix(greek, R"("\u03b)"));
}

TEST_CASE("pattern with minLength / maxLength; unsatisfiable patterns") {
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^a+$","maxLength":3})", R"("aaaa")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^a+$","maxLength":3})", R"("aaa")"));
  CHECK_FALSE(Accepts(R"({"type":"string","pattern":"^(ab)+$","minLength":3})", R"("ab")"));
  CHECK(Accepts(R"({"type":"string","pattern":"^(ab)+$","minLength":3})", R"("abab")"));
  // "b" could only become bcccc, longer than 3.
  CHECK_FALSE(Prefix(R"({"type":"string","pattern":"^(a|bcccc)$","maxLength":3})", R"("b)"));
  CHECK(Prefix(R"({"type":"string","pattern":"^(a|bcccc)$","maxLength":3})", R"("a)"));
  for (const char* s : {R"({"type":"string","pattern":"^a{5}$","maxLength":3})",
                        R"({"type":"string","pattern":"^ab$","minLength":5})",
                        R"({"type":"string","pattern":"^[^\\s\\S]$"})",
                        R"({"type":"object","properties":{"k":{"type":"string","pattern":"^x{3}$","maxLength":2}},"required":["k"]})"}) {
    auto e = CompileError(s);
    CHECK_MESSAGE(e.code() == k3::ErrorCode::kInvalidArgument, s);
  }
  // An optional property that cannot be satisfied is simply never offered...
  // (compiles: the whole schema still has values).
}

TEST_CASE("pattern refusals name the keyword and the pointer") {
  const char* bad[] = {"(?=a)", "(?!a)", "(?<=a)", "(?<!a)", "(a)\\\\1", "a\\\\b", "\\\\Bx", "\\\\p{L}", "(?i)a",
                       "a^b", "a$b", "(^a)", "(a$)", "a{", "a{,3}", "x{3,2}", "[]", "[^]", "[]a]", "(?<n>a)",
                       "(?P<n>a)", "\\\\u{1F600}", "a**", "a++", "*a", "(a", "a)", "[a", "\\\\k<n>", "\\\\cA",
                       "\\\\Z", "\\\\A", "\\\\01", "[a-\\\\d]", "[z-a]", "(a{100}){100}", "x{100001}"};
  for (const char* p : bad) {
    std::string schema = std::string(R"({"type":"object","properties":{"id":{"type":"string","pattern":")") + p + "\"}}}";
    auto e = CompileError(schema);
    CHECK_MESSAGE(e.code() == k3::ErrorCode::kUnsupported, schema);
    CHECK_MESSAGE(e.object() == "pattern", e.what());
    CHECK_MESSAGE(std::string(e.what()).find("at /properties/id") != std::string::npos, e.what());
  }
  CHECK(CompileError(R"({"type":"string","pattern":3})").code() == k3::ErrorCode::kCorrupt);
  // Caps: a pattern whose automaton is too big is refused, not approximated.
  CHECK(std::string(CompileError(R"({"type":"string","pattern":"(a{100}){100}"})").what()).find("NFA states") !=
        std::string::npos);
}

TEST_CASE("pattern: a token that spans the closing quote; masks equal the direct check") {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, char(b));
  for (const char* x : {"b\"}", "a\"}", "aa", "ab", "\"}", "\":\"", "{\"k", "\\u00", "e9\"", "\xc3\xa9\"}"}) t.emplace_back(x);
  Vocabulary v(std::move(t), 256 + 10);
  auto id = [&](std::string_view s) {
    for (uint32_t i = 256; i < v.num_ranks(); ++i)
      if (v.TokenBytes(i) == s) return i;
    FAIL("no token " << std::string(s));
    return 0u;
  };
  auto s = Schema::CompileOrThrow(R"({"type":"object","properties":{"k":{"type":"string","pattern":"^a*(b|é)$"}},"required":["k"]})");
  TokenConstraint c(s, v);
  REQUIRE(c.AdvanceBytes(R"({"k":"aa)"));
  std::vector<uint64_t> m;
  c.AllowedMask(m);
  CHECK(Bit(m, id("b\"}")));
  CHECK_FALSE(Bit(m, id("a\"}")));
  CHECK_FALSE(Bit(m, id("\"}")));
  CHECK(Bit(m, id("aa")));
  CHECK(Bit(m, id("ab")));
  CHECK(Bit(m, id("\\u00")));
  CHECK(Bit(m, id("\xc3\xa9\"}")));
  CheckMaskAgainstDirect(s, v, c.text(), c);
  c.Advance(id("\\u00"));
  c.AllowedMask(m);
  CHECK(Bit(m, id("e9\"")));
  CheckMaskAgainstDirect(s, v, c.text(), c);
  c.Advance(id("e9\""));
  CHECK(c.AdvanceBytes("}"));
  CHECK(c.Complete());
  CHECK(c.text() == R"({"k":"aa\u00e9"})");

  // Random walks over the tiny vocabulary and one of tokens that straddle
  // escapes and characters: the mask equals the direct check, and never
  // dead-ends.
  Vocabulary tv = Vocabulary::FromTokenizer(Tiny());
  Vocabulary rv = RandomVocab("\\\"uUdD0189ab-.:{} x\xc3\xa9\xe4\xbd\xa0\xf0\x9f\x98\x80", 4000, 5, 9);
  const char* schemas[] = {
      R"({"type":"string","pattern":"^[a-z]{2,5}-\\d{1,3}$"})",
      R"({"type":"object","properties":{"v":{"type":"string","pattern":"ab|\\u00e9","maxLength":6},"n":{"type":"integer"}},"required":["v","n"]})",
      R"({"type":"array","items":{"type":"string","pattern":"^(\\d{4}-\\d{2}|x+)$"},"maxItems":3})",
      R"({"type":"string","pattern":"^[^\"\\\\]*\"","minLength":2})",
      R"({"anyOf":[{"type":"string","pattern":"^a+$"},{"type":"string","pattern":"^b"}]})",
  };
  // Raw strings (XTML arguments) with a pattern: quotes and backslashes are characters.
  {
    auto raw = Schema::CompileOrThrow(R"({"type":"string","pattern":"^[a-z\"\\\\]{2,6}\\d?$"})");
    const k3::constrain::Format fmt{false, true};
    std::mt19937_64 r2(5);
    for (const Vocabulary* voc : std::vector<const Vocabulary*>{&tv, &rv}) {
      TokenConstraint w(raw, *voc, fmt);
      for (int step = 0; step < 6 && !w.Complete(); ++step) {
        CheckMaskAgainstDirect(raw, *voc, w.text(), w, fmt);
        w.AllowedMask(m);
        std::vector<uint32_t> ok;
        for (uint32_t i = 0; i < voc->vocab_size(); ++i)
          if (Bit(m, i)) ok.push_back(i);
        if (ok.empty()) break;
        w.Advance(ok[r2() % ok.size()]);
      }
    }
  }
  std::mt19937_64 rng(161);
  for (const char* js : schemas) {
    auto sc = Schema::CompileOrThrow(js);
    for (const Vocabulary* voc : std::vector<const Vocabulary*>{&tv, &rv, &Bytes()}) {
      for (int run = 0; run < 3; ++run) {
        TokenConstraint w(sc, *voc);
        for (int step = 0; step < 30 && !w.Complete(); ++step) {
          CheckMaskAgainstDirect(sc, *voc, w.text(), w);
          w.AllowedMask(m);
          std::vector<uint32_t> ok;
          for (uint32_t i = 0; i < voc->vocab_size(); ++i)
            if (Bit(m, i)) ok.push_back(i);
          REQUIRE_MESSAGE(!ok.empty(), "dead end after '" << w.text() << "' for " << js);
          w.Advance(ok[rng() % ok.size()]);
        }
      }
    }
  }
}

TEST_CASE("pattern: PreferredByte leads to acceptance (shortest-completion steering)") {
  struct Case { const char* schema; const char* prefix; const char* want; };
  const Case cases[] = {
      {R"({"type":"string","pattern":"^a*b$"})", R"("aaa)", R"(b")"},
      {R"({"type":"string","pattern":"^a*b$"})", R"(")", R"(b")"},
      {R"({"type":"string","pattern":"^\\d{3}$"})", R"("1)", R"(00")"},
      {R"({"type":"string","pattern":"^(ab)+$","minLength":3})", R"("ab)", R"(ab")"},
      {R"({"type":"string","pattern":"xyz"})", R"("q)", R"(xyz")"},
      {R"({"type":"string","pattern":"^é+$"})", R"(")", "\xc3\xa9\""},
      {R"({"type":"string","pattern":"^é+$"})", "\"\xc3", "\xa9\""},
      {R"({"type":"string","pattern":"^é+$"})", R"("\u0)", R"(0e9")"},
      {R"({"type":"string","pattern":"^\"$"})", R"(")", R"(\"")"},
      {R"({"type":"string","pattern":"^\\n$"})", R"(")", R"(\n")"},
      {"{\"type\":\"string\",\"pattern\":\"^\xf0\x9f\x98\x80$\"}", R"("\ud83d)", R"(\ude00")"},
  };
  for (const Case& c : cases) {
    auto s = Schema::CompileOrThrow(c.schema);
    TokenConstraint t(s, Bytes());
    REQUIRE(t.AdvanceBytes(c.prefix));
    std::string out;
    while (!t.Accepting() && out.size() < 64) {
      int b = t.PreferredByte();
      REQUIRE_MESSAGE(b >= 0, c.schema << " after " << t.text());
      char ch = char(b);
      REQUIRE_MESSAGE(t.AdvanceBytes(std::string_view(&ch, 1)), c.schema << " after " << t.text());
      out += ch;
    }
    CHECK_MESSAGE(out == c.want, c.schema << " from " << c.prefix << ": " << out);
    CHECK(t.PreferredByte() == -1);  // outside the string
  }
  // No hint outside pattern strings.
  TokenConstraint plain(Schema::CompileOrThrow(R"({"type":"string"})"), Bytes());
  REQUIRE(plain.AdvanceBytes("\"a"));
  CHECK(plain.PreferredByte() == -1);
  // Raw top-level strings (XTML arguments): no quote, Accepting() ends it.
  auto raw = Schema::CompileOrThrow(R"({"type":"string","pattern":"^[0-9]{3}$"})");
  TokenConstraint r(raw, Bytes(), k3::constrain::Format{false, true});
  CHECK_FALSE(r.Accepting());
  std::string out;
  while (!r.Accepting() && out.size() < 10) {
    char ch = char(r.PreferredByte());
    REQUIRE(r.AdvanceBytes(std::string_view(&ch, 1)));
    out += ch;
  }
  CHECK(out == "000");
  CHECK(r.PreferredByte() == -1);
  CHECK_FALSE(r.AdvanceBytes("0"));
  TokenConstraint q(Schema::CompileOrThrow(R"({"type":"string","pattern":"^\"\\\\$"})"), Bytes(),
                    k3::constrain::Format{false, true});
  CHECK(q.AdvanceBytes("\"\\"));  // raw: the quote and backslash are characters
  CHECK(q.Accepting());
}

TEST_CASE("bounds beyond +-1e15: exact integers up to 18 digits, far number bounds") {
  // A far maximum holds for every generated integer.
  const char* max16 = R"({"type":"integer","maximum":10000000000000000})";
  CHECK(Accepts(max16, "5"));
  CHECK(Accepts(max16, "-999999999999999"));
  // A far minimum: integers get the digits they need (17 here), compared exactly.
  const char* min16 = R"({"type":"integer","minimum":10000000000000000})";
  CHECK(Accepts(min16, "10000000000000000"));
  CHECK(Accepts(min16, "99999999999999999"));
  CHECK_FALSE(Accepts(min16, "9999999999999999"));
  CHECK_FALSE(Accepts(min16, "5"));
  CHECK_FALSE(Prefix(min16, "100000000000000000"));  // 18 digits: more than needed
  CHECK_FALSE(Prefix(min16, "-"));
  // Beyond 2^53, where doubles lose the last digits.
  const char* tight = R"({"type":"integer","minimum":123456789012345678,"maximum":123456789012345679})";
  CHECK(Accepts(tight, "123456789012345678"));
  CHECK(Accepts(tight, "123456789012345679"));
  CHECK_FALSE(Accepts(tight, "123456789012345677"));
  CHECK_FALSE(Accepts(tight, "123456789012345680"));
  CHECK_FALSE(Prefix(tight, "123456789012345670"));
  const char* neg = R"({"type":"integer","exclusiveMaximum":-9007199254740993})";
  CHECK(Accepts(neg, "-9007199254740994"));
  CHECK_FALSE(Accepts(neg, "-9007199254740993"));
  CHECK(Accepts(R"({"type":"integer","minimum":1.5e16,"maximum":1.5e16})", "15000000000000000"));
  CHECK(Accepts(R"({"type":"integer","exclusiveMinimum":1.5e16,"maximum":15000000000000001})", "15000000000000001"));
  // Numbers: a far bound that every generated value meets is exact; one that
  // leaves none of them is refused.
  CHECK(Accepts(R"({"type":"number","maximum":1e16,"minimum":-1e300})", "5.5"));
  for (const char* s : {R"({"type":"integer","minimum":1e19})", R"({"type":"integer","maximum":-1000000000000000000})",
                        R"({"type":"number","minimum":1e16})", R"({"type":"number","exclusiveMaximum":-999999999999999})"}) {
    auto e = CompileError(s);
    CHECK_MESSAGE(e.code() == k3::ErrorCode::kUnsupported, s);
    CHECK_MESSAGE(std::string(e.what()).find("lies beyond") != std::string::npos, e.what());
  }
  CHECK(CompileError(R"({"type":"integer","minimum":10000000000000001,"maximum":10000000000000000})").code() ==
        k3::ErrorCode::kInvalidArgument);
}

TEST_CASE("long outputs: states stay exact once dead frames are compacted away, and in clones") {
  // Thousands of bytes commit far more frames than live ones, so the arena is
  // compacted many times along the way (Run), and Clone copies live chains
  // only; a fresh constraint run over the whole text in one step is the
  // reference, and a union keeps several states alive at once.
  const k3::tok::Tokenizer& tiny = Tiny();
  Vocabulary tv = Vocabulary::FromTokenizer(tiny);
  auto s = Schema::CompileOrThrow(
      R"({"type":"array","items":{"anyOf":[{"type":"object","properties":{"k":{"type":"integer"},"v":{"type":"string","maxLength":30}},"required":["k"]},)"
      R"({"type":"object","properties":{"k":{"type":"string"},"w":{"enum":["p","q"]}},"required":["w"]},{"type":"array","items":{"type":"integer"},"maxItems":3}]}})");
  std::mt19937_64 rng(1616);
  TokenConstraint c(s, tv);
  std::vector<uint64_t> m, mc;
  int checks = 0;
  for (int step = 0; c.text().size() < 4000; ++step) {
    REQUIRE(step < 20000);
    c.AllowedMask(m);
    std::vector<uint32_t> ok;
    for (uint32_t id = 0; id < tv.vocab_size(); ++id)
      if (Bit(m, id)) ok.push_back(id);
    REQUIRE_MESSAGE(!ok.empty(), "dead end after '" << c.text() << "'");
    const uint32_t pick = ok[rng() % ok.size()];
    TokenConstraint probe = c.Clone();
    probe.Advance(pick);
    if (probe.Complete()) continue;  // keep the array open
    c.Advance(pick);
    if (step % 97 == 0) {
      CheckMaskAgainstDirect(s, tv, c.text(), c);
      TokenConstraint copy = c.Clone();
      copy.AllowedMask(mc);
      c.AllowedMask(m);
      CHECK(mc == m);
      CHECK(copy.text() == c.text());
      CHECK(copy.Accepting() == c.Accepting());
      ++checks;
    }
  }
  CHECK(checks >= 5);
  // Closing it all still works from the long state.
  TokenConstraint direct(s, tv);
  REQUIRE(direct.AdvanceBytes(c.text()));
  CHECK(direct.Accepting() == c.Accepting());
}

TEST_CASE("NextBytes is a superset of the bytes AdvanceBytes takes, in objects, arrays and at the root") {
  const k3::tok::Tokenizer& tiny = Tiny();
  Vocabulary tv = Vocabulary::FromTokenizer(tiny);
  std::vector<const char*> schemas = WalkSchemas();
  for (const char* js : {R"({"type":"object","properties":{"a":{"type":"object","properties":{"ab":{"type":"null"},"abc":{"type":"array"}},"required":["abc"]},"b":{}}})",
                         R"({"type":"object"})", R"({})"})
    schemas.push_back(js);
  std::mt19937_64 rng(4);
  int known = 0, states = 0;
  for (const char* js : schemas) {
    CAPTURE(js);
    auto s = Schema::CompileOrThrow(js);
    for (bool py : {false, true}) {
      k3::constrain::Format f;
      f.python_separators = py;
      for (int walk = 0; walk < 4; ++walk) {
        TokenConstraint c(s, tv, f);
        std::vector<uint64_t> m;
        for (int step = 0; step < 60 && !c.Complete(); ++step) {
          uint64_t set[4];
          ++states;
          if (c.NextBytes(set)) {
            ++known;
            for (int b = 0; b < 256; ++b) {
              TokenConstraint probe = c.Clone();
              const char ch = char(b);
              if (probe.AdvanceBytes(std::string_view(&ch, 1)) && !((set[b / 64] >> (b % 64)) & 1)) {
                FAIL_CHECK("byte " << b << " taken after '" << c.text() << "' but not in NextBytes");
              }
            }
          }
          c.AllowedMask(m);
          std::vector<uint32_t> ok;
          for (uint32_t id = 0; id < tv.vocab_size(); ++id)
            if (Bit(m, id)) ok.push_back(id);
          REQUIRE(!ok.empty());
          // Short tokens so that the walk stops at many positions between values.
          uint32_t pick = ok[rng() % ok.size()];
          for (int t = 0; t < 4 && tv.TokenBytes(pick).size() > 2; ++t) pick = ok[rng() % ok.size()];
          c.Advance(pick);
        }
      }
    }
  }
  MESSAGE("NextBytes known at " << known << " of " << states << " states");
  CHECK(known * 4 > states);  // coverage of the walk: bounded exponents keep most states reachable
  // A complete value takes nothing.
  TokenConstraint done(Schema::CompileOrThrow(R"({"type":"object"})"), Bytes());
  REQUIRE(done.AdvanceBytes("{}"));
  uint64_t set[4];
  REQUIRE(done.NextBytes(set));
  CHECK((set[0] | set[1] | set[2] | set[3]) == 0);
}

TEST_CASE("a vocabulary without most single bytes: the mask equals the direct check") {
  // The walk jumps between the trie root's children by first byte; here most
  // first bytes have no child at all.
  std::vector<std::string> t;
  std::mt19937_64 rng(77);
  const std::string alphabet = "{}[]\",:019-.etrufalsn\\ab";
  std::set<std::string> seen;
  while (t.size() < 1500) {
    std::string s;
    const size_t len = 1 + rng() % 5;
    for (size_t i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
    if (s.size() == 1 && s[0] != '"' && s[0] != '}' && s[0] != ']') continue;  // few single bytes
    if (s[0] == '-' || s[0] == '0' || s[0] == '[') continue;  // first bytes a value may take, with no child
    if (seen.insert(s).second) t.push_back(s);
  }
  Vocabulary v(std::move(t), 1500 + 2);
  const char* schemas[] = {
      R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"array","items":{"type":"boolean"}},"b":{"type":"string"}},"required":["a"]})",
      R"({"type":"array","items":{"anyOf":[{"type":"number"},{"type":"null"},{"type":"object"}]}})",
      R"({})",
  };
  int checked = 0;
  for (const char* js : schemas) {
    auto s = Schema::CompileOrThrow(js);
    for (int walk = 0; walk < 24; ++walk) {
      TokenConstraint c(s, v);
      std::vector<uint64_t> m;
      for (int step = 0; step < 30 && !c.Complete(); ++step) {
        CheckMaskAgainstDirect(s, v, c.text(), c);
        ++checked;
        c.AllowedMask(m);
        std::vector<uint32_t> ok;
        for (uint32_t id = 0; id < v.vocab_size(); ++id)
          if (Bit(m, id)) ok.push_back(id);
        if (ok.empty()) break;  // this vocabulary may not spell every continuation
        c.Advance(ok[rng() % ok.size()]);
      }
    }
  }
  CHECK(checked > 100);
}

// ---- numbers stay finite; the widened subset; relaxed (non-strict) compiles ----

namespace {

CompiledSchema Relaxed(std::string_view schema) {
  return Schema::CompileOrThrow(schema, {.strict = false});
}

// The first relaxation naming `keyword`, or null.
const k3::constrain::Relaxation* Note(const CompiledSchema& s, std::string_view keyword) {
  for (const auto& r : s.relaxations())
    if (r.keyword == keyword) return &r;
  return nullptr;
}

// Every number in a compact JSON text (outside strings).
std::vector<std::string> NumbersIn(const std::string& text) {
  std::vector<std::string> out;
  bool in_string = false, escaped = false;
  std::string cur;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if ((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E') {
      cur += c;
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  // true/false/null letters never reach here as numbers: 'e' alone is dropped.
  std::erase_if(
      out, [](const std::string& n) { return n.find_first_of("0123456789") == std::string::npos; });
  return out;
}

}  // namespace

TEST_CASE(
    "every generated number parses to a finite double; unbounded integers are exact doubles") {
  CHECK_FALSE(Prefix(R"({"type":"number"})", "77998E556"));
  CHECK_FALSE(Prefix(R"({"type":"number"})",
                     "1e308"));  // 1 digit + 308 > 308: conservative (1e308 is finite)
  CHECK(Accepts(R"({"type":"number"})", "9.99e307"));
  CHECK(Accepts(R"({"type":"number"})", "123456789012345e293"));
  CHECK_FALSE(Prefix(R"({"type":"number"})", "123456789012345e294"));
  CHECK(Accepts(R"({"type":"number"})", "1e-999"));  // underflows to 0: finite
  CHECK(Accepts(R"({"type":"number"})", "-5E+300"));
  // Random walks over byte and k3-tiny vocabularies, biased towards exponents.
  const Vocabulary tiny = Vocabulary::FromTokenizer(Tiny());
  std::mt19937_64 rng(26);
  const char* schemas[] = {R"({"type":"array","items":{"type":"number"},"minItems":1})",
                           R"({"type":"array","items":{"type":"integer"},"minItems":1})", R"({})",
                           R"({"type":"object","additionalProperties":{"type":"number"}})"};
  int numbers = 0, exponents = 0;
  for (const Vocabulary* v : {&Bytes(), static_cast<const Vocabulary*>(&tiny)}) {
    for (const char* js : schemas) {
      const bool integers = std::string(js).find("integer") != std::string::npos;
      auto s = Schema::CompileOrThrow(js);
      for (int walk = 0; walk < 60; ++walk) {
        TokenConstraint c(s, *v);
        std::vector<uint64_t> m;
        for (int step = 0; step < 80 && !c.Complete(); ++step) {
          if (step > 60 && c.Accepting()) break;
          c.AllowedMask(m);
          std::vector<uint32_t> ok, numeric;
          for (uint32_t id = 0; id < v->vocab_size(); ++id) {
            if (!Bit(m, id)) continue;
            ok.push_back(id);
            std::string_view b = v->TokenBytes(id);
            if (b.find_first_of("0123456789eE") != std::string_view::npos) numeric.push_back(id);
          }
          REQUIRE(!ok.empty());
          const auto& pool = !numeric.empty() && rng() % 4 != 0 ? numeric : ok;
          c.Advance(pool[rng() % pool.size()]);
        }
        for (const std::string& n : NumbersIn(c.text())) {
          errno = 0;
          const double d = std::strtod(n.c_str(), nullptr);
          CHECK_MESSAGE(std::isfinite(d), n << " in " << c.text());
          if (integers && c.Accepting()) CHECK_MESSAGE(std::fabs(d) <= 9007199254740992.0, n);
          ++numbers;
          exponents += n.find_first_of("eE") != std::string::npos;
        }
      }
    }
  }
  CHECK(numbers > 500);
  CHECK(exponents > 50);
}

TEST_CASE("oneOf: an enum beside a schema that refuses its values is exclusive (Qwen Code)") {
  const char* s =
      R"({"oneOf":[{"type":"string","enum":["all"]},{"type":"string","pattern":"^[1-9][0-9]*$"}]})";
  CHECK(Accepts(s, R"("all")"));
  CHECK(Accepts(s, R"("12")"));
  CHECK_FALSE(Accepts(s, R"("0")"));
  CHECK(Accepts(R"({"oneOf":[{"const":5},{"type":"integer","minimum":6}]})", "5"));
  // The enum value matches the other alternative: still refused when strict...
  auto e = CompileError(R"({"oneOf":[{"enum":["7"]},{"type":"string","pattern":"^[0-9]+$"}]})");
  CHECK(e.object() == "oneOf");
  // ... and read as anyOf when not.
  auto r = Relaxed(R"({"oneOf":[{"enum":["7"]},{"type":"string","pattern":"^[0-9]+$"}]})");
  REQUIRE(Note(r, "oneOf") != nullptr);
  CHECK(Note(r, "oneOf")->pointer == "/");
  CHECK(Accepts(r, R"("7")"));
  CHECK(Accepts(r, R"("8")"));
}

TEST_CASE("allOf merges, and type beside allOf/anyOf/$ref (Claude Code, zod)") {
  const char* both =
      R"({"type":"object","allOf":[{"properties":{"a":{"type":"string"}},"required":["a"]},
                                                   {"properties":{"b":{"type":"integer","maximum":5}}}]})";
  CHECK(Accepts(both, R"({"a":"x","b":1})"));
  CHECK(Accepts(both, R"({"b":2,"a":"x"})"));
  CHECK_FALSE(Accepts(both, R"({"b":1})"));
  CHECK_FALSE(Prefix(both, R"({"a":"x","b":6)"));
  // additionalProperties false in one member refuses the other's keys (the allOf rule).
  const char* closed =
      R"({"allOf":[{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false},
                                    {"properties":{"b":{"type":"integer"}}}]})";
  CHECK(Accepts(closed, R"({"a":"x"})"));
  CHECK_FALSE(Prefix(closed, R"({"b)"));
  // A property in both: its value meets both.
  const char* narrow =
      R"({"allOf":[{"properties":{"n":{"type":"integer","minimum":0}}},{"properties":{"n":{"maximum":9}},"required":["n"]}]})";
  CHECK(Accepts(narrow, R"({"n":9})"));
  CHECK_FALSE(Prefix(narrow, R"({"n":10)"));
  CHECK_FALSE(Prefix(narrow, R"({"n":-1)"));
  // Two .regex() on one string: both patterns.
  const char* two = R"({"type":"string","allOf":[{"pattern":"^[a-z]+$"},{"pattern":"x"}]})";
  CHECK(Accepts(two, R"("abxc")"));
  CHECK_FALSE(Accepts(two, R"("abc")"));
  CHECK_FALSE(Prefix(two, R"("aX)"));
  const char* four =
      R"({"allOf":[{"pattern":"^a"},{"pattern":"b"},{"type":"string"},{"pattern":"c"},{"pattern":"d$"},{"maxLength":9}]})";
  CHECK(Accepts(four, R"("abcd")"));
  CHECK(Accepts(four, R"("acbd")"));
  CHECK_FALSE(Accepts(four, R"("abd")"));
  CHECK_FALSE(Accepts(four, R"("acd")"));
  CHECK_FALSE(Accepts(four, R"("bcd")"));
  CHECK(Accepts(R"({"pattern":"^a","allOf":[{"pattern":"b$"}],"minLength":3})", R"("aab")"));
  CHECK_FALSE(Accepts(R"({"pattern":"^a","allOf":[{"pattern":"b$"}],"minLength":3})", R"("ab")"));
  // anyOf beside other keywords: each alternative gets them.
  const char* dist = R"({"type":"object","properties":{"k":{"type":"integer"}},"required":["k"],
                         "anyOf":[{"properties":{"x":{"type":"string"}},"required":["x"]},{"properties":{"y":{"type":"boolean"}},"required":["y"]}]})";
  CHECK(Accepts(dist, R"({"k":1,"x":"s"})"));
  CHECK(Accepts(dist, R"({"y":true,"k":1})"));
  CHECK_FALSE(Accepts(dist, R"({"x":"s"})"));
  // A $ref beside a description and a type (pydantic), and beside bounds.
  const char* ref = R"({"$defs":{"N":{"type":"integer","minimum":0}},"type":"object",
                        "properties":{"a":{"$ref":"#/$defs/N","maximum":3,"description":"d"}},"required":["a"]})";
  CHECK(Accepts(ref, R"({"a":3})"));
  CHECK_FALSE(Prefix(ref, R"({"a":4)"));
  // Types intersect; an empty intersection can match nothing.
  CHECK(Accepts(R"({"allOf":[{"type":["integer","string"]},{"type":"number"}]})", "7"));
  CHECK_FALSE(Prefix(R"({"allOf":[{"type":["integer","string"]},{"type":"number"}]})", "\""));
  CHECK(CompileError(R"({"allOf":[{"type":"string"},{"type":"number"}]})").code() ==
        k3::ErrorCode::kInvalidArgument);
  CHECK(CompileError(R"({"allOf":[{"const":1},{"const":2}]})").code() ==
        k3::ErrorCode::kInvalidArgument);
}

TEST_CASE("propertyNames, tuples, multipleOf, format") {
  // z.record(z.string().regex(...), z.number())
  const char* rec =
      R"({"type":"object","propertyNames":{"pattern":"^[a-z]+$"},"additionalProperties":{"type":"number"}})";
  CHECK(Accepts(rec, R"({"ab":1,"c":2.5})"));
  CHECK_FALSE(Prefix(rec, R"({"aB)"));
  // z.record(z.enum([...]), ...): the values become optional declared keys.
  const char* keys =
      R"({"type":"object","propertyNames":{"enum":["a","b"]},"additionalProperties":{"type":"boolean"}})";
  CHECK(Accepts(keys, R"({"b":true,"a":false})"));
  CHECK_FALSE(Prefix(keys, R"({"c)"));
  CHECK_FALSE(Prefix(keys, R"({"a":true,"a)"));
  // Declared keys propertyNames refuses cannot appear (or, required, leave nothing).
  CHECK_FALSE(Prefix(R"({"properties":{"AB":{}},"propertyNames":{"maxLength":1}})", R"({"A)"));
  CHECK(
      CompileError(R"({"properties":{"AB":{}},"required":["AB"],"propertyNames":{"maxLength":1}})")
          .code() == k3::ErrorCode::kInvalidArgument);
  // Tuples: prefixItems + items, and draft 7's array items + additionalItems.
  const char* tup =
      R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false,"minItems":2})";
  CHECK(Accepts(tup, R"(["a",1])"));
  CHECK_FALSE(Prefix(tup, R"([1)"));
  CHECK_FALSE(Prefix(tup, R"(["a",1,)"));
  CHECK_FALSE(Accepts(tup, R"(["a"])"));
  const char* d7 =
      R"({"type":"array","items":[{"type":"boolean"}],"additionalItems":{"type":"null"}})";
  CHECK(Accepts(d7, "[true,null,null]"));
  CHECK(Accepts(d7, "[]"));
  CHECK_FALSE(Prefix(d7, "[true,1"));
  CHECK(CompileError(R"({"type":"array","prefixItems":[{}],"items":false,"minItems":2})").code() ==
        k3::ErrorCode::kInvalidArgument);
  // multipleOf: integers, exact with bounds; "number" generates integer multiples.
  const char* five = R"({"type":"integer","multipleOf":5,"minimum":3,"maximum":22})";
  for (const char* v : {"5", "10", "15", "20"}) CHECK_MESSAGE(Accepts(five, v), v);
  for (const char* v : {"3", "25", "0", "12"}) CHECK_MESSAGE(!Accepts(five, v), v);
  CHECK_FALSE(Prefix(five, "4"));
  CHECK(Prefix(five, "1"));
  CHECK(Accepts(R"({"type":"number","multipleOf":3})", "-9"));
  CHECK_FALSE(Prefix(R"({"type":"number","multipleOf":3})", "9."));
  CHECK_FALSE(Accepts(R"({"type":"integer","multipleOf":7})", "15"));
  CHECK(CompileError(R"({"type":"integer","multipleOf":10,"minimum":1,"maximum":9})").code() ==
        k3::ErrorCode::kInvalidArgument);
  // format as a pattern (validators do not assert it, so this only narrows).
  CHECK(Accepts(R"({"type":"string","format":"date"})", R"("2024-02-28")"));
  CHECK_FALSE(Accepts(R"({"type":"string","format":"date"})", R"("2024-13-01")"));
  CHECK(Accepts(R"({"type":"string","format":"date-time"})", R"("2024-02-28T12:30:00.5Z")"));
  CHECK(
      Accepts(R"({"type":"string","format":"uuid"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
  CHECK_FALSE(Prefix(R"({"type":"string","format":"ipv4"})", R"("256)"));
  CHECK(Accepts(R"({"type":"string","format":"email"})", R"("a.b@example.com")"));
  CHECK(Accepts(R"({"type":"string","format":"uri"})", R"("https://example.com/a?b=1")"));
  CHECK(Accepts(R"({"type":"string","format":"hostname"})",
                R"("anything")"));  // unknown formats: annotations
  // A format the pattern leaves no room for is not enforced (never a refusal).
  CHECK(Accepts(R"({"type":"string","format":"date","pattern":"^x$"})", R"("x")"));
}

TEST_CASE("not strict: what cannot be enforced is relaxed to a superset, and noted") {
  struct Case {
    const char* schema;
    const char* keyword;
    const char* pointer;
    std::vector<const char*>
        valid;  // valid under the original schema: the relaxed automaton accepts them
  };
  const std::vector<Case> cases = {
      {R"({"type":"string","pattern":"^(?!\\.)[a-z.]+$"})", "pattern", "/", {R"("a.b")"}},
      {R"({"type":"string","pattern":"^(\\p{Extended_Pictographic}|\\p{Emoji_Component})+$"})",
       "pattern",
       "/",
       {"\"\xF0\x9F\x98\x80\""}},
      {R"({"type":"object","properties":{"w":{"type":"string","pattern":"\\bx\\b"}}})",
       "pattern",
       "/properties/w",
       {R"({"w":"a x b"})"}},
      {R"({"type":"string","pattern":"(?i)abc"})", "pattern", "/", {R"("ABC")"}},
      {R"({"oneOf":[{"type":"object"},{"type":"object","properties":{"a":{}}}]})",
       "oneOf",
       "/",
       {R"({"a":1})"}},
      {R"({"type":"object","patternProperties":{"^x":{"type":"integer"}},"additionalProperties":false})",
       "patternProperties",
       "/",
       {R"({"x1":5})", "{}"}},
      {R"({"type":"array","items":{"type":"object"},"uniqueItems":true})",
       "uniqueItems",
       "/",
       {R"([{},{"a":1}])"}},
      {R"({"type":"number","multipleOf":0.01})", "multipleOf", "/", {"0.07", "3"}},
      {R"({"type":"integer","minimum":1e20})", "minimum", "/", {}},
      {R"({"type":"integer","exclusiveMinimum":true,"minimum":3})", "exclusiveMinimum", "/", {"4"}},
      {R"({"if":{"type":"string"},"then":{"minLength":2},"not":{"type":"null"}})",
       "if",
       "/",
       {R"("ab")", "1"}},
      {R"({"$ref":"https://example.com/s.json"})", "$ref", "/", {"1", R"({"a":[]})"}},
      {R"({"type":"strin"})", "schema", "/", {"1"}},
      {R"({"type":"integer","minimum":3,"maximum":2})", "schema", "/", {}},
      {R"({"frobnicate":1,"type":"boolean"})", "frobnicate", "/", {"true"}},
  };
  for (const Case& c : cases) {
    CHECK_THROWS_AS(Schema::CompileOrThrow(c.schema), k3::Error);  // strict: refused as before
    CompiledSchema r = Relaxed(c.schema);
    const auto* note = Note(r, c.keyword);
    REQUIRE_MESSAGE(note != nullptr, c.schema);
    CHECK_MESSAGE(note->pointer == c.pointer, c.schema << " " << note->pointer);
    CHECK_FALSE(note->what.empty());
    for (const char* v : c.valid) CHECK_MESSAGE(Accepts(r, v), c.schema << " " << v);
  }
  // What the subset enforces stays enforced beside a relaxed keyword.
  CompiledSchema mixed =
      Relaxed(R"({"type":"object","properties":{"n":{"type":"integer","maximum":3},
                                     "s":{"type":"string","pattern":"^(?=a)a+$"}},"required":["n"],"not":{}})");
  CHECK(Accepts(mixed, R"({"n":3,"s":"aa"})"));
  CHECK_FALSE(Prefix(mixed, R"({"n":4)"));
  CHECK_FALSE(Prefix(mixed, R"({"n":1,"s":"b)"));
  CHECK_FALSE(Accepts(mixed, R"({"s":"a"})"));
  // A strict compile notes nothing; a supported schema relaxes nothing.
  CHECK(Schema::CompileOrThrow(R"({"type":"string"})").relaxations().empty());
  CHECK(Relaxed(
            R"({"type":"object","properties":{"a":{"anyOf":[{"type":"string"},{"type":"null"}]}}})")
            .relaxations()
            .empty());
}
