// The Messages request: validation with Anthropic's field names, then the
// mapping to the equivalent chat.completions body, which the OpenAI parser
// (request.cc) resolves and renders. So both APIs share one sampling policy,
// one renderer and one set of K3 rules, and a Messages request renders to the
// ids of its OpenAI twin (messages_test.cc checks that). docs/server.md.
#include "k3/server/messages.h"

#include <simdjson.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "json_node.h"
#include "k3/core/json_writer.h"
#include "request_body.h"

namespace k3::server {
namespace {

using namespace json_node;  // NOLINT: the parser's vocabulary
using simdjson::dom::element;

std::string_view BlockType(const Node& block) { return TypeOf(block); }

// Anthropic's tool-name rule ([A-Za-z0-9_-], 1..128) within Kimi K3's (a
// letter or '_' first), so every name that passes also renders.
void CheckToolName(const Node& n) {
  std::string_view name = Text(n);
  bool ok = !name.empty() && name.size() <= 128;
  for (size_t i = 0; ok && i < name.size(); ++i) {
    char c = name[i];
    bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    bool digit = (c >= '0' && c <= '9') || c == '-';
    ok = letter || (digit && i > 0);
  }
  if (!ok) {
    ThrowBadParam(n.path, n.path + " " + Shown(name) +
                              " is invalid: use 1..128 letters, digits, '_' or '-', starting with a letter or '_'");
  }
}

// The raw text of every input_schema and tool_use input, so the OpenAI twin
// carries the client's own bytes (numbers included) as request.cc does.
struct RawSpans {
  std::vector<std::string_view> schemas;                      // by tools index
  std::map<std::pair<size_t, size_t>, std::string_view> inputs;  // (message, block)
};

std::string_view RawObject(simdjson::ondemand::value v) {
  simdjson::ondemand::object o;
  std::string_view raw;
  if (v.get_object().get(o) != simdjson::SUCCESS || o.raw_json().get(raw) != simdjson::SUCCESS) return {};
  return raw;
}

// The body was validated by the DOM parser already; an on-demand error here
// only leaves a span empty, and the caller falls back to the DOM's text.
RawSpans CollectRawSpans(const simdjson::padded_string& padded) {
  RawSpans spans;
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  simdjson::ondemand::object root;
  if (parser.iterate(padded).get(doc) != simdjson::SUCCESS || doc.get_object().get(root) != simdjson::SUCCESS) {
    return spans;
  }
  bool seen_tools = false, seen_messages = false;  // the first of duplicate keys, as the DOM reads them
  for (auto field : root) {
    std::string_view key;
    simdjson::ondemand::array list;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS) return spans;
    bool tools = key == "tools" && !std::exchange(seen_tools, true);
    bool messages = key == "messages" && !std::exchange(seen_messages, true);
    if ((!tools && !messages) || field.value().get_array().get(list) != simdjson::SUCCESS) continue;
    size_t i = 0;
    for (auto item : list) {
      simdjson::ondemand::object obj;
      if (item.get_object().get(obj) != simdjson::SUCCESS) return spans;
      if (tools) spans.schemas.emplace_back();
      bool seen_inner = false;
      for (auto f : obj) {
        if (f.unescaped_key().get(key) != simdjson::SUCCESS) return spans;
        if (tools && key == "input_schema" && !std::exchange(seen_inner, true)) spans.schemas.back() = RawObject(f.value());
        if (!messages || key != "content" || std::exchange(seen_inner, true)) continue;
        simdjson::ondemand::array blocks;
        if (f.value().get_array().get(blocks) != simdjson::SUCCESS) continue;
        size_t j = 0;
        for (auto b : blocks) {
          simdjson::ondemand::object block;
          if (b.get_object().get(block) != simdjson::SUCCESS) return spans;
          bool seen_input = false;
          for (auto bf : block) {
            if (bf.unescaped_key().get(key) != simdjson::SUCCESS) return spans;
            if (key == "input" && !std::exchange(seen_input, true)) spans.inputs[{i, j}] = RawObject(bf.value());
          }
          ++j;
        }
      }
      ++i;
    }
  }
  return spans;
}

std::string RawOr(std::string_view raw, element v) {
  if (!raw.empty()) return std::string(raw);
  return simdjson::minify(v);
}

std::string_view TextBlockText(const Node& block) { return Text(Need(block, "text")); }

[[noreturn]] void RefuseBlock(const Node& block, std::string_view type, std::string_view role) {
  std::string p = Child(block.path, "type");
  if (type == "image" || type == "document" || type == "search_result" || type == "container_upload") {
    Unsupported(p, p + " " + Shown(type) + " is not supported: k3 serves text only");
  }
  if (type == "server_tool_use" || type == "web_search_tool_result" || type == "web_fetch_tool_result" ||
      type == "code_execution_tool_result" || type == "mcp_tool_use" || type == "mcp_tool_result") {
    Unsupported(p, p + " " + Shown(type) + " is not supported: k3 runs no server tools");
  }
  ThrowBadParam(p, p + " " + Shown(type) + " is not a content block a " + std::string(role) + " message may carry");
}

// A tool_result's content: a string or text blocks; is_error adds a leading
// "Error: " part (chat messages have no such flag).
void ToolResultContent(JsonWriter& j, const Node& block) {
  bool is_error = false;
  if (auto e = Member(block, "is_error")) is_error = Flag(*e);
  auto content = Member(block, "content");
  j.Key("content");
  if (!is_error && (!content || content->v.is_string())) {
    j.String(content ? Text(*content) : std::string_view());
    return;
  }
  j.BeginArray();
  if (is_error) TextPart(j, "Error: ");
  if (content && content->v.is_string()) {
    TextPart(j, Text(*content));
  } else if (content) {
    for (const Node& part : Items(*content, "a string or an array of text blocks")) {
      std::string_view type = BlockType(part);
      if (type != "text") RefuseBlock(part, type, "tool_result");
      TextPart(j, TextBlockText(part));
    }
  }
  j.EndArray();
}

struct Mapper {
  const ApiPolicy& policy;
  const RawSpans& spans;
  std::set<std::string, std::less<>> tool_names;
  JsonWriter messages;  // the chat messages array

