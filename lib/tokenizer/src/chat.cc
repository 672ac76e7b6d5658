// XTML rendering (encoding_k3.py's rules, read off its recorded segment lists) and
// the generated-output stream parser. See docs/tokenizer.md "Chat format".
#include "k3/tokenizer/chat.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/json_writer.h"

namespace k3::tok {
namespace {

constexpr const char* kOpen = "<|open|>";
constexpr const char* kClose = "<|close|>";
constexpr const char* kSep = "<|sep|>";
constexpr const char* kEndOfMsg = "<|end_of_msg|>";

using simdjson::dom::element;
using simdjson::dom::element_type;

// Copies out of simdjson_result so no range-for iterates a dead temporary.
simdjson::dom::array ArrayOf(element e) {
  simdjson::dom::array a;
  if (e.get_array().get(a) != simdjson::SUCCESS) return {};
  return a;
}
simdjson::dom::object ObjectOf(element e) {
  simdjson::dom::object o;
  if (e.get_object().get(o) != simdjson::SUCCESS) return {};
  return o;
}

Error BadRequest(const std::string& detail) { return Error(ErrorCode::kInvalidArgument, detail); }

// ---------------------------------------------------------------------------
// JSON text as Python's json.dumps writes it (the encoder's serialiser).

// repr(float): shortest round-trip digits; fixed notation for decimal exponents
// -4..15, scientific ("1e+16", "1.5e-05") outside.
void AppendPythonFloat(std::string& out, double v) {
  if (v != v) { out += "NaN"; return; }
  if (v == __builtin_inf()) { out += "Infinity"; return; }
  if (v == -__builtin_inf()) { out += "-Infinity"; return; }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') { sign = "-"; sci.erase(0, 1); }
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant) if (c != '.') digits += c;
  out += sign;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (digits.size() <= size_t(exp) + 1) {
        out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
}

// A JSON string literal, non-ASCII kept as UTF-8 byte for byte
// (ensure_ascii=False); the goldens expect invalid bytes passed through too.
void AppendJsonText(std::string& out, std::string_view s) {
  AppendJsonString(out, s, InvalidUtf8::kPassThrough);
}

// sort_keys: the encoder deep-sorts tool schemas; compact: "," and ":" separators
// (tool declarations) versus Python's default ", " and ": " (argument values).
void AppendJson(std::string& out, element v, bool sort_keys, bool compact) {
  const char* item_sep = compact ? "," : ", ";
  const char* key_sep = compact ? ":" : ": ";
  switch (v.type()) {
    case element_type::ARRAY: {
      out += '[';
      bool first = true;
      for (element x : ArrayOf(v)) {
        if (!first) out += item_sep;
        first = false;
        AppendJson(out, x, sort_keys, compact);
      }
      out += ']';
      break;
    }
    case element_type::OBJECT: {
      std::vector<std::pair<std::string_view, element>> fields;
      for (auto f : ObjectOf(v)) fields.emplace_back(f.key, f.value);
      if (sort_keys) {
        std::stable_sort(fields.begin(), fields.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      bool first = true;
      for (auto& [k, x] : fields) {
        if (!first) out += item_sep;
        first = false;
        AppendJsonText(out, k);
        out += key_sep;
        AppendJson(out, x, sort_keys, compact);
      }
      out += '}';
      break;
    }
    case element_type::STRING: AppendJsonText(out, v.get_string().value_unsafe()); break;
    case element_type::INT64: out += std::to_string(v.get_int64().value_unsafe()); break;
    case element_type::UINT64: out += std::to_string(v.get_uint64().value_unsafe()); break;
    case element_type::DOUBLE: AppendPythonFloat(out, v.get_double().value_unsafe()); break;
    case element_type::BOOL: out += v.get_bool().value_unsafe() ? "true" : "false"; break;
    case element_type::NULL_VALUE: out += "null"; break;
  }
}

// ---------------------------------------------------------------------------

std::optional<element> Field(element obj, std::string_view key) {
  element v;
  if (!obj.is_object() || obj[key].get(v) != simdjson::SUCCESS) return std::nullopt;
  return v;
}

std::optional<std::string_view> StringField(element obj, std::string_view key) {
  auto v = Field(obj, key);
  if (!v || !v->is_string()) return std::nullopt;
  return v->get_string().value_unsafe();
}

// Python truthiness, for the encoder's `if message.get("name")` style tests.
bool Truthy(const std::optional<element>& v) {
  if (!v) return false;
  switch (v->type()) {
    case element_type::NULL_VALUE: return false;
    case element_type::BOOL: return v->get_bool().value_unsafe();
    case element_type::STRING: return !v->get_string().value_unsafe().empty();
    case element_type::ARRAY: return ArrayOf(*v).size() > 0;
    case element_type::OBJECT: return ObjectOf(*v).size() > 0;
    case element_type::INT64: return v->get_int64().value_unsafe() != 0;
    case element_type::UINT64: return v->get_uint64().value_unsafe() != 0;
    case element_type::DOUBLE: return v->get_double().value_unsafe() != 0;
  }
  return false;
}

// An attribute value as text (ids and names may arrive as numbers).
std::string ScalarText(element v) {
  if (v.is_string()) return std::string(v.get_string().value_unsafe());
  std::string out;
  AppendJson(out, v, false, false);
  return out;
}

// Message content: a string, null, or a list of text parts.
std::string ContentText(const std::optional<element>& content) {
  if (!content || content->is_null()) return {};
  if (content->is_string()) return std::string(content->get_string().value_unsafe());
  if (content->is_array()) {
    std::string out;
    for (element part : ArrayOf(*content)) {
      if (part.is_string()) {
        out += part.get_string().value_unsafe();
        continue;
      }
      auto type = StringField(part, "type");
      if (type && (*type == "text" || *type == "input_text" || *type == "output_text")) {
        if (auto t = StringField(part, "text")) out += *t;
        continue;
      }
      throw Error(ErrorCode::kUnsupported,
                  "message content part of type '" + std::string(type.value_or("?")) +
                      "' is not supported (text only)");
    }
    return out;
  }
  throw BadRequest("message content must be a string, null or a list of parts");
}

class Builder {
 public:
  void Special(const char* marker) { segments_.push_back({marker, true}); }
  void Text(std::string_view text) {
    if (!text.empty()) segments_.push_back({std::string(text), false});
  }
  // Attribute values escape only & and " (the encoder's rule; < and > stay).
  static std::string Escape(std::string_view v) {
    std::string out;
    for (char c : v) {
      if (c == '&') out += "&amp;";
      else if (c == '"') out += "&quot;";
      else out += c;
    }
    return out;
  }
  void Open(std::string_view tag, const std::vector<std::pair<std::string, std::string>>& attrs = {}) {
    Special(kOpen);
    Text(tag);
    for (auto& [k, v] : attrs) {
      Text(" " + k);
      Text("=\"");
      Text(Escape(v));
      Text("\"");
    }
    Special(kSep);
  }
  void Close(std::string_view tag) {
    Special(kClose);
    Text(tag);
    Special(kSep);
  }
  void EndOfMessage() { Special(kEndOfMsg); }
  // An encoder-generated system message (tool declarations, effort, ...).
  void InternalSystem(std::string_view type, std::string_view body) {
    Open("message", {{"role", "system"}, {"type", std::string(type)}});
    Text(Strip(body));
    Close("message");
    EndOfMessage();
  }
  static std::string_view Strip(std::string_view s) {
    auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
    while (!s.empty() && space(s.front())) s.remove_prefix(1);
    while (!s.empty() && space(s.back())) s.remove_suffix(1);
    return s;
  }
  std::vector<ChatSegment> Take() { return std::move(segments_); }

 private:
  std::vector<ChatSegment> segments_;
};

void RenderToolDeclare(Builder& b, element tools, bool dynamic) {
  std::string json;
  AppendJson(json, tools, /*sort_keys=*/true, /*compact=*/true);
  std::string body = dynamic
                         ? "## New Tools Available\nThe system dynamically extends the toolset via "
                           "lazy-loading.\nYou have access to all existing and extended tools.\nHere are "
                           "the specs for the extended tools.\n\n```json\n" +
                               json + "\n```"
                         : "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" +
                               json + "\n```";
  b.Open("message", {{"role", "system"}, {"type", "tool-declare"}});
  b.Text(body);
  b.Close("message");
  b.EndOfMessage();
}

// JSON type names the encoder writes into <|open|>argument type="...".
const char* XtmlType(element v) {
  switch (v.type()) {
    case element_type::BOOL: return "boolean";
    case element_type::NULL_VALUE: return "null";
    case element_type::INT64:
    case element_type::UINT64:
    case element_type::DOUBLE: return "number";
    case element_type::STRING: return "string";
    case element_type::ARRAY: return "array";
    case element_type::OBJECT: return "object";
  }
  return "null";
}

void RenderArguments(Builder& b, element obj) {
  for (auto f : ObjectOf(obj)) {
    std::string value;
    if (f.value.is_string()) {
      value = std::string(f.value.get_string().value_unsafe());
    } else {
      AppendJson(value, f.value, false, false);  // json.dumps defaults
    }
    b.Open("argument", {{"key", std::string(f.key)}, {"type", XtmlType(f.value)}});
    b.Text(value);
    b.Close("argument");
  }
}

void RenderToolCalls(Builder& b, element calls) {
  simdjson::dom::parser arg_parser;  // one per message; arguments arrive as JSON text
  b.Open("tools");
  int index = 0;
  for (element call : ArrayOf(calls)) {
    ++index;
    element fn = Field(call, "function").value_or(call);
    auto name = Field(fn, "name");
    if (!name || name->is_null()) throw BadRequest("tool call " + std::to_string(index) + " has no function name");
    b.Open("call", {{"tool", ScalarText(*name)}, {"index", std::to_string(index)}});
    auto args = Field(fn, "arguments");
    if (args && args->is_object()) {
      RenderArguments(b, *args);
    } else if (args && args->is_string()) {
      std::string_view text = args->get_string().value_unsafe();
      if (!text.empty()) {
        simdjson::padded_string padded(text);
        element parsed;
        if (arg_parser.parse(padded).get(parsed) == simdjson::SUCCESS && parsed.is_object()) {
          RenderArguments(b, parsed);
        } else {
          // Not a JSON object: the encoder carries the raw text in a json block.
          b.Open("json", {{"type", "object"}});
          b.Text(text);
          b.Close("json");
        }
      }
    } else if (args && !args->is_null()) {
      throw BadRequest("tool call arguments must be an object or a JSON object string");
    }
    b.Close("call");
  }
  b.Close("tools");
}

// Tool results arrive in any order; the encoder puts each run of tool messages
// back into the order of the preceding assistant's tool_calls (by tool_call_id)
// and names each after its call. A run with any unknown id is left as it is.
struct ToolMessage {
  element msg;
  std::optional<std::string> resolved_name;
};

std::vector<ToolMessage> ReorderToolResults(simdjson::dom::array messages) {
  std::vector<element> all(messages.begin(), messages.end());
  std::vector<ToolMessage> out;
  std::map<std::string, std::pair<int, std::optional<std::string>>> index;
  size_t i = 0;
  while (i < all.size()) {
    auto role = StringField(all[i], "role");
    if (role == "assistant") {
      index.clear();
      if (auto calls = Field(all[i], "tool_calls"); calls && calls->is_array()) {
        int position = 0;
        for (element call : ArrayOf(*calls)) {
          ++position;
          auto id = Field(call, "id");
          if (!id || id->is_null()) continue;
          element fn = Field(call, "function").value_or(call);
          std::optional<std::string> name;
          if (auto n = Field(fn, "name"); n && !n->is_null()) name = ScalarText(*n);
          index.emplace(ScalarText(*id), std::make_pair(position, name));
        }
      }
      out.push_back({all[i], std::nullopt});
      ++i;
      continue;
    }
    if (role != "tool") {
      out.push_back({all[i], std::nullopt});
      ++i;
      continue;
    }
    struct Item {
      int position;
      size_t offset;
      element msg;
      std::optional<std::string> name;
    };
    std::vector<Item> run;
    bool unresolved = false;
    for (size_t offset = 0; i < all.size() && StringField(all[i], "role") == "tool"; ++i, ++offset) {
      auto id = Field(all[i], "tool_call_id");
      if (!id || id->is_null()) id = Field(all[i], "id");
      auto it = (id && !id->is_null()) ? index.find(ScalarText(*id)) : index.end();
      if (it == index.end()) {
        unresolved = true;
        run.push_back({0, offset, all[i], std::nullopt});
      } else {
        run.push_back({it->second.first, offset, all[i], it->second.second});
      }
    }
    if (!unresolved) {
      std::stable_sort(run.begin(), run.end(), [](const Item& a, const Item& b) {
        return std::tie(a.position, a.offset) < std::tie(b.position, b.offset);
      });
    }
    for (auto& item : run) out.push_back({item.msg, unresolved ? std::nullopt : item.name});
  }
  return out;
}

void ValidateEffort(const std::string& effort) {
  if (effort != "low" && effort != "high" && effort != "max") {
    throw BadRequest("thinking_effort must be one of low, high, max (got '" + effort + "')");
  }
}

struct RenderInputs {
  simdjson::dom::array messages;
  std::optional<element> tools, tool_choice, response_format;
  bool thinking = true;
  std::optional<std::string> effort;
  bool add_generation_prompt = true;
};

RenderedChat Render(const RenderInputs& in) {
  RenderedChat result;
  result.resolved.thinking = in.thinking;
  if (in.thinking) {
    result.resolved.thinking_effort = in.effort.value_or("max");
    ValidateEffort(*result.resolved.thinking_effort);
  }
  Builder b;
  if (in.tools && in.tools->is_array() && ArrayOf(*in.tools).size() > 0) {
    RenderToolDeclare(b, *in.tools, false);
  } else if (in.tools && !in.tools->is_null() && !in.tools->is_array()) {
    throw BadRequest("tools must be a list");
  }
  if (in.thinking) {
    b.InternalSystem("thinking-effort",
                     "`thinking_effort` guides on how much to think in your thinking channel (not "
                     "including the response channel), supported values include `low`, `medium`, "
                     "`high`, and `max`.\nNow the system is invoked with `thinking_effort=" +
                         *result.resolved.thinking_effort + "`.");
  }

  std::optional<element> last_tool_calls;
  int tool_index = 0;
  for (const ToolMessage& tm : ReorderToolResults(in.messages)) {
    element m = tm.msg;
    if (!m.is_object()) throw BadRequest("every message must be an object");
    auto role_field = StringField(m, "role");
    if (!role_field) throw BadRequest("every message needs a string role");
    std::string_view role = *role_field;
    auto name_attr = [&](std::vector<std::pair<std::string, std::string>>& attrs) {
      auto name = Field(m, "name");
      if (Truthy(name)) attrs.push_back({"name", ScalarText(*name)});
    };
    if (role == "user" || (role == "system" && !Truthy(Field(m, "tools")))) {
      std::vector<std::pair<std::string, std::string>> attrs{{"role", std::string(role)}};
      name_attr(attrs);
      b.Open("message", attrs);
      b.Text(ContentText(Field(m, "content")));
      b.Close("message");
      b.EndOfMessage();
    } else if (role == "system") {
      RenderToolDeclare(b, *Field(m, "tools"), true);
    } else if (role == "tool") {
      ++tool_index;
      std::optional<std::string> tool_name = tm.resolved_name;
      if (!tool_name) {
        if (auto t = Field(m, "tool"); t && !t->is_null()) tool_name = ScalarText(*t);
      }
      if (!tool_name) {
        if (auto n = Field(m, "name"); n && !n->is_null()) tool_name = ScalarText(*n);
      }
      if (!tool_name && last_tool_calls) {
        auto calls = ArrayOf(*last_tool_calls);
        if (size_t(tool_index) <= calls.size()) {
          element fn = Field(calls.at(tool_index - 1).value_unsafe(), "function")
                           .value_or(calls.at(tool_index - 1).value_unsafe());
          if (auto n = Field(fn, "name"); n && !n->is_null()) tool_name = ScalarText(*n);
        }
      }
      if (!tool_name) {
        throw BadRequest("tool message " + std::to_string(tool_index) +
                         " has no tool_call_id matching a call, no name, and no preceding call to name it");
      }
      b.Open("message", {{"role", "tool"}, {"tool", *tool_name}, {"index", std::to_string(tool_index)}});
      b.Text(ContentText(Field(m, "content")));
      b.Close("message");
      b.EndOfMessage();
    } else if (role == "assistant") {
      auto calls = Field(m, "tool_calls");
      last_tool_calls = (calls && calls->is_array()) ? calls : std::nullopt;
      tool_index = 0;
      std::vector<std::pair<std::string, std::string>> attrs{{"role", "assistant"}};
      name_attr(attrs);
      b.Open("message", attrs);
      if (in.thinking) {
        // Preserved thinking: the think channel is always present in history.
        auto reasoning = Field(m, "reasoning_content");
        if (!Truthy(reasoning)) reasoning = Field(m, "reasoning");
        b.Open("think");
        if (reasoning && !reasoning->is_null()) b.Text(ContentText(reasoning));
        b.Close("think");
      }
      b.Open("response");
      b.Text(ContentText(Field(m, "content")));
      b.Close("response");
      if (last_tool_calls && ArrayOf(*last_tool_calls).size() > 0) {
        RenderToolCalls(b, *last_tool_calls);
      }
      b.Close("message");
      b.EndOfMessage();
    }
    // Any other role (developer, function, ...) is skipped, as the encoder does.
  }

  if (in.tool_choice && in.tool_choice->is_string()) {
    std::string_view choice = in.tool_choice->get_string().value_unsafe();
    if (choice == "required") {
      b.InternalSystem("tool-choice",
                       "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
    } else if (choice == "none") {
      b.InternalSystem("tool-choice",
                       "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");
    }
  } else if (in.tool_choice && in.tool_choice->is_object()) {
    element fn = Field(*in.tool_choice, "function").value_or(*in.tool_choice);
    auto name = StringField(fn, "name");
    if (!name) throw BadRequest("tool_choice object needs function.name");
    b.InternalSystem("tool-choice", "The system is invoked with `tool_choice=specified`.\nYou MUST call the tool `" +
                                        std::string(*name) + "` in the next message.");
  }

  if (in.response_format && !in.response_format->is_null()) {
    std::optional<std::string_view> type;
    if (in.response_format->is_string()) type = in.response_format->get_string().value_unsafe();
    else type = StringField(*in.response_format, "type");
    if (type == "json_object") {
      b.InternalSystem("response-format",
                       "The system is invoked with `response_format=json_object`.\nYour response must be raw "
                       "JSON data without markdown code blocks (```json) or any additional formatting.");
    } else if (type == "json_schema") {
      std::optional<element> schema = Field(*in.response_format, "json_schema");
      if (schema) {
        if (auto inner = Field(*schema, "schema")) schema = inner;
      } else {
        schema = Field(*in.response_format, "schema");
      }
      std::string json = "null";
      if (schema) {
        json.clear();
        AppendJson(json, *schema, true, true);
      }
      b.InternalSystem("response-format",
                       "The system is invoked with `response_format=json_schema`.\nYour response must be raw "
                       "JSON data without markdown code blocks (```json) or any additional formatting.\nThe "
                       "JSON data must match the following schema:\n```json\n" +
                           json + "\n```");
    }
  }

  if (in.add_generation_prompt) {
    b.Open("message", {{"role", "assistant"}});
    b.Open(in.thinking ? "think" : "response");
  }
  result.segments = b.Take();
  return result;
}

std::optional<element> Option(element root, std::optional<element> options, std::string_view key) {
  if (options) {
    if (auto v = Field(*options, key)) return v;
  }
  return Field(root, key);
}

}  // namespace

RenderedChat RenderChatRequestOrThrow(std::string_view request_json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(request_json);
  element root;
  if (auto err = parser.parse(padded).get(root); err != simdjson::SUCCESS) {
    throw BadRequest(std::string("request is not valid JSON: ") + simdjson::error_message(err));
  }
  if (!root.is_object()) throw BadRequest("request must be a JSON object");
  RenderInputs in;
  auto messages = Field(root, "messages");
  if (!messages || !messages->is_array()) throw BadRequest("request needs a \"messages\" list");
  in.messages = ArrayOf(*messages);
  std::optional<element> options = Field(root, "options");
  if (options && !options->is_object()) options.reset();
  if (auto t = Option(root, options, "thinking"); t && !t->is_null()) {
    if (!t->is_bool()) throw BadRequest("thinking must be true or false");
    in.thinking = t->get_bool().value_unsafe();
  }
  if (auto e = Option(root, options, "thinking_effort"); e && !e->is_null()) {
    if (!e->is_string()) throw BadRequest("thinking_effort must be a string: low, high or max");
    in.effort = std::string(e->get_string().value_unsafe());
  }
  if (auto g = Option(root, options, "add_generation_prompt"); g && !g->is_null()) {
    if (!g->is_bool()) throw BadRequest("add_generation_prompt must be true or false");
    in.add_generation_prompt = g->get_bool().value_unsafe();
  }
  in.tools = Option(root, options, "tools");
  in.tool_choice = Option(root, options, "tool_choice");
  in.response_format = Option(root, options, "response_format");
  return Render(in);
}

RenderedChat RenderChatOrThrow(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  // Build the request JSON and take the one rendering path.
  std::string json = "{\"messages\":[";
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i) json += ',';
    json += "{\"role\":";
    AppendJsonText(json, m.role);
    json += ",\"content\":";
    AppendJsonText(json, m.content);
    if (!m.reasoning_content.empty()) {
      json += ",\"reasoning_content\":";
      AppendJsonText(json, m.reasoning_content);
    }
    json += '}';
  }
  json += "],\"options\":{\"thinking\":";
  json += options.thinking ? "true" : "false";
  if (options.thinking_effort) {
    json += ",\"thinking_effort\":";
    AppendJsonText(json, *options.thinking_effort);
  }
  json += ",\"add_generation_prompt\":";
  json += options.add_generation_prompt ? "true" : "false";
  json += "}}";
  return RenderChatRequestOrThrow(json);
}

XtmlIds XtmlIds::FromTokenizerOrThrow(const Tokenizer& tok) {
  return XtmlIds{tok.SpecialIdOrThrow(kOpen), tok.SpecialIdOrThrow(kClose), tok.SpecialIdOrThrow(kSep),
                 tok.SpecialIdOrThrow(kEndOfMsg)};
}

std::vector<TokenId> EncodeChatSegments(const Tokenizer& tok, const std::vector<ChatSegment>& segments) {
  std::vector<TokenId> ids;
  for (const ChatSegment& s : segments) {
    if (s.allow_special) {
      ids.push_back(tok.SpecialIdOrThrow(s.text));
    } else {
      tok.EncodeAppend(s.text, false, ids);
    }
  }
  return ids;
}

// ---------------------------------------------------------------------------
// Stream parser

namespace {

struct TagHeader {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
};

std::string Unescape(std::string_view v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v.compare(i, 5, "&amp;") == 0) { out += '&'; i += 4; }
    else if (v.compare(i, 6, "&quot;") == 0) { out += '"'; i += 5; }
    else out += v[i];
  }
  return out;
}

// "call tool=\"x\" index=\"1\"" -> name + attributes; tolerant of junk.
TagHeader ParseHeader(std::string_view h) {
  TagHeader t;
  size_t i = 0;
  while (i < h.size() && h[i] != ' ') ++i;
  t.name = std::string(h.substr(0, i));
  while (i < h.size()) {
    while (i < h.size() && h[i] == ' ') ++i;
    size_t eq = h.find("=\"", i);
    if (eq == std::string_view::npos) break;
    size_t end = h.find('"', eq + 2);
    if (end == std::string_view::npos) break;
    t.attrs.emplace_back(std::string(h.substr(i, eq - i)), Unescape(h.substr(eq + 2, end - eq - 2)));
    i = end + 1;
  }
  return t;
}

std::string Attr(const TagHeader& t, std::string_view key) {
  for (auto& [k, v] : t.attrs) if (k == key) return v;
  return {};
}

}  // namespace

