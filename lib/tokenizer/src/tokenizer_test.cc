// Tokenizer against tiktoken's own ids (tests/data/oracle/tokenizer/cases.json).
#include <doctest/doctest.h>
#include <simdjson.h>

#include <thread>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/tokenizer/tokenizer.h"
#include "bpe_internal.h"
#include "k3_test_support.h"
#include "regex_pattern.h"

using k3::tok::TokenId;
using k3::tok::Tokenizer;

namespace {

const std::string kData = K3_TEST_DATA_DIR;
const std::string kModelDir = kData + "/oracle/k3-tiny";

const Tokenizer& Tiny() {
  static Tokenizer tok = Tokenizer::LoadDirOrThrow(kModelDir);
  return tok;
}

struct Case {
  std::string name, text;
  bool allow_special, roundtrip;
  std::vector<TokenId> ids;
};

std::vector<Case> LoadCases() {
  std::string json = k3::ReadFileOrThrow(kData + "/oracle/tokenizer/cases.json", 64 << 20);
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::element root = parser.parse(padded).value();
  std::vector<Case> cases;
  for (simdjson::dom::element c : root["cases"].get_array()) {
    Case k;
    k.name = std::string(c["name"].get_string().value());
    k.text = std::string(c["text"].get_string().value());
    k.allow_special = c["allow_special"].get_bool().value();
    k.roundtrip = c["decode_roundtrip"].get_bool().value();
    for (auto id : c["ids"].get_array()) k.ids.push_back(TokenId(id.get_int64().value()));
    cases.push_back(std::move(k));
  }
  return cases;
}

}  // namespace

TEST_CASE("loads the tiny vocabulary: ranks, specials, BOS/EOS from config.json") {
  const Tokenizer& tok = Tiny();
  CHECK(tok.num_ranks() == 2048);
  CHECK(tok.vocab_size() == 2304);
  CHECK(tok.SpecialId("[BOS]") == 2048u);
  CHECK(tok.SpecialId("<|end_of_msg|>") == 2050u);
  CHECK(tok.SpecialId("<|open|>") == 2051u);
  CHECK(tok.SpecialId("<|close|>") == 2052u);
  CHECK(tok.SpecialId("<|sep|>") == 2053u);
  CHECK(tok.SpecialId("<|reserved_token_2054|>") == 2054u);
  CHECK(tok.SpecialId("[PAD]") == 2303u);
  CHECK_FALSE(tok.SpecialId("<|nope|>").has_value());
  CHECK(tok.bos_id() == 2048u);
  CHECK(tok.eos_id() == 2050u);  // config.json's eos, not tokenizer_config's [EOS]
  CHECK(tok.TokenBytes(2051) == "<|open|>");
  CHECK_THROWS_AS(tok.TokenBytes(2304), k3::Error);
}

TEST_CASE("every oracle case is id-exact and decodes back") {
  auto cases = LoadCases();
  REQUIRE(cases.size() == 45);
  for (const Case& c : cases) {
    INFO("case " << c.name);
    std::vector<TokenId> ids = Tiny().Encode(c.text, c.allow_special);
    CHECK(ids == c.ids);
    if (c.roundtrip) CHECK(Tiny().Decode(ids) == c.text);
  }
}

TEST_CASE("heap merge path alone is id-exact on every oracle case") {
  // Both merge implementations must agree with tiktoken, not just with each other.
  k3::tok::internal::SetHeapBpeThresholdForTest(1);
  for (const Case& c : LoadCases()) {
    INFO("case " << c.name);
    CHECK(Tiny().Encode(c.text, c.allow_special) == c.ids);
  }
  k3::tok::internal::SetHeapBpeThresholdForTest(128);
}

TEST_CASE("one tokenizer serves several threads") {
  auto cases = LoadCases();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        for (const Case& c : cases) {
          if (Tiny().Encode(c.text, c.allow_special) != c.ids) ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) CHECK(f == 0);
}

TEST_CASE("special text: ordinary vs allowed") {
  const Tokenizer& tok = Tiny();
  auto ordinary = tok.EncodeOrdinary("<|open|>");
  CHECK(ordinary.size() > 1);
  CHECK(tok.Encode("<|open|>", true) == std::vector<TokenId>{2051});
  CHECK(tok.Encode("a<|sep|><|sep|>b", true).size() == 4);
  // Reserved names are specials too.
  CHECK(tok.Encode("<|reserved_token_2100|>", true) == std::vector<TokenId>{2100});
}

