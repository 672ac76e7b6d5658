// The Responses request parser and event writer: a Responses request renders
// to exactly the segments (so the ids) of its chat.completions twin, written
// here by hand as an OpenAI client would send it; refusals name the Responses
// field; the streamed events follow the API's order (every item-scoped event
// names its item and output index, sequence numbers count up) and the whole
// response carries the same items.
#include "k3/server/responses.h"

#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>
#include <vector>

namespace k3::server {
namespace {

void CheckSameRender(const std::string& responses_body, const std::string& openai_body) {
  ResponsesRequest r = ParseResponsesRequestOrThrow(responses_body, ApiPolicy{});
  ChatRequest o = ParseChatRequestOrThrow(openai_body, ApiPolicy{});
  CHECK(r.request.chat.segments == o.chat.segments);
  CHECK(r.request.thinking == o.thinking);
  CHECK(r.request.effort == o.effort);
  CHECK(r.request.max_tokens == o.max_tokens);
  CHECK(r.request.tools.size() == o.tools.size());
  CHECK(r.request.tool_choice == o.tool_choice);
  CHECK(r.request.response_format == o.response_format);
}

std::pair<ErrorCode, std::string> Refusal(const std::string& body) {
  try {
    ParseResponsesRequestOrThrow(body, ApiPolicy{});
  } catch (const Error& e) {
    return {e.code(), e.object()};
  }
  return {ErrorCode::kOk, "accepted"};
}

const char* kSchema =
    R"({"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]})";

TEST_CASE("a string input with instructions renders as system + user") {
  CheckSameRender(
      R"({"model":"k3","instructions":"Be terse.","input":"Hello"})",
      R"({"model":"k3","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"Hello"}]})");
}

TEST_CASE(
    "Codex's conversation renders as its twin: developer, reasoning, calls, outputs, tools, "
    "effort") {
  std::string input =
      R"([{"type":"message","role":"developer","content":[{"type":"input_text","text":"Sandbox: read-only."}]},)"
      R"({"type":"message","role":"user","content":[{"type":"input_text","text":"List the files."}]},)"
      R"({"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"Use the shell."}],"encrypted_content":null},)"
      R"({"type":"message","role":"assistant","content":[{"type":"output_text","text":"Listing."}]},)"
      R"({"type":"function_call","id":"fc_1","call_id":"call_1","name":"shell","arguments":"{\"command\":[\"ls\"]}"},)"
      R"({"type":"function_call_output","call_id":"call_1","output":"a.txt\nb.txt"},)"
      R"({"role":"user","content":"Thanks"}])";
  std::string responses =
      std::string(R"({"model":"k3","instructions":"You are Codex.","input":)") + input +
      R"(,"tools":[{"type":"web_search"},{"type":"function","name":"shell","description":"Run.","strict":false,"parameters":)" +
      kSchema +
      R"(},{"type":"namespace","name":"mcp","tools":[]}],"tool_choice":"auto","parallel_tool_calls":false,)"
      R"("reasoning":{"effort":"medium","summary":"auto"},"store":false,"stream":true,)"
      R"("include":["reasoning.encrypted_content"],"prompt_cache_key":"abc","max_output_tokens":300})";
  std::string twin =
      std::string(
          R"({"model":"k3","messages":[{"role":"system","content":"You are Codex."},)"
          R"({"role":"system","content":[{"type":"text","text":"Sandbox: read-only."}]},)"
          R"({"role":"user","content":[{"type":"text","text":"List the files."}]},)"
          R"({"role":"assistant","content":[{"type":"text","text":"Listing."}],"reasoning_content":"Use the shell.",)"
          R"("tool_calls":[{"id":"call_1","type":"function","function":{"name":"shell","arguments":"{\"command\":[\"ls\"]}"}}]},)"
          R"({"role":"tool","tool_call_id":"call_1","content":"a.txt\nb.txt"},)"
          R"({"role":"user","content":"Thanks"}],)"
          R"("tools":[{"type":"function","function":{"name":"shell","description":"Run.","parameters":)") +
      kSchema +
      R"(,"strict":false}}],"tool_choice":"auto","thinking":{"type":"enabled","effort":"high"},"max_completion_tokens":300,"stream":true})";
  CheckSameRender(responses, twin);
  ResponsesRequest r = ParseResponsesRequestOrThrow(responses, ApiPolicy{});
  CHECK(r.ignored_tools == std::vector<std::string>{"web_search", "namespace"});
  CHECK(r.request.stream);
  CHECK(r.echo.max_output_tokens == "300");
  CHECK_FALSE(r.echo.parallel_tool_calls);
}

