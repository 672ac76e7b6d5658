// Request validation against the rules Moonshot's Kimi-Vendor-Verifier checks
// (the request bodies below are the verifier's own, tests/k3_features and
// tests/params) and the prompt path shared with `k3-run render`.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "k3/server/api.h"
#include "k3/tokenizer/chat.h"

namespace k3::server {
namespace {

const char* kWeather =
    R"({"type":"function","function":{"name":"get_weather","description":"Get the weather of a city.",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}})";

std::string Fn(const std::string& name) {
  return R"({"type":"function","function":{"name":")" + name +
         R"(","description":"A tool.","parameters":{"type":"object","properties":{}}}})";
}

std::string Body(const std::string& extra, const std::string& messages = R"([{"role":"user","content":"hello"}])") {
  return R"({"model":"k3-tiny","messages":)" + messages + (extra.empty() ? "" : "," + extra) + "}";
}

int StatusOf(const std::string& body, const ApiPolicy& policy = {}) {
  try {
    ParseChatRequestOrThrow(body, policy);
    return 200;
  } catch (const Error& e) {
    return ApiErrorFor(e).status;
  }
}

TEST_CASE("KVV request-validation cases are each exactly 400") {
  std::string sys_tools = R"([{"role":"system","content":"","tools":)";
  std::vector<std::pair<const char*, std::string>> cases = {
      {"dynamic tool in user message",
       Body("", std::string(R"([{"role":"user","content":"hi","tools":[)") + kWeather +
                    R"(]},{"role":"user","content":"q"}])")},
      {"dynamic tool in assistant message",
       Body("", std::string(R"([{"role":"user","content":"hi"},{"role":"assistant","content":"hello","tools":[)") +
                    kWeather + R"(]},{"role":"user","content":"q"}])")},
      {"content and dynamic tools",
       Body("", std::string(R"([{"role":"system","content":"not empty","tools":[)") + kWeather +
                    R"(]},{"role":"user","content":"hello"}])")},
      {"missing type", Body("", sys_tools + R"([{"function":{"name":"good_tool","parameters":{}}}]},{"role":"user","content":"h"}])")},
      {"missing function", Body("", sys_tools + R"([{"type":"function"}]},{"role":"user","content":"h"}])")},
      {"missing name", Body("", sys_tools + R"([{"type":"function","function":{"parameters":{}}}]},{"role":"user","content":"h"}])")},
      {"name starts with a digit", Body("", sys_tools + "[" + Fn("1bad_name") + R"(]},{"role":"user","content":"h"}])")},
      {"name with @", Body("", sys_tools + "[" + Fn("bad@name") + R"(]},{"role":"user","content":"h"}])")},
      {"empty name", Body("", sys_tools + "[" + Fn("") + R"(]},{"role":"user","content":"h"}])")},
      {"257-character name", Body("", sys_tools + "[" + Fn(std::string(257, 'a')) + R"(]},{"role":"user","content":"h"}])")},
      {"bogus tool type", Body("", sys_tools + R"([{"type":"bogus","function":{"name":"x"}}]},{"role":"user","content":"h"}])")},
      {"valid and bogus tools", Body("", sys_tools + "[" + Fn("good_tool") + R"(,{"type":"bogus","function":{"name":"x"}}]},{"role":"user","content":"h"}])")},
      {"tools not an array", Body("", sys_tools + R"({"type":"function"}},{"role":"user","content":"h"}])")},
      {"tools item not an object", Body("", sys_tools + R"([null]},{"role":"user","content":"h"}])")},
      {"duplicate dynamic names", Body("", sys_tools + "[" + Fn("dup") + "," + Fn("dup") + R"(]},{"role":"user","content":"h"}])")},
      {"duplicate across dynamic messages",
       Body("", sys_tools + "[" + Fn("dup") + R"(]},{"role":"system","content":"","tools":[)" + Fn("dup") +
                    R"(]},{"role":"user","content":"h"}])")},
      {"duplicate global and dynamic",
       Body("\"tools\":[" + Fn("dup") + "]", sys_tools + "[" + Fn("dup") + R"(]},{"role":"user","content":"h"}])")},
      {"tool message without tool_call_id",
       Body("", R"([{"role":"tool","content":"some tool result"},{"role":"user","content":"hello"}])")},
      {"tool_choice required without tools", Body(R"("tool_choice":"required")")},
      {"tool_choice required with empty tools", Body(R"("tools":[],"tool_choice":"required")")},
      {"tool_choice invalid", Body(std::string(R"("tools":[)") + kWeather + R"(],"tool_choice":"bogus")")},
      // The named form is honoured, but only for a declared tool.
      {"tool_choice named function not declared",
       Body(std::string(R"("tools":[)") + kWeather + R"(],"tool_choice":{"type":"function","function":{"name":"get_time"}})")},
      {"tool_choice named function without tools",
       Body(R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})")},
      {"response_format bogus", Body(R"("response_format":{"type":"bogus"})")},
      {"json_schema without name", Body(R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}})")},
      {"json_schema without schema", Body(R"("response_format":{"type":"json_schema","json_schema":{"name":"weather"}})")},
      {"json_schema missing", Body(R"("response_format":{"type":"json_schema"})")},
      {"strict not boolean",
       Body(R"("response_format":{"type":"json_schema","json_schema":{"name":"weather","strict":"yes","schema":{"type":"object"}}})")},
      {"schema not an object", Body(R"("response_format":{"type":"json_schema","json_schema":{"name":"weather","schema":"x"}})")},
      // tests/params: wrong values of the locked parameters.
      {"temperature 1.1", Body(R"("temperature":1.1)")},
      {"temperature 2.0", Body(R"("temperature":2.0)")},
      {"temperature -0.1", Body(R"("temperature":-0.1)")},
      {"top_p 0.8", Body(R"("top_p":0.8)")},
      {"presence_penalty 0.5", Body(R"("presence_penalty":0.5)")},
      {"frequency_penalty 0.5", Body(R"("frequency_penalty":0.5)")},
      {"n 2", Body(R"("n":2)")},
      // Shapes and types.
      {"not JSON", "{\"messages\": ["},
      {"not an object", "[1,2]"},
      {"no messages", R"({"model":"x"})"},
      {"empty messages", Body("", "[]")},
      {"unknown role", Body("", R"([{"role":"wizard","content":"x"}])")},
      {"content a number", Body("", R"([{"role":"user","content":5}])")},
      {"image part", Body("", R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])")},
      {"max_tokens 0", Body(R"("max_tokens":0)")},
      {"max_tokens string", Body(R"("max_tokens":"5")")},
      {"stop not strings", Body(R"("stop":[1])")},
      {"five stops", Body(R"("stop":["a","b","c","d","e"])")},
      {"stream not boolean", Body(R"("stream":"yes")")},
      {"thinking type bogus", Body(R"("thinking":{"type":"sometimes"})")},
      {"reasoning_effort medium", Body(R"("reasoning_effort":"medium")")},
      {"seed a string", Body(R"("seed":"1")")},
      {"deep nesting", Body("\"x\":" + std::string(100, '[') + std::string(100, ']'))},
      {"invalid UTF-8", std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}")},
  };
  for (auto& [name, body] : cases) {
    CAPTURE(name);
    CHECK(StatusOf(body) == 400);
  }
}