// Long single-character runs (the large-piece BPE path) round-trip. Their speed is
// a benchmark's business (k3-bench tokenizer), not a timed test's.
TEST_CASE("10 KB of one character round-trips through the large-piece path") {
  std::string text(10240, 'o');
  auto ids = Tiny().EncodeOrdinary(text);
  CHECK(Tiny().Decode(ids) == text);
  // A character with no merges at all and a multi-byte one.
  std::string x;
  for (int i = 0; i < 5000; ++i) x += "\xC3\xA9";
  ids = Tiny().EncodeOrdinary(x);
  CHECK(Tiny().Decode(ids) == x);
}

namespace {

// tiktoken's merge rule written the slow, obvious way from tiktoken.model
// itself: repeatedly merge the adjacent pair whose concatenation has the lowest
// rank (leftmost on ties), then map the parts to their ranks.
std::map<std::string, TokenId> LoadRanks() {
  static const std::string kB64 =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::map<std::string, TokenId> ranks;
  std::ifstream f(kModelDir + "/tiktoken.model");
  REQUIRE(f.good());
  std::string b64;
  TokenId rank;
  while (f >> b64 >> rank) {
    std::string bytes;
    uint32_t acc = 0;
    int bits = 0;
    for (char ch : b64) {
      if (ch == '=') break;
      const size_t v = kB64.find(ch);
      REQUIRE(v != std::string::npos);
      acc = (acc << 6) | uint32_t(v);
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        bytes += char((acc >> bits) & 0xff);
      }
    }
    ranks[bytes] = rank;
  }
  REQUIRE(ranks.size() == 2048);
  return ranks;
}

std::vector<TokenId> NaiveBpe(const std::string& piece, const std::map<std::string, TokenId>& r) {
  std::vector<std::string> parts;
  for (char ch : piece) parts.emplace_back(1, ch);
  for (;;) {
    size_t best_i = parts.size();
    TokenId best = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = r.find(parts[i] + parts[i + 1]);
      if (it != r.end() && (best_i == parts.size() || it->second < best)) {
        best = it->second;
        best_i = i;
      }
    }
    if (best_i == parts.size()) break;
    parts[best_i] += parts[best_i + 1];
    parts.erase(parts.begin() + long(best_i) + 1);
  }
  std::vector<TokenId> ids;
  for (const auto& p : parts) ids.push_back(r.at(p));
  return ids;
}

}  // namespace

TEST_CASE("large-piece BPE agrees with the small-piece path") {
  // Single pre-tokenizer pieces (letters only) just below, at and above the
  // 128-byte switch-over, merge-rich and tie-rich ('o' runs: every "oo" pair has
  // the same rank). Pieces up to 128 bytes go through both paths (the heap path
  // forced with threshold 1); every length is checked against the naive rule.
  const auto ranks = LoadRanks();
  std::vector<std::string> words;
  for (int n : {1, 2, 3, 17, 64, 100, 127, 128, 129, 200, 1000}) {
    std::string word;
    const char* alphabet = "thequickbrownfoxjumps";
    for (int i = 0; i < n; ++i) word += alphabet[(i * 7 + i / 3) % 21];
    words.push_back(word);
    words.push_back(std::string(size_t(n), 'o'));
  }
  for (const std::string& w : words) {
    INFO(w.size() << " bytes: " << w.substr(0, 40));
    const std::vector<TokenId> want = NaiveBpe(w, ranks);
    const std::vector<TokenId> by_default = Tiny().EncodeOrdinary(w);  // small path up to 128
    k3::tok::internal::SetHeapBpeThresholdForTest(1);
    const std::vector<TokenId> heap = Tiny().EncodeOrdinary(w);
    k3::tok::internal::SetHeapBpeThresholdForTest(128);
    CHECK(Tiny().PreTokenize(w).size() == 1);
    CHECK(by_default == want);
    CHECK(heap == want);
    CHECK(Tiny().Decode(heap) == w);
  }
}

TEST_CASE("pre-tokenizer: Han is Script=Han, not Script_Extensions") {
  const Tokenizer& tok = Tiny();
  // U+3001 (、) has Script=Common (Script_Extensions includes Han): it must not
  // join the Han run.
  auto pieces = tok.PreTokenize("中文、日本");
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[0] == "中文");
  CHECK(pieces[1] == "、");
  CHECK(pieces[2] == "日本");
  // CJK Extension H (Unicode 15) is Han even though PCRE2 10.42's tables predate it.
  pieces = tok.PreTokenize("\xF0\xB1\x8D\x90\xF0\xB1\x8D\x91x");  // U+31350 U+31351 'x'
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[1] == "x");
  // U+0085 (NEL) is White_Space for tiktoken's regex.
  pieces = tok.PreTokenize("a\xC2\x85\xC2\x85" "b");
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[1] == "\xC2\x85");
  CHECK(pieces[2] == "\xC2\x85" "b");
}

