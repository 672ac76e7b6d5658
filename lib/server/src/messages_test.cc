// The Messages request parser and mapper: each Messages request renders to
// exactly the segments (so the ids) of its chat.completions twin, written
// here by hand as an OpenAI client would send it and parsed by the OpenAI
// route's parser; tool_choice and tools fill the structured-output contract;
// every refusal names the Anthropic field; Service routes Messages requests
// with Anthropic's errors (401 via x-api-key, 400, 529 when the queue is full).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "k3/engine/engine.h"
#include "k3/server/messages.h"
#include "k3/server/dialect.h"
#include "k3/server/server.h"

namespace k3::server {
namespace {

const char* kWeatherSchema = R"({"type":"object","properties":{"city":{"type":"string","maxLength":1.0e2}},"required":["city"]})";

std::string AnthropicTools() {
  return std::string(R"([{"name":"get_weather","description":"Get the weather.","input_schema":)") + kWeatherSchema +
         R"(,"cache_control":{"type":"ephemeral"}},{"name":"get_time","input_schema":{"type":"object"}}])";
}
std::string OpenAITools() {
  return std::string(R"([{"type":"function","function":{"name":"get_weather","description":"Get the weather.","parameters":)") +
         kWeatherSchema + R"(}},{"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}])";
}

void CheckSameRender(const std::string& messages_body, const std::string& openai_body) {
  MessagesRequest m = ParseMessagesRequestOrThrow(messages_body, ApiPolicy{});
  ChatRequest o = ParseChatRequestOrThrow(openai_body, ApiPolicy{});
  CHECK(m.request.chat.segments == o.chat.segments);
  CHECK(m.request.thinking == o.thinking);
  CHECK(m.request.effort == o.effort);
  CHECK(m.request.max_tokens == o.max_tokens);
}

// The ErrorCode and field a refused body names.
std::pair<ErrorCode, std::string> Refusal(const std::string& body) {
  try {
    ParseMessagesRequestOrThrow(body, ApiPolicy{});
  } catch (const Error& e) {
    return {e.code(), e.object()};
  }
  return {ErrorCode::kOk, "accepted"};
}

std::string Msgs(const std::string& messages, const std::string& extra = "") {
  return R"({"model":"k3","max_tokens":64,"messages":)" + messages + (extra.empty() ? "" : "," + extra) + "}";
}

TEST_CASE("a plain request renders as its OpenAI twin: system blocks, user text, thinking off by default") {
  CheckSameRender(
      R"({"model":"k3","max_tokens":32,"system":[{"type":"text","text":"You are terse.","cache_control":{"type":"ephemeral"}}],)"
      R"("messages":[{"role":"user","content":"Hello"},{"role":"assistant","content":"Hi."},)"
      R"({"role":"user","content":[{"type":"text","text":"Part one."},{"type":"text","text":"Part two."}]}]})",
      R"({"model":"k3","max_tokens":32,"thinking":{"type":"disabled"},"messages":[)"
      R"({"role":"system","content":[{"type":"text","text":"You are terse."}]},{"role":"user","content":"Hello"},)"
      R"({"role":"assistant","content":"Hi."},)"
      R"({"role":"user","content":[{"type":"text","text":"Part one."},{"type":"text","text":"Part two."}]}]})");
  // A string system prompt and thinking enabled.
  CheckSameRender(
      R"({"model":"k3","max_tokens":2048,"system":"Be brief.","thinking":{"type":"enabled","budget_tokens":1024},)"
      R"("messages":[{"role":"user","content":"Hello"}]})",
      R"({"model":"k3","max_tokens":2048,"messages":[{"role":"system","content":"Be brief."},)"
      R"({"role":"user","content":"Hello"}]})");
}