  void System(const Node& system) {
    if (system.v.is_string()) {
      if (Text(system).empty()) return;
      messages.BeginObject().Field("role", "system").Field("content", Text(system)).EndObject();
      return;
    }
    std::vector<Node> blocks = Items(system, "a string or an array of text blocks");
    if (blocks.empty()) return;
    messages.BeginObject().Field("role", "system").Key("content").BeginArray();
    for (const Node& b : blocks) {
      std::string_view type = BlockType(b);
      if (type != "text") RefuseBlock(b, type, "system");
      TextPart(messages, TextBlockText(b));
    }
    messages.EndArray().EndObject();
  }

  // User turns: runs of text blocks become user messages, each tool_result a
  // tool message, in order. `calls` are the ids the preceding assistant made.
  void User(const Node& content, const std::set<std::string, std::less<>>& calls) {
    if (content.v.is_string()) {
      messages.BeginObject().Field("role", "user").Field("content", Text(content)).EndObject();
      return;
    }
    std::vector<Node> blocks = Items(content, "a string or an array of content blocks");
    if (blocks.empty()) ThrowBadParam(content.path, content.path + " must not be empty");
    bool text_open = false;
    auto close_text = [&] {
      if (!text_open) return;
      messages.EndArray().EndObject();
      text_open = false;
    };
    for (const Node& b : blocks) {
      std::string_view type = BlockType(b);
      if (type == "text") {
        if (!text_open) {
          messages.BeginObject().Field("role", "user").Key("content").BeginArray();
          text_open = true;
        }
        TextPart(messages, TextBlockText(b));
      } else if (type == "tool_result") {
        close_text();
        Node id = Need(b, "tool_use_id");
        std::string_view tool_use_id = Text(id);
        if (!calls.count(tool_use_id)) {
          ThrowBadParam(id.path, id.path + " " + Shown(tool_use_id) +
                                     " answers no tool_use block of the assistant message before it");
        }
        messages.BeginObject().Field("role", "tool").Field("tool_call_id", tool_use_id);
        ToolResultContent(messages, b);
        messages.EndObject();
      } else {
        RefuseBlock(b, type, "user");
      }
    }
    close_text();
  }