TEST_CASE("letters and numbers of Unicode 15-16 split as tiktoken splits them") {
  // Strings where PCRE2's own Unicode 14 tables give different ids; the ids were
  // produced by tiktoken 1.0.22 (npm) with this vocabulary.
  // From CMake, not __FILE__: a compiler cache may rewrite source paths to relative ones.
  std::string path = std::string(K3_TOKENIZER_TESTDATA) + "/tiktoken_unicode16.jsonl";
  std::ifstream f(path);
  REQUIRE(f.good());
  simdjson::dom::parser parser;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    simdjson::dom::element o = parser.parse(line).value();
    std::string text(o["text"].get_string().value());
    std::vector<TokenId> want;
    for (auto id : o["ids"].get_array()) want.push_back(TokenId(id.get_int64().value()));
    INFO("line " << n + 1);
    CHECK(Tiny().EncodeOrdinary(text) == want);
    ++n;
  }
  CHECK(n >= 40);
  // The fast pattern is chosen only for text without such characters.
  CHECK_FALSE(k3::tok::NeedsUnicode16Pattern("hello 中文 日本語 한국어 🍕 é"));
  CHECK(k3::tok::NeedsUnicode16Pattern("O\xF0\x93\x9D\xB1's"));  // U+13771 (Unicode 16)
  CHECK(k3::tok::NeedsUnicode16Pattern("\xE0\xA2\x97"));           // U+0897
  CHECK_FALSE(k3::tok::NeedsUnicode16Pattern("\xE0\xA2\x96"));     // U+0896
  CHECK_FALSE(k3::tok::NeedsUnicode16Pattern("\xF0\x93\x9D"));      // truncated
}

// scripts/test.sh runs a short pass (lib/tokenizer/tools/tiktoken-fuzz.sh) with
// ids from the npm tiktoken; a plain ctest run has no file and says so.
TEST_CASE("tiktoken fuzz file (lib/tokenizer/tools/tiktoken-fuzz.sh)" *
          doctest::skip(k3::test::SkipWithoutEnv("K3_TIKTOKEN_FUZZ_FILE", "tiktoken fuzz file"))) {
  const char* file = std::getenv("K3_TIKTOKEN_FUZZ_FILE");
  REQUIRE(file != nullptr);
  std::ifstream f(file);
  REQUIRE(f.good());
  simdjson::dom::parser parser;
  std::string line;
  int n = 0, bad = 0;
  while (std::getline(f, line)) {
    simdjson::dom::element o = parser.parse(line).value();
    std::string text(o["text"].get_string().value());
    std::vector<TokenId> want;
    for (auto id : o["ids"].get_array()) want.push_back(TokenId(id.get_int64().value()));
    bool allow_special = false;
    (void)o["allow_special"].get_bool().get(allow_special);  // absent: ordinary
    ++n;
    if (Tiny().Encode(text, allow_special) != want) {
      if (++bad <= 10) MESSAGE("mismatch on line " << n << ": " << line);
    }
  }
  MESSAGE(n << " strings, " << bad << " mismatches");
  CHECK(n > 0);  // an empty or unreadable file proves nothing
  CHECK(bad == 0);
}

TEST_CASE("Kimi's wrapper cuts runs longer than 25,000 characters") {
  const Tokenizer& tok = Tiny();
  std::string spaces(30000, ' ');
  auto ids = tok.EncodeOrdinary(spaces);
  CHECK(tok.Decode(ids) == spaces);
  // The cut is at 25,000: equal to encoding the two halves separately.
  auto a = tok.EncodeOrdinary(std::string(25000, ' '));
  auto b = tok.EncodeOrdinary(std::string(5000, ' '));
  a.insert(a.end(), b.begin(), b.end());
  CHECK(ids == a);
  std::string letters(25001, 'z');
  auto l = tok.EncodeOrdinary(letters);
  auto l1 = tok.EncodeOrdinary(std::string(25000, 'z'));
  l1.push_back(tok.EncodeOrdinary("z")[0]);
  CHECK(l == l1);
}

TEST_CASE("Kimi's wrapper slices at 400,000 code points, not bytes") {
  const Tokenizer& tok = Tiny();
  std::string unit = "\xC3\xA9 ";  // "é ": two code points, three bytes
  std::string head, text;
  for (int i = 0; i < 200000; ++i) head += unit;  // exactly 400,000 code points
  text = head + unit;
  auto want = tok.EncodeOrdinary(head);
  auto tail = tok.EncodeOrdinary(unit);
  want.insert(want.end(), tail.begin(), tail.end());
  CHECK(tok.EncodeOrdinary(text) == want);
  CHECK(tok.Decode(want) == text);
}

