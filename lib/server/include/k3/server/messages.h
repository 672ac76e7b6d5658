// k3::server — the Anthropic Messages API (POST /v1/messages and
// /v1/messages/count_tokens) over the same queue and engine as the OpenAI
// route: a parser that validates a Messages request completely and maps it to
// the equivalent chat.completions request (so it renders to exactly the ids
// that request would), and Anthropic's error object; the answer's events are
// messages_stream.h. docs/server.md "Messages API".
//
// Pure functions, thread-safe, like api.h: the parser throws k3::Error
// kInvalidArgument naming the Anthropic field (object() =
// "messages[2].content[0].tool_use_id"), kUnsupported for valid requests k3
// cannot serve (images, documents, server tools, assistant prefill), kNoSpace
// for a body over the cap.
#pragma once

#include <string>
#include <string_view>

#include "k3/server/api.h"

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
  bool thinking_omitted = false;  // thinking.display "omitted": thinking blocks are sent empty
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

}  // namespace k3::server
