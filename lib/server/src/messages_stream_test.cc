// The Messages event writer against Anthropic's documented event sequence
// (message_start; per block content_block_start, deltas, content_block_stop;
// message_delta; message_stop; ping; error): each event is parsed back with
// simdjson and checked field by field, the streamed events folded into a
// message equal the whole message, and UTF-8 split over deltas never splits a
// character in an event.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <vector>

#include "k3/server/messages_stream.h"

namespace k3::server {
namespace {

struct Sse {
  std::string event;
  std::string data;
};

// Splits "event: X\ndata: Y\n\n" frames; fails the test on anything else.
std::vector<Sse> Frames(const std::string& bytes) {
  std::vector<Sse> out;
  size_t at = 0;
  while (at < bytes.size()) {
    size_t end = bytes.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    std::string frame = bytes.substr(at, end - at);
    at = end + 2;
    size_t nl = frame.find('\n');
    REQUIRE(nl != std::string::npos);
    REQUIRE(frame.rfind("event: ", 0) == 0);
    REQUIRE(frame.compare(nl + 1, 6, "data: ") == 0);
    out.push_back({frame.substr(7, nl - 7), frame.substr(nl + 7)});
  }
  return out;
}

simdjson::dom::parser& P() {
  static thread_local simdjson::dom::parser p;
  return p;
}
std::string Str(simdjson::dom::element e, const char* pointer) {
  std::string_view v;
  REQUIRE(e.at_pointer(pointer).get_string().get(v) == simdjson::SUCCESS);
  return std::string(v);
}
int64_t Int(simdjson::dom::element e, const char* pointer) {
  int64_t v = -1;
  REQUIRE(e.at_pointer(pointer).get_int64().get(v) == simdjson::SUCCESS);
  return v;
}

MessageMeta Meta() { return MessageMeta{"msg_test", "k3-test", 40}; }

engine::Delta Reasoning(std::string s) {
  engine::Delta d;
  d.reasoning = std::move(s);
  return d;
}
engine::Delta Content(std::string s) {
  engine::Delta d;
  d.content = std::move(s);
  return d;
}
engine::Delta Call(int index, std::string name, std::string args) {
  engine::Delta d;
  engine::ToolCallDelta t;
  t.index = index;
  t.begin = !name.empty();
  if (t.begin) t.id = "call_" + std::to_string(index);
  t.name = std::move(name);
  t.arguments = std::move(args);
  d.tool_calls.push_back(t);
  return d;
}

engine::GenerateResult Result(engine::FinishReason finish, std::string stop_matched = {}) {
  engine::GenerateResult r;
  r.finish = finish;
  r.stop_matched = std::move(stop_matched);
  r.usage.prompt_tokens = 40;
  r.usage.cached_tokens = 30;
  r.usage.completion_tokens = 12;
  return r;
}

std::vector<engine::Delta> Script() {
  // "é" (C3 A9) and "🙂" (F0 9F 99 82) split across deltas.
  return {Reasoning("Thinking about caf\xC3"), Reasoning("\xA9."), Content("Let me check \xF0\x9F"),
          Content("\x99\x82"), Call(0, "get_weather", "{\"city\":"), Call(0, "", "\"Paris\"}"),
          Call(1, "get_time", ""), Call(1, "", "{}")};
}

TEST_CASE("the streamed event sequence: blocks open, delta and stop in order; UTF-8 is never split") {
  MessageEvents ev(Meta(), /*stream=*/true);
  std::string bytes = ev.Begin();
  for (const engine::Delta& d : Script()) bytes += ev.OnDelta(d);
  bytes += ev.Heartbeat("decode");
  bytes += ev.Finish(Result(engine::FinishReason::kToolCalls), ResponseStats{});
  CHECK(ev.Finish(Result(engine::FinishReason::kToolCalls), ResponseStats{}).empty());  // once

  std::vector<Sse> frames = Frames(bytes);
  std::vector<std::string> names;
  for (const Sse& f : frames) names.push_back(f.event);
  std::vector<std::string> expected = {
      "message_start",
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",  // thinking + signature
      "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  // text
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  // tool_use 0
      "content_block_start", "content_block_delta", "ping", "content_block_stop",                 // tool_use 1
      "message_delta", "message_stop"};
  CHECK(names == expected);

  std::string thinking, text, args0, args1, signature;
  int64_t stops = 0;
  for (const Sse& f : frames) {
    simdjson::dom::element e;
    REQUIRE(P().parse(f.data).get(e) == simdjson::SUCCESS);
    CHECK(Str(e, "/type") == f.event);  // "event:" and the data's type agree
    if (f.event == "message_start") {
      CHECK(Str(e, "/message/id") == "msg_test");
      CHECK(Str(e, "/message/type") == "message");
      CHECK(Str(e, "/message/role") == "assistant");
      CHECK(Str(e, "/message/model") == "k3-test");
      CHECK(e.at_pointer("/message/content").get_array().size() == 0);
      CHECK(e.at_pointer("/message/stop_reason").is_null());
      CHECK(Int(e, "/message/usage/input_tokens") == 40);
      CHECK(Int(e, "/message/usage/output_tokens") == 0);
    } else if (f.event == "content_block_start") {
      int64_t i = Int(e, "/index");
      std::string type = Str(e, "/content_block/type");
      CHECK(type == std::vector<std::string>{"thinking", "text", "tool_use", "tool_use"}[size_t(i)]);
      if (type == "tool_use") {
        CHECK(Str(e, "/content_block/id") == "toolu_call_" + std::to_string(i - 2));
        CHECK(Str(e, "/content_block/name") == (i == 2 ? "get_weather" : "get_time"));
        CHECK(e.at_pointer("/content_block/input").get_object().size() == 0);
      }
    } else if (f.event == "content_block_delta") {
      int64_t i = Int(e, "/index");
      std::string type = Str(e, "/delta/type");
      if (type == "thinking_delta") thinking += Str(e, "/delta/thinking");
      else if (type == "signature_delta") signature = Str(e, "/delta/signature");
      else if (type == "text_delta") text += Str(e, "/delta/text");
      else if (type == "input_json_delta") (i == 2 ? args0 : args1) += Str(e, "/delta/partial_json");
      else FAIL("unexpected delta type " << type);
    } else if (f.event == "content_block_stop") {
      CHECK(Int(e, "/index") == stops++);
    } else if (f.event == "message_delta") {
      CHECK(Str(e, "/delta/stop_reason") == "tool_use");
      CHECK(e.at_pointer("/delta/stop_sequence").is_null());
      CHECK(Int(e, "/usage/output_tokens") == 12);
      CHECK(Int(e, "/usage/input_tokens") == 10);  // Anthropic's input excludes cache reads
      CHECK(Int(e, "/usage/cache_read_input_tokens") == 30);
    }
  }
  CHECK(thinking == "Thinking about caf\xC3\xA9.");
  CHECK(text == "Let me check \xF0\x9F\x99\x82");
  CHECK(args0 == R"({"city":"Paris"})");
  CHECK(args1 == "{}");
  CHECK(signature == ThinkingSignature(thinking));
  CHECK(signature.rfind("k3-", 0) == 0);
}

TEST_CASE("the whole message carries the same blocks the stream built") {
  MessageEvents ev(Meta(), /*stream=*/false);
  CHECK(ev.Begin().empty());
  for (const engine::Delta& d : Script()) CHECK(ev.OnDelta(d).empty());
  CHECK(ev.Heartbeat("decode") == " ");
  std::string whole = ev.Finish(Result(engine::FinishReason::kToolCalls), ResponseStats{});
  simdjson::dom::element e;
  REQUIRE(P().parse(whole).get(e) == simdjson::SUCCESS);
  CHECK(Str(e, "/id") == "msg_test");
  CHECK(Str(e, "/type") == "message");
  CHECK(Str(e, "/role") == "assistant");
  CHECK(Str(e, "/content/0/type") == "thinking");
  CHECK(Str(e, "/content/0/thinking") == "Thinking about caf\xC3\xA9.");
  CHECK(Str(e, "/content/0/signature") == ThinkingSignature("Thinking about caf\xC3\xA9."));
  CHECK(Str(e, "/content/1/text") == "Let me check \xF0\x9F\x99\x82");
  CHECK(Str(e, "/content/2/type") == "tool_use");
  CHECK(Str(e, "/content/2/id") == "toolu_call_0");
  CHECK(Str(e, "/content/2/input/city") == "Paris");
  CHECK(e.at_pointer("/content/3/input").get_object().size() == 0);
  CHECK(Str(e, "/stop_reason") == "tool_use");
  CHECK(Int(e, "/usage/input_tokens") == 10);
  CHECK(Int(e, "/usage/cache_read_input_tokens") == 30);
  CHECK(Int(e, "/usage/output_tokens") == 12);
}

TEST_CASE("stop_reason: end_turn, stop_sequence with the sequence, max_tokens") {
  for (auto [result, reason] : {std::pair{Result(engine::FinishReason::kStop), "end_turn"},
                                std::pair{Result(engine::FinishReason::kStop, "END"), "stop_sequence"},
                                std::pair{Result(engine::FinishReason::kLength), "max_tokens"}}) {
    CAPTURE(reason);
    MessageEvents ev(Meta(), false);
    ev.OnDelta(Content("hello"));
    simdjson::dom::element e;
    std::string whole = ev.Finish(result, ResponseStats{});
    REQUIRE(P().parse(whole).get(e) == simdjson::SUCCESS);
    CHECK(Str(e, "/stop_reason") == reason);
    if (std::string(reason) == "stop_sequence") CHECK(Str(e, "/stop_sequence") == "END");
    else CHECK(e.at_pointer("/stop_sequence").is_null());
  }
  // Nothing generated: an empty content list, still one message_delta and message_stop.
  MessageEvents ev(Meta(), true);
  std::vector<Sse> frames = Frames(ev.Begin() + ev.Finish(Result(engine::FinishReason::kLength), ResponseStats{}));
  REQUIRE(frames.size() == 3);
  CHECK(frames[1].event == "message_delta");
  CHECK(frames[2].event == "message_stop");
}

TEST_CASE("an error after the stream began is one error event in Anthropic's shape") {
  MessageEvents ev(Meta(), true);
  std::string bytes = ev.Begin() + ev.OnDelta(Content("partial"));
  std::vector<Sse> frames = Frames(ev.Error(MakeApiError(500, "server_error", "the expert store failed")));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].event == "error");
  CHECK(frames[0].data == R"({"type":"error","error":{"type":"api_error","message":"the expert store failed"}})");
  CHECK(ev.Finish(Result(engine::FinishReason::kStop), ResponseStats{}).empty());
  CHECK(ev.Heartbeat("x") == "event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

TEST_CASE("tool input: a JSON object, {} when empty, the raw text kept otherwise") {
  CHECK(ToolInputJson(R"( {"a": [1, 2]} )") == R"({"a":[1,2]})");
  CHECK(ToolInputJson("") == "{}");
  CHECK(ToolInputJson("  ") == "{}");
  CHECK(ToolInputJson("[1]") == R"({"_k3_unparsed_arguments":"[1]"})");
  CHECK(ToolInputJson(R"({"a":)") == R"({"_k3_unparsed_arguments":"{\"a\":"})");
}

}  // namespace
}  // namespace k3::server