TEST_CASE("KVV accepted cases pass, and locked values follow --sampling free") {
  for (const char* extra : {"", R"("temperature":0.6)", R"("temperature":0.0)", R"("temperature":1.0)",
                            R"("top_p":0.95)", R"("presence_penalty":0)", R"("frequency_penalty":0)", R"("n":1)",
                            R"("thinking":{"type":"disabled"})", R"("thinking":{"type":"enabled","keep":"all"})",
                            R"("chat_template_kwargs":{"thinking":false})", R"("tool_choice":"none")",
                            R"("tool_choice":"auto")", R"("response_format":{"type":"json_object"})",
                            R"("stop":"\n\n","seed":-3,"max_completion_tokens":9,"stream":true)",
                            R"("temperature":null,"top_p":null,"n":null,"stream_options":{"include_usage":true})"}) {
    CAPTURE(extra);
    CHECK(StatusOf(Body(extra)) == 200);
  }
  // Dynamic tools on a system message, and tool_choice required with only them.
  std::string dyn = std::string(R"([{"role":"system","content":"","tools":[)") + kWeather +
                    R"(]},{"role":"user","content":"weather?"}])";
  CHECK(StatusOf(Body(R"("tool_choice":"required")", dyn)) == 200);
  // Malformed tool-call arguments in history are rendered as they are.
  CHECK(StatusOf(Body("", R"([{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[)"
                          R"({"id":"c1","type":"function","function":{"name":"f","arguments":"{not json"}}]},)"
                          R"({"role":"tool","tool_call_id":"c1","content":"r"}])")) == 200);
  ApiPolicy free;
  free.sampling_free = true;
  CHECK(StatusOf(Body(R"("temperature":0.3,"top_p":0.5)"), free) == 200);
  CHECK(StatusOf(Body(R"("temperature":2.5)"), free) == 400);       // still out of range
  CHECK(StatusOf(Body(R"("presence_penalty":0.5)"), free) == 400);  // not implemented at all
  try {
    ParseChatRequestOrThrow(Body(R"("temperature":1.1)"), {});
    FAIL("accepted");
  } catch (const Error& e) {
    ApiError api = ApiErrorFor(e);
    CHECK(api.param == "temperature");
    CHECK(api.message.find("--sampling free") != std::string::npos);
    CHECK(api.Json().rfind("{\"error\":{\"message\":", 0) == 0);
  }
}

TEST_CASE("a body over the cap is 413") {
  ApiPolicy p;
  p.max_body_bytes = 100;
  CHECK(StatusOf(Body("\"pad\":\"" + std::string(200, 'x') + "\""), p) == 413);
}

TEST_CASE("thinking controls resolve in the verifier's precedence") {
  auto resolved = [](const std::string& extra) {
    ChatRequest r = ParseChatRequestOrThrow(Body(extra), {});
    return std::make_pair(r.thinking, r.effort.value_or("-"));
  };
  CHECK(resolved("") == std::make_pair(true, std::string("max")));
  CHECK(resolved(R"("thinking":{"type":"enabled","effort":"low"})") == std::make_pair(true, std::string("low")));
  // thinking.effort wins; reasoning_effort only when it is absent (KVV).
  CHECK(resolved(R"("thinking":{"effort":"low"},"reasoning_effort":"max")") ==
        std::make_pair(true, std::string("low")));
  CHECK(resolved(R"("thinking":{"type":"enabled"},"reasoning_effort":"low")") ==
        std::make_pair(true, std::string("low")));
  CHECK(resolved(R"("chat_template_kwargs":{"thinking_effort":"high"},"reasoning_effort":"low")") ==
        std::make_pair(true, std::string("low")));
  CHECK(resolved(R"("thinking":{"type":"disabled","effort":"low"})") == std::make_pair(false, std::string("-")));
  CHECK(resolved(R"("chat_template_kwargs":{"thinking":false})") == std::make_pair(false, std::string("-")));
  CHECK(resolved(R"("chat_template_kwargs":{"thinking":false},"thinking":{"type":"enabled"})") ==
        std::make_pair(true, std::string("max")));
  CHECK(resolved(R"("reasoning_effort":"high")") == std::make_pair(true, std::string("high")));
}

TEST_CASE("max_tokens: max_completion_tokens wins, else the operator's default") {
  ApiPolicy p;
  p.default_max_tokens = 77;
  CHECK(ParseChatRequestOrThrow(Body(""), p).max_tokens == 77);
  CHECK(ParseChatRequestOrThrow(Body(R"("max_tokens":5)"), p).max_tokens == 5);
  CHECK(ParseChatRequestOrThrow(Body(R"("max_tokens":5,"max_completion_tokens":6)"), p).max_tokens == 6);
}

TEST_CASE("max_tokens: with no operator cap, a request that sets none runs to the context limit") {
  // Codex and other agents set no cap; OpenAI, llama-server and vLLM then
  // stop only at the end of the answer or of the context (0 to the engine).
  const ApiPolicy p;
  CHECK(p.default_max_tokens == 0);
  const ChatRequest r = ParseChatRequestOrThrow(Body(""), p);
  CHECK(r.max_tokens == 0);
  CHECK_FALSE(r.max_tokens_from_request);
  CHECK(ParseChatRequestOrThrow(Body(R"("max_tokens":700)"), p).max_tokens == 700);
}

TEST_CASE("the prompt is rendered exactly as the renderer renders the equivalent request") {
  // The renderer's own request form (what `k3-run render --request` reads)
  // against the OpenAI form the server takes, for a conversation with tools,
  // history reasoning, a tool result and thinking settings.
  std::string messages =
      R"([{"role":"system","content":"You are terse."},{"role":"user","content":[{"type":"text","text":"weather?"}]},)"
      R"({"role":"assistant","content":"","reasoning_content":"call it","tool_calls":[{"id":"c1","type":"function",)"
      R"("function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"t\": 1.0}"}}]},)"
      R"({"role":"tool","tool_call_id":"c1","content":"sunny"}])";
  std::string tools = std::string("[") + kWeather + "]";
  struct Case {
    std::string server_extra, render_options;
  } cases[] = {
      {R"("thinking":{"type":"enabled","effort":"low"})", R"("thinking":true,"thinking_effort":"low")"},
      {R"("thinking":{"type":"disabled"})", R"("thinking":false)"},
      {R"("reasoning_effort":"high","response_format":{"type":"json_object"})",
       R"("thinking":true,"thinking_effort":"high","response_format":{"type":"json_object"})"},
      {R"("chat_template_kwargs":{"thinking":false},"tool_choice":"required")",
       R"("thinking":false,"tool_choice":"required")"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.server_extra);
    ChatRequest r = ParseChatRequestOrThrow(Body("\"tools\":" + tools + "," + c.server_extra, messages), {});
    tok::RenderedChat direct = tok::RenderChatRequestOrThrow(
        R"({"messages":)" + messages + R"(,"options":{"tools":)" + tools + "," + c.render_options + "}}");
    CHECK(r.chat.segments == direct.segments);
    // render_json itself is a request `k3-run render` accepts, with the same result.
    CHECK(tok::RenderChatRequestOrThrow(r.render_json).segments == direct.segments);
  }
}

