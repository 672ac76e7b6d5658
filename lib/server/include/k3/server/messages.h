// k3::server — the Anthropic Messages API (POST /v1/messages and
// /v1/messages/count_tokens) over the same queue and engine as the OpenAI
// route: a parser that validates a Messages request completely and maps it to
// the equivalent chat.completions request (so it renders to exactly the ids
// that request would), the event writer for the streamed answer and the
// whole message, and Anthropic's error object. docs/server.md "Messages API".
//
// Pure functions and per-request objects, like api.h and stream.h: the parser
// is thread-safe and throws k3::Error kInvalidArgument naming the Anthropic
// field (object() = "messages[2].content[0].tool_use_id"), kUnsupported for
// valid requests k3 cannot serve (images, documents, server tools, assistant
// prefill), kNoSpace for a body over the cap. MessageEvents is not
// thread-safe and never throws on model output.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "k3/engine/engine.h"
#include "k3/server/api.h"
#include "k3/server/response_writer.h"
#include "k3/server/stream.h"

namespace k3::server {

enum class MessagesCall { kCreate, kCountTokens };

struct MessagesRequest {
  // Ready for the queue: rendered prompt, sampling, stop sequences, tools,
  // tool_choice (auto -> kAuto, any -> kRequired, tool -> kNamed, none -> kNone).
  ChatRequest request;
  // The equivalent chat.completions body (what the OpenAI route would be sent;
  // request.render_json is this body with the renderer's options).
  std::string openai_body;
  bool disable_parallel_tool_use = false;  // accepted; advisory (docs/server.md)
};

// Stop sequences a Messages request may carry (the engine's own limit).
inline constexpr size_t kMaxStopSequences = 16;

// Validates `body` and maps it. kCountTokens: max_tokens is not required.
MessagesRequest ParseMessagesRequestOrThrow(std::string_view body, const ApiPolicy& policy,
                                            MessagesCall call = MessagesCall::kCreate);

// Anthropic's error object for an ApiError: {"type":"error","error":{"type",
// "message"}} with the status mapped to Anthropic's types (400
// invalid_request_error, 401 authentication_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 500 api_error, 503/529
// overloaded_error).
std::string AnthropicErrorType(int status);
std::string AnthropicErrorJson(const ApiError& error);

// What a Messages answer needs besides the deltas.
struct MessageMeta {
  std::string id;     // "msg_..."
  std::string model;
  int64_t prompt_tokens = 0;  // for message_start, before the engine reports cache reuse
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
// tool call is its own tool_use block; incomplete UTF-8 is held back.
class MessageEvents : public ResponseWriter {
 public:
  MessageEvents(MessageMeta meta, bool stream);

  std::string Begin() override;  // message_start (streamed); "" otherwise
  std::string OnDelta(const engine::Delta& delta) override;
  std::string Heartbeat(std::string_view what) override;  // event: ping / JSON whitespace
  std::string Finish(const engine::GenerateResult& result, const ResponseStats& stats) override;
  std::string Error(const ApiError& error) override;  // event: error / the error object

  struct Block {
    enum Kind { kThinking, kText, kToolUse } kind = kText;
    std::string text;  // thinking, text, or the tool's arguments JSON text
    std::string id, name;  // tool_use
  };
  const std::vector<Block>& blocks() const { return blocks_; }

 private:
  std::string Open(Block::Kind kind, std::string id = {}, std::string name = {});
  std::string CloseOpen();
  std::string Piece(size_t index, const std::string& piece);
  std::string Event(const char* type, const std::string& json) const;
  MessageMeta meta_;
  bool stream_;
  bool finished_ = false;
  int open_ = -1;  // index of the open block
  std::vector<Block> blocks_;
  std::vector<Utf8Holder> holds_;  // per block
  std::map<int, size_t> call_block_;  // engine call index -> block
};

// The tool_use input object for arguments text: the text itself when it is a
// JSON object, {} when empty, else {"_k3_unparsed_arguments": text}.
std::string ToolInputJson(std::string_view arguments);

}  // namespace k3::server
