// The Responses request: validation with the Responses API's field names,
// then the mapping to the equivalent chat.completions body, which the OpenAI
// parser (request.cc) resolves and renders, as messages.cc does for the
// Messages API. So all three APIs share one sampling policy, one renderer and
// one set of K3 rules. docs/server.md "The Responses API".
#include "k3/server/responses.h"

#include <simdjson.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "json_node.h"
#include "k3/core/json_writer.h"
#include "request_body.h"

namespace k3::server {
namespace {

using namespace json_node;  // NOLINT: the parser's vocabulary

std::string Minified(const Node& n) { return simdjson::minify(n.v); }

// Content parts of a message: a string, or input_text / output_text / text
// parts (refusal parts as their text). Images, files and audio are refused.
void ContentParts(JsonWriter& j, const Node& content) {
  if (content.v.is_string()) {
    j.String(Text(content));
    return;
  }
  j.BeginArray();
  for (const Node& part : Items(content, "a string or an array of content parts")) {
    std::string_view type = TypeOf(part);
    if (type == "input_text" || type == "output_text" || type == "text") {
      TextPart(j, Text(Need(part, "text")));
    } else if (type == "refusal") {
      TextPart(j, Text(Need(part, "refusal")));
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      Unsupported(Child(part.path, "type"), Child(part.path, "type") + " " + Shown(type) +
                                                " is not supported: k3 serves text only");
    } else {
      ThrowBadParam(Child(part.path, "type"),
                    Child(part.path, "type") + " " + Shown(type) +
                        " is not a content part (input_text, output_text)");
    }
  }
  j.EndArray();
}

// Items of a reasoning item as text: its reasoning_text content when there
// is one (what k3 sends), else its summary parts.
std::string ReasoningText(const Node& item) {
  std::string text;
  auto gather = [&](const Node& list, std::string_view part_type) {
    for (const Node& part : Items(list, "an array")) {
      std::string_view type = TypeOf(part);
      if (type != part_type) {
        ThrowBadParam(Child(part.path, "type"), Child(part.path, "type") + " " + Shown(type) +
                                                    " is not " + std::string(part_type));
      }
      if (!text.empty()) text += "\n\n";
      text += Text(Need(part, "text"));
    }
  };
  if (auto content = Member(item, "content"); content && !Items(*content, "an array").empty()) {
    gather(*content, "reasoning_text");
  } else if (auto summary = Member(item, "summary")) {
    gather(*summary, "summary_text");
  }
  if (auto enc = Member(item, "encrypted_content")) Text(*enc);  // k3 makes none and reads none
  return text;
}

// input[] -> chat messages. Consecutive assistant items (reasoning, assistant
// messages, function calls) are one assistant turn; a function_call_output
// is a tool message.
struct InputMapper {
  JsonWriter messages;  // inside the chat messages array
  bool assistant_open = false;
  std::string reasoning;
  bool has_reasoning = false;
  std::vector<std::string> texts;  // the open assistant turn's text parts
  std::vector<std::string> calls;  // its tool_calls, as JSON objects

  void Flush() {
    if (!assistant_open) return;
    messages.BeginObject().Field("role", "assistant");
    if (!texts.empty()) {
      messages.Key("content").BeginArray();
      for (const std::string& t : texts) TextPart(messages, t);
      messages.EndArray();
    }
    if (has_reasoning) messages.Field("reasoning_content", reasoning);
    if (!calls.empty()) {
      messages.Key("tool_calls").BeginArray();
      for (const std::string& c : calls) messages.Raw(c);
      messages.EndArray();
    }
    messages.EndObject();
    assistant_open = has_reasoning = false;
    reasoning.clear();
    texts.clear();
    calls.clear();
  }