ChatStreamParser::ChatStreamParser(const Tokenizer& tok, Start start)
    : tok_(tok), ids_(XtmlIds::FromTokenizerOrThrow(tok)) {
  channel_ = start == Start::kThink ? Channel::kThink
             : start == Start::kResponse ? Channel::kResponse
                                         : Channel::kNone;
}

void ChatStreamParser::OnText(std::string_view bytes, ChatDelta& delta) {
  switch (channel_) {
    case Channel::kThink: {
      std::string t = reasoning_decoder_.Push(bytes);
      reasoning_ += t;
      delta.reasoning += t;
      break;
    }
    case Channel::kResponse:
    case Channel::kNone: {
      // Text outside any channel (no think/response tags at all) is the answer.
      std::string t = content_decoder_.Push(bytes);
      content_ += t;
      delta.content += t;
      break;
    }
    case Channel::kArgument:
    case Channel::kJson:
      if (!arg_drop_) OnArgumentText(arg_decoder_.Push(bytes), delta);
      break;
  }
}

void ChatStreamParser::EmitArguments(std::string piece, ChatDelta& delta) {
  if (piece.empty()) return;
  call_stream_ += piece;
  if (!delta.tool_calls.empty() && delta.tool_calls.back().call == call_pos_ &&
      !delta.tool_calls.back().begin) {
    delta.tool_calls.back().arguments += piece;
  } else {
    delta.tool_calls.push_back({call_pos_, false, {}, std::move(piece)});
  }
}

