// XTML rendering against Moonshot's encoder (tests/data/oracle/chat/cases.json)
// and the stream parser on well-formed, truncated and malformed outputs.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/tokenizer/chat.h"
#include "k3/tokenizer/tokenizer.h"

using namespace k3::tok;

namespace {

const std::string kData = K3_TEST_DATA_DIR;

const Tokenizer& Tiny() {
  static Tokenizer tok = Tokenizer::LoadDirOrThrow(kData + "/oracle/k3-tiny");
  return tok;
}

std::string Json(simdjson::dom::element e) { return simdjson::minify(e); }

// Ids of ordinary text then specials, for building model outputs.
struct Out {
  std::vector<TokenId> ids;
  Out& T(std::string_view text) {
    auto v = Tiny().EncodeOrdinary(text);
    ids.insert(ids.end(), v.begin(), v.end());
    return *this;
  }
  Out& S(std::string_view special) {
    ids.push_back(*Tiny().SpecialId(special));
    return *this;
  }
  Out& Open(std::string_view header) { return S("<|open|>").T(header).S("<|sep|>"); }
  Out& Close(std::string_view tag) { return S("<|close|>").T(tag).S("<|sep|>"); }
};

struct Parsed {
  std::string reasoning, content, streamed_reasoning, streamed_content;
  std::vector<ToolCall> calls;
  std::vector<ToolCallFragment> fragments;  // every streamed tool-call fragment, in order
  std::vector<std::string> warnings;
  bool ended;
  // The streamed pieces of call `i` concatenated.
  std::string StreamedArguments(int i) const {
    std::string a;
    for (const ToolCallFragment& f : fragments) if (f.call == i) a += f.arguments;
    return a;
  }
};

Parsed Parse(const std::vector<TokenId>& ids, ChatStreamParser::Start start) {
  ChatStreamParser p(Tiny(), start);
  Parsed r;
  for (TokenId id : ids) {
    ChatDelta d = p.Push(id);
    r.streamed_reasoning += d.reasoning;
    r.streamed_content += d.content;
    r.fragments.insert(r.fragments.end(), d.tool_calls.begin(), d.tool_calls.end());
  }
  ChatDelta d = p.Finish();
  r.streamed_reasoning += d.reasoning;
  r.streamed_content += d.content;
  r.fragments.insert(r.fragments.end(), d.tool_calls.begin(), d.tool_calls.end());
  r.reasoning = p.reasoning();
  r.content = p.content();
  r.calls = p.tool_calls();
  r.warnings = p.warnings();
  r.ended = p.ended();
  return r;
}

}  // namespace

TEST_CASE("every chat oracle case: segments and ids exact") {
  std::string text = k3::ReadFileOrThrow(kData + "/oracle/chat/cases.json", 64 << 20);
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::element root = parser.parse(padded).value();
  int n = 0;
  for (simdjson::dom::element c : root["cases"].get_array()) {
    ++n;
    std::string name(c["name"].get_string().value());
    INFO("case " << name);
    std::string request = "{\"messages\":" + Json(c["messages"].value()) +
                          ",\"options\":" + Json(c["options"].value()) + "}";
    RenderedChat r = RenderChatRequestOrThrow(request);
    std::vector<ChatSegment> want;
    for (simdjson::dom::element s : c["segments"].get_array()) {
      want.push_back({std::string(s["text"].get_string().value()), s["allow_special"].get_bool().value()});
    }
    REQUIRE(r.segments.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("segment " << i);
      CHECK(r.segments[i].text == want[i].text);
      CHECK(r.segments[i].allow_special == want[i].allow_special);
    }
    std::vector<TokenId> ids;
    for (auto id : c["ids"].get_array()) ids.push_back(TokenId(id.get_int64().value()));
    CHECK(EncodeChatSegments(Tiny(), r.segments) == ids);
    // resolved options
    simdjson::dom::element resolved = c["resolved"].value();
    CHECK(r.resolved.thinking == resolved["thinking"].get_bool().value());
    if (resolved["thinking_effort"].is_null()) {
      CHECK_FALSE(r.resolved.thinking_effort.has_value());
    } else {
      CHECK(r.resolved.thinking_effort == std::string(resolved["thinking_effort"].get_string().value()));
    }
  }
  CHECK(n == 14);
}