TEST_CASE("invalid UTF-8 is encoded as U+FFFD") {
  const Tokenizer& tok = Tiny();
  CHECK(tok.EncodeOrdinary("a\xFF" "b") == tok.EncodeOrdinary("a\xEF\xBF\xBD" "b"));
  CHECK(k3::tok::SanitizeUtf8("\xE4\xBD") == "\xEF\xBF\xBD");
  CHECK(k3::tok::SanitizeUtf8("\xF0\x9F\x98") == "\xEF\xBF\xBD");
  CHECK(k3::tok::SanitizeUtf8("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(k3::tok::IsValidUtf8("héllo 你好 🍕"));
  CHECK_FALSE(k3::tok::IsValidUtf8("\xC0\x80"));
}

TEST_CASE("streaming decoder holds back split characters") {
  k3::tok::Utf8StreamDecoder d;
  std::string pizza = "\xF0\x9F\x8D\x95";
  CHECK(d.Push(pizza.substr(0, 1)) == "");
  CHECK(d.Push(pizza.substr(1, 2)) == "");
  CHECK(d.has_pending());
  CHECK(d.Push(pizza.substr(3) + "ok") == pizza + "ok");
  CHECK(d.Push("\xE4\xBD") == "");
  CHECK(d.Push("x") == "\xEF\xBF\xBDx");  // broken sequence, then valid text
  CHECK(d.Push("\xE4") == "");
  CHECK(d.Flush() == "\xEF\xBF\xBD");
  // Through real tokens: decode id by id.
  const Tokenizer& tok = Tiny();
  std::string text = "emoji 👨\u200d👩\u200d👧 and 日本語";
  auto ids = tok.EncodeOrdinary(text);
  k3::tok::Utf8StreamDecoder s;
  std::string out;
  for (TokenId id : ids) {
    std::string piece = s.Push(tok.TokenBytes(id));
    CHECK(k3::tok::IsValidUtf8(piece));
    out += piece;
  }
  out += s.Flush();
  CHECK(out == text);
}

TEST_CASE("loader rejects broken vocabularies") {
  std::string cfg = R"({"added_tokens_decoder":{}})";
  std::string vocab;
  // Missing byte ranks.
  CHECK_THROWS_AS(Tokenizer::FromStringsOrThrow("YQ== 0\n", cfg), k3::Error);
  CHECK_THROWS_AS(Tokenizer::FromStringsOrThrow("", cfg), k3::Error);
  CHECK_THROWS_AS(Tokenizer::FromStringsOrThrow("@@@@ 0\n", cfg), k3::Error);
  CHECK_THROWS_AS(Tokenizer::FromStringsOrThrow("YQ== x\n", cfg), k3::Error);
  // A hole in the ranks.
  std::string full = k3::ReadFileOrThrow(kModelDir + "/tiktoken.model", 1 << 20);
  std::string holed = full.substr(0, full.find("\n") + 1) + full.substr(full.find("\n", full.find("\n") + 1) + 1);
  CHECK_THROWS_AS(Tokenizer::FromStringsOrThrow(holed, cfg), k3::Error);
  // Works without config.json; unnamed specials become reserved names.
  Tokenizer t = Tokenizer::FromStringsOrThrow(full, cfg);
  CHECK(t.SpecialId("<|reserved_token_2048|>") == 2048u);
  CHECK_FALSE(t.bos_id().has_value());
  CHECK_THROWS_AS(Tokenizer::FromStringsOrThrow(full, "not json"), k3::Error);
  // config.json ids win over tokenizer_config names; a list of EOS ids gives its first.
  std::string tcfg = R"({"added_tokens_decoder":{"2049":{"content":"[EOS]"}},"eos_token":"[EOS]",)"
                     R"("model_max_length":1000000000000000019884624838656})";
  CHECK(Tokenizer::FromStringsOrThrow(full, tcfg).eos_id() == 2049u);
  CHECK(Tokenizer::FromStringsOrThrow(full, tcfg, R"({"text_config":{"eos_token_id":[2050,2049]}})").eos_id() ==
        2050u);
  CHECK_THROWS_AS(Tokenizer::FromStringsOrThrow(full, tcfg, R"({"eos_token_id":99999})"), k3::Error);
}

TEST_CASE("repository copy of the oracle matches ../shared/oracle when present" *
          doctest::skip(k3::test::SkipWithoutDir(K3_SHARED_ORACLE_DIR, "tokenizer oracle copy"))) {
  std::string shared = K3_SHARED_ORACLE_DIR;
  REQUIRE_MESSAGE(k3::IsDirectory(shared), shared << " is absent and CI=true");
  for (const char* rel : {"tokenizer/cases.json", "chat/cases.json", "k3-tiny/tiktoken.model",
                          "k3-tiny/tokenizer_config.json"}) {
    INFO(std::string(rel));
    CHECK(k3::ReadFileOrThrow(kData + "/oracle/" + rel, 64 << 20) ==
          k3::ReadFileOrThrow(shared + "/" + rel, 64 << 20));
  }
}