std::string ParamOf(const std::string& body) {
  try {
    ParseChatRequestOrThrow(body, {});
    return "(accepted)";
  } catch (const Error& e) {
    ApiError api = ApiErrorFor(e);
    return api.status == 400 ? api.param + " | " + api.message : "(status " + std::to_string(api.status) + ")";
  }
}

TEST_CASE("ignore_eos: a boolean, off by default, refused where structured output decides the end") {
  CHECK_FALSE(ParseChatRequestOrThrow(Body(""), {}).ignore_eos);
  CHECK(ParseChatRequestOrThrow(Body(R"("ignore_eos":true)"), {}).ignore_eos);
  CHECK_FALSE(ParseChatRequestOrThrow(Body(R"("ignore_eos":false)"), {}).ignore_eos);
  CHECK(ParamOf(Body(R"("ignore_eos":1)")).rfind("ignore_eos | ", 0) == 0);
  // Declared tools leave the answer free but a call is constrained once open;
  // the structured decoder ends it, so the two do not mix.
  CHECK(ParamOf(Body(std::string(R"("ignore_eos":true,"tools":[)") + kWeather + "]")).rfind("ignore_eos | ", 0) == 0);
  CHECK(ParamOf(Body(R"("ignore_eos":true,"response_format":{"type":"json_object"})")).rfind("ignore_eos | ", 0) == 0);
  // The prompt does not change: the field is not rendered.
  CHECK(ParseChatRequestOrThrow(Body(R"("ignore_eos":true)"), {}).chat.segments ==
        ParseChatRequestOrThrow(Body(""), {}).chat.segments);
}

