// The Responses answer from engine::Delta events: the typed SSE events and
// the whole Response object, folded the same way. An output item opens when
// the kind of output changes (reasoning -> message -> function calls), each
// call is its own function_call item. docs/server.md "The Responses API".
#include <cstdio>

#include "k3/core/json_writer.h"
#include "k3/server/responses.h"

namespace k3::server {
namespace {

const char* KindName(ResponseEvents::Item::Kind kind) {
  switch (kind) {
    case ResponseEvents::Item::kReasoning:
      return "reasoning";
    case ResponseEvents::Item::kFunctionCall:
      return "function_call";
    case ResponseEvents::Item::kMessage:
      break;
  }
  return "message";
}

// A content part: reasoning_text for reasoning, output_text for a message.
std::string PartJson(ResponseEvents::Item::Kind kind, const std::string& text) {
  JsonWriter j;
  if (kind == ResponseEvents::Item::kReasoning) {
    j.BeginObject().Field("type", "reasoning_text").Field("text", text).EndObject();
  } else {
    j.BeginObject().Field("type", "output_text").Field("text", text).Key("annotations").Raw("[]");
    j.Key("logprobs").Raw("[]").EndObject();
  }
  return j.Take();
}

// An item as output_item.added announces it (empty, in_progress) or as
// output_item.done and the response carry it (complete).
std::string ItemJson(const ResponseEvents::Item& item, bool complete) {
  JsonWriter j;
  j.BeginObject().Field("id", item.id).Field("type", KindName(item.kind));
  switch (item.kind) {
    case ResponseEvents::Item::kReasoning:
      j.Key("summary").Raw("[]").Key("content").BeginArray();
      if (complete) j.Raw(PartJson(item.kind, item.text));
      j.EndArray();
      break;
    case ResponseEvents::Item::kMessage:
      j.Field("status", complete ? "completed" : "in_progress").Field("role", "assistant");
      j.Key("content").BeginArray();
      if (complete) j.Raw(PartJson(item.kind, item.text));
      j.EndArray();
      break;
    case ResponseEvents::Item::kFunctionCall:
      j.Field("status", complete ? "completed" : "in_progress").Field("call_id", item.call_id);
      j.Field("name", item.name).Field("arguments", complete ? item.text : std::string());
      break;
  }
  j.EndObject();
  return j.Take();
}

}  // namespace

std::string ResponsesUsageJson(const engine::Usage& usage) {
  JsonWriter j;
  j.BeginObject()
      .Field("input_tokens", usage.prompt_tokens)
      .Key("input_tokens_details")
      .BeginObject()
      .Field("cached_tokens", usage.cached_tokens)
      .EndObject()
      .Field("output_tokens", usage.completion_tokens)
      .Key("output_tokens_details")
      .BeginObject()
      .Field("reasoning_tokens", usage.reasoning_tokens)
      .EndObject()
      .Field("total_tokens", usage.prompt_tokens + usage.completion_tokens)
      .EndObject();
  return j.Take();
}

ResponseEvents::ResponseEvents(ResponseObjectMeta meta, bool stream)
    : meta_(std::move(meta)), stream_(stream) {}

std::string ResponseEvents::Event(const char* type, const std::string& fields) {
  if (!stream_) return {};
  std::string json = "{\"type\":\"" + std::string(type) +
                     "\",\"sequence_number\":" + std::to_string(sequence_++) + fields + "}";
  return std::string("event: ") + type + "\ndata: " + json + "\n\n";
}

// The Response object; `extra` adds ",\"output\":...,\"usage\":..." etc.
std::string ResponseEvents::ResponseJson(const char* status, const std::string& extra) const {
  const ResponsesEcho& e = meta_.echo;
  JsonWriter j;
  j.BeginObject()
      .Field("id", meta_.id)
      .Field("object", "response")
      .Field("created_at", meta_.created_at)
      .Field("status", status)
      .Field("model", meta_.model)
      .Key("instructions")
      .Raw(e.instructions)
      .Key("tools")
      .Raw(e.tools)
      .Key("tool_choice")
      .Raw(e.tool_choice)
      .Field("parallel_tool_calls", e.parallel_tool_calls)
      .Key("text")
      .Raw(e.text)
      .Key("reasoning")
      .Raw(e.reasoning)
      .Key("max_output_tokens")
      .Raw(e.max_output_tokens)
      .Field("temperature", double(e.temperature))
      .Field("top_p", double(e.top_p))
      .Field("store", e.store)
      .Key("previous_response_id")
      .Null()
      .Field("truncation", "disabled")
      .Key("metadata")
      .Raw(e.metadata);
  std::string out = j.Take();
  out += extra;
  out += "}";
  return out;
}

std::string ResponseEvents::Begin() {
  std::string r = ResponseJson(
      "in_progress", ",\"output\":[],\"error\":null,\"incomplete_details\":null,\"usage\":null");
  std::string out = Event("response.created", ",\"response\":" + r);  // numbered first
  return out + Event("response.in_progress", ",\"response\":" + r);
}

std::string ResponseEvents::Heartbeat(std::string_view what) {
  if (!stream_) return " ";
  return ChatStream::Heartbeat(what) + Event("keepalive", "");
}

std::string ResponseEvents::Progress(const engine::PrefillProgress& progress) {
  if (!stream_) return " ";
  if (!meta_.return_progress || finished_) return Heartbeat(ProgressText(progress));
  std::string r = ResponseJson(
      "in_progress", ",\"output\":[],\"error\":null,\"incomplete_details\":null,\"usage\":null");
  return ChatStream::Heartbeat(ProgressText(progress)) +
         Event("response.in_progress",
               ",\"response\":" + r + ",\"prompt_progress\":" + PromptProgressJson(progress));
}

// Routing fields every item-scoped event carries.
static std::string ItemFields(const ResponseEvents::Item& item, size_t index) {
  return ",\"item_id\":\"" + item.id + "\",\"output_index\":" + std::to_string(index);
}

std::string ResponseEvents::Open(Item::Kind kind, std::string call_id, std::string name) {
  std::string out = CloseOpen();
  Item item;
  item.kind = kind;
  const char* prefix = kind == Item::kReasoning ? "rs_" : kind == Item::kMessage ? "msg_" : "fc_";
  // The response id without its "resp_" makes every item id unique.
  item.id = prefix + meta_.id.substr(meta_.id.rfind('_') + 1) + "_" + std::to_string(items_.size());
  item.call_id = std::move(call_id);
  item.name = std::move(name);
  items_.push_back(std::move(item));
  holds_.emplace_back();
  open_ = int(items_.size()) - 1;
  const Item& it = items_.back();
  out += Event("response.output_item.added", ",\"output_index\":" + std::to_string(open_) +
                                                 ",\"item\":" + ItemJson(it, /*complete=*/false));
  if (kind != Item::kFunctionCall) {
    out += Event(
        "response.content_part.added",
        ItemFields(it, size_t(open_)) + ",\"content_index\":0,\"part\":" + PartJson(kind, ""));
  }
  return out;
}

// Flushes what the open item holds back and closes it with its done events.
std::string ResponseEvents::CloseOpen() {
  if (open_ < 0) return {};
  size_t index = size_t(open_);
  std::string out = Piece(index, holds_[index].Flush());
  const Item& it = items_[index];
  std::string fields = ItemFields(it, index);
  std::string text;
  AppendJsonString(text, it.text);
  switch (it.kind) {
    case Item::kReasoning:
      out +=
          Event("response.reasoning_text.done", fields + ",\"content_index\":0,\"text\":" + text);
      break;
    case Item::kMessage:
      out += Event("response.output_text.done",
                   fields + ",\"content_index\":0,\"text\":" + text + ",\"logprobs\":[]");
      break;
    case Item::kFunctionCall: {
      std::string name;
      AppendJsonString(name, it.name);
      out += Event("response.function_call_arguments.done",
                   fields + ",\"name\":" + name + ",\"arguments\":" + text);
      break;
    }
  }
  if (it.kind != Item::kFunctionCall) {
    out += Event("response.content_part.done",
                 fields + ",\"content_index\":0,\"part\":" + PartJson(it.kind, it.text));
  }
  out += Event("response.output_item.done", ",\"output_index\":" + std::to_string(index) +
                                                ",\"item\":" + ItemJson(it, /*complete=*/true));
  open_ = -1;
  return out;
}

// A piece already released by the item's UTF-8 holder.
std::string ResponseEvents::Piece(size_t index, const std::string& piece) {
  if (piece.empty()) return {};
  Item& it = items_[index];
  it.text += piece;
  std::string delta;
  AppendJsonString(delta, piece);
  std::string fields = ItemFields(it, index) + ",\"delta\":" + delta;
  switch (it.kind) {
    case Item::kReasoning:
      return Event("response.reasoning_text.delta", fields + ",\"content_index\":0");
    case Item::kMessage:
      return Event("response.output_text.delta", fields + ",\"content_index\":0,\"logprobs\":[]");
    case Item::kFunctionCall:
      break;
  }
  return Event("response.function_call_arguments.delta", fields);
}

std::string ResponseEvents::OnDelta(const engine::Delta& delta) {
  if (finished_) return {};
  std::string out;
  auto text = [&](Item::Kind kind, const std::string& bytes) {
    if (bytes.empty()) return;
    if (open_ < 0 || items_[size_t(open_)].kind != kind) out += Open(kind);
    out += Piece(size_t(open_), holds_[size_t(open_)].Push(bytes));
  };
  text(Item::kReasoning, delta.reasoning);
  text(Item::kMessage, delta.content);
  for (const engine::ToolCallDelta& tc : delta.tool_calls) {
    auto it = call_item_.find(tc.index);
    if (it == call_item_.end()) {
      std::string call_id = tc.id.empty() ? meta_.id + "-call-" + std::to_string(tc.index) : tc.id;
      out += Open(Item::kFunctionCall, std::move(call_id), tc.name);
      it = call_item_.emplace(tc.index, size_t(open_)).first;
    }
    if (!tc.arguments.empty()) out += Piece(it->second, holds_[it->second].Push(tc.arguments));
  }
  return out;
}

std::string ResponseEvents::Finish(const engine::GenerateResult& result,
                                   const ResponseStats& stats) {
  if (finished_) return {};
  std::string out = CloseOpen();
  finished_ = true;
  // Cut by max_output_tokens (or the context): OpenAI's "incomplete".
  const bool incomplete = result.finish == engine::FinishReason::kLength;
  std::string output = "[";
  for (size_t i = 0; i < items_.size(); ++i)
    output += (i ? "," : "") + ItemJson(items_[i], /*complete=*/true);
  output += "]";
  std::string extra = ",\"output\":" + output + ",\"error\":null,\"incomplete_details\":" +
                      (incomplete ? "{\"reason\":\"max_output_tokens\"}" : "null") +
                      ",\"usage\":" + ResponsesUsageJson(result.usage) +
                      ",\"k3\":" + StatsJson(stats);
  std::string response = ResponseJson(incomplete ? "incomplete" : "completed", extra);
  if (!stream_) return response;
  return out + Event(incomplete ? "response.incomplete" : "response.completed",
                     ",\"response\":" + response);
}

std::string ResponseEvents::Error(const ApiError& error) {
  if (finished_) return {};
  finished_ = true;
  if (!stream_) return error.Json();
  JsonWriter e;
  e.BeginObject()
      .Field("code", error.code.empty() ? "server_error" : error.code)
      .Field("message", error.message);
  e.EndObject();
  std::string r = ResponseJson("failed", ",\"output\":[],\"error\":" + e.str() +
                                             ",\"incomplete_details\":null,\"usage\":null");
  return Event("response.failed", ",\"response\":" + r);
}

}  // namespace k3::server