TEST_CASE("effort, text.format and tool_choice map to K3's settings") {
  CheckSameRender(R"({"input":"x","reasoning":{"effort":"none"}})",
                  R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"disabled"}})");
  CheckSameRender(
      R"({"input":"x","reasoning":{"effort":"xhigh"}})",
      R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","effort":"max"}})");
  CheckSameRender(
      R"({"input":"x","reasoning":{"effort":"minimal"}})",
      R"({"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","effort":"low"}})");
  CheckSameRender(
      R"({"input":"x","text":{"format":{"type":"json_schema","name":"out","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},"strict":true},"verbosity":"low"}})",
      R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"out","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},"strict":true}}})");
  std::string tools =
      std::string(R"("tools":[{"type":"function","name":"shell","parameters":)") + kSchema + "}]";
  CheckSameRender(
      R"({"input":"x",)" + tools + R"(,"tool_choice":{"type":"function","name":"shell"}})",
      R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"shell","parameters":)" +
          std::string(kSchema) +
          R"(}}],"tool_choice":{"type":"function","function":{"name":"shell"}}})");
  CheckSameRender(
      R"({"input":"x",)" + tools + R"(,"tool_choice":"required"})",
      R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"shell","parameters":)" +
          std::string(kSchema) + R"(}}],"tool_choice":"required"})");
}

TEST_CASE("refusals name the Responses field") {
  CHECK(Refusal(R"({"input":"x","previous_response_id":"resp_1"})") ==
        std::pair{ErrorCode::kUnsupported, std::string("previous_response_id")});
  CHECK(Refusal(R"({"input":"x","background":true})").first == ErrorCode::kUnsupported);
  CHECK(Refusal(R"({"model":"k3"})") ==
        std::pair{ErrorCode::kInvalidArgument, std::string("input")});
  CHECK(Refusal(R"({"input":[]})") == std::pair{ErrorCode::kInvalidArgument, std::string("input")});
  CHECK(Refusal(R"({"input":[{"role":"tool","content":"x"}]})") ==
        std::pair{ErrorCode::kInvalidArgument, std::string("input[0].role")});
  CHECK(Refusal(
            R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]})") ==
        std::pair{ErrorCode::kUnsupported, std::string("input[0].content[0].type")});
  CHECK(Refusal(R"({"input":[{"type":"item_reference","id":"msg_1"}]})") ==
        std::pair{ErrorCode::kUnsupported, std::string("input[0].type")});
  CHECK(Refusal(R"({"input":[{"type":"local_shell_call","id":"x"}]})") ==
        std::pair{ErrorCode::kUnsupported, std::string("input[0].type")});
  CHECK(Refusal(R"({"input":[{"type":"function_call_output","call_id":"","output":"x"}]})") ==
        std::pair{ErrorCode::kInvalidArgument, std::string("input[0].call_id")});
  CHECK(Refusal(R"({"input":"x","max_output_tokens":0})") ==
        std::pair{ErrorCode::kInvalidArgument, std::string("max_output_tokens")});
  CHECK(Refusal(R"({"input":"x","reasoning":{"effort":"huge"}})") ==
        std::pair{ErrorCode::kInvalidArgument, std::string("reasoning.effort")});
  CHECK(Refusal(R"({"input":"x","tool_choice":{"type":"web_search_preview"}})").first ==
        ErrorCode::kUnsupported);
  // Errors of the twin's parser are renamed: the second tool (after an
  // ignored hosted tool) is the request's tools[2].
  std::string named =
      Refusal(
          R"({"input":"x","tools":[{"type":"web_search"},{"type":"function","name":"a","parameters":{"type":"object"}},)"
          R"({"type":"function","name":"b","strict":true,"parameters":{"type":"object","not":{}}}]})")
          .second;
  CHECK(named == "tools[2].parameters");
  CHECK(
      Refusal(
          R"({"input":"x","tools":[{"type":"function","name":"a"}],"tool_choice":{"type":"function","name":"zz"}})")
          .second == "tool_choice.name");
  CHECK(
      Refusal(
          R"({"input":"x","text":{"format":{"type":"json_schema","name":"o","schema":{"type":"object","not":{}},"strict":true}}})")
          .second.rfind("text.format.schema", 0) == 0);
}

