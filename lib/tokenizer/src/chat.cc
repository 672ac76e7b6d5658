// XTML rendering (the rules of Moonshot's encoding_k3.py, restated; see
// docs/tokenizer.md "Chat format") and the generated-output stream parser.
//
// The renderer reads the request with Python's json.loads semantics (py_json.h)
// because the encoder's behaviour is defined on Python values: str(None) is
// "None", integers have any size, `x or y` tests truthiness, dict.get(k, d)
// returns a present null. Each step below names the encoder function it follows.
#include "k3/tokenizer/chat.h"

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "py_json.h"

namespace k3::tok {
namespace {

constexpr const char* kOpen = "<|open|>";
constexpr const char* kClose = "<|close|>";
constexpr const char* kSep = "<|sep|>";
constexpr const char* kEndOfMsg = "<|end_of_msg|>";

using py::Value;
using Kind = py::Value::Kind;
using Attrs = std::vector<std::pair<std::string, std::string>>;

Error BadRequest(const std::string& detail) { return Error(ErrorCode::kInvalidArgument, detail); }

// A JSON string literal, non-ASCII kept as UTF-8 byte for byte (ensure_ascii=False).
void AppendJsonText(std::string& out, std::string_view s) {
  AppendJsonString(out, s, InvalidUtf8::kPassThrough);
}

// "message 3" for errors (1-based, as a person counts).
std::string Where(size_t message_idx) { return "message " + std::to_string(message_idx + 1); }

class Builder {
 public:
  void Special(const char* marker) { segments_.push_back({marker, true}); }
  void Text(std::string_view text) {
    if (!text.empty()) segments_.push_back({std::string(text), false});
  }
  // _escape_attr_value: only & and " (< and > stay; the brackets are tokens).
  static std::string Escape(std::string_view v) {
    std::string out;
    for (char c : v) {
      if (c == '&') out += "&amp;";
      else if (c == '"') out += "&quot;";
      else out += c;
    }
    return out;
  }
  void Open(std::string_view tag, const Attrs& attrs = {}) {
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
  // _internal_system_message: an encoder-written system message.
  void InternalSystem(std::string_view type, std::string_view body) {
    Open("message", {{"role", "system"}, {"type", std::string(type)}});
    Text(py::Strip(body));
    Close("message");
    EndOfMessage();
  }
  // ASCII whitespace trim, for the stream parser's argument values.
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

// ---------------------------------------------------------------------------
// Request options (_normalize_vllm_chat_options and build_chat_segments' kwargs)

struct RenderOptions {
  bool thinking = true;
  std::string effort = "max";
  const Value* tools = nullptr;
  const Value* tool_choice = nullptr;
  const Value* response_format = nullptr;
  const Value* response_schema = nullptr;
  bool add_generation_prompt = true;
};

// The effort is checked whether or not thinking is on, as the encoder does.
void ValidateEffort(const Value& effort) {
  if (effort.Equals("low") || effort.Equals("high") || effort.Equals("max")) return;
  std::string shown;
  py::AppendRepr(shown, effort);
  throw BadRequest("thinking_effort must be one of low, high, max (got " + shown +
                   "); Kimi K3's encoder refuses anything else, \"medium\" included");
}

// extract_response_schema: json_schema.schema, else json_schema.json_schema,
// else json_schema itself; a response_format without json_schema has none.
const Value* ExtractResponseSchema(const Value* rf) {
  if (rf == nullptr || rf->is_null()) return nullptr;
  const Value* js = rf->Get("json_schema");
  if (js == nullptr || js->is_null()) return nullptr;
  if (js->is_object()) {
    if (const Value* s = js->Get("schema")) return s;
    if (const Value* s = js->Get("json_schema")) return s;
  }
  return js;
}

RenderOptions ResolveOptions(const Value& root) {
  const Value* options = root.Get("options");
  if (options && !options->is_object()) options = nullptr;
  // Option keys live in "options" (the oracle cases' shape) or at the top level
  // (an OpenAI request body); a key present in "options" wins, even as null.
  auto option = [&](std::string_view key) -> const Value* {
    if (options) {
      if (const Value* v = options->Get(key)) return v;
    }
    return root.Get(key);
  };
  auto present = [](const Value* v) { return v != nullptr && !v->is_null(); };
  RenderOptions o;
  const Value* thinking = option("thinking");
  const Value* enable_thinking = option("enable_thinking");
  const Value* reasoning_effort = option("reasoning_effort");
  const Value* effort = option("thinking_effort");
  o.thinking = present(thinking) ? py::Truthy(*thinking) : present(enable_thinking) ? py::Truthy(*enable_thinking) : true;
  if (reasoning_effort && reasoning_effort->Equals("none")) {
    o.thinking = false;
  } else if (!present(effort) && present(reasoning_effort)) {
    effort = reasoning_effort;
  }
  if (present(effort)) {
    ValidateEffort(*effort);
    o.effort = effort->text;
  }
  o.tools = option("tools");
  o.tool_choice = option("tool_choice");
  o.response_format = option("response_format");
  if (const Value* schema = option("response_schema")) {
    o.response_schema = schema;
  } else {
    o.response_schema = ExtractResponseSchema(o.response_format);
  }
  // add_generation_prompt=None is falsy: a present null turns the prompt off.
  if (const Value* g = option("add_generation_prompt")) o.add_generation_prompt = py::Truthy(*g);
  return o;
}

// ---------------------------------------------------------------------------
// Messages

// tool_call.get("function", tool_call): a present key wins, whatever its value.
const Value& FunctionOf(const Value& call) {
  const Value* fn = call.Get("function");
  return fn ? *fn : call;
}

// normalize_tool_arguments: an object, a JSON object string, or a string that
// is not JSON at all (kept raw for a json block); None and blank are empty.
struct Arguments {
  Value parsed;                          // the object, when arguments is a string
  const Value* object = nullptr;         // the object to render (may be &parsed)
  std::optional<std::string> json_block;
};

Arguments NormalizeArguments(const Value* args, const std::string& where) {
  Arguments out;
  if (args == nullptr || args->is_null()) return out;
  if (args->is_object()) {
    out.object = args;
    return out;
  }
  if (!args->is_string()) {
    throw BadRequest(where + ": tool call arguments must be an object or a JSON object string");
  }
  if (py::Strip(args->text).empty()) return out;
  std::string error;
  if (!py::Parse(args->text, out.parsed, error)) {
    out.json_block = args->text;  // not JSON: the model sees back what it wrote
    return out;
  }
  if (!out.parsed.is_object()) throw BadRequest(where + ": tool call arguments must be a JSON object");
  out.object = &out.parsed;
  return out;
}

// normalize_conversation: every message's tool_calls are iterated and their
// arguments normalized before anything renders, user messages included.
void ValidateToolCalls(const Value& messages) {
  for (size_t i = 0; i < messages.items.size(); ++i) {
    const Value* calls = messages.items[i].Get("tool_calls");
    if (!py::Truthy(calls)) continue;
    if (calls->is(Kind::kInt) || calls->is(Kind::kFloat) || calls->is(Kind::kBool)) {
      throw BadRequest(Where(i) + ": tool_calls must be a list");
    }
    if (!calls->is_array()) continue;  // a str or dict iterates; rendering refuses it
    for (size_t c = 0; c < calls->items.size(); ++c) {
      const Value& call = calls->items[c];
      if (!call.is_object()) continue;
      const Value* fn = call.Get("function");
      const Value* args = fn && fn->is_object() ? fn->Get("arguments") : call.Get("arguments");
      NormalizeArguments(args, Where(i) + " tool call " + std::to_string(c + 1));
    }
  }
}

// _render_content_segments: a str, None, or an iterable of parts; each part is
// its own segment (no joining). A part that is not an image is read as text,
// whatever its type; part["type"] and part["text"] must exist.
void RenderContent(Builder& b, const Value* content, const std::string& where) {
  if (content == nullptr || content->is_null()) return;
  if (content->is_string()) {
    b.Text(content->text);
    return;
  }
  if (!content->is_array()) {
    // A dict iterates its keys (str parts), a number does not iterate: both
    // are TypeErrors in the encoder.
    throw BadRequest(where + ": content must be a string, null or a list of parts");
  }
  for (size_t p = 0; p < content->items.size(); ++p) {
    const Value& part = content->items[p];
    std::string at = where + " content part " + std::to_string(p + 1);
    if (!part.is_object()) throw BadRequest(at + " must be an object with \"type\" and \"text\"");
    const Value* type = part.Get("type");
    if (type == nullptr) throw BadRequest(at + " has no \"type\"");
    if (type->Equals("image") || type->Equals("image_url")) {
      throw Error(ErrorCode::kUnsupported, at + " is an image; this engine is text-only");
    }
    const Value* text = part.Get("text");
    if (text == nullptr) throw BadRequest(at + " has no \"text\"");
    b.Text(py::Str(*text));
  }
}

// _render_tool_declare: the tools, deep-sorted by key, as compact JSON.
void RenderToolDeclare(Builder& b, const Value& tools, bool dynamic) {
  std::string json;
  py::AppendDumps(json, tools, /*sort_keys=*/true, /*compact=*/true);
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

// _xtml_type
const char* XtmlType(const Value& v) {
  switch (v.kind) {
    case Kind::kBool: return "boolean";
    case Kind::kNull: return "null";
    case Kind::kInt:
    case Kind::kFloat: return "number";
    case Kind::kString: return "string";
    case Kind::kObject: return "object";
    case Kind::kArray: return "array";
  }
  return "array";
}

void RenderToolCalls(Builder& b, const Value& calls, const std::string& where) {
  if (!calls.is_array()) throw BadRequest(where + ": tool_calls must be a list of objects");
  b.Open("tools");
  for (size_t c = 0; c < calls.items.size(); ++c) {
    std::string at = where + " tool call " + std::to_string(c + 1);
    const Value& call = calls.items[c];
    if (!call.is_object()) throw BadRequest(at + " must be an object");
    const Value& fn = FunctionOf(call);
    if (!fn.is_object()) throw BadRequest(at + ": function must be an object");
    const Value* name = fn.Get("name");
    if (name == nullptr) throw BadRequest(at + " has no function name");
    b.Open("call", {{"tool", py::Str(*name)}, {"index", std::to_string(c + 1)}});
    Arguments args = NormalizeArguments(fn.Get("arguments"), at);
    if (args.json_block) {
      b.Open("json", {{"type", "object"}});
      b.Text(*args.json_block);
      b.Close("json");
    } else if (args.object) {
      for (const auto& [key, value] : args.object->fields) {
        b.Open("argument", {{"key", key}, {"type", XtmlType(value)}});
        // _xtml_value: a string raw, anything else as json.dumps defaults.
        std::string text;
        if (value.is_string()) text = value.text;
        else py::AppendDumps(text, value, false, false);
        b.Text(text);
        b.Close("argument");
      }
    }
    b.Close("call");
  }
  b.Close("tools");
}

// normalize_xtml_tool_result_messages: each run of tool messages is put back
// into the order of the preceding assistant's tool_calls (by tool_call_id, as
// str()) and named after its call; a run with any unmatched id is left as it is.
struct MessageRef {
  const Value* msg;
  size_t original_idx;
  const Value* resolved_name = nullptr;  // the matched call's function name
};

std::vector<MessageRef> ReorderToolResults(const Value& messages) {
  const auto& all = messages.items;
  std::vector<MessageRef> out;
  std::map<std::string, std::pair<size_t, const Value*>> index;  // id -> (position, name)
  auto role_is = [](const Value& m, std::string_view r) {
    const Value* role = m.Get("role");
    return role && role->Equals(r);
  };
  size_t i = 0;
  while (i < all.size()) {
    if (role_is(all[i], "assistant")) {
      index.clear();
      const Value* calls = all[i].Get("tool_calls");
      if (calls && calls->is_array()) {
        for (size_t p = 0; p < calls->items.size(); ++p) {
          const Value& call = calls->items[p];
          const Value* id = call.Get("id");
          if (id == nullptr || id->is_null()) continue;
          const Value* fn = call.Get("function");
          const Value* name = fn && fn->is_object() ? fn->Get("name") : call.Get("name");
          index.emplace(py::Str(*id), std::make_pair(p + 1, name));  // first occurrence wins
        }
      }
    }
    if (!role_is(all[i], "tool")) {
      out.push_back({&all[i], i});
      ++i;
      continue;
    }
    struct Item {
      size_t position, offset;
      MessageRef ref;
    };
    std::vector<Item> run;
    bool unresolved = false;
    for (size_t offset = 0; i < all.size() && role_is(all[i], "tool"); ++i, ++offset) {
      // tool_message.get("tool_call_id", tool_message.get("id"))
      const Value* id = all[i].Get("tool_call_id");
      if (id == nullptr) id = all[i].Get("id");
      auto it = (id && !id->is_null()) ? index.find(py::Str(*id)) : index.end();
      if (it == index.end()) {
        unresolved = true;
        run.push_back({0, offset, {&all[i], i}});
      } else {
        const Value* name = it->second.second;
        run.push_back({it->second.first, offset, {&all[i], i, name && !name->is_null() ? name : nullptr}});
      }
    }
    if (unresolved) {
      for (auto& item : run) out.push_back({item.ref.msg, item.ref.original_idx});
      continue;
    }
    std::stable_sort(run.begin(), run.end(), [](const Item& a, const Item& b) {
      return std::tie(a.position, a.offset) < std::tie(b.position, b.offset);
    });
    for (auto& item : run) out.push_back(item.ref);
  }
  return out;
}

struct History {
  const Value* last_tool_calls = nullptr;  // the latest assistant's tool_calls
  size_t tool_index = 0;
};

void RenderToolMessage(Builder& b, const MessageRef& ref, History& h, const std::string& where) {
  const Value& m = *ref.msg;
  ++h.tool_index;
  // message.get("tool", message.get("name")), unless the reorder matched a call.
  const Value* name = ref.resolved_name;
  if (name == nullptr) {
    name = m.Get("tool");
    if (name == nullptr) name = m.Get("name");
  }
  if ((name == nullptr || name->is_null()) && h.last_tool_calls && !h.last_tool_calls->is_null()) {
    const Value& calls = *h.last_tool_calls;
    size_t n = calls.is_array() ? calls.items.size() : calls.is_object() ? calls.fields.size()
               : calls.is_string() ? calls.text.size() : SIZE_MAX;
    if (n == SIZE_MAX) throw BadRequest(where + ": the preceding assistant's tool_calls is not a list");
    if (h.tool_index <= n && calls.is_array()) {
      const Value& call = calls.items[h.tool_index - 1];
      const Value& fn = FunctionOf(call);
      name = fn.Get("name");
      if (name == nullptr) throw BadRequest(where + ": the matching tool call has no function name");
    }
  }
  if (name == nullptr || name->is_null()) {
    throw BadRequest(where + ": a tool message needs a resolvable tool name: carry \"tool\" or \"name\", "
                             "or follow an assistant whose tool_calls it answers in order");
  }
  b.Open("message", {{"role", "tool"}, {"tool", py::Str(*name)}, {"index", std::to_string(h.tool_index)}});
  RenderContent(b, m.Get("content"), where);
  b.Close("message");
  b.EndOfMessage();
}

// _render_assistant_segments
void RenderAssistant(Builder& b, const Value& m, bool thinking, History& h, const std::string& where) {
  h.last_tool_calls = m.Get("tool_calls");
  h.tool_index = 0;
  Attrs attrs{{"role", "assistant"}};
  if (const Value* name = m.Get("name"); py::Truthy(name)) attrs.push_back({"name", py::Str(*name)});
  b.Open("message", attrs);
  if (thinking) {
    // The think channel is structural: always present in thinking mode.
    // `reasoning_content or reasoning`; a text that is only whitespace (by
    // str.strip(), Unicode spaces included) leaves the channel empty, any other
    // is written as it is.
    const Value* reasoning = m.Get("reasoning_content");
    if (!py::Truthy(reasoning)) reasoning = m.Get("reasoning");
    b.Open("think");
    if (reasoning && !reasoning->is_null()) {
      std::string text = py::Str(*reasoning);
      if (!py::Strip(text).empty()) b.Text(text);
    }
    b.Close("think");
  }
  b.Open("response");
  RenderContent(b, m.Get("content"), where);
  b.Close("response");
  if (py::Truthy(h.last_tool_calls)) RenderToolCalls(b, *h.last_tool_calls, where);
  b.Close("message");
  b.EndOfMessage();
}

void RenderMessages(Builder& b, const Value& messages, bool thinking) {
  History h;
  for (const MessageRef& ref : ReorderToolResults(messages)) {
    const Value& m = *ref.msg;
    std::string where = Where(ref.original_idx);
    if (!m.is_object()) continue;  // the encoder skips anything that is not a dict
    const Value* role = m.Get("role");
    if (role == nullptr) throw BadRequest(where + " has no \"role\"");
    if (role->Equals("user") || (role->Equals("system") && !py::Truthy(m.Get("tools")))) {
      Attrs attrs{{"role", role->text}};
      if (const Value* name = m.Get("name"); py::Truthy(name)) attrs.push_back({"name", py::Str(*name)});
      b.Open("message", attrs);
      RenderContent(b, m.Get("content"), where);
      b.Close("message");
      b.EndOfMessage();
    } else if (role->Equals("system")) {
      RenderToolDeclare(b, *m.Get("tools"), /*dynamic=*/true);
    } else if (role->Equals("tool")) {
      RenderToolMessage(b, ref, h, where);
    } else if (role->Equals("assistant")) {
      RenderAssistant(b, m, thinking, h, where);
    }
    // Any other role (developer, function, a non-string ...) is skipped, as the encoder does.
  }
}

void RenderTrailer(Builder& b, const RenderOptions& o) {
  if (o.tool_choice && o.tool_choice->Equals("required")) {
    b.InternalSystem("tool-choice",
                     "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
  } else if (o.tool_choice && o.tool_choice->Equals("none")) {
    b.InternalSystem("tool-choice",
                     "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");
  }
  // rf.get("type", rf) for a dict, rf itself otherwise.
  const Value* rf_type = o.response_format;
  if (rf_type && rf_type->is_object()) {
    const Value* t = rf_type->Get("type");
    if (t) rf_type = t;
  }
  const char* kRaw = "Your response must be raw JSON data without markdown code blocks (```json) or any additional "
                     "formatting.";
  if (rf_type && rf_type->Equals("json_object")) {
    b.InternalSystem("response-format", std::string("The system is invoked with `response_format=json_object`.\n") + kRaw);
  } else if (rf_type && rf_type->Equals("json_schema")) {
    std::string schema = "null";
    if (o.response_schema) {
      schema.clear();
      py::AppendDumps(schema, *o.response_schema, /*sort_keys=*/true, /*compact=*/true);
    }
    b.InternalSystem("response-format", std::string("The system is invoked with `response_format=json_schema`.\n") +
                                            kRaw + "\nThe JSON data must match the following schema:\n```json\n" +
                                            schema + "\n```");
  }
}

RenderedChat Render(const Value& root) {
  RenderOptions o = ResolveOptions(root);
  const Value* messages = root.Get("messages");
  if (messages == nullptr || !messages->is_array()) throw BadRequest("request needs a \"messages\" list");
  ValidateToolCalls(*messages);

  RenderedChat result;
  result.resolved.thinking = o.thinking;
  if (o.thinking) result.resolved.thinking_effort = o.effort;
  Builder b;
  if (py::Truthy(o.tools)) RenderToolDeclare(b, *o.tools, /*dynamic=*/false);
  if (o.thinking) {
    b.InternalSystem("thinking-effort",
                     "`thinking_effort` guides on how much to think in your thinking channel (not "
                     "including the response channel), supported values include `low`, `medium`, "
                     "`high`, and `max`.\nNow the system is invoked with `thinking_effort=" +
                         o.effort + "`.");
  }
  RenderMessages(b, *messages, o.thinking);
  RenderTrailer(b, o);
  if (o.add_generation_prompt) {
    b.Open("message", {{"role", "assistant"}});
    b.Open(o.thinking ? "think" : "response");
  }
  result.segments = b.Take();
  return result;
}

}  // namespace

RenderedChat RenderChatRequestOrThrow(std::string_view request_json) {
  Value root;
  std::string error;
  if (!py::Parse(request_json, root, error)) throw BadRequest("request is not valid JSON: " + error);
  if (!root.is_object()) throw BadRequest("request must be a JSON object");
  return Render(root);
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
