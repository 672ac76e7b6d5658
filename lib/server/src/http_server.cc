// cpp-httplib (0.11.4, Debian) around Service. The library runs handlers on a
// thread pool; long answers go out as chunked responses written from the
// content provider, so a failed write is how a vanished client is noticed
// (0.11.4 has no "is the peer still there" call).
#include <httplib.h>

#include <algorithm>
#include <thread>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/server/messages.h"
#include "k3/server/server.h"

namespace k3::server {
namespace {

void Send(httplib::Response& res, const HttpReply& reply) {
  res.status = reply.status;
  for (auto& [k, v] : reply.headers) res.set_header(k, v);
  res.set_content(reply.body, reply.content_type.c_str());
}

// The Anthropic routes answer errors in Anthropic's shape (messages.h).
bool IsMessagesPath(const std::string& path) { return path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0; }

// A validated job goes out as a chunked response written from the content
// provider (RunChat writes heartbeats, deltas and the end).
void SendJob(Service& service, httplib::Response& res, std::variant<HttpReply, std::unique_ptr<Service::Job>> prepared) {
  if (auto* reply = std::get_if<HttpReply>(&prepared)) {
    Send(res, *reply);
    return;
  }
  std::shared_ptr<Service::Job> job(std::move(std::get<std::unique_ptr<Service::Job>>(prepared)));
  // "application/json; charset=utf-8" is not on httplib's compressible list, so
  // the whitespace heartbeats of a non-streamed answer are not held in a gzip buffer.
  const char* type = Service::IsStream(*job) ? "text/event-stream" : "application/json; charset=utf-8";
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(type, [&service, job](size_t, httplib::DataSink& sink) {
    service.RunChat(*job, [&sink](std::string_view bytes) {
      if (bytes.empty()) return true;
      return sink.write(bytes.data(), bytes.size());
    });
    sink.done();
    return true;
  });
}

}  // namespace

struct HttpServer::Impl {
  httplib::Server svr;
};

HttpServer::HttpServer(Service& service) : impl_(std::make_unique<Impl>()), service_(service) {
  const ServerOptions& o = service_.options();
  httplib::Server& svr = impl_->svr;
  size_t threads = o.threads > 0 ? size_t(o.threads) : size_t(o.queue) + 8;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(o.api.max_body_bytes);
  svr.set_read_timeout(o.read_timeout_s, 0);
  svr.set_write_timeout(o.write_timeout_s, 0);
  svr.set_keep_alive_max_count(100);
  svr.set_keep_alive_timeout(5);
  svr.set_tcp_nodelay(true);  // SSE chunks are small and latency matters

  // /v1 needs the key when one is configured; /health, /metrics and / do not.
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 &&
        !service_.Authorized(req.get_header_value("Authorization"), req.get_header_value("x-api-key"))) {
      Send(res, IsMessagesPath(req.path) ? service_.MessagesUnauthorized() : service_.Unauthorized());
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Errors httplib produces itself (413 body too large, 400 bad request line,
  // 404 no route) get the same JSON error object as ours.
  svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (IsMessagesPath(req.path)) {
      std::string what = res.status == 413 ? "request body exceeds the " +
                                                 std::to_string(service_.options().api.max_body_bytes) + "-byte limit"
                                           : res.status == 404 ? "no route " + req.method + " " + req.path
                                                               : "HTTP error " + std::to_string(res.status);
      HttpReply r = service_.MessagesErrorReply(MakeApiError(res.status, "", what));
      res.set_content(r.body, r.content_type.c_str());
      return;
    }
    if (res.status == 404) {
      HttpReply r = service_.NotFound(req.path);
      res.set_content(r.body, r.content_type.c_str());
      return;
    }
    ApiError e;
    e.status = res.status;
    if (res.status == 413) {
      e.message = "request body exceeds the " + std::to_string(service_.options().api.max_body_bytes) +
                  "-byte limit";
      e.code = "request_too_large";
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    service_.metrics().CountRejected(res.status);
    res.set_content(e.Json(), "application/json");
  });
  svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    K3_LOG_ERROR("serve: handler failed: %s", what.c_str());
    res.status = 500;
    ApiError e = MakeApiError(500, "server_error", what);
    res.set_content(IsMessagesPath(req.path) ? AnthropicErrorJson(e) : e.Json(), "application/json");
  });

  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) { Send(res, service_.Health()); });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { Send(res, service_.MetricsText()); });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { Send(res, service_.Models()); });
  svr.Get("/", [this](const httplib::Request&, httplib::Response& res) { Send(res, service_.Page()); });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    SendJob(service_, res, service_.PrepareChat(req.body));
  });
  // The Anthropic Messages API (docs/server.md); anthropic-version is accepted, whatever it says.
  svr.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    SendJob(service_, res, service_.PrepareMessages(req.body));
  });
  svr.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
    SendJob(service_, res, service_.PrepareResponses(req.body));
  });
  svr.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    Send(res, service_.CountTokens(req.body));
  });
}

HttpServer::~HttpServer() = default;

void HttpServer::BindOrThrow() {
  const ServerOptions& o = service_.options();
  httplib::Server& svr = impl_->svr;
  if (o.port == 0) {
    port_ = svr.bind_to_any_port(o.host);
    if (port_ <= 0) throw Error(ErrorCode::kIo, "cannot bind any port on " + o.host, o.host);
  } else {
    if (!svr.bind_to_port(o.host, o.port)) {
      throw Error(ErrorCode::kIo, "cannot bind " + o.host + ":" + std::to_string(o.port) + " (in use?)",
                  o.host + ":" + std::to_string(o.port));
    }
    port_ = o.port;
  }
}

void HttpServer::Serve() { impl_->svr.listen_after_bind(); }

void HttpServer::Stop() { impl_->svr.stop(); }

}  // namespace k3::server
