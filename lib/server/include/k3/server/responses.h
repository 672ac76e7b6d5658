// k3::server — the OpenAI Responses API (POST /v1/responses), the protocol
// Codex and the openai SDKs' responses.create / responses.stream speak, over
// the same queue and engine as the other routes: a parser that validates a
// Responses body and maps it to the equivalent chat.completions request (so
// it renders to exactly the ids that request would), and ResponseEvents, the
// typed event stream / whole response object built from engine::Delta
// events. docs/server.md "The Responses API".
//
// The parser is a pure function, thread-safe: it throws k3::Error
// kInvalidArgument naming the Responses field (object() =
// "input[3].call_id"), kUnsupported for valid requests k3 cannot serve
// (images, previous_response_id, hosted tool calls in the input). A
// ResponseEvents is per request, not thread-safe, and never throws on model
// output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "k3/engine/engine.h"
#include "k3/server/api.h"
#include "k3/server/response_writer.h"
#include "k3/server/stream.h"

namespace k3::server {

class Segmenter;  // segmenter.h (private)

// What the response object echoes of the request (OpenAI's Response carries
// its parameters), as JSON text ready to be written.
struct ResponsesEcho {
  std::string instructions = "null";
  std::string tools = "[]";  // the function tools k3 declared to the model
  std::string tool_choice = "\"auto\"";
  std::string text = "{\"format\":{\"type\":\"text\"}}";
  std::string reasoning = "{\"effort\":null,\"summary\":null}";
  std::string max_output_tokens = "null";
  std::string metadata = "{}";
  bool parallel_tool_calls = true;
  bool store = false;
  double temperature = 1.0, top_p = 1.0;  // the values the engine samples with
};

struct ResponsesRequest {
  // Ready for the queue: rendered prompt, sampling, tools and schemas.
  ChatRequest request;
  // The equivalent chat.completions body (request.render_json is this body
  // with the renderer's options), what `k3-run render --request` takes.
  std::string openai_body;
  ResponsesEcho echo;
  // Tools of types k3 cannot run (web_search, namespace, ...) that were left
  // out of the prompt, by type, in request order.
  std::vector<std::string> ignored_tools;
};

// Validates `body` and maps it (docs/server.md, field by field).
ResponsesRequest ParseResponsesRequestOrThrow(std::string_view body, const ApiPolicy& policy);

struct ResponseObjectMeta {
  std::string id;  // "resp_..."
  int64_t created_at = 0;
  std::string model;
  ResponsesEcho echo;
  bool return_progress = false;  // response.in_progress events carry prompt_progress
};

// The answer as output items (reasoning, message, function_call), streamed
// as the Responses API's typed SSE events (response.created,
// response.in_progress, response.output_item.added / done,
// response.content_part.added / done, response.reasoning_text.* /
// response.output_text.* / response.function_call_arguments.*,
// response.completed or response.incomplete; response.failed for an engine
// error) with a sequence_number on each, or returned as one Response object.
class ResponseEvents : public ResponseWriter {
 public:
  ResponseEvents(ResponseObjectMeta meta, bool stream);
  ~ResponseEvents() override;

  std::string Begin() override;  // response.created + response.in_progress (streamed)
  std::string OnDelta(const engine::Delta& delta) override;
  // An SSE comment plus a "keepalive" event (the openai SDK's no-op event;
  // Codex's idle timer counts every event); JSON whitespace when whole.
  std::string Heartbeat(std::string_view what) override;
  // With return_progress: a response.in_progress event carrying
  // "prompt_progress" (PromptProgressJson) in place of the keepalive.
  std::string Progress(const engine::PrefillProgress& progress) override;
  std::string Finish(const engine::GenerateResult& result, const ResponseStats& stats) override;
  std::string Error(const ApiError& error) override;

 private:
  template <class>
  friend class WriterEvents;  // segmenter.h: the segment events as output_item / content_part events
  std::string Opened(size_t index);
  std::string Piece(size_t index, const std::string& piece);
  std::string Closed(size_t index);
  std::string Event(const char* type, const std::string& fields);  // fields: "" or ",\"k\":v..."
  std::string ResponseJson(const char* status, const std::string& extra) const;
  ResponseObjectMeta meta_;
  bool stream_;
  bool finished_ = false;
  int64_t sequence_ = 0;
  std::unique_ptr<Segmenter> items_;
};

// The Responses API's usage object: input_tokens (+ details.cached_tokens),
// output_tokens (+ details.reasoning_tokens), total_tokens.
std::string ResponsesUsageJson(const engine::Usage& usage);

}  // namespace k3::server