  // Assistant turns: thinking -> reasoning_content, text -> content parts,
  // tool_use -> tool_calls (redacted_thinking cannot be read back and is left
  // out). Returns the tool_use ids, which the next user turn may answer.
  std::set<std::string, std::less<>> Assistant(const Node& content, size_t message_idx) {
    std::set<std::string, std::less<>> ids;
    if (content.v.is_string()) {
      messages.BeginObject().Field("role", "assistant").Field("content", Text(content)).EndObject();
      return ids;
    }
    std::vector<Node> blocks = Items(content, "a string or an array of content blocks");
    std::string reasoning;
    bool has_reasoning = false;
    std::vector<std::string_view> texts;
    JsonWriter calls;
    calls.BeginArray();
    size_t j = 0;
    for (const Node& b : blocks) {
      std::string_view type = BlockType(b);
      if (type == "text") {
        texts.push_back(TextBlockText(b));
      } else if (type == "thinking") {
        reasoning += Text(Need(b, "thinking"));
        has_reasoning = true;
        if (auto sig = Member(b, "signature")) Text(*sig);  // accepted, not checked
      } else if (type == "redacted_thinking") {
        Text(Need(b, "data"));
      } else if (type == "tool_use") {
        Node id = Need(b, "id");
        Node name = Need(b, "name");
        Node input = Need(b, "input");
        if (Text(id).empty()) ThrowBadParam(id.path, id.path + " must not be empty");
        CheckToolName(name);
        MustBeObject(input);
        if (!ids.emplace(Text(id)).second) {
          ThrowBadParam(id.path, id.path + " " + Shown(Text(id)) + " is used twice in one message");
        }
        auto raw = spans.inputs.find({message_idx, j});
        calls.BeginObject().Field("id", Text(id)).Field("type", "function").Key("function").BeginObject();
        calls.Field("name", Text(name)).Key("arguments").Raw(RawOr(raw == spans.inputs.end() ? "" : raw->second, input.v));
        calls.EndObject().EndObject();
      } else {
        RefuseBlock(b, type, "assistant");
      }
      ++j;
    }
    calls.EndArray();
    messages.BeginObject().Field("role", "assistant");
    if (!texts.empty()) {
      messages.Key("content").BeginArray();
      for (std::string_view t : texts) TextPart(messages, t);
      messages.EndArray();
    }
    if (has_reasoning) messages.Field("reasoning_content", reasoning);
    if (!ids.empty()) messages.Key("tool_calls").Raw(calls.str());
    messages.EndObject();
    return ids;
  }

  void Messages(const Node& list) {
    std::vector<Node> items = Items(list, "an array of message objects");
    if (items.empty()) ThrowBadParam(list.path, "messages must not be empty");
    if (items.size() > policy.max_messages) {
      ThrowBadParam(list.path, "messages has " + std::to_string(items.size()) + " entries; at most " +
                                   std::to_string(policy.max_messages) + " are accepted");
    }
    std::set<std::string, std::less<>> last_calls;
    for (size_t i = 0; i < items.size(); ++i) {
      const Node& m = items[i];
      MustBeObject(m);
      Node role = Need(m, "role");
      std::string_view r = Text(role);
      Node content = Need(m, "content");
      if (!content.v.is_string() && !content.v.is_array()) {
        ThrowBadParam(content.path, content.path + " must be a string or an array of content blocks");
      }
      if (r == "user") {
        User(content, last_calls);
        last_calls.clear();
      } else if (r == "assistant") {
        if (i + 1 == items.size()) {
          Unsupported(m.path, m.path + ": a final assistant message (prefill) is not supported; k3 always "
                                       "answers in a new assistant turn");
        }
        last_calls = Assistant(content, i);
      } else if (r == "system") {
        // Claude Code sends system messages inside `messages` (for models it
        // does not know): a system message at that place of the conversation,
        // rendered as Moonshot's encoder renders a system message after the
        // first turn (oracle chat case system_last_before_generation).
        System(content);
      } else {
        ThrowBadParam(role.path,
                      role.path + " " + Shown(r) + " is not \"user\", \"assistant\" or \"system\"");
      }
    }
  }