TEST_CASE("system messages inside messages render where they stand (Claude Code's placement)") {
  // Moonshot's encoder renders a later system message as a plain system
  // message at its place (oracle chat case system_last_before_generation).
  CheckSameRender(
      R"({"model":"k3","max_tokens":32,"system":"Top.","messages":[{"role":"user","content":"Hi"},)"
      R"({"role":"system","content":[{"type":"text","text":"Reminder: be brief."}]},{"role":"assistant","content":"Ok."},)"
      R"({"role":"system","content":"Now answer."},{"role":"user","content":"Go"}]})",
      R"({"model":"k3","max_tokens":32,"thinking":{"type":"disabled"},"messages":[{"role":"system","content":"Top."},)"
      R"({"role":"user","content":"Hi"},{"role":"system","content":[{"type":"text","text":"Reminder: be brief."}]},)"
      R"({"role":"assistant","content":"Ok."},{"role":"system","content":"Now answer."},{"role":"user","content":"Go"}]})");
  MessagesRequest omitted = ParseMessagesRequestOrThrow(
      R"({"model":"k3","max_tokens":2048,"thinking":{"type":"enabled","budget_tokens":1024,"display":"omitted"},)"
      R"("messages":[{"role":"user","content":"Hi"}]})",
      ApiPolicy{});
  CHECK(omitted.thinking_omitted);
  CHECK(omitted.request.thinking);
}

TEST_CASE("a tool conversation renders as its OpenAI twin: thinking, tool_use, tool_result in order") {
  std::string messages =
      R"([{"role":"user","content":"Weather in Paris and the time?"},)"
      R"({"role":"assistant","content":[{"type":"thinking","thinking":"Two tools.","signature":"sig"},)"
      R"({"type":"text","text":"Checking."},)"
      R"({"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris","days":2.50}},)"
      R"({"type":"tool_use","id":"toolu_2","name":"get_time","input":{}}]},)"
      R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_2","content":"12:00"},)"
      R"({"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"Sunny"}]},)"
      R"({"type":"text","text":"Thanks!"}]}])";
  std::string twin =
      R"([{"role":"user","content":"Weather in Paris and the time?"},)"
      R"({"role":"assistant","content":[{"type":"text","text":"Checking."}],"reasoning_content":"Two tools.",)"
      R"("tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":2.50}"}},)"
      R"({"id":"toolu_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},)"
      R"({"role":"tool","tool_call_id":"toolu_2","content":"12:00"},)"
      R"({"role":"tool","tool_call_id":"toolu_1","content":[{"type":"text","text":"Sunny"}]},)"
      R"({"role":"user","content":[{"type":"text","text":"Thanks!"}]}])";
  for (const char* thinking : {R"({"type":"enabled","budget_tokens":4096})", R"({"type":"disabled"})"}) {
    CAPTURE(thinking);
    CheckSameRender(R"({"model":"k3","max_tokens":64,"thinking":)" + std::string(thinking) +
                        R"(,"tools":)" + AnthropicTools() + R"(,"messages":)" + messages + "}",
                    R"({"model":"k3","max_tokens":64,"thinking":)" + std::string(thinking) + R"(,"tools":)" +
                        OpenAITools() + R"(,"messages":)" + twin + "}");
  }
}

