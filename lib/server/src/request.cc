// Chat-completions request validation. Every rule cites where it comes from in
// docs/server.md; the K3-specific ones are Moonshot's Kimi-Vendor-Verifier
// (tests/k3_features, tests/params).
#include <simdjson.h>

#include <cmath>
#include <set>
#include <span>
#include <string>

#include "k3/core/json_writer.h"
#include "k3/server/api.h"
#include "request_body.h"

namespace k3::server {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// Copies out of simdjson_result so no range-for iterates a dead temporary.
simdjson::dom::array ArrayOf(element e) {
  simdjson::dom::array a;
  if (e.get_array().get(a) != simdjson::SUCCESS) return {};
  return a;
}

std::optional<element> Get(element obj, std::string_view key) {
  element v;
  if (obj[key].get(v) != simdjson::SUCCESS) return std::nullopt;
  return v;
}
// A field that is absent or null counts as absent (OpenAI clients send nulls).
std::optional<element> GetSet(element obj, std::string_view key) {
  auto v = Get(obj, key);
  if (v && v->is_null()) return std::nullopt;
  return v;
}

const char* TypeName(element v) {
  switch (v.type()) {
    case element_type::ARRAY: return "an array";
    case element_type::OBJECT: return "an object";
    case element_type::STRING: return "a string";
    case element_type::INT64:
    case element_type::UINT64:
    case element_type::DOUBLE: return "a number";
    case element_type::BOOL: return "a boolean";
    case element_type::NULL_VALUE: return "null";
  }
  return "?";
}

bool IsNumber(element v) {
  return v.type() == element_type::INT64 || v.type() == element_type::UINT64 || v.type() == element_type::DOUBLE;
}
double NumberOf(element v) {
  switch (v.type()) {
    case element_type::INT64: return double(v.get_int64().value_unsafe());
    case element_type::UINT64: return double(v.get_uint64().value_unsafe());
    default: return v.get_double().value_unsafe();
  }
}

std::string Quote(std::string_view s) {
  std::string out;
  AppendJsonString(out, s.substr(0, 80));
  return out;
}

// Tool names: a letter or underscore, then letters, digits, '_', '-' or '.', at
// most policy.max_tool_name bytes (KVV test_invalid_dynamic_tool_name_rejected).
bool ValidToolName(std::string_view name, size_t max_len) {
  if (name.empty() || name.size() > max_len) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(name[0])) return false;
  for (char c : name) {
    if (!alpha(c) && !(c >= '0' && c <= '9') && c != '-' && c != '.') return false;
  }
  return true;
}

void ValidateTools(element tools, const std::string& param, const ApiPolicy& policy,
                   std::set<std::string, std::less<>>& names, std::vector<ToolSpec>& specs) {
  if (!tools.is_array()) ThrowBadParam(param, param + " must be an array of tool objects");
  size_t i = 0;
  for (element tool : ArrayOf(tools)) {
    std::string p = param + "[" + std::to_string(i++) + "]";
    if (!tool.is_object()) ThrowBadParam(p, p + " must be an object, not " + TypeName(tool));
    auto type = Get(tool, "type");
    if (!type) ThrowBadParam(p + ".type", p + ".type is required (\"function\")");
    if (!type->is_string() || type->get_string().value_unsafe() != "function") {
      ThrowBadParam(p + ".type", p + ".type must be \"function\"");
    }
    auto fn = Get(tool, "function");
    if (!fn || !fn->is_object()) ThrowBadParam(p + ".function", p + ".function must be an object");
    auto name = Get(*fn, "name");
    if (!name || !name->is_string()) ThrowBadParam(p + ".function.name", p + ".function.name must be a string");
    std::string_view n = name->get_string().value_unsafe();
    if (!ValidToolName(n, policy.max_tool_name)) {
      ThrowBadParam(p + ".function.name",
                    p + ".function.name " + Quote(n) + " is invalid: it must start with a letter or '_', use only "
                        "letters, digits, '_', '-' and '.', and be 1.." + std::to_string(policy.max_tool_name) +
                        " characters");
    }
    if (!names.emplace(n).second) {
      ThrowBadParam(p + ".function.name", "tool name " + Quote(n) + " is declared more than once");
    }
    if (auto d = GetSet(*fn, "description"); d && !d->is_string()) {
      ThrowBadParam(p + ".function.description", p + ".function.description must be a string");
    }
    ToolSpec spec;
    spec.name = std::string(n);
    spec.param = p + ".function.parameters";
    if (auto params = GetSet(*fn, "parameters")) {
      if (!params->is_object()) {
        ThrowBadParam(p + ".function.parameters", p + ".function.parameters must be a JSON Schema object");
      }
      spec.parameters_json = simdjson::minify(*params);
    }
    if (auto s = GetSet(*fn, "strict")) {
      if (!s->is_bool()) ThrowBadParam(p + ".function.strict", p + ".function.strict must be a boolean");
      spec.strict = s->get_bool().value_unsafe();
    }
    specs.push_back(std::move(spec));
  }
}