// Whole characters of an argument value or json block, as they arrive.
void ChatStreamParser::OnArgumentText(std::string_view text, ChatDelta& delta) {
  if (text.empty()) return;
  if (channel_ == Channel::kJson) {
    EmitArguments(std::string(text), delta);
  } else if (arg_string_) {
    std::string quoted;
    AppendJsonText(quoted, text);  // "..." : keep the escaped body only
    EmitArguments(quoted.substr(1, quoted.size() - 2), delta);
  } else {
    // JSON text already; trimmed like Strip(): leading whitespace dropped,
    // inner whitespace held until something follows it.
    std::string out;
    for (char ch : text) {
      const bool space = ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
      if (space) {
        if (arg_started_) arg_ws_ += ch;
        continue;
      }
      out += arg_ws_;
      arg_ws_.clear();
      out += ch;
      arg_started_ = true;
    }
    EmitArguments(std::move(out), delta);
  }
}

void ChatStreamParser::CloseArgument(ChatDelta& delta) {
  if (!arg_drop_) OnArgumentText(arg_decoder_.Flush(), delta);
  if (channel_ == Channel::kArgument && !arg_drop_) {
    if (arg_string_) EmitArguments("\"", delta);
    else if (!arg_started_) EmitArguments("null", delta);
  }
  arg_decoder_ = Utf8StreamDecoder();
  arg_ws_.clear();
  arg_drop_ = false;
  channel_ = Channel::kNone;
}