TEST_CASE("tool_choice maps to the structured-output contract, as the OpenAI twin's does") {
  std::string user = R"([{"role":"user","content":"hi"}])";
  using Calls = engine::StructuredOutput::Calls;
  struct Case {
    const char* anthropic;
    ToolChoice choice;
    const char* openai;  // the twin's tool_choice
    Calls calls;
  };
  for (const Case& c : {Case{R"({"type":"auto"})", ToolChoice::kAuto, R"("auto")", Calls::kAuto},
                        Case{R"({"type":"any"})", ToolChoice::kRequired, R"("required")", Calls::kRequired},
                        Case{R"({"type":"tool","name":"get_time"})", ToolChoice::kNamed,
                             R"({"type":"function","function":{"name":"get_time"}})", Calls::kRequired},
                        Case{R"({"type":"none"})", ToolChoice::kNone, R"("none")", Calls::kNone}}) {
    CAPTURE(c.anthropic);
    std::string body = Msgs(user, R"("tools":)" + AnthropicTools() + R"(,"tool_choice":)" + c.anthropic);
    MessagesRequest m = ParseMessagesRequestOrThrow(body, ApiPolicy{});
    ChatRequest twin = ParseChatRequestOrThrow(
        R"({"model":"k3","max_tokens":64,"thinking":{"type":"disabled"},"messages":)" + user + R"(,"tools":)" +
            OpenAITools() + R"(,"tool_choice":)" + c.openai + "}",
        ApiPolicy{});
    CHECK(m.request.chat.segments == twin.chat.segments);
    CHECK(m.request.tool_choice == c.choice);
    CHECK(m.request.tool_choice_name == (c.choice == ToolChoice::kNamed ? "get_time" : ""));
    CHECK(m.request.has_tools);
    REQUIRE(m.request.tools.size() == 2);
    for (size_t i = 0; i < 2; ++i) {
      CHECK(m.request.tools[i].name == twin.tools[i].name);
      CHECK(m.request.tools[i].parameters_json == twin.tools[i].parameters_json);
    }
    CHECK(m.request.tools[0].name == "get_weather");
    // The compiled constraint the engine enforces.
    REQUIRE(m.request.structured);
    CHECK(m.request.structured->calls == c.calls);
    CHECK(m.request.structured->only_tool == (c.choice == ToolChoice::kNamed ? "get_time" : ""));
    CHECK(m.request.structured->tools.size() == 2);
  }
  MessagesRequest par = ParseMessagesRequestOrThrow(
      Msgs(user, R"("tools":)" + AnthropicTools() + R"(,"tool_choice":{"type":"auto","disable_parallel_tool_use":true})"),
      ApiPolicy{});
  CHECK(par.disable_parallel_tool_use);
  CHECK_FALSE(ParseMessagesRequestOrThrow(Msgs(user), ApiPolicy{}).request.structured);
}

TEST_CASE("stop_sequences, sampling, stream and count_tokens") {
  std::string user = R"([{"role":"user","content":"hi"}])";
  MessagesRequest m = ParseMessagesRequestOrThrow(
      Msgs(user, R"("stop_sequences":["\n\nHuman:","END"],"temperature":0.6,"top_p":0.95,"stream":true,)"
                 R"("metadata":{"user_id":"u1"})"),
      ApiPolicy{});
  CHECK(m.request.stop == std::vector<std::string>{"\n\nHuman:", "END"});
  CHECK(m.request.temperature == doctest::Approx(0.6));
  CHECK(m.request.top_p == doctest::Approx(0.95));
  CHECK(m.request.stream);
  CHECK(m.request.max_tokens == 64);
  // count_tokens bodies have no max_tokens; the prompt is the same.
  MessagesRequest count = ParseMessagesRequestOrThrow(R"({"model":"k3","messages":)" + user + "}", ApiPolicy{},
                                                      MessagesCall::kCountTokens);
  CHECK(count.request.chat.segments == ParseMessagesRequestOrThrow(Msgs(user), ApiPolicy{}).request.chat.segments);
  // The OpenAI route's sampling lock applies (a free server allows the value).
  CHECK(Refusal(Msgs(user, R"("temperature":0.3)")) == std::pair{ErrorCode::kInvalidArgument, std::string("temperature")});
  ApiPolicy free;
  free.sampling_free = true;
  CHECK(ParseMessagesRequestOrThrow(Msgs(user, R"("temperature":0.3)"), free).request.temperature ==
        doctest::Approx(0.3));
}

