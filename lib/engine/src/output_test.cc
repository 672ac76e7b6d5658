// OutputStream with scripted ids (the post-sampling logic Engine::Generate
// runs): stop strings split at every byte and token boundary, never emitted in
// part; EOS and end-of-message; channels, tool-call fragments, reasoning count.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "k3/engine/output.h"
#include "k3/tokenizer/tokenizer.h"

using namespace k3;
using namespace k3::engine;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";

const tok::Tokenizer& Tiny() {
  static const tok::Tokenizer t = tok::Tokenizer::LoadDirOrThrow(kTiny);
  return t;
}

std::vector<int32_t> Ids(std::string_view text) {
  std::vector<int32_t> ids;
  for (tok::TokenId id : Tiny().Encode(text, false)) ids.push_back(static_cast<int32_t>(id));
  return ids;
}

int32_t Special(std::string_view s) { return static_cast<int32_t>(*Tiny().SpecialId(s)); }

// One single-byte token per byte, so a character can be split anywhere.
std::vector<int32_t> ByteIds(std::string_view text) {
  static const std::vector<int32_t> table = [] {
    std::vector<int32_t> t(256, -1);
    for (uint32_t id = 0; id < Tiny().num_ranks(); ++id) {
      std::string_view b = Tiny().TokenBytes(id);
      if (b.size() == 1 && t[static_cast<unsigned char>(b[0])] < 0) {
        t[static_cast<unsigned char>(b[0])] = static_cast<int32_t>(id);
      }
    }
    return t;
  }();
  std::vector<int32_t> ids;
  for (char ch : text) {
    const int32_t id = table[static_cast<unsigned char>(ch)];
    REQUIRE(id >= 0);
    ids.push_back(id);
  }
  return ids;
}

bool CharBoundary(const std::string& s, size_t i) {
  return i == s.size() || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
}

struct Run {
  std::string streamed_content, streamed_reasoning;
  std::vector<std::string> content_pieces;
  std::vector<ToolCallDelta> calls;
  OutputStream* out = nullptr;
};