void ChatStreamParser::FinishCall(ChatDelta& delta) {
  if (!in_call_) return;
  if (channel_ == Channel::kArgument || channel_ == Channel::kJson) CloseArgument(delta);
  if (call_args_ > 0) EmitArguments("}", delta);
  else if (call_stream_.empty()) EmitArguments("{}", delta);
  call_.arguments_json = std::move(call_stream_);
  tool_calls_.push_back(std::move(call_));
  call_ = ToolCall{};
  call_stream_.clear();
  call_args_ = 0;
  call_json_ = false;
  in_call_ = false;
}

void ChatStreamParser::OnTag(bool is_open, std::string_view header_text, ChatDelta& delta) {
  TagHeader h = ParseHeader(header_text);
  const std::string& tag = h.name;
  if (is_open) {
    if (tag == "think") {
      if (channel_ == Channel::kResponse) warnings_.push_back("think opened inside the response");
      channel_ = Channel::kThink;
    } else if (tag == "response") {
      if (channel_ == Channel::kThink) warnings_.push_back("response opened before think was closed");
      channel_ = Channel::kResponse;
    } else if (tag == "tools") {
      channel_ = Channel::kNone;
    } else if (tag == "call") {
      FinishCall(delta);
      in_call_ = true;
      call_.name = Attr(h, "tool");
      std::string index = Attr(h, "index");
      call_.index = index.empty() ? int(tool_calls_.size()) + 1 : std::atoi(index.c_str());
      call_pos_ = int(tool_calls_.size());
      delta.tool_calls.push_back({call_pos_, true, call_.name, {}});
      channel_ = Channel::kNone;
    } else if ((tag == "argument" || tag == "json") && in_call_) {
      if (channel_ == Channel::kArgument || channel_ == Channel::kJson) CloseArgument(delta);
      const bool json = tag == "json";
      channel_ = json ? Channel::kJson : Channel::kArgument;
      // One call carries either <argument>s or one <json> block; the first form wins.
      arg_drop_ = call_json_ || (json && call_args_ > 0);
      if (arg_drop_) {
        warnings_.push_back("call mixes <argument> and <json>; '" + tag + "' ignored");
        return;
      }
      if (json) {
        call_json_ = true;
        return;
      }
      const std::string type = Attr(h, "type");
      arg_string_ = type == "string" || type.empty();
      arg_started_ = false;
      std::string piece = call_args_++ == 0 ? "{" : ",";
      AppendJsonText(piece, Attr(h, "key"));
      piece += arg_string_ ? ":\"" : ":";
      EmitArguments(std::move(piece), delta);
    } else if (tag == "message") {
      channel_ = Channel::kNone;
    } else {
      warnings_.push_back("unknown tag '" + tag + "' opened");
    }
    return;
  }
  // Close tags.
  if (tag == "think") {
    if (channel_ != Channel::kThink) {
      warnings_.push_back("think closed while not open");
      return;
    }
    channel_ = Channel::kNone;
  } else if (tag == "response") {
    if (channel_ != Channel::kResponse) warnings_.push_back("response closed while not open");
    if (channel_ == Channel::kResponse) channel_ = Channel::kNone;
  } else if ((tag == "argument" && channel_ == Channel::kArgument) ||
             (tag == "json" && channel_ == Channel::kJson)) {
    CloseArgument(delta);
  } else if (tag == "call") {
    FinishCall(delta);
  } else if (tag == "tools" || tag == "message") {
    FinishCall(delta);
    channel_ = Channel::kNone;
  } else {
    warnings_.push_back("unexpected close of '" + tag + "'");
  }
}