// Parsed SSE events: type and JSON text.
std::vector<std::pair<std::string, std::string>> Events(const std::string& sse) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t at = 0;
  while ((at = sse.find("event: ", at)) != std::string::npos) {
    size_t nl = sse.find('\n', at);
    std::string type = sse.substr(at + 7, nl - at - 7);
    size_t data = sse.find("data: ", nl);
    size_t end = sse.find("\n\n", data);
    out.emplace_back(type, sse.substr(data + 6, end - data - 6));
    at = end;
  }
  return out;
}

std::vector<engine::Delta> Script() {
  std::vector<engine::Delta> d(5);
  d[0].reasoning = "Think \xE4\xB8";  // a character split across deltas
  d[1].reasoning = "\x96 more";
  d[2].content = "Calling.";
  engine::ToolCallDelta open;
  open.index = 0;
  open.begin = true;
  open.id = "call_a";
  open.name = "shell";
  d[3].tool_calls.push_back(open);
  engine::ToolCallDelta args;
  args.index = 0;
  args.arguments = R"({"command":["ls"]})";
  d[3].tool_calls.push_back(args);
  engine::ToolCallDelta second;
  second.index = 1;
  second.begin = true;
  second.id = "call_b";
  second.name = "shell";
  second.arguments = "{}";
  d[4].tool_calls.push_back(second);
  return d;
}

ResponseObjectMeta Meta() {
  ResponseObjectMeta m;
  m.id = "resp_k3-1-1";
  m.created_at = 7;
  m.model = "k3-test";
  return m;
}

