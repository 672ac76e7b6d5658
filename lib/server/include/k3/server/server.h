// The OpenAI-compatible server: Service is every route's logic without
// sockets (unit-testable with a scripted Backend), HttpServer puts it on
// k3's own event-driven HTTP/1.1 layer (http_server.cc, http_parser.h).
// docs/server.md documents the routes, fields, errors and limits.
//
// Threads: HttpServer reads and parses every connection on one epoll thread
// and runs the POST routes on a pool of workers; Service is thread-safe; the
// Backend is only ever asked to Generate by requests holding one of the
// queue's `parallel` slots (one at a time with --parallel 1), while PromptIds
// and the const getters may be called from any worker concurrently.
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
#include "k3/server/http_parser.h"
#include "k3/server/metrics.h"
#include "k3/server/queue.h"
#include "k3/server/response_writer.h"
#include "k3/server/stream.h"

namespace k3::server {

struct Dialect;  // dialect.h

// What the server needs from a generation runtime (EngineBackend wraps
// engine::Engine; tests script one).
class Backend {
 public:
  virtual ~Backend() = default;
  // Thread-safe: BOS + the rendered chat's ids, as Engine::ChatPromptIds.
  virtual std::vector<int32_t> PromptIds(const tok::RenderedChat& chat) const = 0;
  virtual int64_t context_limit() const = 0;
  virtual engine::SamplingParams default_sampling() const = 0;
  // Called by up to ServerOptions::parallel requests at a time (the queue's slots).
  virtual engine::GenerateResult Generate(const engine::GenerateRequest& request,
                                          const engine::Callbacks& callbacks) = 0;
  virtual model::ExpertStoreStats expert_stats() const = 0;
  // Thread-safe (read by /metrics while a request runs); zero without checkpoints.
  virtual engine::CheckpointCacheStats checkpoint_stats() const { return {}; }
  // Thread-safe: continuous batching's counters (--parallel > 1; else zeros).
  virtual engine::Engine::StepStats step_stats() const { return {}; }
};

// Wraps an engine (defined only when lib/engine is built).
std::unique_ptr<Backend> MakeEngineBackend(engine::Engine& engine);

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;            // 0: any free port (HttpServer::port() says which)
  std::string api_key;        // empty: no auth; any Authorization header is ignored
  int queue = 8;              // requests that may wait behind the running ones
  // Requests that run on the model at once (k3-run serve --parallel): the
  // backend must take that many Generate calls at a time (an engine with
  // EngineOptions::parallel at least this). 0: the backend's own count
  // (Backend::step_stats().parallel), taken when SetBackend installs it.
  int parallel = 1;
  std::string model_id = "k3";
  bool webui = true;
  ApiPolicy api;
  int threads = 0;            // HTTP workers; 0: queue + parallel + prepare_concurrency
  int read_timeout_s = 10;    // per read while receiving a request body
  int write_timeout_s = 30;   // per write; a client that stops reading is dropped
  int heartbeat_ms = 1000;    // SSE comment / JSON whitespace while queued or prefilling
  // A whole (non-streamed) answer sends nothing for this long after its
  // request arrived, so a failure in that time gets its own status (503 for a
  // lost cluster worker, 500); after it, JSON whitespace keeps idle timers
  // alive and a late error is the error object in a 200 body. 0: whitespace
  // from the start. Needs ReplyHooks::peer (the HTTP layer gives it).
  int hold_status_ms = 30000;
  int retry_after_s = 1;      // Retry-After on 429

