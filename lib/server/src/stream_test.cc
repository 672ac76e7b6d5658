// The SSE serializer and stream state machine against OpenAI's chunk contract
// (docs/server.md "Streaming"): scripted answers (thinking, content, several
// tool calls, multi-byte text) split at every byte and every token boundary
// must give chunks that obey every rule and add up to exactly the whole
// (non-streamed) response; the SSE bytes are also re-read split at every byte.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <vector>

#include "k3/server/stream.h"
#include "segmenter.h"

namespace k3::server {
namespace {

using simdjson::dom::element;

// A client-side SSE reader fed arbitrary pieces (what a socket delivers).
class SseReader {
 public:
  void Feed(std::string_view bytes) {
    buf_.append(bytes);
    size_t end;
    while ((end = buf_.find("\n\n")) != std::string::npos) {
      std::string event = buf_.substr(0, end);
      buf_.erase(0, end + 2);
      if (event.rfind(": ", 0) == 0) {
        ++comments;
        continue;
      }
      REQUIRE(event.rfind("data: ", 0) == 0);
      std::string data = event.substr(6);
      if (data == "[DONE]") {
        ++done;
        continue;
      }
      CHECK(done == 0);  // nothing after [DONE]
      events.push_back(data);
    }
  }
  bool clean() const { return buf_.empty(); }
  std::vector<std::string> events;
  int done = 0, comments = 0;

