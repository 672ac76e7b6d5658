// The Messages answer from engine::Delta events: Anthropic's SSE event
// sequence (message_start, content_block_start / _delta / _stop per block,
// ping, message_delta, message_stop; error after the stream began) and the
// whole message object, folded the same way. docs/server.md "Messages API".
#include <simdjson.h>

#include <cstdio>

#include "k3/core/json_writer.h"
#include "k3/server/messages.h"
#include "k3/server/messages_stream.h"

namespace k3::server {
namespace {

const char* KindName(MessageEvents::Block::Kind kind) {
  switch (kind) {
    case MessageEvents::Block::kThinking: return "thinking";
    case MessageEvents::Block::kToolUse: return "tool_use";
    case MessageEvents::Block::kText: break;
  }
  return "text";
}

// A block as content_block_start announces it (empty) or as the whole
// message carries it (complete).
void BlockJson(JsonWriter& j, const MessageEvents::Block& b, bool complete, bool thinking_omitted) {
  j.BeginObject().Field("type", KindName(b.kind));
  switch (b.kind) {
    case MessageEvents::Block::kThinking:
      j.Field("thinking", complete && !thinking_omitted ? b.text : std::string());
      j.Field("signature", complete ? ThinkingSignature(b.text) : std::string());
      break;
    case MessageEvents::Block::kText:
      j.Field("text", complete ? b.text : std::string());
      break;
    case MessageEvents::Block::kToolUse:
      j.Field("id", b.id).Field("name", b.name).Key("input").Raw(complete ? ToolInputJson(b.text) : "{}");
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

MessageEvents::MessageEvents(MessageMeta meta, bool stream) : meta_(std::move(meta)), stream_(stream) {}

std::string MessageEvents::Event(const char* type, const std::string& json) const {
  if (!stream_) return {};
  return std::string("event: ") + type + "\ndata: " + json + "\n\n";
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

std::string MessageEvents::Open(Block::Kind kind, std::string id, std::string name) {
  std::string out = CloseOpen();
  Block b;
  b.kind = kind;
  b.id = std::move(id);
  b.name = std::move(name);
  blocks_.push_back(std::move(b));
  holds_.emplace_back();
  open_ = int(blocks_.size()) - 1;
  JsonWriter j;
  j.BeginObject().Field("type", "content_block_start").Field("index", open_).Key("content_block");
  BlockJson(j, blocks_.back(), /*complete=*/false, meta_.thinking_omitted);
  j.EndObject();
  return out + Event("content_block_start", j.str());
}

// Flushes what the open block holds back, signs a thinking block, stops it.
std::string MessageEvents::CloseOpen() {
  if (open_ < 0) return {};
  size_t index = size_t(open_);
  std::string out = Piece(index, holds_[index].Flush());
  if (blocks_[index].kind == Block::kThinking) {
    JsonWriter j;
    j.BeginObject().Field("type", "content_block_delta").Field("index", open_).Key("delta").BeginObject();
    j.Field("type", "signature_delta").Field("signature", ThinkingSignature(blocks_[index].text)).EndObject();
    j.EndObject();
    out += Event("content_block_delta", j.str());
  }
  JsonWriter j;
  j.BeginObject().Field("type", "content_block_stop").Field("index", open_).EndObject();
  out += Event("content_block_stop", j.str());
  open_ = -1;
  return out;
}

// A piece already released by the block's UTF-8 holder.
std::string MessageEvents::Piece(size_t index, const std::string& piece) {
  if (piece.empty()) return {};
  Block& b = blocks_[index];
  b.text += piece;
  JsonWriter j;
  j.BeginObject().Field("type", "content_block_delta").Field("index", int64_t(index)).Key("delta").BeginObject();
  switch (b.kind) {
    case Block::kThinking:
      if (meta_.thinking_omitted) return {};  // the signature still covers the text
      j.Field("type", "thinking_delta").Field("thinking", piece);
      break;
    case Block::kText: j.Field("type", "text_delta").Field("text", piece); break;
    case Block::kToolUse: j.Field("type", "input_json_delta").Field("partial_json", piece); break;
  }
  j.EndObject().EndObject();
  return Event("content_block_delta", j.str());
}

std::string MessageEvents::OnDelta(const engine::Delta& delta) {
  if (finished_) return {};
  std::string out;
  auto text = [&](Block::Kind kind, const std::string& bytes) {
    if (bytes.empty()) return;
    if (open_ < 0 || blocks_[size_t(open_)].kind != kind) out += Open(kind);
    out += Piece(size_t(open_), holds_[size_t(open_)].Push(bytes));
  };
  text(Block::kThinking, delta.reasoning);
  text(Block::kText, delta.content);
  for (const engine::ToolCallDelta& tc : delta.tool_calls) {
    auto it = call_block_.find(tc.index);
    if (it == call_block_.end()) {
      // Anthropic's ids are "toolu_..."; the engine's own id keeps it unique.
      std::string id = "toolu_" + (tc.id.empty() ? meta_.id + "_" + std::to_string(tc.index) : tc.id);
      out += Open(Block::kToolUse, std::move(id), tc.name);
      it = call_block_.emplace(tc.index, size_t(open_)).first;
    }
    // Calls arrive one after another; a piece for an earlier call (not seen
    // from K3's parser) still lands in its own block.
    if (!tc.arguments.empty()) out += Piece(it->second, holds_[it->second].Push(tc.arguments));
  }
  return out;
}

std::string MessageEvents::Finish(const engine::GenerateResult& result, const ResponseStats& stats) {
  if (finished_) return {};
  std::string out = CloseOpen();
  for (size_t i = 0; i < blocks_.size(); ++i) out += Piece(i, holds_[i].Flush());  // earlier calls' leftovers
  finished_ = true;
  bool calls = !call_block_.empty();
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
  for (const Block& b : blocks_) BlockJson(j, b, /*complete=*/true, meta_.thinking_omitted);
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