void ValidateContent(element msg, const std::string& p, bool required) {
  auto content = Get(msg, "content");
  if (!content || content->is_null()) {
    if (required) ThrowBadParam(p + ".content", p + ".content is required");
    return;
  }
  if (content->is_string()) return;
  if (!content->is_array()) ThrowBadParam(p + ".content", p + ".content must be a string or a list of text parts");
  size_t i = 0;
  for (element part : ArrayOf(*content)) {
    std::string pp = p + ".content[" + std::to_string(i++) + "]";
    if (!part.is_object()) ThrowBadParam(pp, pp + " must be an object {\"type\":\"text\",\"text\":...}");
    auto type = Get(part, "type");
    if (!type || !type->is_string()) ThrowBadParam(pp + ".type", pp + ".type must be a string");
    std::string_view t = type->get_string().value_unsafe();
    if (t != "text") {
      throw Error(ErrorCode::kUnsupported,
                  pp + ".type " + Quote(t) + " is not supported: k3 serves text only", {}, Error::kNoOffset,
                  pp + ".type");
    }
    auto text = Get(part, "text");
    if (!text || !text->is_string()) ThrowBadParam(pp + ".text", pp + ".text must be a string");
  }
}

// True when the system message content is empty ("", null, absent, []).
bool ContentEmpty(element msg) {
  auto c = Get(msg, "content");
  if (!c || c->is_null()) return true;
  if (c->is_string()) return c->get_string().value_unsafe().empty();
  if (c->is_array()) return ArrayOf(*c).size() == 0;
  return false;
}