ChatDelta ChatStreamParser::Push(TokenId id) {
  ChatDelta delta;
  if (ended_) return delta;
  if (id == ids_.end_of_msg) {
    ended_ = true;
    ChatDelta rest = Finish();
    return rest;
  }
  if (id == ids_.open || id == ids_.close) {
    if (tag_mode_ != TagMode::kNone) warnings_.push_back("tag '" + tag_header_ + "' never reached <|sep|>");
    tag_mode_ = id == ids_.open ? TagMode::kOpen : TagMode::kClose;
    tag_header_.clear();
    return delta;
  }
  if (id == ids_.sep) {
    if (tag_mode_ == TagMode::kNone) {
      warnings_.push_back("stray <|sep|>");
      return delta;
    }
    bool is_open = tag_mode_ == TagMode::kOpen;
    tag_mode_ = TagMode::kNone;
    // Flush held-back bytes of the channel being left before switching.
    OnTag(is_open, tag_header_, delta);
    return delta;
  }
  if (tok_.IsSpecial(id)) {
    warnings_.push_back("special token '" + std::string(tok_.TokenBytes(id)) + "' in output dropped");
    return delta;
  }
  std::string_view bytes = tok_.TokenBytes(id);
  if (tag_mode_ != TagMode::kNone) {
    tag_header_ += bytes;
    if (tag_header_.size() > 4096) {  // runaway header: give it back as text
      warnings_.push_back("tag header too long; treated as text");
      tag_mode_ = TagMode::kNone;
      std::string text = std::move(tag_header_);
      tag_header_.clear();
      OnText(text, delta);
    }
    return delta;
  }
  OnText(bytes, delta);
  return delta;
}

ChatDelta ChatStreamParser::Finish() {
  ChatDelta delta;
  if (tag_mode_ != TagMode::kNone) {
    warnings_.push_back("output ended inside a tag");
    tag_mode_ = TagMode::kNone;
  }
  std::string r = reasoning_decoder_.Flush(), c = content_decoder_.Flush();
  reasoning_ += r;
  content_ += c;
  delta.reasoning = std::move(r);
  delta.content = std::move(c);
  if (channel_ == Channel::kArgument || channel_ == Channel::kJson) warnings_.push_back("tool call truncated");
  if (in_call_) FinishCall(delta);
  if (!ended_) warnings_.push_back("output ended without <|end_of_msg|>");
  channel_ = Channel::kNone;
  return delta;
}

}  // namespace k3::tok