  // tools -> chat tools [{type: function, function: {name, description, parameters}}].
  // Returns the number of tools.
  size_t Tools(const Node& tools, JsonWriter& out) {
    out.BeginArray();
    size_t i = 0;
    for (const Node& t : Items(tools, "an array of tool objects")) {
      MustBeObject(t);
      if (auto type = Member(t, "type"); type && Text(*type) != "custom") {
        Unsupported(type->path, type->path + " " + Shown(Text(*type)) +
                                    " is not supported: k3 runs no server tools (only client tools, type "
                                    "\"custom\" or none)");
      }
      Node name = Need(t, "name");
      CheckToolName(name);
      if (!tool_names.emplace(Text(name)).second) {
        ThrowBadParam(name.path, "tool name " + Shown(Text(name)) + " is declared more than once");
      }
      Node schema = Need(t, "input_schema");
      MustBeObject(schema);
      if (auto st = Member(schema, "type"); !st || !st->v.is_string() || Text(*st) != "object") {
        ThrowBadParam(Child(schema.path, "type"), Child(schema.path, "type") + " must be \"object\"");
      }
      std::string raw = RawOr(i < spans.schemas.size() ? spans.schemas[i] : "", schema.v);
      out.BeginObject().Field("type", "function").Key("function").BeginObject().Field("name", Text(name));
      if (auto d = Member(t, "description")) out.Field("description", Text(*d));
      out.Key("parameters").Raw(raw);
      if (auto s = Member(t, "strict")) out.Field("strict", Flag(*s));
      out.EndObject().EndObject();
      ++i;
    }
    out.EndArray();
    return i;
  }
};

// An error of the twin's parser (a schema k3 cannot enforce, the sampling
// lock) named by the Messages field it came from.
Error InMessagesTerms(const Error& e) {
  return Renamed(e, {{".function.parameters", ".input_schema"},
                     {"tool_choice.function.name", "tool_choice.name"}});
}

}  // namespace