void ValidateMessages(element messages, const ApiPolicy& policy, std::set<std::string, std::less<>>& names,
                      bool& has_dynamic_tools, std::vector<ToolSpec>& specs) {
  if (!messages.is_array()) ThrowBadParam("messages", "messages must be an array of message objects");
  simdjson::dom::array list = ArrayOf(messages);
  if (list.size() == 0) ThrowBadParam("messages", "messages must not be empty");
  if (list.size() > policy.max_messages) {
    ThrowBadParam("messages", "messages has " + std::to_string(list.size()) + " entries; at most " +
                                  std::to_string(policy.max_messages) + " are accepted");
  }
  size_t i = 0;
  for (element msg : list) {
    std::string p = "messages[" + std::to_string(i++) + "]";
    if (!msg.is_object()) ThrowBadParam(p, p + " must be an object");
    auto role_v = Get(msg, "role");
    if (!role_v || !role_v->is_string()) ThrowBadParam(p + ".role", p + ".role must be a string");
    std::string_view role = role_v->get_string().value_unsafe();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      ThrowBadParam(p + ".role", p + ".role " + Quote(role) + " is not one of system, user, assistant, tool");
    }
    if (auto name = GetSet(msg, "name"); name && !name->is_string()) {
      ThrowBadParam(p + ".name", p + ".name must be a string");
    }
    // Dynamic tools: only on system messages, only with empty content
    // (KVV test_dynamic_tools.py, section 3).
    if (auto tools = GetSet(msg, "tools")) {
      if (role != "system") {
        ThrowBadParam(p + ".tools", p + ".tools: tools may be declared only on system messages, not on " +
                                        std::string(role) + " messages");
      }
      ValidateTools(*tools, p + ".tools", policy, names, specs);
      if (ArrayOf(*tools).size() > 0) {
        if (!ContentEmpty(msg)) {
          ThrowBadParam(p + ".content", p + ": a system message that declares tools must have empty content");
        }
        has_dynamic_tools = true;
        continue;
      }
    }
    if (role == "assistant") {
      auto calls = GetSet(msg, "tool_calls");
      ValidateContent(msg, p, /*required=*/false);
      if (auto r = GetSet(msg, "reasoning_content"); r && !r->is_string()) {
        ThrowBadParam(p + ".reasoning_content", p + ".reasoning_content must be a string");
      }
      if (calls) {
        if (!calls->is_array()) ThrowBadParam(p + ".tool_calls", p + ".tool_calls must be an array");
        size_t j = 0;
        for (element call : ArrayOf(*calls)) {
          std::string cp = p + ".tool_calls[" + std::to_string(j++) + "]";
          if (!call.is_object()) ThrowBadParam(cp, cp + " must be an object");
          auto fn = Get(call, "function");
          if (!fn || !fn->is_object()) ThrowBadParam(cp + ".function", cp + ".function must be an object");
          auto name = Get(*fn, "name");
          if (!name || !name->is_string()) ThrowBadParam(cp + ".function.name", cp + ".function.name must be a string");
          // Arguments are rendered as they are, even when not valid JSON:
          // only their JSON type is checked.
          if (auto a = GetSet(*fn, "arguments"); a && !a->is_string() && !a->is_object()) {
            ThrowBadParam(cp + ".function.arguments", cp + ".function.arguments must be a string");
          }
          if (auto id = GetSet(call, "id"); id && !id->is_string()) {
            ThrowBadParam(cp + ".id", cp + ".id must be a string");
          }
        }
      }
    } else if (role == "tool") {
      // KVV test_tool_role_without_tool_call_id_rejected.
      auto id = GetSet(msg, "tool_call_id");
      if (!id || !id->is_string() || id->get_string().value_unsafe().empty()) {
        ThrowBadParam(p + ".tool_call_id", p + ": a tool message needs a non-empty string tool_call_id");
      }
      ValidateContent(msg, p, /*required=*/false);
    } else {
      ValidateContent(msg, p, /*required=*/role == "user");
    }
  }
}

void ValidateResponseFormat(element rf, ChatRequest& out) {
  // KVV test_response_format.py: type in text / json_object / json_schema;
  // json_schema needs {name, schema: object, strict?: bool}.
  if (!rf.is_object()) ThrowBadParam("response_format", "response_format must be an object {\"type\": ...}");
  auto type = Get(rf, "type");
  if (!type || !type->is_string()) ThrowBadParam("response_format.type", "response_format.type must be a string");
  std::string_view t = type->get_string().value_unsafe();
  if (t == "text") return;
  if (t == "json_object") {
    out.response_format = ResponseFormat::kJsonObject;
    return;
  }
  if (t != "json_schema") {
    ThrowBadParam("response_format.type",
                  "response_format.type " + Quote(t) + " is not one of text, json_object, json_schema");
  }
  auto js = Get(rf, "json_schema");
  if (!js || !js->is_object()) {
    ThrowBadParam("response_format.json_schema", "response_format type json_schema needs a json_schema object");
  }
  auto name = Get(*js, "name");
  if (!name || !name->is_string() || name->get_string().value_unsafe().empty()) {
    ThrowBadParam("response_format.json_schema.name", "response_format.json_schema.name must be a non-empty string");
  }
  auto schema = Get(*js, "schema");
  if (!schema) ThrowBadParam("response_format.json_schema.schema", "response_format.json_schema.schema is required");
  if (!schema->is_object()) {
    ThrowBadParam("response_format.json_schema.schema", "response_format.json_schema.schema must be an object");
  }
  auto strict = GetSet(*js, "strict");
  if (strict && !strict->is_bool()) {
    ThrowBadParam("response_format.json_schema.strict", "response_format.json_schema.strict must be a boolean");
  }
  out.response_strict = strict && strict->get_bool().value_unsafe();
  out.response_format = ResponseFormat::kJsonSchema;
  out.response_schema_json = simdjson::minify(*schema);
}