  void Message(const Node& item) {
    Node role = Need(item, "role");
    std::string_view r = Text(role);
    Node content = Need(item, "content");
    if (!content.v.is_string() && !content.v.is_array()) {
      ThrowBadParam(content.path, content.path + " must be a string or an array of content parts");
    }
    if (r == "assistant") {
      assistant_open = true;
      if (content.v.is_string()) {
        texts.emplace_back(Text(content));
        return;
      }
      for (const Node& part : Items(content, "an array of content parts")) {
        std::string_view type = TypeOf(part);
        if (type == "output_text" || type == "input_text" || type == "text") {
          texts.emplace_back(Text(Need(part, "text")));
        } else if (type == "refusal") {
          texts.emplace_back(Text(Need(part, "refusal")));
        } else {
          ThrowBadParam(Child(part.path, "type"),
                        Child(part.path, "type") + " " + Shown(type) +
                            " is not a content part an assistant message may carry");
        }
      }
      return;
    }
    if (r != "user" && r != "system" && r != "developer") {
      ThrowBadParam(role.path, role.path + " " + Shown(r) +
                                   " is not one of user, assistant, system, developer");
    }
    Flush();
    // developer is OpenAI's name for the system role (Codex sends its
    // instructions that way); Moonshot's encoder knows only system.
    messages.BeginObject().Field("role", r == "user" ? "user" : "system").Key("content");
    ContentParts(messages, content);
    messages.EndObject();
  }

  void FunctionCall(const Node& item) {
    Node call_id = Need(item, "call_id");
    if (Text(call_id).empty()) ThrowBadParam(call_id.path, call_id.path + " must not be empty");
    Node name = Need(item, "name");
    Node arguments = Need(item, "arguments");
    assistant_open = true;
    JsonWriter call;
    call.BeginObject()
        .Field("id", Text(call_id))
        .Field("type", "function")
        .Key("function")
        .BeginObject();
    call.Field("name", Text(name)).Field("arguments", Text(arguments)).EndObject().EndObject();
    calls.push_back(call.Take());
  }

  void FunctionCallOutput(const Node& item) {
    Node call_id = Need(item, "call_id");
    if (Text(call_id).empty()) ThrowBadParam(call_id.path, call_id.path + " must not be empty");
    Node output = Need(item, "output");
    if (!output.v.is_string() && !output.v.is_array()) {
      ThrowBadParam(output.path, output.path + " must be a string or an array of content parts");
    }
    Flush();
    messages.BeginObject()
        .Field("role", "tool")
        .Field("tool_call_id", Text(call_id))
        .Key("content");
    ContentParts(messages, output);
    messages.EndObject();
  }

  void Input(const Node& input, size_t max_items) {
    if (input.v.is_string()) {
      messages.BeginObject().Field("role", "user").Field("content", Text(input)).EndObject();
      return;
    }
    std::vector<Node> items = Items(input, "a string or an array of input items");
    if (items.empty()) ThrowBadParam(input.path, "input must not be empty");
    if (items.size() > max_items) {
      ThrowBadParam(input.path, "input has " + std::to_string(items.size()) + " items; at most " +
                                    std::to_string(max_items) + " are accepted");
    }
    for (const Node& item : items) {
      MustBeObject(item);
      // A message may leave out its type (the SDK's EasyInputMessage).
      std::string_view type = "message";
      if (auto t = Member(item, "type")) type = Text(*t);
      if (type == "message") {
        Message(item);
      } else if (type == "reasoning") {
        assistant_open = true;
        std::string text = ReasoningText(item);
        if (!reasoning.empty() && !text.empty()) reasoning += "\n\n";
        reasoning += text;
        has_reasoning = true;
      } else if (type == "function_call") {
        FunctionCall(item);
      } else if (type == "function_call_output") {
        FunctionCallOutput(item);
      } else if (type == "item_reference") {
        Unsupported(Child(item.path, "type"),
                    Child(item.path, "type") +
                        " \"item_reference\" is not supported: k3 stores no responses; send "
                        "the items themselves");
      } else {
        Unsupported(Child(item.path, "type"),
                    Child(item.path, "type") + " " + Shown(type) +
                        " is not supported: k3 runs only function tools (items: message, "
                        "reasoning, function_call, function_call_output)");
      }
    }
    Flush();
  }
};

// reasoning.effort -> K3's thinking (the chat twin's "thinking" object).
void Effort(JsonWriter& chat, const Node& effort) {
  std::string_view e = Text(effort);
  const char* k3 = nullptr;
  if (e == "minimal" || e == "low")
    k3 = "low";
  else if (e == "medium" || e == "high")
    k3 = "high";
  else if (e == "xhigh")
    k3 = "max";
  else if (e != "none") {
    ThrowBadParam(effort.path, effort.path + " " + Shown(e) +
                                   " is not one of none, minimal, low, medium, high, xhigh");
  }
  chat.Key("thinking").BeginObject();
  if (k3)
    chat.Field("type", "enabled").Field("effort", k3);
  else
    chat.Field("type", "disabled");
  chat.EndObject();
}

}  // namespace

ResponsesRequest ParseResponsesRequestOrThrow(std::string_view body, const ApiPolicy& policy) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded;
  Node root{ParseBodyOrThrow(body, policy, parser, padded), ""};
  ResponsesRequest out;
  ResponsesEcho& echo = out.echo;