TEST_CASE("structured output: the request's tools, tool_choice and response_format are filled and compiled") {
  std::string tools = std::string(R"("tools":[)") + kWeather + "," + Fn("noop") + "]";
  ChatRequest r = ParseChatRequestOrThrow(Body(tools + R"(,"tool_choice":{"type":"function","function":{"name":"noop"}})"), {});
  REQUIRE(r.tools.size() == 2);
  CHECK(r.tools[0].name == "get_weather");
  CHECK(r.tools[0].parameters_json == R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
  CHECK(r.tools[0].param == "tools[0].function.parameters");
  CHECK(r.tool_choice == ToolChoice::kNamed);
  CHECK(r.tool_choice_name == "noop");
  REQUIRE(r.structured != nullptr);
  // The encoder renders no tool_choice message for the named form (oracle case
  // tool_choice_function_object): the prompt is the one of tool_choice auto.
  CHECK(r.chat.segments == ParseChatRequestOrThrow(Body(tools), {}).chat.segments);

  ChatRequest j = ParseChatRequestOrThrow(
      Body(R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"integer"}}}}})"),
      {});
  CHECK(j.response_format == ResponseFormat::kJsonSchema);
  CHECK(j.response_schema_json == R"({"type":"object","properties":{"a":{"type":"integer"}}})");
  CHECK(j.structured != nullptr);
  CHECK(ParseChatRequestOrThrow(Body(R"("response_format":{"type":"json_object"})"), {}).response_format ==
        ResponseFormat::kJsonObject);
  CHECK(ParseChatRequestOrThrow(Body(""), {}).structured == nullptr);  // nothing to enforce
  CHECK(ParseChatRequestOrThrow(Body(R"("tool_choice":"required",)" + tools), {}).tool_choice == ToolChoice::kRequired);
  // Dynamic tools keep their own path.
  std::string dyn =
      std::string(R"([{"role":"system","content":"","tools":[)") +
      R"({"type":"function","function":{"name":"z","strict":true,"parameters":{"type":"string","pattern":"a+"}}})" +
      R"(]},{"role":"user","content":"weather?"}])";
  CHECK(ParamOf(Body("", dyn)).rfind("messages[0].tools[0].function.parameters | ", 0) == 0);
}