std::string EffortOf(element v, const std::string& param) {
  if (!v.is_string()) ThrowBadParam(param, param + " must be one of low, high, max");
  std::string e(v.get_string().value_unsafe());
  if (e != "low" && e != "high" && e != "max") {
    ThrowBadParam(param, param + " " + Quote(e) + " is not one of low, high, max");
  }
  return e;
}

// Thinking controls, in the verifier's precedence (test_thinking_effort.py:
// test_reasoning_effort_ignored_when_effort_present / _effective_when_effort_
// absent): thinking{type, effort} (Moonshot's form) over chat_template_kwargs
// {thinking, thinking_effort} (the open-source form); reasoning_effort applies
// only when thinking.effort is absent; effort is ignored when thinking is
// disabled; default enabled, "max".
void ResolveThinking(element root, ChatRequest& out) {
  std::optional<bool> thinking;
  std::optional<std::string> effort, thinking_effort;
  if (auto kw = GetSet(root, "chat_template_kwargs")) {
    if (!kw->is_object()) ThrowBadParam("chat_template_kwargs", "chat_template_kwargs must be an object");
    if (auto t = GetSet(*kw, "thinking")) {
      if (!t->is_bool()) ThrowBadParam("chat_template_kwargs.thinking", "chat_template_kwargs.thinking must be a boolean");
      thinking = t->get_bool().value_unsafe();
    }
    if (auto e = GetSet(*kw, "thinking_effort")) effort = EffortOf(*e, "chat_template_kwargs.thinking_effort");
  }
  if (auto t = GetSet(root, "thinking")) {
    if (t->is_bool()) {
      thinking = t->get_bool().value_unsafe();
    } else if (t->is_object()) {
      if (auto type = GetSet(*t, "type")) {
        if (!type->is_string()) ThrowBadParam("thinking.type", "thinking.type must be \"enabled\" or \"disabled\"");
        std::string_view ty = type->get_string().value_unsafe();
        if (ty == "enabled") thinking = true;
        else if (ty == "disabled") thinking = false;
        else ThrowBadParam("thinking.type", "thinking.type " + Quote(ty) + " is not \"enabled\" or \"disabled\"");
      } else {
        thinking = true;
      }
      if (auto keep = GetSet(*t, "keep"); keep && !keep->is_string()) {
        ThrowBadParam("thinking.keep", "thinking.keep must be a string (\"all\")");
      }
      if (auto e = GetSet(*t, "effort")) thinking_effort = EffortOf(*e, "thinking.effort");
    } else {
      ThrowBadParam("thinking", "thinking must be an object {\"type\": \"enabled\" | \"disabled\", \"effort\": ...}");
    }
  }
  if (auto e = GetSet(root, "reasoning_effort")) effort = EffortOf(*e, "reasoning_effort");
  if (thinking_effort) effort = thinking_effort;
  out.thinking = thinking.value_or(true);
  if (out.thinking) out.effort = effort.value_or("max");
}

bool Near(double a, double b) { return std::fabs(a - b) < 1e-6; }

float Sampling(element root, std::string_view key, float dflt, const ApiPolicy& policy,
               std::span<const double> locked_ok, double lo, double hi, bool lo_open) {
  auto v = GetSet(root, key);
  if (!v) return dflt;
  std::string p(key);
  if (!IsNumber(*v)) ThrowBadParam(p, p + " must be a number");
  double x = NumberOf(*v);
  if (!(x >= lo && x <= hi) || (lo_open && x == lo)) {
    ThrowBadParam(p, p + " " + std::to_string(x) + " is out of range");
  }
  if (policy.sampling_free) return float(x);
  if (Near(x, dflt)) return dflt;
  for (double ok : locked_ok) {
    if (Near(x, ok)) return float(x);
  }
  ThrowBadParam(p, p + " is locked for Kimi K3 (the model's default is " + std::to_string(dflt) +
                       "); start the server with --sampling free to allow other values");
}

}  // namespace

[[noreturn]] void ThrowBadParam(std::string_view param, std::string message) {
  throw Error(ErrorCode::kInvalidArgument, std::move(message), {}, Error::kNoOffset, std::string(param));
}

