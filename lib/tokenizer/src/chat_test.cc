// XTML rendering against Moonshot's encoder (tests/data/oracle/chat/cases*.json, rejects-2.json)
// and the stream parser on well-formed, truncated and malformed outputs.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
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

// An oracle case as a render request.
std::string Request(simdjson::dom::element c) {
  return "{\"messages\":" + Json(c["messages"].value()) + ",\"options\":" + Json(c["options"].value()) + "}";
}

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

// Renders every case of an oracle file and compares segments, ids and the
// resolved options with the encoder's; returns the number of cases.
int CheckOracleCases(const std::string& file) {
  std::string text = k3::ReadFileOrThrow(kData + "/oracle/chat/" + file, 64 << 20);
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::element root = parser.parse(padded).value();
  int n = 0;
  for (simdjson::dom::element c : root["cases"].get_array()) {
    ++n;
    std::string name(c["name"].get_string().value());
    INFO(file << " case " << name);
    RenderedChat r = RenderChatRequestOrThrow(Request(c));
    std::vector<ChatSegment> want;
    for (simdjson::dom::element s : c["segments"].get_array()) {
      want.push_back({std::string(s["text"].get_string().value()), s["allow_special"].get_bool().value()});
    }
    CHECK(r.segments.size() == want.size());
    for (size_t i = 0; i < std::min(want.size(), r.segments.size()); ++i) {
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
  return n;
}

TEST_CASE("every chat oracle case: segments and ids exact") {
  CHECK(CheckOracleCases("cases.json") == 14);
}

TEST_CASE("second oracle set (parts, whitespace reasoning, big integers, ...): segments and ids exact") {
  CHECK(CheckOracleCases("cases-2.json") == 42);
}

TEST_CASE("every conversation the encoder refuses is refused") {
  std::string text = k3::ReadFileOrThrow(kData + "/oracle/chat/rejects-2.json", 1 << 20);
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::element root = parser.parse(padded).value();
  int n = 0;
  for (simdjson::dom::element c : root["cases"].get_array()) {
    ++n;
    INFO("case " << std::string(c["name"].get_string().value()) << ": encoder says "
                 << std::string(c["error"].get_string().value()));
    try {
      RenderChatRequestOrThrow(Request(c));
      FAIL("rendered");
    } catch (const k3::Error& e) {
      CHECK(e.code() == k3::ErrorCode::kInvalidArgument);
    }
  }
  CHECK(n == 10);
}

TEST_CASE("thinking_effort other than low/high/max is refused with a clear message") {
  for (const char* bad : {"medium", "MAX", "", "extreme"}) {
    for (const char* thinking : {"true", "false"}) {
      // The encoder checks the effort even with thinking off (rejects-2.json has the case).
      std::string req = std::string(R"({"messages":[{"role":"user","content":"hi"}],"options":{"thinking":)") +
                        thinking + R"(,"thinking_effort":")" + bad + "\"}}";
      try {
        RenderChatRequestOrThrow(req);
        FAIL("accepted " << bad);
      } catch (const k3::Error& e) {
        CHECK(e.code() == k3::ErrorCode::kInvalidArgument);
        CHECK(std::string(e.what()).find("low, high, max") != std::string::npos);
      }
    }
  }
}

// Rules read off encoding_k3.py that no oracle case exercises; each expected
// text is what the encoder's Python produces (worked out from its source, noted
// per case), not our output.
namespace {
std::string Rendered(const std::string& req) {
  std::string text;
  for (auto& s : RenderChatRequestOrThrow(req).segments) text += s.text;
  return text;
}
const char* kNoThink = R"("options":{"thinking":false,"add_generation_prompt":false})";
}  // namespace

TEST_CASE("encoder rules beyond the oracle: Python values become text with str()") {
  // _render_content_segments: part["text"] goes through str(): None, True, 5, 1.5.
  CHECK(Rendered(std::string(R"({"messages":[{"role":"user","content":[{"type":"text","text":null},)"
                             R"({"type":"text","text":true},{"type":"text","text":5},{"type":"note","text":1.50}]}],)") +
                 kNoThink + "}") == "<|open|>message role=\"user\"<|sep|>NoneTrue51.5<|close|>message<|sep|><|end_of_msg|>");
  // name attributes: str(7) and str(False) is falsy so omitted.
  CHECK(Rendered(std::string(R"({"messages":[{"role":"user","content":"x","name":7},{"role":"user","content":"y","name":false}],)") +
                 kNoThink + "}")
            .find("role=\"user\" name=\"7\"<|sep|>x") != std::string::npos);
  // reasoning_content that is not a str is written as str(): a list is its repr.
  std::string r = Rendered(R"({"messages":[{"role":"assistant","content":"a","reasoning_content":["it's",{"k":1.0,"b":null}]}],)"
                           R"("options":{"thinking":true,"add_generation_prompt":false}})");
  CHECK(r.find("<|open|>think<|sep|>[\"it's\", {'k': 1.0, 'b': None}]<|close|>think") != std::string::npos);
  // Tool call names and ids through str(): a numeric name, a float id matched as "2.0".
  r = Rendered(std::string(R"({"messages":[{"role":"assistant","content":"","tool_calls":[)"
                           R"({"id":1,"function":{"name":9,"arguments":{}}},{"id":2.0,"function":{"name":"b","arguments":{}}}]},)"
                           R"({"role":"tool","tool_call_id":"2.0","content":"B"},{"role":"tool","tool_call_id":"1","content":"A"}],)") +
               kNoThink + "}");
  CHECK(r.find("<|open|>call tool=\"9\" index=\"1\"") != std::string::npos);
  CHECK(r.find("role=\"tool\" tool=\"9\" index=\"1\"<|sep|>A") < r.find("role=\"tool\" tool=\"b\" index=\"2\"<|sep|>B"));
}

TEST_CASE("encoder rules beyond the oracle: dict.get keeps a present null") {
  // message.get("tool", message.get("name")): "tool": null does not fall back to
  // name; the name then comes from the preceding call at that position.
  std::string r = Rendered(std::string(R"({"messages":[{"role":"assistant","content":"","tool_calls":[)"
                                       R"({"function":{"name":"calc","arguments":{}}}]},)"
                                       R"({"role":"tool","tool":null,"name":"ignored","content":"1"}],)") +
                           kNoThink + "}");
  CHECK(r.find("role=\"tool\" tool=\"calc\" index=\"1\"") != std::string::npos);
  // tool_message.get("tool_call_id", tool_message.get("id")): a null tool_call_id
  // leaves the run unmatched, so it keeps its order and its own names.
  r = Rendered(std::string(R"({"messages":[{"role":"assistant","content":"","tool_calls":[)"
                           R"({"id":"a","function":{"name":"fa","arguments":{}}},{"id":"b","function":{"name":"fb","arguments":{}}}]},)"
                           R"({"role":"tool","tool_call_id":null,"id":"b","name":"nb","content":"B"},)"
                           R"({"role":"tool","tool_call_id":"a","content":"A"}],)") +
               kNoThink + "}");
  CHECK(r.find("tool=\"nb\" index=\"1\"<|sep|>B") < r.find("tool=\"fb\" index=\"2\"<|sep|>A"));
  // add_generation_prompt=None is falsy.
  CHECK(Rendered(R"({"messages":[{"role":"user","content":"x"}],"options":{"thinking":false,"add_generation_prompt":null}})")
            .ends_with("<|end_of_msg|>"));
}

TEST_CASE("encoder rules beyond the oracle: options as vLLM passes them") {
  auto effort = [](const std::string& options) {
    return RenderChatRequestOrThrow(R"({"messages":[{"role":"user","content":"x"}],"options":)" + options + "}").resolved;
  };
  CHECK_FALSE(effort(R"({"reasoning_effort":"none","thinking":true})").thinking);   // "none" turns thinking off
  CHECK(effort(R"({"reasoning_effort":"low"})").thinking_effort == "low");           // stands in for thinking_effort
  CHECK(effort(R"({"reasoning_effort":"low","thinking_effort":"high"})").thinking_effort == "high");
  CHECK_FALSE(effort(R"({"enable_thinking":false})").thinking);                      // used when thinking is unset
  CHECK(effort(R"({"enable_thinking":false,"thinking":true})").thinking);
  CHECK_FALSE(effort(R"({"thinking":0})").thinking);                                 // truthiness
  CHECK_THROWS_AS(effort(R"({"reasoning_effort":"medium"})"), k3::Error);
  // response_format: json_schema.json_schema is the schema when .schema is absent;
  // a response_schema option is used as it is.
  std::string r = Rendered(R"({"messages":[],"options":{"thinking":false,"add_generation_prompt":false,)"
                           R"("response_format":{"type":"json_schema","json_schema":{"json_schema":{"b":1,"a":2}}}}})");
  CHECK(r.find("```json\n{\"a\":2,\"b\":1}\n```") != std::string::npos);
  r = Rendered(R"({"messages":[],"options":{"thinking":false,"add_generation_prompt":false,)"
               R"("response_format":{"type":"json_schema","json_schema":{"schema":{"x":1}}},"response_schema":[3]}})");
  CHECK(r.find("```json\n[3]\n```") != std::string::npos);
  // `if tools:`: any truthy value is declared, an empty dict is not.
  CHECK(Rendered(R"({"messages":[],"options":{"thinking":false,"add_generation_prompt":false,"tools":{"z":1,"a":[]}}})")
            .find("```json\n{\"a\":[],\"z\":1}\n```") != std::string::npos);
  CHECK(Rendered(R"({"messages":[],"options":{"thinking":false,"add_generation_prompt":false,"tools":{}}})").empty());
}

TEST_CASE("encoder rules beyond the oracle: messages it skips and arguments as json.loads reads them") {
  // Non-dict messages and non-str roles are skipped.
  CHECK(Rendered(std::string(R"({"messages":["text",[1],null,{"role":5,"content":"x"},{"role":"developer","content":"y"}],)") +
                 kNoThink + "}")
            .empty());
  // Arguments: blank is no arguments; NaN / Infinity / big and -0 integers and
  // duplicate keys as json.loads builds them, written back by json.dumps.
  std::string r = Rendered(std::string(R"({"messages":[{"role":"assistant","content":"","tool_calls":[)"
                                       R"({"function":{"name":"f","arguments":" \n "}},)"
                                       R"({"function":{"name":"g","arguments":"{\"a\": NaN, \"b\": [1e400, -0, 1E2], \"a\": 99999999999999999999999}"}}]}],)") +
                           kNoThink + "}");
  CHECK(r.find("<|open|>call tool=\"f\" index=\"1\"<|sep|><|close|>call") != std::string::npos);
  CHECK(r.find("key=\"a\" type=\"number\"<|sep|>99999999999999999999999<|close|>argument") != std::string::npos);
  CHECK(r.find("key=\"b\" type=\"array\"<|sep|>[Infinity, 0, 100.0]<|close|>argument") != std::string::npos);
  CHECK(r.find("key=\"a\"", r.find("key=\"a\"") + 1) == std::string::npos);
  // Refused as the encoder refuses: arguments that parse to a non-object or are
  // neither dict nor str, tool_calls that are not a list (on any message).
  for (const char* bad : {R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]})",
                          R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":[1]}}]})",
                          R"({"role":"user","content":"x","tool_calls":[{"function":{"arguments":"7"}}]})",
                          R"({"role":"user","content":"x","tool_calls":3})",
                          R"({"role":"assistant","tool_calls":{"id":"x"}})",
                          R"({"role":"assistant","tool_calls":[{"function":{"arguments":{}}}]})",
                          R"({"role":"user","content":7})", R"({"role":"user","content":["x"]})"}) {
    INFO(bad);
    CHECK_THROWS_AS(RenderChatRequestOrThrow(std::string(R"({"messages":[)") + bad + "]," + kNoThink + "}"), k3::Error);
  }
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
