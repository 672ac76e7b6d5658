// The API dialects k3 speaks (OpenAI chat.completions, Anthropic Messages,
// the OpenAI Responses API), each one descriptor: how its request body parses,
// how its errors look, how its response ids start, which writer answers it.
// The POST routes are a table of them (Dialects()), and an error on a path is
// shaped by the dialect that owns the path (DialectForPath), so a new dialect
// is one file defining one more descriptor plus its line in the table
// (dialect.cc). docs/server.md "The code's rooms".
//
// Descriptors are constants; every function in them is thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "k3/server/api.h"
#include "k3/server/response_writer.h"
#include "k3/server/server.h"
#include "k3/tokenizer/chat.h"

namespace k3::server {

// A body validated and mapped by a dialect's parser.
struct ParsedRequest {
  ChatRequest request;  // ready for the queue: rendered prompt, sampling, tools
  // The answer's writer once the request is admitted (the job has its id,
  // prompt ids and request); carries what the parser kept for it.
  std::function<std::unique_ptr<ResponseWriter>(const Service::Job& job)> writer;
};

struct Dialect {
  const char* name;       // for logs: "chat.completions"
  const char* path;       // its POST route; errors there and below it take its shape
  const char* id_prefix;  // response ids start with it: "chatcmpl-k3"
  // Validates and renders a body; throws k3::Error (ApiErrorFor maps it).
  ParsedRequest (*parse)(std::string_view body, const ApiPolicy& policy);
  // The one place an error becomes this dialect's reply: status, error object
  // and the headers its clients act on. retry_after_s < 0: a refusal by the
  // HTTP layer itself, which carries no Retry-After.
  HttpReply (*error)(const ApiError& error, int retry_after_s);
  // How a missing or wrong key is to be sent, in this dialect's words.
  const char* key_hint = "Authorization: Bearer <key>";
  // Optional POST route answering {"input_tokens": N} for a body, and the
  // chat its parser renders for it (nullptr: none).
  const char* count_tokens_path = nullptr;
  tok::RenderedChat (*count_parse)(std::string_view body, const ApiPolicy& policy) = nullptr;
};

extern const Dialect kChatCompletionsDialect;  // chat_dialect.cc
extern const Dialect kMessagesDialect;         // messages_dialect.cc
extern const Dialect kResponsesDialect;        // responses_dialect.cc

// OpenAI's error reply (chat.completions and the Responses API): the status
// as it is, Retry-After on 429, WWW-Authenticate on 401.
HttpReply OpenAiErrorReply(const ApiError& error, int retry_after_s);

// Every dialect, in route order.
std::span<const Dialect* const> Dialects();
// The dialect owning `path` (its route or below it); chat.completions for
// every other path, so k3's own routes answer errors in OpenAI's shape.
const Dialect& DialectForPath(std::string_view path);

}  // namespace k3::server