element ParseBodyOrThrow(std::string_view body, const ApiPolicy& policy, simdjson::dom::parser& parser,
                         simdjson::padded_string& padded) {
  if (body.size() > policy.max_body_bytes) {
    throw Error(ErrorCode::kNoSpace, "request body of " + std::to_string(body.size()) + " bytes exceeds the " +
                                         std::to_string(policy.max_body_bytes) + "-byte limit");
  }
  if (parser.allocate(std::max<size_t>(body.size(), 64), policy.max_depth) != simdjson::SUCCESS) {
    throw Error(ErrorCode::kNoSpace, "cannot allocate a parser for the request body");
  }
  padded = simdjson::padded_string(body);
  element root;
  if (auto err = parser.parse(padded).get(root); err != simdjson::SUCCESS) {
    std::string why = err == simdjson::DEPTH_ERROR
                          ? "JSON nested deeper than " + std::to_string(policy.max_depth) + " levels"
                          : std::string(simdjson::error_message(err));
    throw Error(ErrorCode::kInvalidArgument, "request body is not valid JSON: " + why);
  }
  if (!root.is_object()) ThrowBadParam("", "request body must be a JSON object");
  return root;
}

// OpenAI fields that would change the answer and that k3 does not implement:
// a 400 naming the field rather than an answer that silently ignores it
// (docs/server.md lists them). n and logprobs are checked with the
// sampling fields below. An empty/null/false/zero value asks for nothing.
static void RefuseUnimplementedFields(element root) {
  auto asks = [](element v) {
    if (v.is_null()) return false;
    if (v.is_bool()) return v.get_bool().value_unsafe();
    if (v.is_object()) return v.get_object().value_unsafe().size() > 0;
    if (v.is_array()) return v.get_array().value_unsafe().size() > 0;
    if (IsNumber(v)) return NumberOf(v) != 0;
    return true;
  };
  for (const char* key : {"logit_bias", "top_logprobs", "prediction", "audio", "web_search_options"}) {
    if (auto v = Get(root, key); v && asks(*v)) {
      throw Error(ErrorCode::kUnsupported, std::string(key) + " is not supported by k3 (it would change the answer)",
                  {}, Error::kNoOffset, key);
    }
  }
  if (auto m = Get(root, "modalities"); m && m->is_array()) {
    for (element v : m->get_array().value_unsafe()) {
      if (!v.is_string() || v.get_string().value_unsafe() != "text") {
        throw Error(ErrorCode::kUnsupported, "modalities other than \"text\" are not supported by k3", {},
                    Error::kNoOffset, "modalities");
      }
    }
  }
}