TEST_CASE(
    "structured output: a strict schema k3 cannot enforce is a 400 naming the parameter and the "
    "keyword") {
  auto tool = [](const std::string& schema, bool strict = true) {
    return Body(std::string(R"("tools":[{"type":"function","function":{"name":"f",)") +
                (strict ? R"("strict":true,)" : "") + R"("parameters":)" + schema + "}}]");
  };
  auto rf = [](const std::string& schema, bool strict = true) {
    return Body(
        std::string(R"("response_format":{"type":"json_schema","json_schema":{"name":"x",)") +
        (strict ? R"("strict":true,)" : "") + R"("schema":)" + schema + "}}");
  };
  struct Case {
    std::string body, param, keyword;
  } cases[] = {
      {tool(R"({"type":"object","properties":{"zip":{"type":"string","pattern":"^(?=[0-9])x$"}}})"),
       "tools[0].function.parameters", "'pattern'"},
      {tool(R"({"type":"object","not":{"required":["a"]}})"), "tools[0].function.parameters",
       "'not'"},
      {rf(R"({"type":"number","multipleOf":0.1})"), "response_format.json_schema.schema",
       "'multipleOf'"},
      {rf(R"({"type":"array","contains":{"type":"string"}})"), "response_format.json_schema.schema",
       "'contains'"},
      {rf(R"({"type":"string","minLength":5,"maxLength":2})"), "response_format.json_schema.schema",
       ""},
  };
  for (const Case& c : cases) {
    CAPTURE(c.body);
    std::string got = ParamOf(c.body);
    CAPTURE(got);
    CHECK(got.rfind(c.param + " | " + c.param + ": ", 0) == 0);
    CHECK(got.find(c.keyword) != std::string::npos);
  }
  // Not strict (the default of both): never refused for the schema; what the
  // subset cannot enforce is relaxed to a superset (docs/constrain.md).
  for (
      const std::string& body :
      {tool(R"({"type":"object","properties":{"zip":{"type":"string","pattern":"^(?=[0-9])x$"}}})",
            false),
       tool(R"({"type":"object","not":{"required":["a"]}})", false),
       tool(R"({"type":"string"})", false),
       tool(R"({"type":"object","properties":{"a":{"type":"strin"}}})", false),
       rf(R"({"type":"number","multipleOf":0.1})", false),
       rf(R"({"type":"string","minLength":5,"maxLength":2})", false),
       Body(
           R"("response_format":{"type":"json_schema","json_schema":{"name":"x","strict":false,"schema":{"not":{}}}})")}) {
    CAPTURE(body);
    ChatRequest r = ParseChatRequestOrThrow(body, {});
    CHECK(r.structured != nullptr);
  }
  // Real schemas are enforced even when strict.
  for (
      const std::string& body :
      {tool(
           R"({"type":"object","properties":{"n":{"oneOf":[{"type":"string","enum":["all"]},{"type":"string","pattern":"^[1-9][0-9]*$"}]}}})"),
       tool(R"({"type":"object","allOf":[{"properties":{"a":{"type":"string"}}}]})"),
       rf(R"({"type":"array","prefixItems":[{"type":"string"}],"items":false})"),
       rf(R"({"type":"integer","multipleOf":3})")}) {
    CAPTURE(body);
    CHECK(ParseChatRequestOrThrow(body, {}).structured != nullptr);
  }
}

}  // namespace
}  // namespace k3::server