TEST_CASE(
    "the streamed events: lifecycle, items in order, ids and indexes consistent, the whole "
    "response agrees") {
  ResponseEvents stream(Meta(), true);
  std::string sse = stream.Begin();
  sse += stream.Heartbeat("queued");
  for (const engine::Delta& d : Script()) sse += stream.OnDelta(d);
  engine::GenerateResult result;
  result.finish = engine::FinishReason::kToolCalls;
  result.usage.prompt_tokens = 20;
  result.usage.cached_tokens = 4;
  result.usage.completion_tokens = 9;
  result.usage.reasoning_tokens = 3;
  sse += stream.Finish(result, ResponseStats{});
  auto events = Events(sse);
  std::vector<std::string> types;
  for (auto& [t, _] : events) types.push_back(t);
  std::vector<std::string> expect = {
      "response.created", "response.in_progress", "keepalive",
      // reasoning
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      // message
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      // two calls
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  CHECK(types == expect);
  simdjson::dom::parser parser;
  int64_t seq = 0;
  for (auto& [type, json] : events) {
    simdjson::dom::element e;
    REQUIRE(parser.parse(json).get(e) == simdjson::SUCCESS);
    CHECK(std::string(e["type"].get_string().value()) == type);
    CHECK(e["sequence_number"].get_int64().value() == seq++);
  }
  // The UTF-8 character split across deltas is never split in an event.
  CHECK(sse.find(R"("delta":"Think ")") != std::string::npos);
  CHECK(sse.find("\xE4\xB8\x96 more") != std::string::npos);
  // Item-scoped events name the item they belong to.
  CHECK(sse.find(R"("item_id":"fc_k3-1-1_2","output_index":2,"delta":"{\"command\":[\"ls\"]}")") !=
        std::string::npos);
  CHECK(sse.find(R"("call_id":"call_b","name":"shell","arguments":"{}")") != std::string::npos);
  // response.completed carries the output and the usage with cached and reasoning tokens.
  const std::string& done = events.back().second;
  CHECK(done.find(R"("status":"completed")") != std::string::npos);
  CHECK(
      done.find(
          R"("usage":{"input_tokens":20,"input_tokens_details":{"cached_tokens":4},"output_tokens":9,)"
          R"("output_tokens_details":{"reasoning_tokens":3},"total_tokens":29})") !=
      std::string::npos);

  // Not streamed: the same response object.
  ResponseEvents whole(Meta(), false);
  CHECK(whole.Begin().empty());
  CHECK(whole.Heartbeat("x") == " ");
  for (const engine::Delta& d : Script()) CHECK(whole.OnDelta(d).empty());
  std::string body = whole.Finish(result, ResponseStats{});
  std::string streamed = done.substr(done.find("\"response\":") + 11);
  streamed.pop_back();
  CHECK(body == streamed);
  simdjson::dom::element r;
  REQUIRE(parser.parse(body).get(r) == simdjson::SUCCESS);
  CHECK(r["output"].get_array().size() == 4);
  CHECK(std::string(r["output"].at(0)["content"].at(0)["text"].get_string().value()) ==
        "Think \xE4\xB8\x96 more");
  CHECK(std::string(r["output"].at(1)["content"].at(0)["text"].get_string().value()) == "Calling.");
}

TEST_CASE(
    "a cut answer is response.incomplete; an engine error is response.failed; progress on "
    "request") {
  ResponseEvents cut(Meta(), true);
  std::string sse = cut.Begin();
  engine::Delta d;
  d.content = "partial";
  sse += cut.OnDelta(d);
  engine::GenerateResult result;
  result.finish = engine::FinishReason::kLength;
  sse += cut.Finish(result, ResponseStats{});
  auto events = Events(sse);
  CHECK(events.back().first == "response.incomplete");
  CHECK(events.back().second.find(R"("incomplete_details":{"reason":"max_output_tokens"})") !=
        std::string::npos);

  ResponseEvents failed(Meta(), true);
  std::string f = failed.Begin();
  f += failed.Error(MakeApiError(500, "server_error", "disk gone", "io"));
  CHECK(Events(f).back().first == "response.failed");
  CHECK(f.find(R"("error":{"code":"io","message":"disk gone"})") != std::string::npos);
  CHECK(failed.Finish(result, ResponseStats{}).empty());

  ResponseObjectMeta m = Meta();
  m.return_progress = true;
  ResponseEvents progress(m, true);
  engine::PrefillProgress p{};
  p.prompt_tokens = 100;
  p.total = 100;
  p.done = 40;
  p.elapsed_s = 2;
  p.eta_s = 3;
  std::string pe = progress.Begin();
  pe += progress.Progress(p);
  auto pev = Events(pe);
  CHECK(pev.back().first == "response.in_progress");
  CHECK(
      pev.back().second.find(
          R"("prompt_progress":{"total":100,"cache":0,"processed":40,"time_ms":2000,"eta_ms":3000)") !=
      std::string::npos);
  ResponseEvents plain(Meta(), true);
  plain.Begin();
  CHECK(Events(plain.Progress(p)).back().first == "keepalive");
}

}  // namespace
}  // namespace k3::server
