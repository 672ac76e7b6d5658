// The Messages answer from engine::Delta events: Anthropic's SSE event
// sequence (message_start, content_block_start / _delta / _stop per block,
// ping, message_delta, message_stop; error after the stream began) and the
// whole message object, folded the same way. docs/server.md "Messages API".
#include <simdjson.h>

#include <cstdio>

#include "k3/core/json_writer.h"
#include "k3/server/messages.h"
#include "k3/server/messages_stream.h"
#include "segmenter.h"
#include "sse.h"

namespace k3::server {
namespace {

// A block's "type", by Channel.
const char* KindName(Channel channel) {
  static constexpr const char* kNames[] = {"thinking", "text", "tool_use"};
  return kNames[static_cast<int>(channel)];
}

// Anthropic's ids are "toolu_..."; the engine's own id keeps it unique.
std::string ToolUseId(const Segment& s, const MessageMeta& meta) {
  return "toolu_" + (s.call_id.empty() ? meta.id + "_" + std::to_string(s.call_index) : s.call_id);
}

// A block as content_block_start announces it (empty) or as the whole
// message carries it (complete).
void BlockJson(JsonWriter& j, const Segment& b, bool complete, const MessageMeta& meta) {
  j.BeginObject().Field("type", KindName(b.channel));
  switch (b.channel) {
    case Channel::kReasoning:
      j.Field("thinking", complete && !meta.thinking_omitted ? b.text : std::string());
      j.Field("signature", complete ? ThinkingSignature(b.text) : std::string());
      break;
    case Channel::kText:
      j.Field("text", complete ? b.text : std::string());
      break;
    case Channel::kToolCall:
      j.Field("id", ToolUseId(b, meta)).Field("name", b.name).Key("input").Raw(complete ? ToolInputJson(b.text) : "{}");
      break;
  }
  j.EndObject();
}

// Anthropic counts input as the part not read from the cache.
void UsageJson(JsonWriter& j, const engine::Usage& usage, bool with_output) {
  j.BeginObject()
      .Field("input_tokens", usage.prompt_tokens - usage.cached_tokens)
      .Field("cache_creation_input_tokens", int64_t(0))
      .Field("cache_read_input_tokens", usage.cached_tokens);
  if (with_output) j.Field("output_tokens", usage.completion_tokens);
  j.EndObject();
}

}  // namespace

std::string StopReasonName(engine::FinishReason reason, bool had_tool_calls, bool stop_matched) {
  if (reason == engine::FinishReason::kLength) return "max_tokens";
  if (reason == engine::FinishReason::kToolCalls || had_tool_calls) return "tool_use";
  return stop_matched ? "stop_sequence" : "end_turn";
}

std::string ThinkingSignature(std::string_view thinking) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : thinking) h = (h ^ c) * 0x100000001b3ull;
  char buf[32];
  std::snprintf(buf, sizeof buf, "k3-%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string ToolInputJson(std::string_view arguments) {
  size_t first = arguments.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return "{}";
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  if (parser.parse(arguments.data(), arguments.size()).get(e) == simdjson::SUCCESS && e.is_object()) {
    return simdjson::minify(e);
  }
  JsonWriter j;
  j.BeginObject().Field("_k3_unparsed_arguments", arguments).EndObject();
  return j.Take();
}

MessageEvents::MessageEvents(MessageMeta meta, bool stream)
    : meta_(std::move(meta)), stream_(stream), blocks_(std::make_unique<Segmenter>(Runs::kPerChange)) {}

MessageEvents::~MessageEvents() = default;

std::string MessageEvents::Event(const char* type, const std::string& json) const {
  if (!stream_) return {};
  return SseEvent(type, json);
}

std::string MessageEvents::Begin() {
  JsonWriter j;
  j.BeginObject().Field("type", "message_start").Key("message").BeginObject();
  j.Field("id", meta_.id).Field("type", "message").Field("role", "assistant").Field("model", meta_.model);
  j.Key("content").BeginArray().EndArray().Key("stop_reason").Null().Key("stop_sequence").Null().Key("usage");
  engine::Usage before;
  before.prompt_tokens = meta_.prompt_tokens;
  UsageJson(j, before, /*with_output=*/true);
  j.EndObject().EndObject();
  return Event("message_start", j.str());
}

std::string MessageEvents::Heartbeat(std::string_view) {
  return stream_ ? std::string("event: ping\ndata: {\"type\":\"ping\"}\n\n") : std::string(" ");
}