TEST_CASE("refusals name the Anthropic field; unsupported content is kUnsupported") {
  std::string user = R"([{"role":"user","content":"hi"}])";
  using P = std::pair<ErrorCode, std::string>;
  const ErrorCode bad = ErrorCode::kInvalidArgument, unsup = ErrorCode::kUnsupported;
  CHECK(Refusal(R"({"model":"k3","messages":)" + user + "}") == P{bad, "max_tokens"});
  CHECK(Refusal(R"({"max_tokens":5,"messages":)" + user + "}") == P{bad, "model"});
  CHECK(Refusal(R"({"model":"k3","max_tokens":0,"messages":)" + user + "}") == P{bad, "max_tokens"});
  CHECK(Refusal(R"({"model":"k3","max_tokens":"5","messages":)" + user + "}") == P{bad, "max_tokens"});
  CHECK(Refusal(Msgs("[]")) == P{bad, "messages"});
  CHECK(Refusal(Msgs(R"([{"role":"tool","content":"x"}])")) == P{bad, "messages[0].role"});
  CHECK(
      Refusal(
          R"({"model":"k3","max_tokens":9,"thinking":{"type":"adaptive","display":"full"},"messages":)" +
          user + "}") == P{bad, "thinking.display"});
  CHECK(Refusal(Msgs(R"([{"role":"user"}])")) == P{bad, "messages[0].content"});
  CHECK(Refusal(Msgs(R"([{"role":"user","content":[{"type":"text"}]}])")) == P{bad, "messages[0].content[0].text"});
  CHECK(Refusal(Msgs(R"([{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}])")) ==
        P{unsup, "messages[0].content[0].type"});
  CHECK(Refusal(Msgs(R"([{"role":"user","content":[{"type":"document","source":{}}]}])")) ==
        P{unsup, "messages[0].content[0].type"});
  CHECK(Refusal(Msgs(R"([{"role":"user","content":[{"type":"bogus"}]}])")) == P{bad, "messages[0].content[0].type"});
  CHECK(Refusal(Msgs(R"([{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_x","content":"?"}]}])")) ==
        P{bad, "messages[0].content[0].tool_use_id"});
  CHECK(Refusal(Msgs(R"([{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},)"
                     R"({"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"image","source":{}}]}]}])",
                     R"("tools":[{"name":"f","input_schema":{"type":"object"}}])")) ==
        P{unsup, "messages[2].content[0].content[0].type"});
  CHECK(Refusal(Msgs(R"([{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":"x"}]},{"role":"user","content":"z"}])")) ==
        P{bad, "messages[1].content[0].input"});
  CHECK(Refusal(Msgs(R"([{"role":"user","content":"q"},{"role":"assistant","content":"prefill"}])")) ==
        P{unsup, "messages[1]"});
  CHECK(Refusal(Msgs(user, R"("system":[{"type":"image"}])")) == P{unsup, "system[0].type"});
  CHECK(Refusal(Msgs(user, R"("tools":[{"type":"web_search_20250305","name":"web_search"}])")) == P{unsup, "tools[0].type"});
  CHECK(Refusal(Msgs(user, R"("tools":[{"name":"f"}])")) == P{bad, "tools[0].input_schema"});
  CHECK(Refusal(Msgs(user, R"("tools":[{"name":"f","input_schema":{"type":"string"}}])")) == P{bad, "tools[0].input_schema.type"});
  CHECK(Refusal(Msgs(user, R"("tools":[{"name":"bad name","input_schema":{"type":"object"}}])")) == P{bad, "tools[0].name"});
  CHECK(Refusal(Msgs(user, R"("tools":[{"name":"f","input_schema":{"type":"object"}},{"name":"f","input_schema":{"type":"object"}}])")) ==
        P{bad, "tools[1].name"});
  CHECK(Refusal(Msgs(user, R"("tool_choice":{"type":"any"})")) == P{bad, "tool_choice.type"});
  // A schema the decoder cannot enforce is refused by the twin's parser, named as the Messages field.
  auto unenforceable = Refusal(Msgs(
      user,
      R"("tools":[{"name":"f","strict":true,"input_schema":{"type":"object","patternProperties":{"^x":{}}}}])"));
  CHECK(unenforceable.second == "tools[0].input_schema");
  CHECK(unenforceable.first != ErrorCode::kOk);
  CHECK(Refusal(Msgs(user, R"("tool_choice":{"type":"sometimes"})")) == P{bad, "tool_choice.type"});
  CHECK(Refusal(Msgs(user, R"("tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"g"})")) ==
        P{bad, "tool_choice.name"});
  CHECK(Refusal(Msgs(user, R"("tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool"})")) ==
        P{bad, "tool_choice.name"});
  CHECK(Refusal(Msgs(user, R"("stop_sequences":"END")")) == P{bad, "stop_sequences"});
  CHECK(Refusal(Msgs(user, R"("stop_sequences":[""])")) == P{bad, "stop_sequences[0]"});
  CHECK(Refusal(Msgs(user, R"("stop_sequences":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])")) ==
        P{bad, "stop_sequences"});
  CHECK(Refusal(Msgs(user, R"("temperature":1.5)")) == P{bad, "temperature"});
  CHECK(Refusal(Msgs(user, R"("top_k":40)")) == P{unsup, "top_k"});
  CHECK(Refusal(Msgs(user, R"("thinking":{"type":"enabled"})")) == P{bad, "thinking.budget_tokens"});
  CHECK(Refusal(Msgs(user, R"("thinking":{"type":"enabled","budget_tokens":100})")) == P{bad, "thinking.budget_tokens"});
  CHECK(Refusal(Msgs(user, R"("thinking":{"type":"maybe"})")) == P{bad, "thinking.type"});
  CHECK(Refusal(Msgs(user, R"("stream":"yes")")) == P{bad, "stream"});
  CHECK(Refusal(Msgs(user, R"("metadata":"x")")) == P{bad, "metadata"});
  CHECK(Refusal("[1]") == P{bad, ""});
  CHECK(Refusal("{\"model\":") .first == bad);
  ApiPolicy tiny;
  tiny.max_body_bytes = 16;
  CHECK_THROWS_AS(ParseMessagesRequestOrThrow(Msgs(user), tiny), Error);
  // Accepted: redacted_thinking is left out; null fields are absent; unknown cache_control passes.
  CHECK(Refusal(Msgs(R"([{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"redacted_thinking","data":"xyz"},)"
                     R"({"type":"text","text":"a","cache_control":{"type":"ephemeral"}}]},{"role":"user","content":"z"}])",
                     R"("system":null,"tools":null,"stop_sequences":null)")) == P{ErrorCode::kOk, "accepted"});
}

