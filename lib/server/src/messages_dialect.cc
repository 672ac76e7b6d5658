// The Anthropic Messages dialect: the same admission, queue and generation as
// chat.completions (service.cc), with Anthropic's parser, event writer
// (messages_stream.cc) and error shape, and its count_tokens route.
#include "k3/server/dialect.h"
#include "k3/server/messages.h"
#include "k3/server/messages_stream.h"

namespace k3::server {
namespace {

ParsedRequest ParseMessages(std::string_view body, const ApiPolicy& policy) {
  MessagesRequest m = ParseMessagesRequestOrThrow(body, policy);
  ParsedRequest p;
  p.request = std::move(m.request);
  p.writer = [thinking_omitted = m.thinking_omitted](const Service::Job& job) {
    MessageMeta meta;
    meta.id = job.meta.id;
    meta.model = job.meta.model;
    meta.prompt_tokens = int64_t(job.prompt_ids.size());
    meta.thinking_omitted = thinking_omitted;
    meta.return_progress = job.request.return_progress;
    return std::make_unique<MessageEvents>(std::move(meta), job.request.stream);
  };
  return p;
}

tok::RenderedChat ParseCountTokens(std::string_view body, const ApiPolicy& policy) {
  return ParseMessagesRequestOrThrow(body, policy, MessagesCall::kCountTokens).request.chat;
}

HttpReply AnthropicErrorReply(const ApiError& e, int retry_after_s) {
  ApiError shaped = e;
  // A full queue is the server's capacity, not the client's rate: Anthropic's
  // 529 overloaded_error, which its SDKs retry (docs/server.md).
  if (e.code == "queue_full") shaped.status = 529;
  HttpReply r;
  r.status = shaped.status;
  r.body = AnthropicErrorJson(shaped);
  if (retry_after_s >= 0 && (shaped.status == 429 || shaped.status == 529 || shaped.status == 503)) {
    r.headers.push_back({"Retry-After", std::to_string(retry_after_s)});
  }
  return r;
}

}  // namespace

// anthropic-version is accepted, whatever it says.
constinit const Dialect kMessagesDialect{.name = "messages", .path = "/v1/messages", .id_prefix = "msg_k3",
                                         .parse = &ParseMessages, .error = &AnthropicErrorReply,
                                         .key_hint = "x-api-key: <key> (or Authorization: Bearer <key>)",
                                         .count_tokens_path = "/v1/messages/count_tokens",
                                         .count_parse = &ParseCountTokens};

}  // namespace k3::server
