// The OpenAI Responses dialect (Codex, client.responses.*): the same
// admission, queue and generation as chat.completions (service.cc), with the
// Responses parser and event writer (responses_stream.cc); errors in OpenAI's
// shape.
#include "k3/core/log.h"
#include "k3/server/dialect.h"
#include "k3/server/responses.h"

namespace k3::server {
namespace {

ParsedRequest ParseResponses(std::string_view body, const ApiPolicy& policy) {
  ResponsesRequest r = ParseResponsesRequestOrThrow(body, policy);
  if (!r.ignored_tools.empty()) {
    std::string types;
    for (const std::string& t : r.ignored_tools) types += (types.empty() ? "" : ", ") + t;
    K3_LOG_INFO("serve: /v1/responses: tools k3 cannot run left out of the prompt: %s", types.c_str());
  }
  ParsedRequest p;
  p.request = std::move(r.request);
  p.writer = [echo = std::move(r.echo)](const Service::Job& job) {
    ResponseObjectMeta meta;
    meta.id = job.meta.id;
    meta.created_at = job.meta.created;
    meta.model = job.meta.model;
    meta.echo = echo;
    meta.return_progress = job.request.return_progress;
    return std::make_unique<ResponseEvents>(std::move(meta), job.request.stream);
  };
  return p;
}

}  // namespace

constinit const Dialect kResponsesDialect{.name = "responses", .path = "/v1/responses", .id_prefix = "resp_k3",
                                          .parse = &ParseResponses, .error = &OpenAiErrorReply};

}  // namespace k3::server