TEST_CASE("thinking_effort other than low/high/max is refused with a clear message") {
  for (const char* bad : {"medium", "MAX", "", "extreme"}) {
    std::string req = std::string(R"({"messages":[{"role":"user","content":"hi"}],"options":{"thinking_effort":")") +
                      bad + "\"}}";
    try {
      RenderChatRequestOrThrow(req);
      FAIL("accepted " << bad);
    } catch (const k3::Error& e) {
      CHECK(e.code() == k3::ErrorCode::kInvalidArgument);
      CHECK(std::string(e.what()).find("low, high, max") != std::string::npos);
    }
  }
  // Thinking off ignores the effort, as the encoder does.
  CHECK_NOTHROW(RenderChatRequestOrThrow(
      R"({"messages":[{"role":"user","content":"hi"}],"options":{"thinking":false,"thinking_effort":"medium"}})"));
}

TEST_CASE("tool results are reordered by tool_call_id and named after their call") {
  std::string req = R"({"messages":[
    {"role":"user","content":"q"},
    {"role":"assistant","content":"","tool_calls":[
      {"id":"a","type":"function","function":{"name":"first","arguments":"{\"x\": [1,2], \"y\": 1.5}"}},
      {"id":"b","type":"function","function":{"name":"second","arguments":{"s":"t"}}}]},
    {"role":"tool","tool_call_id":"b","content":"B"},
    {"role":"tool","tool_call_id":"a","content":"A"},
    {"role":"developer","content":"skipped"}],
    "options":{"thinking":false,"add_generation_prompt":false}})";
  RenderedChat r = RenderChatRequestOrThrow(req);
  std::string text;
  for (auto& s : r.segments) text += s.text;
  CHECK(text.find("skipped") == std::string::npos);
  size_t a = text.find("role=\"tool\" tool=\"first\" index=\"1\"<|sep|>A");
  size_t b = text.find("role=\"tool\" tool=\"second\" index=\"2\"<|sep|>B");
  CHECK(a != std::string::npos);
  CHECK(b != std::string::npos);
  CHECK(a < b);
  // Python json.dumps spacing for non-string argument values.
  CHECK(text.find("key=\"x\" type=\"array\"<|sep|>[1, 2]<|close|>argument") != std::string::npos);
  CHECK(text.find("key=\"y\" type=\"number\"<|sep|>1.5<|close|>") != std::string::npos);
  CHECK(text.find("key=\"s\" type=\"string\"<|sep|>t<|close|>") != std::string::npos);
}

TEST_CASE("arguments that are not a JSON object travel in a json block") {
  std::string req = R"({"messages":[{"role":"assistant","content":"","tool_calls":[
      {"id":"a","function":{"name":"f","arguments":"not json"}}]}],
      "options":{"thinking":false,"add_generation_prompt":false}})";
  std::string text;
  for (auto& s : RenderChatRequestOrThrow(req).segments) text += s.text;
  CHECK(text.find("<|open|>json type=\"object\"<|sep|>not json<|close|>json<|sep|>") != std::string::npos);
}

TEST_CASE("bad requests are refused") {
  CHECK_THROWS_AS(RenderChatRequestOrThrow("{"), k3::Error);
  CHECK_THROWS_AS(RenderChatRequestOrThrow("{}"), k3::Error);
  CHECK_THROWS_AS(RenderChatRequestOrThrow(R"({"messages":[{"content":"x"}]})"), k3::Error);
  CHECK_THROWS_AS(RenderChatRequestOrThrow(R"({"messages":[{"role":"tool","content":"x"}]})"), k3::Error);
  CHECK_THROWS_AS(RenderChatRequestOrThrow(
                      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})"),
                  k3::Error);
}

TEST_CASE("code-built conversations render like the JSON path") {
  std::vector<ChatMessage> msgs = {{"system", "Be brief.", ""}, {"user", "hi", ""}, {"assistant", "hello", "greet"},
                                   {"user", "bye", ""}};
  ChatOptions o;
  o.thinking_effort = "low";
  RenderedChat r = RenderChatOrThrow(msgs, o);
  std::string text;
  for (auto& s : r.segments) text += s.text;
  CHECK(text.find("<|open|>think<|sep|>greet<|close|>think<|sep|><|open|>response<|sep|>hello") != std::string::npos);
  CHECK(text.ends_with("<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"));
}