ChatRequest ParseChatRequestOrThrow(std::string_view body, const ApiPolicy& policy) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded;
  element root = ParseBodyOrThrow(body, policy, parser, padded);

  ChatRequest out;
  if (auto m = GetSet(root, "model")) {
    if (!m->is_string()) ThrowBadParam("model", "model must be a string");
    out.model = std::string(m->get_string().value_unsafe());
  }
  auto messages = Get(root, "messages");
  if (!messages) ThrowBadParam("messages", "messages is required");

  std::set<std::string, std::less<>> names;
  bool has_dynamic = false;
  bool has_global = false;
  if (auto tools = GetSet(root, "tools")) {
    ValidateTools(*tools, "tools", policy, names, out.tools);
    has_global = ArrayOf(*tools).size() > 0;
  }
  ValidateMessages(*messages, policy, names, has_dynamic, out.tools);
  out.has_tools = has_global || has_dynamic;

  // tool_choice: auto / none / required (KVV test_tool_choice.py: required
  // needs tools), or the named form {"type":"function","function":{"name"}},
  // which k3 honours by constraint (Moonshot's service ignores it,
  // and its encoder renders no message for it).
  if (auto tc = GetSet(root, "tool_choice")) {
    if (tc->is_object()) {
      auto type = Get(*tc, "type");
      if (!type || !type->is_string() || type->get_string().value_unsafe() != "function") {
        ThrowBadParam("tool_choice.type", "tool_choice.type must be \"function\"");
      }
      auto fn = Get(*tc, "function");
      if (!fn || !fn->is_object()) ThrowBadParam("tool_choice.function", "tool_choice.function must be an object");
      auto name = Get(*fn, "name");
      if (!name || !name->is_string()) {
        ThrowBadParam("tool_choice.function.name", "tool_choice.function.name must be a string");
      }
      std::string_view n = name->get_string().value_unsafe();
      if (names.find(n) == names.end()) {
        ThrowBadParam("tool_choice.function.name",
                      "tool_choice.function.name " + Quote(n) + " is not one of the declared tools");
      }
      out.tool_choice = ToolChoice::kNamed;
      out.tool_choice_name = std::string(n);
    } else if (tc->is_string()) {
      std::string_view c = tc->get_string().value_unsafe();
      if (c != "auto" && c != "none" && c != "required") {
        ThrowBadParam("tool_choice", "tool_choice " + Quote(c) + " is not one of auto, none, required");
      }
      if (c == "required" && !out.has_tools) {
        ThrowBadParam("tool_choice", "tool_choice \"required\" needs at least one tool");
      }
      out.tool_choice = c == "none" ? ToolChoice::kNone : c == "required" ? ToolChoice::kRequired : ToolChoice::kAuto;
    } else {
      ThrowBadParam("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or "
                                   "{\"type\":\"function\",\"function\":{\"name\":...}}");
    }
  }
  if (auto rf = GetSet(root, "response_format")) ValidateResponseFormat(*rf, out);

  // Sampling (KVV tests/params/test_params.py): n must be 1; penalties 0;
  // temperature and top_p locked to K3's values unless --sampling free.
  if (auto n = GetSet(root, "n")) {
    if (!IsNumber(*n) || !Near(NumberOf(*n), 1)) ThrowBadParam("n", "n must be 1: k3 returns one choice");
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (auto v = GetSet(root, key)) {
      if (!IsNumber(*v)) ThrowBadParam(key, std::string(key) + " must be a number");
      if (!Near(NumberOf(*v), 0)) {
        ThrowBadParam(key, std::string(key) + " must be 0: penalties are locked for Kimi K3 (k3 implements none)");
      }
    }
  }
  RefuseUnimplementedFields(root);
  if (auto lp = GetSet(root, "logprobs"); lp && !(lp->is_bool() && !lp->get_bool().value_unsafe())) {
    throw Error(ErrorCode::kUnsupported, "logprobs are not supported by k3", {}, Error::kNoOffset, "logprobs");
  }
  out.temperature = Sampling(root, "temperature", policy.default_temperature, policy, kLockedTemperatures, 0, 2, false);
  out.top_p = Sampling(root, "top_p", policy.default_top_p, policy, kLockedTopP, 0, 1, true);

  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    auto v = GetSet(root, key);
    if (!v) continue;
    if (v->type() != element_type::INT64 && v->type() != element_type::UINT64) {
      ThrowBadParam(key, std::string(key) + " must be an integer");
    }
    if (v->type() == element_type::UINT64 || v->get_int64().value_unsafe() < 1) {
      ThrowBadParam(key, std::string(key) + " must be at least 1");
    }
    if (!out.max_tokens_from_request) {  // max_completion_tokens wins
      out.max_tokens = v->get_int64().value_unsafe();
      out.max_tokens_from_request = true;
    }
  }
  if (!out.max_tokens_from_request) out.max_tokens = policy.default_max_tokens;

  if (auto stop = GetSet(root, "stop")) {
    auto add = [&](element s) {
      if (!s.is_string()) ThrowBadParam("stop", "stop must be a string or an array of strings");
      std::string_view t = s.get_string().value_unsafe();
      if (t.empty()) ThrowBadParam("stop", "stop strings must not be empty");
      if (t.size() > policy.max_stop_bytes) {
        ThrowBadParam("stop", "stop strings are limited to " + std::to_string(policy.max_stop_bytes) + " bytes");
      }
      out.stop.emplace_back(t);
    };
    if (stop->is_array()) {
      for (element s : ArrayOf(*stop)) add(s);
      if (out.stop.size() > policy.max_stop) {
        ThrowBadParam("stop", "at most " + std::to_string(policy.max_stop) + " stop strings are accepted");
      }
    } else {
      add(*stop);
    }
  }
  if (auto seed = GetSet(root, "seed")) {
    if (seed->type() == element_type::INT64) out.seed = uint64_t(seed->get_int64().value_unsafe());
    else if (seed->type() == element_type::UINT64) out.seed = seed->get_uint64().value_unsafe();
    else ThrowBadParam("seed", "seed must be an integer");
  }
  if (auto s = GetSet(root, "stream")) {
    if (!s->is_bool()) ThrowBadParam("stream", "stream must be a boolean");
    out.stream = s->get_bool().value_unsafe();
  }
  // llama-server's field: prompt_progress chunks during prefill (docs/server.md).
  if (auto rp = GetSet(root, "return_progress")) {
    if (!rp->is_bool()) ThrowBadParam("return_progress", "return_progress must be a boolean");
    out.return_progress = rp->get_bool().value_unsafe();
  }
  // llama-server's and vLLM's field: EOS is never drawn, the answer runs to
  // max_tokens, a stop string or the client leaving (benchmarks, tests).
  if (auto ie = GetSet(root, "ignore_eos")) {
    if (!ie->is_bool()) ThrowBadParam("ignore_eos", "ignore_eos must be a boolean");
    out.ignore_eos = ie->get_bool().value_unsafe();
  }
  if (auto so = GetSet(root, "stream_options")) {
    if (!so->is_object()) ThrowBadParam("stream_options", "stream_options must be an object");
    if (auto iu = GetSet(*so, "include_usage")) {
      if (!iu->is_bool()) ThrowBadParam("stream_options.include_usage", "stream_options.include_usage must be a boolean");
      out.include_usage = iu->get_bool().value_unsafe();
    }
  }
  ResolveThinking(root, out);

  // The render request: the body itself, with a leading "options" object that
  // the renderer prefers over top-level keys (lib/tokenizer chat.cc Option()).
  // The body's own bytes are kept, so `k3-run render` on render_json gives the
  // same ids, numbers in tool schemas included.
  std::string options = "{\"options\":{\"thinking\":";
  options += out.thinking ? "true" : "false";
  if (out.effort) {
    options += ",\"thinking_effort\":";
    AppendJsonString(options, *out.effort);
  }
  options += ",\"add_generation_prompt\":true},";
  size_t brace = body.find('{');  // the root is an object: the first byte that is not space
  out.render_json = options + std::string(body.substr(brace + 1));
  try {
    out.chat = tok::RenderChatRequestOrThrow(out.render_json);
  } catch (const Error& e) {
    throw Error(e.code() == ErrorCode::kUnsupported ? ErrorCode::kUnsupported : ErrorCode::kInvalidArgument,
                e.detail(), {}, Error::kNoOffset, "messages");
  }
  // Structured output: every schema compiles now, or the request is a 400.
  CompileStructuredOrThrow(out);
  return out;
}

