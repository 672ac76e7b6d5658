// The Responses answer from engine::Delta events: the typed SSE events and
// the whole Response object, folded the same way. An output item opens when
// the kind of output changes (reasoning -> message -> function calls), each
// call is its own function_call item. docs/server.md "The Responses API".
#include <cstdio>

#include "k3/core/json_writer.h"
#include "k3/server/responses.h"
#include "segmenter.h"
#include "sse.h"

namespace k3::server {
namespace {

// An item's "type", by Channel.
const char* KindName(Channel channel) {
  static constexpr const char* kNames[] = {"reasoning", "message", "function_call"};
  return kNames[static_cast<int>(channel)];
}

// A content part: reasoning_text for reasoning, output_text for a message.
std::string PartJson(Channel channel, const std::string& text) {
  JsonWriter j;
  if (channel == Channel::kReasoning) {
    j.BeginObject().Field("type", "reasoning_text").Field("text", text).EndObject();
  } else {
    j.BeginObject().Field("type", "output_text").Field("text", text).Key("annotations").Raw("[]");
    j.Key("logprobs").Raw("[]").EndObject();
  }
  return j.Take();
}

// rs_ / msg_ / fc_ and the response id without its "resp_": every item id is unique.
std::string ItemId(const Segment& item, size_t index, const ResponseObjectMeta& meta) {
  const char* prefix = item.channel == Channel::kReasoning ? "rs_" : item.channel == Channel::kText ? "msg_" : "fc_";
  return prefix + meta.id.substr(meta.id.rfind('_') + 1) + "_" + std::to_string(index);
}

std::string CallId(const Segment& item, const ResponseObjectMeta& meta) {
  return item.call_id.empty() ? meta.id + "-call-" + std::to_string(item.call_index) : item.call_id;
}

// An item as output_item.added announces it (empty, in_progress) or as
// output_item.done and the response carry it (complete).
std::string ItemJson(const Segment& item, size_t index, const ResponseObjectMeta& meta, bool complete) {
  JsonWriter j;
  j.BeginObject().Field("id", ItemId(item, index, meta)).Field("type", KindName(item.channel));
  switch (item.channel) {
    case Channel::kReasoning:
      j.Key("summary").Raw("[]").Key("content").BeginArray();
      if (complete) j.Raw(PartJson(item.channel, item.text));
      j.EndArray();
      break;
    case Channel::kText:
      j.Field("status", complete ? "completed" : "in_progress").Field("role", "assistant");
      j.Key("content").BeginArray();
      if (complete) j.Raw(PartJson(item.channel, item.text));
      j.EndArray();
      break;
    case Channel::kToolCall:
      j.Field("status", complete ? "completed" : "in_progress").Field("call_id", CallId(item, meta));
      j.Field("name", item.name).Field("arguments", complete ? item.text : std::string());
      break;
  }
  j.EndObject();
  return j.Take();
}

// Routing fields every item-scoped event carries.
std::string ItemFields(const Segment& item, size_t index, const ResponseObjectMeta& meta) {
  return ",\"item_id\":\"" + ItemId(item, index, meta) + "\",\"output_index\":" + std::to_string(index);
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
    : meta_(std::move(meta)), stream_(stream), items_(std::make_unique<Segmenter>(Runs::kPerChange)) {}

ResponseEvents::~ResponseEvents() = default;

std::string ResponseEvents::Event(const char* type, const std::string& fields) {
  if (!stream_) return {};
  std::string json = "{\"type\":\"" + std::string(type) +
                     "\",\"sequence_number\":" + std::to_string(sequence_++) + fields + "}";
  return SseEvent(type, json);
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
  return SseComment(what) + Event("keepalive", "");
}

std::string ResponseEvents::Progress(const engine::PrefillProgress& progress) {
  if (!stream_) return " ";
  if (!meta_.return_progress || finished_) return Heartbeat(ProgressText(progress));
  std::string r = ResponseJson(
      "in_progress", ",\"output\":[],\"error\":null,\"incomplete_details\":null,\"usage\":null");
  return SseComment(ProgressText(progress)) +
         Event("response.in_progress",
               ",\"response\":" + r + ",\"prompt_progress\":" + PromptProgressJson(progress));
}

// Segment events as output_item.added / .done, content_part.added / .done
// and the text or arguments deltas between them.
std::string ResponseEvents::Opened(size_t index) {
  const Segment& it = items_->segments()[index];
  std::string out = Event("response.output_item.added", ",\"output_index\":" + std::to_string(index) +
                                                            ",\"item\":" + ItemJson(it, index, meta_, /*complete=*/false));
  if (it.channel != Channel::kToolCall) {
    out += Event("response.content_part.added",
                 ItemFields(it, index, meta_) + ",\"content_index\":0,\"part\":" + PartJson(it.channel, ""));
  }
  return out;
}

std::string ResponseEvents::Piece(size_t index, const std::string& piece) {
  const Segment& it = items_->segments()[index];
  std::string delta;
  AppendJsonString(delta, piece);
  std::string fields = ItemFields(it, index, meta_) + ",\"delta\":" + delta;
  switch (it.channel) {
    case Channel::kReasoning:
      return Event("response.reasoning_text.delta", fields + ",\"content_index\":0");
    case Channel::kText:
      return Event("response.output_text.delta", fields + ",\"content_index\":0,\"logprobs\":[]");
    case Channel::kToolCall:
      break;
  }
  return Event("response.function_call_arguments.delta", fields);
}

// The item's done events, with its whole text.
std::string ResponseEvents::Closed(size_t index) {
  const Segment& it = items_->segments()[index];
  std::string fields = ItemFields(it, index, meta_);
  std::string text;
  AppendJsonString(text, it.text);
  std::string out;
  switch (it.channel) {
    case Channel::kReasoning:
      out = Event("response.reasoning_text.done", fields + ",\"content_index\":0,\"text\":" + text);
      break;
    case Channel::kText:
      out = Event("response.output_text.done", fields + ",\"content_index\":0,\"text\":" + text + ",\"logprobs\":[]");
      break;
    case Channel::kToolCall: {
      std::string name;
      AppendJsonString(name, it.name);
      out = Event("response.function_call_arguments.done", fields + ",\"name\":" + name + ",\"arguments\":" + text);
      break;
    }
  }
  if (it.channel != Channel::kToolCall) {
    out += Event("response.content_part.done",
                 fields + ",\"content_index\":0,\"part\":" + PartJson(it.channel, it.text));
  }
  return out + Event("response.output_item.done", ",\"output_index\":" + std::to_string(index) +
                                                      ",\"item\":" + ItemJson(it, index, meta_, /*complete=*/true));
}

std::string ResponseEvents::OnDelta(const engine::Delta& delta) {
  if (finished_) return {};
  WriterEvents events(*this);
  return items_->Fold(delta, events);
}

std::string ResponseEvents::Finish(const engine::GenerateResult& result,
                                   const ResponseStats& stats) {
  if (finished_) return {};
  WriterEvents events(*this);
  std::string out = items_->CloseOpen(events);
  finished_ = true;
  // Cut by max_output_tokens (or the context): OpenAI's "incomplete".
  const bool incomplete = result.finish == engine::FinishReason::kLength;
  std::string output = "[";
  const std::vector<Segment>& items = items_->segments();
  for (size_t i = 0; i < items.size(); ++i)
    output += (i ? "," : "") + ItemJson(items[i], i, meta_, /*complete=*/true);
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
