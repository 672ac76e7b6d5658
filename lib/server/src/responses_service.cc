// The Responses API's route on Service: the same admission, queue and
// generation as chat.completions (service.cc), with the Responses parser and
// event writer; errors in OpenAI's shape.
#include "k3/core/log.h"
#include "k3/server/responses.h"
#include "k3/server/server.h"

namespace k3::server {

std::variant<HttpReply, std::unique_ptr<Service::Job>> Service::PrepareResponses(
    std::string_view body) {
  ResponsesEcho echo;
  auto prepared = Admit(
      body,
      [&](std::string_view b) {
        ResponsesRequest r = ParseResponsesRequestOrThrow(b, options_.api);
        echo = std::move(r.echo);
        if (!r.ignored_tools.empty()) {
          std::string types;
          for (const std::string& t : r.ignored_tools) types += (types.empty() ? "" : ", ") + t;
          K3_LOG_INFO("serve: /v1/responses: tools k3 cannot run left out of the prompt: %s",
                      types.c_str());
        }
        return std::move(r.request);
      },
      &Service::ErrorReply, "resp_k3");
  if (auto* job = std::get_if<std::unique_ptr<Job>>(&prepared)) {
    ResponseObjectMeta meta;
    meta.id = (*job)->meta.id;
    meta.created_at = (*job)->meta.created;
    meta.model = (*job)->meta.model;
    meta.echo = std::move(echo);
    meta.return_progress = (*job)->request.return_progress;
    (*job)->writer = std::make_unique<ResponseEvents>(std::move(meta), (*job)->request.stream);
  }
  return prepared;
}

}  // namespace k3::server