  // Server-side state k3 does not keep (docs/server.md: every request carries
  // the whole conversation, as Codex sends it).
  for (const char* key : {"previous_response_id", "conversation"}) {
    if (auto n = Member(root, key)) {
      Unsupported(
          n->path,
          std::string(key) +
              " is not supported: k3 stores no responses; send the whole conversation in input");
    }
  }
  if (auto b = Member(root, "background"); b && Flag(*b)) {
    Unsupported(b->path,
                "background responses are not supported: k3 answers while the connection is open");
  }
  if (auto s = Member(root, "store")) Flag(*s);  // accepted; nothing is stored (echoed false)
  if (auto lp = Member(root, "top_logprobs"); lp && Integer(*lp) != 0) {
    Unsupported(lp->path, "top_logprobs is not supported");
  }

  JsonWriter chat;  // the chat.completions twin
  chat.BeginObject();
  if (auto m = Member(root, "model")) chat.Field("model", Text(*m));

  // instructions: the first system message (OpenAI: "a system (or
  // developer) message inserted into the model's context").
  InputMapper map;
  map.messages.BeginArray();
  if (auto ins = Member(root, "instructions")) {
    if (!Text(*ins).empty())
      map.messages.BeginObject().Field("role", "system").Field("content", Text(*ins)).EndObject();
    echo.instructions = Minified(*ins);
  }
  map.Input(Need(root, "input"), policy.max_messages);
  map.messages.EndArray();
  chat.Key("messages").Raw(map.messages.str());

  // tools: function tools are declared to the model; hosted and other tool
  // types (web_search, file_search, namespace, custom, local_shell, mcp, ...)
  // are left out: k3 cannot run them, and the model never sees them.
  std::vector<std::pair<std::string, std::string>> renames;
  if (auto tools = Member(root, "tools")) {
    JsonWriter list, echoed;
    list.BeginArray();
    echoed.BeginArray();
    size_t declared = 0;
    for (const Node& t : Items(*tools, "an array of tool objects")) {
      std::string_view type = TypeOf(t);
      if (type != "function") {
        out.ignored_tools.emplace_back(type);
        continue;
      }
      std::string from = "tools[" + std::to_string(declared) + "].function.";
      std::string to = t.path + ".";
      renames.emplace_back(from, to);
      Node name = Need(t, "name");
      list.BeginObject()
          .Field("type", "function")
          .Key("function")
          .BeginObject()
          .Field("name", Text(name));
      if (auto d = Member(t, "description")) list.Field("description", Text(*d));
      if (auto p = Member(t, "parameters")) {
        MustBeObject(*p);
        list.Key("parameters").Raw(Minified(*p));
      }
      // Responses' strict defaults to true at OpenAI; k3 constrains every
      // call it can and treats an absent strict as false (docs/server.md).
      if (auto s = Member(t, "strict")) list.Field("strict", Flag(*s));
      list.EndObject().EndObject();
      echoed.Raw(Minified(t));
      ++declared;
    }
    list.EndArray();
    echoed.EndArray();
    if (declared > 0) chat.Key("tools").Raw(list.str());
    echo.tools = echoed.Take();
  }
  renames.emplace_back("tool_choice.function.name", "tool_choice.name");
  renames.emplace_back("response_format.json_schema.schema", "text.format.schema");
  renames.emplace_back("response_format.json_schema.name", "text.format.name");
  renames.emplace_back("max_completion_tokens", "max_output_tokens");