TEST_CASE("stream parser: well-formed thinking output with a tool call") {
  Out o;
  o.T("Let me think.").Close("think").Open("response").T("Sure: ").Close("response");
  o.Open("tools").Open("call tool=\"get_weather\" index=\"1\"");
  o.Open("argument key=\"city\" type=\"string\"").T("Paris \"x\"").Close("argument");
  o.Open("argument key=\"days\" type=\"number\"").T("2").Close("argument");
  o.Close("call").Close("tools").Close("message").S("<|end_of_msg|>");
  Parsed p = Parse(o.ids, ChatStreamParser::Start::kThink);
  CHECK(p.reasoning == "Let me think.");
  CHECK(p.content == "Sure: ");
  CHECK(p.streamed_reasoning == p.reasoning);
  CHECK(p.streamed_content == p.content);
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0].name == "get_weather");
  CHECK(p.calls[0].index == 1);
  CHECK(p.calls[0].arguments_json == R"({"city":"Paris \"x\"","days":2})");
  CHECK(p.ended);
  CHECK(p.warnings.empty());
  // Streamed: a begin fragment with the name, then the arguments as generated.
  REQUIRE(p.fragments.size() >= 3);
  CHECK(p.fragments[0] == ToolCallFragment{0, true, "get_weather", ""});
  CHECK(p.StreamedArguments(0) == p.calls[0].arguments_json);
  for (size_t i = 1; i < p.fragments.size(); ++i) CHECK_FALSE(p.fragments[i].begin);
}

TEST_CASE("stream parser: tool-call arguments stream token by token") {
  // Every value token is its own delta, so the arguments arrive in pieces
  // before the call closes: {"q": then the escaped text piece by piece.
  Out o;
  o.Close("think").Open("response").Close("response").Open("tools");
  o.Open("call tool=\"search\" index=\"1\"");
  o.Open("argument key=\"q\" type=\"string\"").T("multi \"word\"\n query é😀").Close("argument");
  o.Open("argument key=\"n\" type=\"integer\"").T("  42 ").Close("argument");
  o.Open("argument key=\"e\" type=\"object\"").Close("argument");
  o.Close("call");
  o.Open("call tool=\"raw\" index=\"2\"").Open("json").T("{\"k\": [1, 2]}").Close("json").Close("call");
  o.Close("tools").S("<|end_of_msg|>");
  ChatStreamParser parser(Tiny(), ChatStreamParser::Start::kThink);
  std::vector<std::string> pieces;  // call 0's argument pieces, one per Push
  for (TokenId id : o.ids) {
    for (const ToolCallFragment& f : parser.Push(id).tool_calls) {
      if (f.call == 0 && !f.begin) pieces.push_back(f.arguments);
      CHECK(IsValidUtf8(f.arguments));
    }
  }
  parser.Finish();
  REQUIRE(parser.tool_calls().size() == 2);
  CHECK(parser.tool_calls()[0].arguments_json ==
        R"({"q":"multi \"word\"\n query é😀","n":42,"e":null})");
  CHECK(parser.tool_calls()[1].arguments_json == R"({"k": [1, 2]})");
  CHECK(pieces.size() > 5);  // not one chunk at the end
  std::string joined;
  for (const std::string& p : pieces) joined += p;
  CHECK(joined == parser.tool_calls()[0].arguments_json);
  CHECK(parser.warnings().empty());
}

TEST_CASE("stream parser: think never closed (truncated)") {
  Out o;
  o.T("I keep thinking and thinking 🤔");
  o.ids.pop_back();  // cut inside the emoji's bytes
  Parsed p = Parse(o.ids, ChatStreamParser::Start::kThink);
  CHECK(p.content.empty());
  CHECK(p.reasoning.rfind("I keep thinking and thinking", 0) == 0);
  CHECK(k3::tok::IsValidUtf8(p.reasoning));
  CHECK_FALSE(p.ended);
  CHECK_FALSE(p.warnings.empty());
}