MessagesRequest ParseMessagesRequestOrThrow(std::string_view body, const ApiPolicy& policy, MessagesCall call) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded;
  Node root{ParseBodyOrThrow(body, policy, parser, padded), ""};
  RawSpans spans = CollectRawSpans(padded);

  MessagesRequest out;
  Mapper map{policy, spans, {}, {}};
  JsonWriter chat;  // the OpenAI twin
  chat.BeginObject();
  std::string model;
  if (call == MessagesCall::kCreate || Member(root, "model")) model = std::string(Text(Need(root, "model")));
  chat.Field("model", model);

  size_t num_tools = 0;
  JsonWriter tools;
  if (auto t = Member(root, "tools")) num_tools = map.Tools(*t, tools);

  map.messages.BeginArray();
  if (auto s = Member(root, "system")) map.System(*s);
  map.Messages(Need(root, "messages"));
  map.messages.EndArray();
  chat.Key("messages").Raw(map.messages.str());
  if (num_tools > 0) chat.Key("tools").Raw(tools.str());

  // tool_choice -> the twin's: auto, required (any), none, and the named form
  // {"type":"function","function":{"name"}} (tool), which the OpenAI parser
  // turns into ChatRequest::tool_choice and the compiled constraint.
  if (auto tc = Member(root, "tool_choice")) {
    ToolChoice choice = ToolChoice::kAuto;
    std::string choice_name;
    MustBeObject(*tc);
    Node type = Need(*tc, "type");
    std::string_view t = Text(type);
    if (t == "auto") choice = ToolChoice::kAuto;
    else if (t == "any") choice = ToolChoice::kRequired;
    else if (t == "none") choice = ToolChoice::kNone;
    else if (t == "tool") choice = ToolChoice::kNamed;
    else ThrowBadParam(type.path, type.path + " " + Shown(t) + " is not one of auto, any, tool, none");
    if (choice == ToolChoice::kNamed) {
      Node name = Need(*tc, "name");
      choice_name = std::string(Text(name));
      if (!map.tool_names.count(choice_name)) {
        ThrowBadParam(name.path, name.path + " " + Shown(choice_name) + " is not one of the request's tools");
      }
    }
    if ((choice == ToolChoice::kRequired || choice == ToolChoice::kNamed) && num_tools == 0) {
      ThrowBadParam(type.path, "tool_choice " + Shown(t) + " needs at least one tool");
    }
    if (auto d = Member(*tc, "disable_parallel_tool_use")) out.disable_parallel_tool_use = Flag(*d);
    chat.Key("tool_choice");
    if (choice == ToolChoice::kNamed) {
      chat.BeginObject().Field("type", "function").Key("function").BeginObject().Field("name", choice_name);
      chat.EndObject().EndObject();
    } else {
      chat.String(choice == ToolChoice::kNone ? "none" : choice == ToolChoice::kAuto ? "auto" : "required");
    }
  }

  if (auto n = Member(root, "max_tokens"); n || call == MessagesCall::kCreate) {
    Node mt = n ? *n : Need(root, "max_tokens");
    int64_t v = Integer(mt);
    if (v < 1) ThrowBadParam(mt.path, "max_tokens must be at least 1");
    chat.Field("max_tokens", v);
  }
  // Sampling: Anthropic's ranges, then the OpenAI route's policy (locked
  // values unless --sampling free) on the same numbers.
  for (const char* key : {"temperature", "top_p"}) {
    if (auto v = Member(root, key)) {
      double x = Number(*v);
      if (!(x >= 0 && x <= 1)) ThrowBadParam(v->path, v->path + " must be between 0 and 1");
      chat.Key(key).Raw(simdjson::minify(v->v));
    }
  }
  if (auto k = Member(root, "top_k")) {
    Integer(*k);
    Unsupported(k->path, "top_k is not supported: k3 samples with temperature and top_p only");
  }
  // Thinking: enabled / adaptive -> K3's think channel on, disabled or
  // absent (Anthropic's default) -> off. budget_tokens (>= 1024, as Anthropic
  // checks it) caps the think channel: at the cap its close is forced
  // (docs/server.md); a budget at or above max_tokens never binds.
  bool thinking = false;
  int64_t think_budget = -1;
  if (auto th = Member(root, "thinking")) {
    MustBeObject(*th);
    Node type = Need(*th, "type");
    std::string_view t = Text(type);
    // display: "omitted" sends thinking blocks empty (with their signature);
    // "summarized" (Anthropic's default) sends K3's thinking as it is.
    if (auto d = Member(*th, "display")) {
      std::string_view v = Text(*d);
      if (v != "summarized" && v != "omitted") {
        ThrowBadParam(d->path, d->path + " " + Shown(v) + " is not one of summarized, omitted");
      }
      out.thinking_omitted = v == "omitted";
    }
    if (t == "enabled") {
      thinking = true;
      Node budget = Need(*th, "budget_tokens");
      think_budget = Integer(budget);
      if (think_budget < 1024) ThrowBadParam(budget.path, budget.path + " must be at least 1024");
    } else if (t == "adaptive") {
      thinking = true;
    } else if (t != "disabled") {
      ThrowBadParam(type.path, type.path + " " + Shown(t) + " is not one of enabled, adaptive, disabled");
    }
  }
  chat.Key("thinking").BeginObject().Field("type", thinking ? "enabled" : "disabled").EndObject();
  PassRunFlagsAndClose(root, chat);

  std::vector<std::string> stop;
  if (auto ss = Member(root, "stop_sequences")) {
    for (const Node& s : Items(*ss, "an array of strings")) {
      std::string_view t = Text(s);
      if (t.empty()) ThrowBadParam(s.path, s.path + " must not be empty");
      if (t.size() > policy.max_stop_bytes) {
        ThrowBadParam(s.path, s.path + " is longer than " + std::to_string(policy.max_stop_bytes) + " bytes");
      }
      stop.emplace_back(t);
    }
    if (stop.size() > kMaxStopSequences) {
      ThrowBadParam(ss->path, "at most " + std::to_string(kMaxStopSequences) + " stop_sequences are accepted");
    }
  }
  if (auto md = Member(root, "metadata")) {
    MustBeObject(*md);
    if (auto u = Member(*md, "user_id")) Text(*u);
  }

  out.openai_body = chat.Take();
  // Count-tokens bodies have no max_tokens: the twin gets the policy default.
  try {
    out.request = ParseChatRequestOrThrow(out.openai_body, policy);
  } catch (const Error& e) {
    throw InMessagesTerms(e);
  }
  out.request.stop = std::move(stop);
  if (think_budget >= 0) SetThinkBudget(out.request, think_budget);
  return out;
}

std::string AnthropicErrorType(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    case 504: return "timeout_error";
    default: return "api_error";
  }
}

std::string AnthropicErrorJson(const ApiError& error) {
  JsonWriter j;
  j.BeginObject().Field("type", "error").Key("error").BeginObject();
  j.Field("type", AnthropicErrorType(error.status)).Field("message", error.message).EndObject().EndObject();
  return j.Take();
}

}  // namespace k3::server