std::string MessageEvents::Progress(const engine::PrefillProgress& progress) {
  if (!stream_) return " ";
  std::string out = Heartbeat({});
  if (meta_.return_progress) {
    // An event type Anthropic's SDKs pass over (they accumulate only the
    // types they know); the same object as the OpenAI route's prompt_progress.
    out += Event("prefill_progress", "{\"type\":\"prefill_progress\",\"prompt_progress\":" +
                                         PromptProgressJson(progress) + "}");
  }
  return out;
}

// Segment events as Anthropic's content_block_start / _delta / _stop.
std::string MessageEvents::Opened(size_t index) {
  JsonWriter j;
  j.BeginObject().Field("type", "content_block_start").Field("index", int64_t(index)).Key("content_block");
  BlockJson(j, blocks_->segments()[index], /*complete=*/false, meta_);
  j.EndObject();
  return Event("content_block_start", j.str());
}

std::string MessageEvents::Piece(size_t index, const std::string& piece) {
  const Segment& b = blocks_->segments()[index];
  JsonWriter j;
  j.BeginObject().Field("type", "content_block_delta").Field("index", int64_t(index)).Key("delta").BeginObject();
  switch (b.channel) {
    case Channel::kReasoning:
      if (meta_.thinking_omitted) return {};  // the signature still covers the text
      j.Field("type", "thinking_delta").Field("thinking", piece);
      break;
    case Channel::kText: j.Field("type", "text_delta").Field("text", piece); break;
    case Channel::kToolCall: j.Field("type", "input_json_delta").Field("partial_json", piece); break;
  }
  j.EndObject().EndObject();
  return Event("content_block_delta", j.str());
}

// A thinking block is signed before it stops.
std::string MessageEvents::Closed(size_t index) {
  const Segment& b = blocks_->segments()[index];
  std::string out;
  if (b.channel == Channel::kReasoning) {
    JsonWriter j;
    j.BeginObject().Field("type", "content_block_delta").Field("index", int64_t(index)).Key("delta").BeginObject();
    j.Field("type", "signature_delta").Field("signature", ThinkingSignature(b.text)).EndObject();
    j.EndObject();
    out = Event("content_block_delta", j.str());
  }
  JsonWriter j;
  j.BeginObject().Field("type", "content_block_stop").Field("index", int64_t(index)).EndObject();
  return out + Event("content_block_stop", j.str());
}

std::string MessageEvents::OnDelta(const engine::Delta& delta) {
  if (finished_) return {};
  WriterEvents events(*this);
  return blocks_->Fold(delta, events);
}

std::string MessageEvents::Finish(const engine::GenerateResult& result, const ResponseStats& stats) {
  if (finished_) return {};
  WriterEvents events(*this);
  std::string out = blocks_->CloseOpen(events);
  // Earlier calls' leftovers: a piece for an earlier call (not seen from
  // K3's parser) still lands in its own block.
  for (size_t i = 0; i < blocks_->segments().size(); ++i) out += blocks_->Flush(i, events);
  finished_ = true;
  bool calls = blocks_->has_calls();
  std::string reason = StopReasonName(result.finish, calls, !result.stop_matched.empty());
  auto stop_sequence = [&](JsonWriter& j) {
    j.Key("stop_sequence");
    if (reason == "stop_sequence") j.String(result.stop_matched);
    else j.Null();
  };
  if (stream_) {
    JsonWriter j;
    j.BeginObject().Field("type", "message_delta").Key("delta").BeginObject().Field("stop_reason", reason);
    stop_sequence(j);
    j.EndObject().Key("usage");
    UsageJson(j, result.usage, /*with_output=*/true);
    j.EndObject();
    out += Event("message_delta", j.str());
    out += Event("message_stop", "{\"type\":\"message_stop\"}");
    return out;
  }
  JsonWriter j;
  j.BeginObject().Field("id", meta_.id).Field("type", "message").Field("role", "assistant").Field("model", meta_.model);
  j.Key("content").BeginArray();
  for (const Segment& b : blocks_->segments()) BlockJson(j, b, /*complete=*/true, meta_);
  j.EndArray().Field("stop_reason", reason);
  stop_sequence(j);
  j.Key("usage");
  UsageJson(j, result.usage, /*with_output=*/true);
  j.Key("k3").Raw(StatsJson(stats)).EndObject();
  return j.Take();
}

std::string MessageEvents::Error(const ApiError& error) {
  if (finished_) return {};
  finished_ = true;
  if (!stream_) return AnthropicErrorJson(error);
  return Event("error", AnthropicErrorJson(error));
}

}  // namespace k3::server