TEST_CASE("stream parser: no think at all") {
  // Thinking off: the prompt opened the response channel.
  Out a;
  a.T("Just the answer.").Close("response").Close("message").S("<|end_of_msg|>");
  Parsed p = Parse(a.ids, ChatStreamParser::Start::kResponse);
  CHECK(p.reasoning.empty());
  CHECK(p.content == "Just the answer.");
  CHECK(p.warnings.empty());
  // Thinking on, but the model opens response without closing think.
  Out b;
  b.Open("response").T("Answer.").S("<|end_of_msg|>");
  p = Parse(b.ids, ChatStreamParser::Start::kThink);
  CHECK(p.reasoning.empty());
  CHECK(p.content == "Answer.");
  CHECK_FALSE(p.warnings.empty());
  // Prompt ended at the open message and the model writes plain text.
  Out c;
  c.T("Plain text.").S("<|end_of_msg|>");
  p = Parse(c.ids, ChatStreamParser::Start::kMessage);
  CHECK(p.content == "Plain text.");
}

TEST_CASE("stream parser: close tags inside content") {
  // Spelled as ordinary text: stays content.
  Out a;
  a.Close("think").Open("response").T("Use <|close|>think<|sep|> and </think> literally.").Close("response");
  a.S("<|end_of_msg|>");
  Parsed p = Parse(a.ids, ChatStreamParser::Start::kThink);
  CHECK(p.content == "Use <|close|>think<|sep|> and </think> literally.");
  // A real close of think while in the response: ignored, text stays content.
  Out b;
  b.Close("think").Open("response").T("one ").Close("think").T("two").Close("response").S("<|end_of_msg|>");
  p = Parse(b.ids, ChatStreamParser::Start::kThink);
  CHECK(p.content == "one two");
  CHECK_FALSE(p.warnings.empty());
  // A stray sep, an unterminated tag and other specials are never printed.
  Out c;
  c.T("a").S("<|sep|>").T("b").S("[BOS]").S("<|open|>").T("resp");
  p = Parse(c.ids, ChatStreamParser::Start::kResponse);
  CHECK(p.content == "ab");
  CHECK(p.warnings.size() >= 3);
}

TEST_CASE("stream parser: truncated tool call and json block") {
  Out a;
  a.Close("think").Open("response").Close("response").Open("tools").Open("call tool=\"f\" index=\"1\"");
  a.Open("json type=\"object\"").T("{\"a\": 1}").Close("json").Close("call").Close("tools");
  Parsed p = Parse(a.ids, ChatStreamParser::Start::kThink);
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0].arguments_json == "{\"a\": 1}");
  Out b;
  b.Close("think").Open("response").Close("response").Open("tools").Open("call tool=\"g\" index=\"1\"");
  b.Open("argument key=\"q\" type=\"string\"").T("half");
  p = Parse(b.ids, ChatStreamParser::Start::kThink);
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0].name == "g");
  // What was streamed stays: the cut value is closed so the JSON stays valid.
  CHECK(p.calls[0].arguments_json == R"({"q":"half"})");
  CHECK(p.StreamedArguments(0) == p.calls[0].arguments_json);
  CHECK_FALSE(p.warnings.empty());
}

TEST_CASE("stream parser survives random id sequences") {
  // Any model output, however broken: no throw, valid UTF-8 out, no markers.
  uint32_t state = 12345;
  auto next = [&] { state = state * 1103515245u + 12345u; return state >> 8; };
  const uint32_t vocab = Tiny().vocab_size();
  for (int round = 0; round < 300; ++round) {
    std::vector<TokenId> ids;
    int len = int(next() % 64);
    for (int i = 0; i < len; ++i) {
      // Bias towards the structural markers so tags actually form.
      uint32_t r = next() % 10;
      ids.push_back(r < 3 ? TokenId(2050 + next() % 4) : TokenId(next() % vocab));
    }
    for (auto start : {ChatStreamParser::Start::kThink, ChatStreamParser::Start::kResponse,
                       ChatStreamParser::Start::kMessage}) {
      Parsed p;
      CHECK_NOTHROW(p = Parse(ids, start));
      CHECK(IsValidUtf8(p.reasoning));
      CHECK(IsValidUtf8(p.content));
      CHECK(p.streamed_reasoning == p.reasoning);
      CHECK(p.streamed_content == p.content);
      for (size_t i = 0; i < p.calls.size(); ++i) {
        CHECK(p.StreamedArguments(int(i)) == p.calls[i].arguments_json);
      }
    }
  }
}