std::string ApiError::Json() const {
  JsonWriter j;
  j.BeginObject().Key("error").BeginObject().Field("message", message).Field("type", type).Key("param");
  if (param.empty()) j.Null();
  else j.String(param);
  j.Key("code");
  if (code.empty()) j.Null();
  else j.String(code);
  j.EndObject().EndObject();
  return j.Take();
}

ApiError MakeApiError(int status, std::string type, std::string message, std::string code, std::string param) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

ApiError ApiErrorFor(const Error& e) {
  switch (e.code()) {
    case ErrorCode::kInvalidArgument:
      return MakeApiError(400, "invalid_request_error", e.detail(), "invalid_value", e.object());
    case ErrorCode::kUnsupported:
      return MakeApiError(400, "invalid_request_error", e.detail(), "unsupported", e.object());
    case ErrorCode::kNoSpace:
      return MakeApiError(413, "invalid_request_error", e.detail(), "request_too_large", e.object());
    case ErrorCode::kBusy:
      return MakeApiError(429, "rate_limit_error", e.detail(), "queue_full", e.object());
    case ErrorCode::kUnavailable:  // a cluster worker died or is late (docs/cluster.md)
      return MakeApiError(503, "server_error", e.detail(), "unavailable", e.object());
    case ErrorCode::kCancelled:
      return MakeApiError(499, "cancelled", e.detail(), "cancelled", e.object());
    default:
      return MakeApiError(500, "server_error", e.detail(), std::string(ErrorCodeName(e.code())), e.object());
  }
}

}  // namespace k3::server
