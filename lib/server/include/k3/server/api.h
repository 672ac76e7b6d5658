// k3::server — the OpenAI / Kimi K3 chat-completions request contract: one
// parser that validates a request body completely (size and depth caps first,
// every rule of Moonshot's Kimi-Vendor-Verifier, docs/server.md) and turns it
// into a prompt exactly as `k3-run render` builds it, plus the error object.
//
// Pure functions, thread-safe. Failures: ParseChatRequestOrThrow throws
// k3::Error kInvalidArgument (object() = the offending parameter, for the
// error's "param"); kUnsupported for valid requests k3 cannot serve (images,
// logprobs). ApiErrorFor maps any k3::Error to an HTTP status and error body.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "k3/core/error.h"
#include "k3/tokenizer/chat.h"

namespace k3::engine {
struct StructuredOutput;  // k3/engine/engine.h
}

namespace k3::server {

// The temperature / top_p values `--sampling k3` accepts besides the model's
// defaults (KVV tests/params); /v1/models lists them for the web page.
inline constexpr double kLockedTemperatures[] = {0.0, 0.6, 1.0};
inline constexpr double kLockedTopP[] = {0.95, 1.0};

// Operator choices that shape what a request may ask for.
struct ApiPolicy {
  // Sampling values a client may send without --sampling free: the model's
  // generation_config defaults and the K3 values Moonshot's API accepts
  // (KVV tests/params: temperature 0.6 / 0.0 / 1.0, top_p 0.95 / 1.0).
  float default_temperature = 1.0f;
  float default_top_p = 1.0f;
  bool sampling_free = false;          // --sampling free: any temperature in [0,2], top_p in (0,1]
  // --max-tokens: the cap when the request sets none; 0: none, the answer runs
  // to its end or the context's (as OpenAI, llama-server and vLLM do; an
  // agent that sets no cap must not see its answer cut).
  int64_t default_max_tokens = 0;
  size_t max_body_bytes = 16u << 20;   // checked by the HTTP layer (413) and again here
  size_t max_depth = 64;               // JSON nesting
  size_t max_messages = 4096;          // longer conversations are 400 (tests: 10,000 messages)
  size_t max_stop = 4;                 // OpenAI's limit
  size_t max_stop_bytes = 256;
  size_t max_tool_name = 256;          // KVV: a 257-character name is refused
};

// Structured output (docs/constrain.md): what a request asks the
// decoder to guarantee. Filled by the OpenAI parser (tools[].function,
// tool_choice, response_format) and by the Anthropic Messages parser (tools,
// tool_choice auto/any/tool/none); the engine backend turns it into the
// constraint that masks sampling.
struct ToolSpec {
  std::string name;
  std::string parameters_json;  // the JSON Schema text as sent; "" = none given
  // function.strict (OpenAI): what k3 cannot enforce is a 400. Not strict: it
  // is relaxed to a superset (docs/constrain.md). Constrained once a call opens.
  bool strict = false;
  // Where parameters_json sits in the request ("tools[0].function.parameters"),
  // the param of a 400 when it does not compile.
  std::string param;
};
enum class ToolChoice { kAuto, kNone, kRequired, kNamed };
enum class ResponseFormat { kText, kJsonObject, kJsonSchema };

// A validated request, ready for the queue.
struct ChatRequest {
  std::string model;  // as sent (may be empty)
  bool stream = false;
  bool include_usage = false;
  bool return_progress = false;  // llama-server's return_progress: prompt_progress during prefill
  bool ignore_eos = false;       // llama-server's / vLLM's ignore_eos (engine::GenerateRequest)
  // resolved: max_completion_tokens, max_tokens or the policy default; 0: up
  // to the context limit (engine::GenerateRequest::max_tokens)
  int64_t max_tokens = 0;
  bool max_tokens_from_request = false;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  float temperature = 1.0f;
  float top_p = 1.0f;
  bool thinking = true;                 // resolved
  std::optional<std::string> effort;    // resolved, when thinking
  bool has_tools = false;               // global or dynamic
  // Every tool the prompt declares (global and dynamic, in declaration order).
  std::vector<ToolSpec> tools;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;         // kNamed: the one function allowed
  ResponseFormat response_format = ResponseFormat::kText;
  std::string response_schema_json;     // kJsonSchema: json_schema.schema as sent
  bool response_strict = false;  // kJsonSchema: json_schema.strict (false: relaxed, as for tools)
  // A hard cap on think tokens (the Messages API's thinking.budget_tokens);
  // -1: none. Compiled into structured->think_budget.
  int64_t think_budget = -1;
  // The compiled form of the fields above (CompileStructuredOrThrow), what
  // the engine enforces; null when there is nothing to enforce.
  std::shared_ptr<const engine::StructuredOutput> structured;
  // The request as `k3-run render --request` takes it: the body with a leading
  // "options" object that carries the resolved thinking settings. Rendering it
  // gives `chat`.
  std::string render_json;
  tok::RenderedChat chat;
};

// Validates `body` (a chat.completions request) and renders its prompt.
// Compiles its schemas too (CompileStructuredOrThrow).
ChatRequest ParseChatRequestOrThrow(std::string_view body, const ApiPolicy& policy);

// Compiles tools[].parameters_json and response_schema_json into
// request.structured (docs/server.md "Constrained decoding"), for every API
// parser that fills those fields. A strict schema (ToolSpec::strict,
// response_strict) that k3 cannot enforce is refused, never served
// unconstrained; any other is relaxed to a superset and never refused for its
// keywords. Refusals: kUnsupported (the keyword is named in the message) or
// kInvalidArgument (not a schema, or unsatisfiable), whose object() is the
// ToolSpec's param or `response_param`, so ApiErrorFor gives a 400 naming it.
// kNamed needs tool_choice_name among the tools (kInvalidArgument naming
// `tool_choice_param`).
void CompileStructuredOrThrow(ChatRequest& request,
                              std::string_view response_param = "response_format.json_schema.schema",
                              std::string_view tool_choice_param = "tool_choice.function.name");

// Caps the think channel at `budget` tokens (request.think_budget, and the
// compiled spec's, made when there was none): at the cap the engine forces the
// channel's close. No effect when thinking is off.
void SetThinkBudget(ChatRequest& request, int64_t budget);

// An error as the API answers it: HTTP status and the OpenAI error object.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // empty -> null
  std::string code;   // empty -> null
  std::string Json() const;  // {"error":{"message","type","param","code"}}
};

ApiError ApiErrorFor(const Error& e);
ApiError MakeApiError(int status, std::string type, std::string message, std::string code = {},
                      std::string param = {});

// Throws kInvalidArgument naming `param`.
[[noreturn]] void ThrowBadParam(std::string_view param, std::string message);

}  // namespace k3::server