  if (auto tc = Member(root, "tool_choice")) {
    echo.tool_choice = Minified(*tc);
    chat.Key("tool_choice");
    if (tc->v.is_string()) {
      std::string_view c = Text(*tc);
      if (c != "auto" && c != "none" && c != "required") {
        ThrowBadParam(tc->path, "tool_choice " + Shown(c) + " is not one of auto, none, required");
      }
      chat.String(c);
    } else {
      std::string_view type = TypeOf(*tc);
      if (type != "function") {
        Unsupported(Child(tc->path, "type"), "tool_choice type " + Shown(type) +
                                                 " is not supported: k3 runs only function tools");
      }
      chat.BeginObject().Field("type", "function").Key("function").BeginObject();
      chat.Field("name", Text(Need(*tc, "name"))).EndObject().EndObject();
    }
  }
  if (auto p = Member(root, "parallel_tool_calls"))
    echo.parallel_tool_calls = Flag(*p);  // advisory

  // text.format -> response_format; text.verbosity is accepted.
  if (auto text = Member(root, "text")) {
    MustBeObject(*text);
    if (auto v = Member(*text, "verbosity")) Text(*v);
    if (auto f = Member(*text, "format")) {
      std::string_view type = TypeOf(*f);
      chat.Key("response_format").BeginObject().Field("type", type);
      if (type == "json_schema") {
        chat.Key("json_schema").BeginObject().Field("name", Text(Need(*f, "name")));
        Node schema = Need(*f, "schema");
        MustBeObject(schema);
        chat.Key("schema").Raw(Minified(schema));
        if (auto s = Member(*f, "strict")) chat.Field("strict", Flag(*s));
        if (auto d = Member(*f, "description")) chat.Field("description", Text(*d));
        chat.EndObject();
      } else if (type != "text" && type != "json_object") {
        ThrowBadParam(Child(f->path, "type"), Child(f->path, "type") + " " + Shown(type) +
                                                  " is not one of text, json_object, json_schema");
      }
      chat.EndObject();
      echo.text = "{\"format\":" + Minified(*f) + "}";
    }
  }
  if (auto r = Member(root, "reasoning")) {
    MustBeObject(*r);
    if (auto s = Member(*r, "summary")) Text(*s);  // accepted: k3 sends its reasoning text itself
    if (auto e = Member(*r, "effort")) {
      Effort(chat, *e);
      echo.reasoning = "{\"effort\":" + Minified(*e) + ",\"summary\":null}";
    }
  }
  if (auto n = Member(root, "max_output_tokens")) {
    int64_t v = Integer(*n);
    if (v < 1) ThrowBadParam(n->path, "max_output_tokens must be at least 1");
    chat.Field("max_completion_tokens", v);
    echo.max_output_tokens = std::to_string(v);
  }
  for (const char* key : {"temperature", "top_p"}) {
    if (auto v = Member(root, key)) {
      Number(*v);
      chat.Key(key).Raw(Minified(*v));
    }
  }
  if (auto md = Member(root, "metadata")) {
    MustBeObject(*md);
    echo.metadata = Minified(*md);
  }
  PassRunFlagsAndClose(root, chat);

  out.openai_body = chat.Take();
  try {
    out.request = ParseChatRequestOrThrow(out.openai_body, policy);
  } catch (const Error& e) {
    throw Renamed(e, renames);
  }
  echo.temperature = out.request.temperature;
  echo.top_p = out.request.top_p;
  return out;
}

}  // namespace k3::server