  // The HTTP layer's limits (docs/server.md "Limits"). http.max_body_bytes
  // follows api.max_body_bytes.
  HttpLimits http;
  int max_connections = 1024;           // open at once; beyond, the longest idle is closed or 503
  int max_connections_per_client = 128; // per client address, the same way
  int head_timeout_s = 10;              // the whole request head, from its first byte
  int idle_timeout_s = 30;              // a kept-alive connection between requests
  int prepare_concurrency = 2;          // requests validated/compiled/counted at once
  int shutdown_timeout_s = 10;          // SIGTERM: how long running handlers get to finish
  // Without an API key, Host must name this server (the bound address,
  // localhost, or one of these; "*": any), and a request carrying Origin must
  // come from the server's own page or one of cors_origins.
  std::vector<std::string> allowed_hosts;
  std::vector<std::string> cors_origins;  // also answered with CORS headers
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
  // `e` as `dialect` answers it (dialect.h), with this server's Retry-After.
  HttpReply ErrorReply(const Dialect& dialect, const ApiError& e) const;

  // Constant-time compare of "Bearer <key>" (or of x_api_key, Anthropic's
  // header, with the key itself); always true without a key.
  bool Authorized(std::string_view authorization, std::string_view x_api_key = {}) const;
  HttpReply Unauthorized(const Dialect& dialect) const;

  // A validated, admitted chat request waiting to run.
  struct Job {
    ChatRequest request;
    std::vector<int32_t> prompt_ids;
    std::unique_ptr<RequestQueue::Ticket> ticket;
    ResponseMeta meta;
    std::unique_ptr<ResponseWriter> writer;  // the API's bytes for this request
    std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
  };
  // On the handler thread: validate and render with `dialect`'s parser,
  // count prompt tokens, take a queue place, make the dialect's writer. An
  // HttpReply is an answer already (400 / 413 / 429 / 503), in its shape.
  std::variant<HttpReply, std::unique_ptr<Job>> Prepare(const Dialect& dialect, std::string_view body);
  // A dialect's count_tokens route: {"input_tokens": N}.
  HttpReply CountTokens(const Dialect& dialect, std::string_view body);
  static bool IsStream(const Job& job);
  // What the connection tells RunChat besides accepting bytes (optional).
  struct ReplyHooks {
    enum class Peer { kAlive, kEof, kGone };
    // Whether the client is still there, without writing: kEof when it shut
    // its side (only a write tells a half-close from a client that left).
    std::function<Peer()> peer;
    // Called before the first bytes of an error answer: the status the
    // response head carries if no byte went out yet.
    std::function<void(int)> status;
  };
  // In the response writer: wait for the model, generate, write. `write`
  // returns false when the client is gone; that cancels the request. The
  // outcome is what the access log and /metrics record.
  RequestOutcome RunChat(Job& job, const std::function<bool(std::string_view)>& write,
                         const ReplyHooks& hooks = {});

  // SIGTERM: new requests get 503, queued ones leave the queue with a 503
  // error, the running one is cancelled at its next token or prefill step.
  void BeginShutdown();
  bool stopping() const { return stopping_.load(); }

  Metrics& metrics() { return metrics_; }
  RequestQueue& queue() { return queue_; }

 private:
  ServerOptions options_;
  std::atomic<Backend*> backend_{nullptr};
  RequestQueue queue_;
  mutable Metrics metrics_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> stopping_{false};
};

// The HTTP/1.1 layer around a Service: one epoll thread owns every socket
// while it is read (caps and deadlines, http_parser.h) and answers the cheap
// GET routes itself; the POST routes run on workers, which write their
// response (streamed or whole) straight to the socket and hand the connection
// back. Thread-safe: Stop() may be called from any thread.
class HttpServer {
 public:
  explicit HttpServer(Service& service);
  ~HttpServer();
  // Binds host:port (throws k3::Error kIo naming the address on failure).
  void BindOrThrow();
  int port() const { return port_; }
  // Serves until Stop(); call from one thread. Returns once every handler
  // has finished, or shutdown_timeout_s (+ 2 s after their sockets are shut)
  // after Stop(), whichever comes first.
  void Serve();
  // Stops accepting and closes every connection not inside a handler.
  void Stop();
  // Handlers still running after Serve() returned (0 after a clean stop).
  int handlers_running() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Service& service_;
  int port_ = 0;
};

// The embedded web page (lib/server/src/webui.html).
std::string_view WebPage();

}  // namespace k3::server