 private:
  std::string buf_;
};

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

// Rebuilds the message the way OpenAI's SDK and KVV's accumulator do, and
// checks every per-chunk rule on the way.
struct Rebuilt {
  std::string role, reasoning, content, finish;
  struct Call {
    std::string id, name, arguments;
  };
  std::vector<Call> calls;
  std::string usage;
  int finish_count = 0, role_count = 0, usage_count = 0;
};

Rebuilt Rebuild(const std::vector<std::string>& events, const ResponseMeta& meta) {
  Rebuilt r;
  simdjson::dom::parser parser;
  bool after_usage = false;
  for (size_t n = 0; n < events.size(); ++n) {
    element e;
    REQUIRE(parser.parse(events[n]).get(e) == simdjson::SUCCESS);
    CHECK(std::string(e["id"].get_string().value()) == meta.id);
    CHECK(std::string(e["model"].get_string().value()) == meta.model);
    CHECK(e["created"].get_int64().value() == meta.created);
    CHECK(std::string(e["object"].get_string().value()) == "chat.completion.chunk");
    CHECK_FALSE(after_usage);  // the usage chunk is the last one
    simdjson::dom::array choices = e["choices"].get_array().value();
    element usage;
    if (e["usage"].get(usage) == simdjson::SUCCESS && !usage.is_null()) {
      CHECK(choices.size() == 0);  // usage rides alone, choices: []
      r.usage = simdjson::minify(usage);
      ++r.usage_count;
      after_usage = true;
      continue;
    }
    REQUIRE(choices.size() == 1);
    element choice = choices.at(0).value();
    CHECK(r.finish_count == 0);  // nothing follows the finish chunk but usage
    element delta = choice["delta"].value();
    std::string_view s;
    if (delta["role"].get(s) == simdjson::SUCCESS) {
      CHECK(n == 0);  // role in the first chunk only
      r.role = s;
      ++r.role_count;
    } else {
      CHECK(n != 0);
    }
    if (delta["reasoning_content"].get(s) == simdjson::SUCCESS) {
      CHECK(ValidUtf8(s));
      r.reasoning += s;
    }
    if (delta["content"].get(s) == simdjson::SUCCESS) {
      CHECK(ValidUtf8(s));
      r.content += s;
    }
    simdjson::dom::array calls;
    if (delta["tool_calls"].get(calls) == simdjson::SUCCESS) {
      for (element tc : calls) {
        int64_t index = tc["index"].get_int64().value();
        element fn = tc["function"].value();
        std::string_view id;
        if (tc["id"].get(id) == simdjson::SUCCESS) {
          // Opening fragment: index, id, type, function{name, arguments: ""}.
          CHECK(index == int64_t(r.calls.size()));
          CHECK(std::string(tc["type"].get_string().value()) == "function");
          CHECK(std::string(fn["arguments"].get_string().value()).empty());
          r.calls.push_back({std::string(id), std::string(fn["name"].get_string().value()), ""});
        } else {
          // Later fragments: only index and function.arguments.
          REQUIRE(index < int64_t(r.calls.size()));
          CHECK(tc["type"].error() == simdjson::NO_SUCH_FIELD);
          CHECK(fn["name"].error() == simdjson::NO_SUCH_FIELD);
          std::string_view a = fn["arguments"].get_string().value();
          CHECK(ValidUtf8(a));
          r.calls[index].arguments += a;
        }
      }
    }
    if (choice["finish_reason"].get(s) == simdjson::SUCCESS) {
      r.finish = s;
      ++r.finish_count;
    }
  }
  return r;
}

// A scripted answer: pieces per channel, in generation order.
struct Piece {
  enum Kind { kReasoning, kContent, kToolBegin, kToolArgs } kind;
  std::string text;  // reasoning / content / arguments / tool name
  int index = 0;
};

std::vector<engine::Delta> ToDeltas(const std::vector<Piece>& pieces) {
  std::vector<engine::Delta> out;
  for (const Piece& p : pieces) {
    engine::Delta d;
    switch (p.kind) {
      case Piece::kReasoning: d.reasoning = p.text; break;
      case Piece::kContent: d.content = p.text; break;
      case Piece::kToolBegin: {
        engine::ToolCallDelta tc;
        tc.index = p.index;
        tc.begin = true;
        tc.id = "call_" + std::to_string(p.index);
        tc.name = p.text;
        d.tool_calls.push_back(tc);
        break;
      }
      case Piece::kToolArgs: {
        engine::ToolCallDelta tc;
        tc.index = p.index;
        tc.arguments = p.text;
        d.tool_calls.push_back(tc);
        break;
      }
    }
    out.push_back(d);
  }
  return out;
}

// Splits every text piece at byte `cut` of the whole script (a token boundary
// that may fall inside a UTF-8 character).
std::vector<Piece> SplitAt(const std::vector<Piece>& pieces, size_t cut) {
  std::vector<Piece> out;
  size_t pos = 0;
  for (const Piece& p : pieces) {
    if (p.kind == Piece::kToolBegin || cut <= pos || cut >= pos + p.text.size()) {
      out.push_back(p);
    } else {
      Piece a = p, b = p;
      a.text = p.text.substr(0, cut - pos);
      b.text = p.text.substr(cut - pos);
      out.push_back(a);
      out.push_back(b);
    }
    if (p.kind != Piece::kToolBegin) pos += p.text.size();
  }
  return out;
}

// Every piece cut into single bytes.
std::vector<Piece> Bytewise(const std::vector<Piece>& pieces) {
  std::vector<Piece> out;
  for (const Piece& p : pieces) {
    if (p.kind == Piece::kToolBegin) {
      out.push_back(p);
      continue;
    }
    for (char c : p.text) {
      Piece b = p;
      b.text = std::string(1, c);
      out.push_back(b);
    }
  }
  return out;
}

ResponseMeta Meta(bool thinking) {
  ResponseMeta m;
  m.id = "chatcmpl-test";
  m.created = 1700000000;
  m.model = "k3-tiny";
  m.thinking = thinking;
  return m;
}

engine::Usage SomeUsage() {
  engine::Usage u;
  u.prompt_tokens = 11;
  u.completion_tokens = 7;
  u.reasoning_tokens = 3;
  u.cached_tokens = 2;
  return u;
}

// Streams `pieces`, re-reads the bytes split at every byte when asked, and
// checks the rebuilt message against the expected one and the whole response.
void CheckScript(const std::vector<Piece>& pieces, engine::FinishReason reason, const std::string& want_reasoning,
                 const std::string& want_content, const std::vector<Rebuilt::Call>& want_calls,
                 const std::string& want_finish, bool reread_bytewise) {
  ResponseMeta meta = Meta(true);
  ChatStream stream(meta, /*include_usage=*/true);
  ChatAccumulator whole(meta);
  std::string sse;
  for (const engine::Delta& d : ToDeltas(pieces)) {
    sse += stream.OnDelta(d);
    whole.OnDelta(d);
  }
  ResponseStats stats;
  sse += stream.Finish(reason, SomeUsage(), stats);
  std::string body = whole.Finish(reason, SomeUsage(), stats);

  std::vector<size_t> steps = {sse.size()};
  if (reread_bytewise) steps.push_back(1);
  for (size_t step : steps) {
    SseReader reader;
    for (size_t i = 0; i < sse.size(); i += step) reader.Feed(std::string_view(sse).substr(i, step));
    CHECK(reader.clean());
    CHECK(reader.done == 1);
    Rebuilt r = Rebuild(reader.events, meta);
    CHECK(r.role == "assistant");
    CHECK(r.role_count == 1);
    CHECK(r.finish_count == 1);
    CHECK(r.usage_count == 1);
    CHECK(r.finish == want_finish);
    CHECK(r.reasoning == want_reasoning);
    CHECK(r.content == want_content);
    REQUIRE(r.calls.size() == want_calls.size());
    for (size_t i = 0; i < want_calls.size(); ++i) {
      CHECK(r.calls[i].name == want_calls[i].name);
      CHECK(r.calls[i].arguments == want_calls[i].arguments);
      CHECK(r.calls[i].id == want_calls[i].id);
    }
    CHECK(r.usage ==
          "{\"prompt_tokens\":11,\"completion_tokens\":7,\"total_tokens\":18,\"prompt_tokens_details\":{\"cached_"
          "tokens\":2},\"completion_tokens_details\":{\"reasoning_tokens\":3}}");
  }

  // The whole response carries the same message.
  simdjson::dom::parser parser;
  element e;
  REQUIRE(parser.parse(body).get(e) == simdjson::SUCCESS);
  CHECK(std::string(e["object"].get_string().value()) == "chat.completion");
  element msg = e["choices"].at(0)["message"].value();
  CHECK(std::string(msg["role"].get_string().value()) == "assistant");
  CHECK(std::string(msg["reasoning_content"].get_string().value()) == want_reasoning);
  if (want_calls.empty() || !want_content.empty()) {
    CHECK(std::string(msg["content"].get_string().value()) == want_content);  // always a string
  } else {
    CHECK(msg["content"].is_null());  // null only beside tool calls
  }
  CHECK(std::string(e["choices"].at(0)["finish_reason"].get_string().value()) == want_finish);
  simdjson::dom::array calls;
  if (want_calls.empty()) {
    CHECK(msg["tool_calls"].error() == simdjson::NO_SUCH_FIELD);
  } else {
    REQUIRE(msg["tool_calls"].get(calls) == simdjson::SUCCESS);
    REQUIRE(calls.size() == want_calls.size());
    for (size_t i = 0; i < want_calls.size(); ++i) {
      element c = calls.at(i).value();
      CHECK(std::string(c["id"].get_string().value()) == want_calls[i].id);
      CHECK(std::string(c["function"]["name"].get_string().value()) == want_calls[i].name);
      CHECK(std::string(c["function"]["arguments"].get_string().value()) == want_calls[i].arguments);
    }
  }
  CHECK(std::string(simdjson::minify(e["usage"].value())) ==
        "{\"prompt_tokens\":11,\"completion_tokens\":7,\"total_tokens\":18,\"prompt_tokens_details\":{\"cached_"
        "tokens\":2},\"completion_tokens_details\":{\"reasoning_tokens\":3}}");
}

size_t ScriptBytes(const std::vector<Piece>& pieces) {
  size_t n = 0;
  for (const Piece& p : pieces) {
    if (p.kind != Piece::kToolBegin) n += p.text.size();
  }
  return n;
}

TEST_CASE("thinking then multi-byte content, split at every byte boundary") {
  // 2-, 3- and 4-byte characters (é, 中, 🙂) so cuts fall inside characters.
  std::vector<Piece> script = {{Piece::kReasoning, "Let me think: café 中文"},
                               {Piece::kReasoning, " 🙂."},
                               {Piece::kContent, "Answer: 北京 is the capital 🎉"},
                               {Piece::kContent, "!"}};
  std::string reasoning = "Let me think: café 中文 🙂.";
  std::string content = "Answer: 北京 is the capital 🎉!";
  CheckScript(script, engine::FinishReason::kStop, reasoning, content, {}, "stop", true);
  for (size_t cut = 1; cut < ScriptBytes(script); ++cut) {
    CAPTURE(cut);
    CheckScript(SplitAt(script, cut), engine::FinishReason::kStop, reasoning, content, {}, "stop", false);
  }
  CheckScript(Bytewise(script), engine::FinishReason::kLength, reasoning, content, {}, "length", true);
}

TEST_CASE("several tool calls stream their arguments as generated") {
  std::vector<Piece> script = {{Piece::kReasoning, "need two tools"},
                               {Piece::kToolBegin, "get_weather", 0},
                               {Piece::kToolArgs, "{\"city\": \"北", 0},
                               {Piece::kToolArgs, "京\"}", 0},
                               {Piece::kToolBegin, "get_time", 1},
                               {Piece::kToolArgs, "{\"tz\": \"Asia/Shanghai\"}", 1}};
  std::vector<Rebuilt::Call> calls = {{"call_0", "get_weather", "{\"city\": \"北京\"}"},
                                      {"call_1", "get_time", "{\"tz\": \"Asia/Shanghai\"}"}};
  CheckScript(script, engine::FinishReason::kToolCalls, "need two tools", "", calls, "tool_calls", true);
  for (size_t cut = 1; cut < ScriptBytes(script); ++cut) {
    CAPTURE(cut);
    CheckScript(SplitAt(script, cut), engine::FinishReason::kToolCalls, "need two tools", "", calls, "tool_calls",
                false);
  }
  CheckScript(Bytewise(script), engine::FinishReason::kToolCalls, "need two tools", "", calls, "tool_calls", true);
  // A stop the engine reports after tool calls still finishes as tool_calls.
  CheckScript(script, engine::FinishReason::kStop, "need two tools", "", calls, "tool_calls", false);
}

TEST_CASE("arguments arrive in several chunks, not one at the end") {
  ChatStream stream(Meta(true), false);
  engine::Delta begin;
  begin.tool_calls.push_back({0, true, "call_a", "f", ""});
  std::string first = stream.OnDelta(begin);
  CHECK(first.find("\"name\":\"f\"") != std::string::npos);
  engine::Delta piece;
  piece.tool_calls.push_back({0, false, "", "", "{\"x\":"});
  std::string second = stream.OnDelta(piece);
  CHECK(second.find("{\\\"x\\\":") != std::string::npos);  // forwarded at once
  CHECK(second.find("\"name\"") == std::string::npos);
}

TEST_CASE("an empty answer still has role first, finish once, content \"\"") {
  ChatStream stream(Meta(false), true);
  std::string sse = stream.Finish(engine::FinishReason::kStop, {}, {});
  SseReader reader;
  reader.Feed(sse);
  REQUIRE(reader.events.size() == 2);
  Rebuilt r = Rebuild(reader.events, Meta(false));
  CHECK(r.role == "assistant");
  CHECK(r.finish == "stop");
  ChatAccumulator whole(Meta(false));
  std::string body = whole.Finish(engine::FinishReason::kStop, {}, {});
  CHECK(body.find("\"content\":\"\"") != std::string::npos);
  CHECK(body.find("reasoning_content") == std::string::npos);  // thinking off: no reasoning field
}

TEST_CASE("without include_usage no chunk carries usage; cancelled maps to stop, never a raw id") {
  ChatStream stream(Meta(true), false);
  engine::Delta d;
  d.content = "hi";
  std::string sse = stream.OnDelta(d) + stream.Finish(engine::FinishReason::kCancelled, SomeUsage(), {});
  CHECK(sse.find("usage") == std::string::npos);
  CHECK(sse.find("\"finish_reason\":\"stop\"") != std::string::npos);
  CHECK(sse.find("cancelled") == std::string::npos);
  CHECK(stream.Finish(engine::FinishReason::kStop, {}, {}).empty());  // finish exactly once
}

TEST_CASE("an error after the stream started is one error event, then [DONE]") {
  ChatStream stream(Meta(true), true);
  engine::Delta d;
  d.content = "par";
  std::string sse = stream.OnDelta(d);
  sse += stream.Error(MakeApiError(500, "server_error", "disk gone", "kIo"));
  SseReader reader;
  reader.Feed(sse);
  REQUIRE(reader.events.size() == 2);
  CHECK(reader.events[1] == "{\"error\":{\"message\":\"disk gone\",\"type\":\"server_error\",\"param\":null,"
                            "\"code\":\"kIo\"}}");
  CHECK(reader.done == 1);
  CHECK(stream.Finish(engine::FinishReason::kStop, {}, {}).empty());
}

TEST_CASE("a UTF-8 sequence cut off at the very end becomes U+FFFD, never a split byte") {
  ChatStream stream(Meta(false), false);
  engine::Delta d;
  d.content = "ok \xE4\xB8";  // the first two bytes of 中
  std::string sse = stream.OnDelta(d);
  CHECK(sse.find("ok ") != std::string::npos);
  CHECK(sse.find("\xE4") == std::string::npos);
  sse = stream.Finish(engine::FinishReason::kLength, {}, {});
  CHECK(sse.find("\\ufffd") != std::string::npos);
}

TEST_CASE("Utf8Holder holds only incomplete trailing sequences") {
  Utf8Holder h;
  CHECK(h.Push("a\xF0\x9F") == "a");
  CHECK(h.Push("\x99") == "");
  CHECK(h.Push("\x82z") == "\xF0\x9F\x99\x82z");
  CHECK(h.Push("\xFF") == "\xFF");  // invalid bytes pass (the writer replaces them)
  CHECK(h.Flush().empty());
}

}  // namespace
}  // namespace k3::server
