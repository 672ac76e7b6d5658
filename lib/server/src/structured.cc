// Request schemas -> the engine's structured-output spec.
#include <simdjson.h>

#include <chrono>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "k3/engine/engine.h"
#include "k3/server/api.h"

namespace k3::server {
namespace {

// Compiled schemas by their text: agents send the same tools on
// every turn, so the second turn compiles nothing. Compiled schemas are
// immutable and shared (constrain.h); an LRU bounded by entries and by the
// memory the compiled automata hold (a short text can compile to megabytes),
// thread-safe.
class SchemaCache {
 public:
  static SchemaCache& Get() {
    static SchemaCache cache;
    return cache;
  }
  std::optional<constrain::CompiledSchema> Find(const std::string& text) {
    std::lock_guard lock(mu_);
    auto it = index_.find(text);
    if (it == index_.end()) return std::nullopt;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  void Put(const std::string& text, const constrain::CompiledSchema& schema) {
    if (text.size() > kMaxEntryBytes || Held(text, schema) > kMaxHeldBytes / 8) return;
    std::lock_guard lock(mu_);
    if (index_.count(text)) return;
    lru_.emplace_front(text, schema);
    index_.emplace(lru_.front().first, lru_.begin());
    bytes_ += Held(text, schema);
    while (lru_.size() > kMaxEntries || bytes_ > kMaxHeldBytes) {
      bytes_ -= Held(lru_.back().first, lru_.back().second);
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }

 private:
  static constexpr size_t kMaxEntries = 512;
  static constexpr size_t kMaxEntryBytes = 256u << 10;
  static constexpr size_t kMaxHeldBytes = 64u << 20;  // text (twice: key and index) + compiled
  static size_t Held(const std::string& text, const constrain::CompiledSchema& schema) {
    return 2 * text.size() + schema.bytes();
  }
  std::mutex mu_;
  std::list<std::pair<std::string, constrain::CompiledSchema>> lru_;
  std::unordered_map<std::string_view,
                     std::list<std::pair<std::string, constrain::CompiledSchema>>::iterator>
      index_;
  size_t bytes_ = 0;
};

// Per request, over all of its schemas together (bounded work before
// the queue): schema text and compile time. Past either, a 400 naming the cap.
constexpr size_t kMaxRequestSchemaBytes = 2u << 20;
constexpr double kMaxRequestCompileSeconds = 10.0;

// strict (a strict tool, json_schema with strict true): what k3 cannot
// enforce is a 400. Otherwise it is relaxed to a superset (docs/constrain.md
// "Relaxed keywords"), so a client's schema is never refused. The cache is
// keyed by the policy too: the same text compiles differently strict or not.
// budget: the request's, shared by all of its schemas (a cache hit spends
// nothing); past it a strict schema is a 400 naming it, a non-strict one is
// relaxed to any value and not cached (with a fresh budget it may compile).
constrain::CompiledSchema CompileAt(const std::string& schema_json, std::string_view param, bool strict,
                                    constrain::CompileBudget& budget) {
  const std::string key = (strict ? "s:" : "r:") + schema_json;
  if (auto cached = SchemaCache::Get().Find(key)) return *cached;
  try {
    constrain::CompiledSchema compiled =
        constrain::Schema::CompileOrThrow(schema_json, {.strict = strict, .budget = &budget});
    if (!budget.spent()) SchemaCache::Get().Put(key, compiled);
    return compiled;
  } catch (const Error& e) {
    if (e.object() == constrain::kBudgetObject)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(param) + ": " + e.detail() +
                      " (one budget for all of a request's schemas: every tool's parameters and "
                      "response_format together; docs/constrain.md, \"Compile budget\")",
                  {}, Error::kNoOffset, std::string(param));
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

// The engine refuses the pair too (kInvalidArgument); here it is a 400
// naming the field before the request is queued.
static void RefuseIgnoreEosWithStructured(const ChatRequest& r) {
  if (!r.ignore_eos || !r.structured) return;  // null: nothing to enforce
  throw Error(ErrorCode::kInvalidArgument, engine::kIgnoreEosWithStructured, {}, Error::kNoOffset,
              "ignore_eos");
}

void CompileStructuredOrThrow(ChatRequest& r, std::string_view response_param, std::string_view tool_choice_param) {
  auto spec = std::make_shared<engine::StructuredOutput>();
  size_t schema_bytes = r.response_schema_json.size();
  for (const ToolSpec& t : r.tools) schema_bytes += t.parameters_json.size();
  if (schema_bytes > kMaxRequestSchemaBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "the request's schemas total " + std::to_string(schema_bytes) +
                    " bytes, over the cap of " + std::to_string(kMaxRequestSchemaBytes) +
                    " bytes per request (tools and response_format together)",
                {}, Error::kNoOffset, "tools");
  }
  constrain::CompileBudget budget;
  const auto start = std::chrono::steady_clock::now();
  for (const ToolSpec& t : r.tools) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kMaxRequestCompileSeconds) {
      throw Error(ErrorCode::kInvalidArgument,
                  "compiling the request's tool schemas took over the cap of " +
                      std::to_string(int(kMaxRequestCompileSeconds)) + " s per request",
                  {}, Error::kNoOffset, t.param);
    }
    engine::ToolConstraint c;
    c.name = t.name;
    if (!t.parameters_json.empty()) {
      c.parameters = CompileAt(t.parameters_json, t.param, t.strict, budget);
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
    spec->response = CompileAt(r.response_schema_json, response_param, r.response_strict, budget);
  }
  if (r.thinking && r.think_budget >= 0) spec->think_budget = r.think_budget;
  r.structured = spec->active() ? std::move(spec) : nullptr;
  RefuseIgnoreEosWithStructured(r);
}

void SetThinkBudget(ChatRequest& r, int64_t budget) {
  r.think_budget = budget;
  if (!r.thinking) return;
  auto spec = r.structured ? std::make_shared<engine::StructuredOutput>(*r.structured)
                           : std::make_shared<engine::StructuredOutput>();
  spec->think_budget = budget;
  r.structured = std::move(spec);
  RefuseIgnoreEosWithStructured(r);
}

}  // namespace k3::server