TEST_CASE("Anthropic error types by status") {
  CHECK(AnthropicErrorType(400) == "invalid_request_error");
  CHECK(AnthropicErrorType(401) == "authentication_error");
  CHECK(AnthropicErrorType(404) == "not_found_error");
  CHECK(AnthropicErrorType(413) == "request_too_large");
  CHECK(AnthropicErrorType(429) == "rate_limit_error");
  CHECK(AnthropicErrorType(500) == "api_error");
  CHECK(AnthropicErrorType(529) == "overloaded_error");
  CHECK(AnthropicErrorJson(MakeApiError(400, "invalid_request_error", "bad \"x\"")) ==
        R"({"type":"error","error":{"type":"invalid_request_error","message":"bad \"x\""}})");
}

// A backend that answers every request with one thinking and one text delta,
// and can hold a request until released (to fill the queue).
class OneAnswer : public Backend {
 public:
  std::vector<int32_t> PromptIds(const tok::RenderedChat& chat) const override {
    return std::vector<int32_t>(chat.segments.size() + 1, 7);
  }
  int64_t context_limit() const override { return 1 << 16; }
  engine::SamplingParams default_sampling() const override { return {}; }
  model::ExpertStoreStats expert_stats() const override { return {}; }
  engine::GenerateResult Generate(const engine::GenerateRequest& req, const engine::Callbacks& cb) override {
    engine::GenerateResult r;
    r.usage.prompt_tokens = int64_t(req.prompt_ids.size());
    r.usage.cached_tokens = 2;
    engine::Delta d;
    d.reasoning = "think";
    d.content = "answer";
    r.usage.completion_tokens = 2;
    r.finish = cb.on_delta(d) ? engine::FinishReason::kStop : engine::FinishReason::kCancelled;
    return r;
  }
};

