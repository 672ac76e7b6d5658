// Request schemas -> the engine's structured-output spec (issue 16).
#include <simdjson.h>

#include "k3/engine/engine.h"
#include "k3/server/api.h"

namespace k3::server {
namespace {

// strict (a strict tool, json_schema with strict true): what k3 cannot
// enforce is a 400. Otherwise it is relaxed to a superset (docs/constrain.md
// "Relaxed keywords"), so a client's schema is never refused.
constrain::CompiledSchema CompileAt(const std::string& schema_json, std::string_view param,
                                    bool strict) {
  try {
    return constrain::Schema::CompileOrThrow(schema_json, {.strict = strict});
  } catch (const Error& e) {
    // kUnsupported stays (the error's code "unsupported"); a schema that is not
    // JSON or cannot be satisfied is the client's invalid value. Both are 400s.
    const ErrorCode code = e.code() == ErrorCode::kUnsupported ? ErrorCode::kUnsupported : ErrorCode::kInvalidArgument;
    throw Error(code, std::string(param) + ": " + e.detail() + " (k3 constrains every schema it is sent and refuses "
                "what it cannot enforce; docs/constrain.md lists the subset)", {}, Error::kNoOffset, std::string(param));
  }
}

// K3 calls carry an object of arguments: a parameters schema whose type is
// something else cannot be honoured.
bool IsNotObjectSchema(const std::string& schema_json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(simdjson::padded_string(schema_json)).get(root) != simdjson::SUCCESS)
    return false;  // CompileAt says why
  simdjson::dom::element type;
  if (!root.is_object() || root["type"].get(type) != simdjson::SUCCESS) return false;
  return !(type.is_string() && type.get_string().value_unsafe() == "object");
}

bool WhollyRelaxed(const constrain::CompiledSchema& s) {
  for (const constrain::Relaxation& r : s.relaxations())
    if (r.keyword == "schema") return true;
  return false;
}

void RequireObjectSchema(const std::string& schema_json, std::string_view param) {
  if (!IsNotObjectSchema(schema_json)) return;
  throw Error(ErrorCode::kInvalidArgument,
              std::string(param) + " must describe an object (\"type\": \"object\"): tool arguments are an object",
              {}, Error::kNoOffset, std::string(param));
}

}  // namespace

void CompileStructuredOrThrow(ChatRequest& r, std::string_view response_param, std::string_view tool_choice_param) {
  auto spec = std::make_shared<engine::StructuredOutput>();
  for (const ToolSpec& t : r.tools) {
    engine::ToolConstraint c;
    c.name = t.name;
    if (!t.parameters_json.empty()) {
      c.parameters = CompileAt(t.parameters_json, t.param, t.strict);
      if (t.strict) {
        RequireObjectSchema(t.parameters_json, t.param);
      } else if (IsNotObjectSchema(t.parameters_json) || WhollyRelaxed(c.parameters)) {
        // K3's arguments are an object: a schema of something else, or one
        // relaxed to "any value", constrains them to any object.
        c.parameters = constrain::Schema::JsonObject();
      }
    }
    spec->tools.push_back(std::move(c));
  }
  switch (r.tool_choice) {
    case ToolChoice::kAuto: spec->calls = engine::StructuredOutput::Calls::kAuto; break;
    case ToolChoice::kNone: spec->calls = engine::StructuredOutput::Calls::kNone; break;
    case ToolChoice::kRequired: spec->calls = engine::StructuredOutput::Calls::kRequired; break;
    case ToolChoice::kNamed: {
      spec->calls = engine::StructuredOutput::Calls::kRequired;
      spec->only_tool = r.tool_choice_name;
      bool declared = false;
      for (const ToolSpec& t : r.tools) declared = declared || t.name == r.tool_choice_name;
      if (!declared) {
        std::string shown = r.tool_choice_name.substr(0, 80);
        throw Error(ErrorCode::kInvalidArgument,
                    std::string(tool_choice_param) + " '" + shown + "' is not one of the declared tools", {},
                    Error::kNoOffset, std::string(tool_choice_param));
      }
      break;
    }
  }
  if (spec->calls == engine::StructuredOutput::Calls::kRequired && spec->tools.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "tool_choice requires a call but no tool is declared", {},
                Error::kNoOffset, "tool_choice");
  }
  if (r.response_format == ResponseFormat::kJsonObject) {
    spec->response = constrain::Schema::JsonObject();
  } else if (r.response_format == ResponseFormat::kJsonSchema) {
    spec->response = CompileAt(r.response_schema_json, response_param, r.response_strict);
  }
  if (r.thinking && r.think_budget >= 0) spec->think_budget = r.think_budget;
  r.structured = spec->active() ? std::move(spec) : nullptr;
}

void SetThinkBudget(ChatRequest& r, int64_t budget) {
  r.think_budget = budget;
  if (!r.thinking) return;
  auto spec = r.structured ? std::make_shared<engine::StructuredOutput>(*r.structured)
                           : std::make_shared<engine::StructuredOutput>();
  spec->think_budget = budget;
  r.structured = std::move(spec);
}

}  // namespace k3::server
