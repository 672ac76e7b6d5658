// The OpenAI-compatible server: Service is every route's logic without
// sockets (unit-testable with a scripted Backend), HttpServer puts it on
// cpp-httplib (Debian's libcpp-httplib-dev 0.11.4). docs/server.md documents
// the routes, fields, errors and limits.
//
// Threads: HttpServer runs handlers on a pool of ServerOptions::threads
// threads; Service is thread-safe; the Backend is only ever asked to Generate
// by the request holding the queue's turn (one at a time), while PromptIds and
// the const getters may be called from any handler thread concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "k3/engine/engine.h"
#include "k3/server/api.h"
#include "k3/server/metrics.h"
#include "k3/server/queue.h"
#include "k3/server/response_writer.h"
#include "k3/server/stream.h"

namespace k3::server {

// What the server needs from a generation runtime (EngineBackend wraps
// engine::Engine; tests script one).
class Backend {
 public:
  virtual ~Backend() = default;
  // Thread-safe: BOS + the rendered chat's ids, as Engine::ChatPromptIds.
  virtual std::vector<int32_t> PromptIds(const tok::RenderedChat& chat) const = 0;
  virtual int64_t context_limit() const = 0;
  virtual engine::SamplingParams default_sampling() const = 0;
  // Called by one request at a time (the queue's turn).
  virtual engine::GenerateResult Generate(const engine::GenerateRequest& request,
                                          const engine::Callbacks& callbacks) = 0;
  virtual model::ExpertStoreStats expert_stats() const = 0;
  // Thread-safe (read by /metrics while a request runs); zero without checkpoints.
  virtual engine::CheckpointCacheStats checkpoint_stats() const { return {}; }
};

// Wraps an engine (defined only when lib/engine is built).
std::unique_ptr<Backend> MakeEngineBackend(engine::Engine& engine);

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;            // 0: any free port (HttpServer::port() says which)
  std::string api_key;        // empty: no auth; any Authorization header is ignored
  int queue = 8;              // requests that may wait behind the running one
  std::string model_id = "k3";
  bool webui = true;
  ApiPolicy api;
  int threads = 0;            // 0: queue + 8
  int read_timeout_s = 10;    // per read while receiving a request
  int write_timeout_s = 30;   // per write; a client that stops reading is dropped
  int heartbeat_ms = 1000;    // SSE comment / JSON whitespace while queued or prefilling
  int retry_after_s = 1;      // Retry-After on 429
  // More Prometheus text appended to /metrics (k3-run serve --cluster: the
  // placement, per-worker bytes read, hit rates, exchange time). Thread-safe.
  std::function<std::string()> extra_metrics;
};

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class Service {
 public:
  explicit Service(ServerOptions options);
  ~Service();

  // nullptr while loading: /health answers 503 and chat requests 503.
  void SetBackend(Backend* backend);
  const ServerOptions& options() const { return options_; }

  HttpReply Health() const;
  HttpReply Models() const;
  HttpReply MetricsText() const;
  HttpReply Page() const;
  HttpReply NotFound(std::string_view path) const;
  HttpReply ErrorReply(const ApiError& e) const;  // counts a rejection

  // Constant-time compare of "Bearer <key>" (or of x_api_key, Anthropic's
  // header, with the key itself); always true without a key.
  bool Authorized(std::string_view authorization, std::string_view x_api_key = {}) const;
  HttpReply Unauthorized() const;
  // The Messages API's error replies: Anthropic's error shape (messages.h).
  HttpReply MessagesErrorReply(const ApiError& e) const;  // counts a rejection
  HttpReply MessagesUnauthorized() const;

  // A validated, admitted chat request waiting to run.
  struct Job {
    ChatRequest request;
    std::vector<int32_t> prompt_ids;
    std::unique_ptr<RequestQueue::Ticket> ticket;
    ResponseMeta meta;
    std::unique_ptr<ResponseWriter> writer;  // the API's bytes for this request
    std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
  };
  // On the handler thread: validate, render, count prompt tokens, take a queue
  // place. An HttpReply is an answer already (400 / 413 / 429 / 503).
  std::variant<HttpReply, std::unique_ptr<Job>> PrepareChat(std::string_view body);
  // The same for POST /v1/messages (messages_service.cc).
  std::variant<HttpReply, std::unique_ptr<Job>> PrepareMessages(std::string_view body);
  // POST /v1/messages/count_tokens: {"input_tokens": N}.
  HttpReply CountTokens(std::string_view body);
  static bool IsStream(const Job& job);
  // In the response writer: wait for the model, generate, write. `write`
  // returns false when the client is gone; that cancels the request.
  void RunChat(Job& job, const std::function<bool(std::string_view)>& write);

  Metrics& metrics() { return metrics_; }
  RequestQueue& queue() { return queue_; }

 private:
  // Admission shared by both APIs: `parse` validates and renders, `reply`
  // shapes an error, `id_prefix` starts the response id.
  std::variant<HttpReply, std::unique_ptr<Job>> Admit(std::string_view body,
                                                      const std::function<ChatRequest(std::string_view)>& parse,
                                                      HttpReply (Service::*reply)(const ApiError&) const,
                                                      const char* id_prefix);
  ServerOptions options_;
  std::atomic<Backend*> backend_{nullptr};
  RequestQueue queue_;
  mutable Metrics metrics_;
  std::atomic<uint64_t> next_id_{1};
};

// cpp-httplib around a Service.
class HttpServer {
 public:
  explicit HttpServer(Service& service);
  ~HttpServer();
  // Binds host:port (throws k3::Error kIo naming the address on failure).
  void BindOrThrow();
  int port() const { return port_; }
  // Serves until Stop(); call from one thread.
  void Serve();
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Service& service_;
  int port_ = 0;
};

// The embedded web page (lib/server/src/webui.html).
std::string_view WebPage();

}  // namespace k3::server
