// k3::server — the Anthropic Messages answer (docs/server.md "Messages
// API"): Anthropic's SSE events for a streamed answer and the whole message
// object, both folded from the same engine::Delta events. MessageEvents is a
// per-request object, not thread-safe, and never throws on model output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "k3/engine/engine.h"
#include "k3/server/api.h"
#include "k3/server/response_writer.h"
#include "k3/server/stream.h"

namespace k3::server {

class Segmenter;  // segmenter.h (private)

// What a Messages answer needs besides the deltas.
struct MessageMeta {
  std::string id;     // "msg_..."
  std::string model;
  int64_t prompt_tokens = 0;  // for message_start, before the engine reports cache reuse
  bool thinking_omitted = false;  // thinking.display "omitted": no thinking text goes out
  bool return_progress = false;   // k3's prefill_progress events (docs/server.md)
};

// "stop_reason" from the engine's outcome: max_tokens, tool_use,
// stop_sequence or end_turn.
std::string StopReasonName(engine::FinishReason reason, bool had_tool_calls, bool stop_matched);

// Not a cryptographic signature: a stable tag of the thinking text, so clients
// that require one get one. K3 ignores signatures it is sent back.
std::string ThinkingSignature(std::string_view thinking);

// The answer as content blocks, built from engine::Delta events; streamed as
// Anthropic's SSE events or returned as one message object. A new block opens
// whenever the kind of output changes (thinking -> text -> tool_use), each
// tool call is its own tool_use block (the segments of segmenter.h).
class MessageEvents : public ResponseWriter {
 public:
  MessageEvents(MessageMeta meta, bool stream);
  ~MessageEvents() override;

  std::string Begin() override;  // message_start (streamed); "" otherwise
  std::string OnDelta(const engine::Delta& delta) override;
  std::string Heartbeat(std::string_view what) override;  // event: ping / JSON whitespace
  std::string Progress(
      const engine::PrefillProgress& progress) override;  // ping (+ prefill_progress)
  std::string Finish(const engine::GenerateResult& result, const ResponseStats& stats) override;
  std::string Error(const ApiError& error) override;  // event: error / the error object

 private:
  template <class>
  friend class WriterEvents;  // segmenter.h: the segment events as content_block_* events
  std::string Opened(size_t index);
  std::string Piece(size_t index, const std::string& piece);
  std::string Closed(size_t index);
  std::string Event(const char* type, const std::string& json) const;
  MessageMeta meta_;
  bool stream_;
  bool finished_ = false;
  std::unique_ptr<Segmenter> blocks_;
};

// The tool_use input object for arguments text: the text itself when it is a
// JSON object, {} when empty, else {"_k3_unparsed_arguments": text}.
std::string ToolInputJson(std::string_view arguments);

}  // namespace k3::server