TEST_CASE("Service: Messages requests with Anthropic's errors, 529 when the queue is full, x-api-key") {
  ServerOptions o;
  o.queue = 0;
  o.api_key = "sk-test";
  o.heartbeat_ms = 5;
  Service s(o);
  OneAnswer b;
  s.SetBackend(&b);
  CHECK(s.Authorized("", "sk-test"));
  CHECK(s.Authorized("Bearer sk-test", ""));
  CHECK_FALSE(s.Authorized("", "sk-tes"));
  CHECK_FALSE(s.Authorized("sk-test", "Bearer sk-test"));
  HttpReply unauth = s.Unauthorized(kMessagesDialect);
  CHECK(unauth.status == 401);
  CHECK(unauth.body.find(R"("type":"authentication_error")") != std::string::npos);

  auto bad = s.Prepare(kMessagesDialect, R"({"model":"k3","messages":[]})");
  REQUIRE(std::holds_alternative<HttpReply>(bad));
  CHECK(std::get<HttpReply>(bad).status == 400);
  CHECK(std::get<HttpReply>(bad).body.rfind(R"({"type":"error","error":{"type":"invalid_request_error")", 0) == 0);

  std::string body = R"({"model":"k3","max_tokens":9,"thinking":{"type":"enabled","budget_tokens":2000},)"
                     R"("messages":[{"role":"user","content":"hi"}]})";
  auto first = s.Prepare(kMessagesDialect, body);
  REQUIRE(std::holds_alternative<std::unique_ptr<Service::Job>>(first));
  auto& job = std::get<std::unique_ptr<Service::Job>>(first);
  CHECK(job->meta.id.rfind("msg_", 0) == 0);
  // The running request holds the only place (queue 0 waits behind none).
  auto full = s.Prepare(kMessagesDialect, body);
  REQUIRE(std::holds_alternative<HttpReply>(full));
  CHECK(std::get<HttpReply>(full).status == 529);
  CHECK(std::get<HttpReply>(full).body.find("overloaded_error") != std::string::npos);
  std::string out;
  s.RunChat(*job, [&](std::string_view bytes) {
    out += bytes;
    return true;
  });
  size_t start = out.find("{\"id\":\"msg_");
  REQUIRE(start != std::string::npos);
  CHECK(out.substr(start).find(R"("content":[{"type":"thinking","thinking":"think","signature":"k3-)") != std::string::npos);
  CHECK(out.find(R"({"type":"text","text":"answer"}],"stop_reason":"end_turn","stop_sequence":null,)"
                 R"("usage":{"input_tokens":)") != std::string::npos);
  CHECK(out.find(R"("cache_read_input_tokens":2,"output_tokens":2})") != std::string::npos);
}

TEST_CASE("thinking.budget_tokens caps the think channel (the compiled spec carries it); none without thinking") {
  std::string user = R"([{"role":"user","content":"hi"}])";
  MessagesRequest capped = ParseMessagesRequestOrThrow(
      Msgs(user, R"("thinking":{"type":"enabled","budget_tokens":1500})"), ApiPolicy{});
  CHECK(capped.request.thinking);
  CHECK(capped.request.think_budget == 1500);
  REQUIRE(capped.request.structured);
  CHECK(capped.request.structured->think_budget == 1500);
  CHECK(capped.request.structured->active());
  CHECK(capped.request.structured->tools.empty());
  CHECK(capped.request.structured->calls == engine::StructuredOutput::Calls::kAuto);
  // With a forced call too: the same spec carries both.
  MessagesRequest both = ParseMessagesRequestOrThrow(
      Msgs(user, R"("thinking":{"type":"enabled","budget_tokens":1024},"tools":)" +
                     AnthropicTools() + R"(,"tool_choice":{"type":"any"})"),
      ApiPolicy{});
  REQUIRE(both.request.structured);
  CHECK(both.request.structured->think_budget == 1024);
  CHECK(both.request.structured->calls == engine::StructuredOutput::Calls::kRequired);
  CHECK(both.request.structured->tools.size() == 2);
  // Adaptive and disabled thinking: no cap, nothing to enforce.
  for (const char* t : {R"({"type":"adaptive"})", R"({"type":"disabled"})"}) {
    CAPTURE(t);
    MessagesRequest m = ParseMessagesRequestOrThrow(Msgs(user, std::string(R"("thinking":)") + t), ApiPolicy{});
    CHECK(m.request.think_budget == -1);
    CHECK(m.request.structured == nullptr);
  }
}

}  // namespace
}  // namespace k3::server
