// The Messages API's routes on Service: the same admission, queue and
// generation as chat.completions (service.cc), with Anthropic's parser, event
// writer and error shape.
#include "k3/core/json_writer.h"
#include "k3/server/messages.h"
#include "k3/server/messages_stream.h"
#include "k3/server/server.h"

namespace k3::server {

HttpReply Service::MessagesErrorReply(const ApiError& e) const {
  ApiError shaped = e;
  // A full queue is the server's capacity, not the client's rate: Anthropic's
  // 529 overloaded_error, which its SDKs retry (docs/server.md).
  if (e.code == "queue_full") shaped.status = 529;
  HttpReply r;
  r.status = shaped.status;
  r.body = AnthropicErrorJson(shaped);
  if (shaped.status == 429 || shaped.status == 529 || shaped.status == 503) {
    r.headers.push_back({"Retry-After", std::to_string(options_.retry_after_s)});
  }
  return r;
}

HttpReply Service::MessagesUnauthorized() const {
  return MessagesErrorReply(MakeApiError(
      401, "authentication_error", "missing or wrong API key: send x-api-key: <key> (or Authorization: Bearer <key>)",
      "invalid_api_key"));
}

std::variant<HttpReply, std::unique_ptr<Service::Job>> Service::PrepareMessages(std::string_view body) {
  bool thinking_omitted = false;
  auto prepared = Admit(
      body,
      [&](std::string_view b) {
        MessagesRequest m = ParseMessagesRequestOrThrow(b, options_.api);
        thinking_omitted = m.thinking_omitted;
        return std::move(m.request);
      },
      &Service::MessagesErrorReply, "msg_k3");
  if (auto* job = std::get_if<std::unique_ptr<Job>>(&prepared)) {
    MessageMeta meta;
    meta.id = (*job)->meta.id;
    meta.model = (*job)->meta.model;
    meta.prompt_tokens = int64_t((*job)->prompt_ids.size());
    meta.thinking_omitted = thinking_omitted;
    meta.return_progress = (*job)->request.return_progress;
    (*job)->writer = std::make_unique<MessageEvents>(std::move(meta), (*job)->request.stream);
  }
  return prepared;
}

HttpReply Service::CountTokens(std::string_view body) {
  Backend* backend = backend_.load();
  if (!backend) return MessagesErrorReply(MakeApiError(503, "overloaded_error", "the model is still loading", "loading"));
  std::vector<int32_t> ids;
  try {
    ids = backend->PromptIds(ParseMessagesRequestOrThrow(body, options_.api, MessagesCall::kCountTokens).request.chat);
  } catch (const Error& e) {
    return MessagesErrorReply(ApiErrorFor(e));
  }
  JsonWriter j;
  j.BeginObject().Field("input_tokens", int64_t(ids.size())).EndObject();
  HttpReply r;
  r.body = j.Take();
  return r;
}

}  // namespace k3::server