// Feeds ids until done; returns what was streamed. `finish` calls Finish().
Run Feed(OutputStream& os, const std::vector<int32_t>& ids, bool finish = true) {
  Run r;
  r.out = &os;
  auto take = [&](const Delta& d) {
    r.streamed_content += d.content;
    r.streamed_reasoning += d.reasoning;
    if (!d.content.empty()) r.content_pieces.push_back(d.content);
    r.calls.insert(r.calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  for (int32_t id : ids) {
    if (os.done()) break;
    take(os.Push(id));
  }
  if (finish) take(os.Finish());
  return r;
}

OutputStream Raw(std::vector<std::string> stop) {
  OutputStream::Options o;
  o.stop = std::move(stop);
  o.eos_ids = {2050};
  return OutputStream(&Tiny(), o);
}

}  // namespace

TEST_CASE("stop string split at every byte: content stops before it, no part emitted") {
  const std::string before = "Hello, café! The answer ";
  const std::string text = before + "END_é here and more";
  for (size_t cut = 0; cut <= text.size() + 1; ++cut) {
    CAPTURE(cut);
    // Two encodings meeting at each character boundary, and (last) one token
    // per byte, which splits the stop string and its "é" at every byte.
    if (cut <= text.size() && !CharBoundary(text, cut)) continue;
    std::vector<int32_t> ids;
    if (cut > text.size()) {
      ids = ByteIds(text);
    } else {
      ids = Ids(text.substr(0, cut));
      std::vector<int32_t> tail = Ids(text.substr(cut));
      ids.insert(ids.end(), tail.begin(), tail.end());
    }
    OutputStream os = Raw({"END_é"});
    Run r = Feed(os, ids);
    CHECK(os.done());
    CHECK(os.finish() == FinishReason::kStop);
    CHECK(os.stop_matched() == "END_é");
    CHECK(r.streamed_content == before);
    CHECK(os.content() == before);
    for (const std::string& p : r.content_pieces) CHECK(p.find('E') == std::string::npos);
  }
}

TEST_CASE("a partial stop string is held back, then released when it cannot match") {
  OutputStream os = Raw({"STOP"});
  std::vector<int32_t> ids = Ids("go ST");
  Run r = Feed(os, ids, /*finish=*/false);
  CHECK(r.streamed_content == "go ");  // "ST" may still become STOP
  Run r2 = Feed(os, Ids("ay"), false);
  CHECK(r2.streamed_content == "STay");  // it did not
  Run r3 = Feed(os, Ids(" ST"), true);  // end of output: the held part is content
  CHECK(r3.streamed_content == " ST");
  CHECK_FALSE(os.done());
  CHECK(os.content() == "go STay ST");
  // Of several stop strings the earliest in the text wins.
  OutputStream two = Raw({"world", "lo"});
  Run r4 = Feed(two, Ids("hello world"));
  CHECK(two.stop_matched() == "lo");
  CHECK(r4.streamed_content == "hel");
}

TEST_CASE("raw mode: every byte is content, an EOS id ends it") {
  OutputStream os = Raw({});
  std::vector<int32_t> ids = Ids("abc");
  ids.push_back(2050);
  ids.push_back(Ids("zzz")[0]);  // after EOS: ignored
  Run r = Feed(os, ids);
  CHECK(os.done());
  CHECK(os.finish() == FinishReason::kStop);
  CHECK(r.streamed_content == "abc" + std::string(Tiny().TokenBytes(2050)));
  // A character split over two tokens comes out whole.
  std::string emoji = "😀";
  OutputStream os2 = Raw({});
  Run r2 = Feed(os2, ByteIds(emoji), false);
  CHECK(r2.streamed_content == emoji);
  for (const std::string& p : r2.content_pieces) CHECK(tok::IsValidUtf8(p));
}

TEST_CASE("chat mode: reasoning, content, tool-call fragments, end of message") {
  std::vector<int32_t> ids = Ids("Let me think");
  auto tag = [&](const char* special, std::string_view header) {
    ids.push_back(Special(special));
    for (int32_t id : Ids(header)) ids.push_back(id);
    ids.push_back(Special("<|sep|>"));
  };
  tag("<|close|>", "think");
  tag("<|open|>", "response");
  for (int32_t id : Ids("Calling.")) ids.push_back(id);
  tag("<|close|>", "response");
  tag("<|open|>", "tools");
  tag("<|open|>", "call tool=\"lookup\" index=\"1\"");
  tag("<|open|>", "argument key=\"q\" type=\"string\"");
  for (int32_t id : Ids("two words")) ids.push_back(id);
  tag("<|close|>", "argument");
  tag("<|close|>", "call");
  tag("<|close|>", "tools");
  ids.push_back(Special("<|end_of_msg|>"));

  OutputStream::Options o;
  o.chat_start = tok::ChatStreamParser::Start::kThink;
  o.eos_ids = {2050};
  o.call_id_tag = "t";
  OutputStream os(&Tiny(), o);
  Run r = Feed(os, ids);
  CHECK(os.done());
  CHECK(os.finish() == FinishReason::kToolCalls);
  CHECK(r.streamed_reasoning == "Let me think");
  CHECK(r.streamed_content == "Calling.");
  // Every token up to and including the think close tag's <|sep|>.
  CHECK(os.reasoning_tokens() == static_cast<int64_t>(Ids("Let me think").size() + Ids("think").size() + 2));
  REQUIRE(r.calls.size() >= 2);
  CHECK(r.calls[0].begin);
  CHECK(r.calls[0].id == "call_t_0");
  CHECK(r.calls[0].name == "lookup");
  std::string args;
  for (size_t i = 1; i < r.calls.size(); ++i) {
    CHECK_FALSE(r.calls[i].begin);
    CHECK(r.calls[i].id.empty());
    args += r.calls[i].arguments;
  }
  CHECK(args == R"({"q":"two words"})");
  REQUIRE(os.tool_calls().size() == 1);
  CHECK(os.tool_calls()[0].arguments_json == args);
  // <|end_of_msg|> is the config's EOS and ended the answer: nothing malformed.
  CHECK(os.warnings().empty());
}

TEST_CASE("chat mode: a stop string ends the content; EOS ends without text") {
  OutputStream::Options o;
  o.chat_start = tok::ChatStreamParser::Start::kResponse;
  o.eos_ids = {2050};
  o.stop = {"\n\n"};
  OutputStream os(&Tiny(), o);
  Run r = Feed(os, Ids("Line one.\n\nLine two."));
  CHECK(os.finish() == FinishReason::kStop);
  CHECK(os.stop_matched() == "\n\n");
  CHECK(r.streamed_content == "Line one.");
  OutputStream os2(&Tiny(), o);
  std::vector<int32_t> ids = Ids("Hi");
  ids.push_back(2050);
  Run r2 = Feed(os2, ids);
  CHECK(os2.done());
  CHECK(r2.streamed_content == "Hi");
  CHECK(os2.warnings().empty());
  // Cut off before the end marker (max_tokens): the parser says so.
  OutputStream os3(&Tiny(), o);
  Feed(os3, Ids("Hi"));
  CHECK(os3.warnings() == std::vector<std::string>{"output ended without <|end_of_msg|>"});
}
