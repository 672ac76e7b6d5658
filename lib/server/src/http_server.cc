// k3's HTTP/1.1 layer. One epoll thread owns every socket while a
// request is read: it enforces the connection caps, the head deadline, the
// per-read body deadline, the idle keep-alive timeout and the head/body caps
// (http_parser.h), so slow or idle sockets cost a few hundred bytes each and
// never a thread. It answers the cheap GET routes (/health, /metrics, /,
// /v1/models) itself, so they stay answerable while every worker is busy. The
// POST routes run on a fixed pool of workers (queue + 1 + prepare slots),
// which write their answer, streamed or whole, straight to the socket with a
// per-write deadline; a failed write is how a vanished client is noticed
// (Service::RunChat cancels then). A connection is owned by exactly one
// thread at a time: the loop, or the worker it was handed to.
//
// Why our own layer and not cpp-httplib / libmicrohttpd / Beast: docs/server.md
// "The HTTP layer".
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/server/dialect.h"
#include "k3/server/server.h"

namespace k3::server {
namespace {

using Clock = std::chrono::steady_clock;

// Lingering close (Linger), as nginx does it: after an answer that closes,
// what the client still sends is read and dropped, so a client that writes its
// whole body before it reads (Python's http.client, Node's fetch, the SDKs on
// them) reads its 413 instead of a reset. Bounded three ways: bytes (the body
// its head announced, up to kMaxLingerBody, plus kMaxLingerBytes of slack; a
// request line or head without an end gets only the slack), a gap without a
// byte, and a total time.
constexpr size_t kMaxLingerBytes = 256 << 10;
constexpr uint64_t kMaxLingerBody = uint64_t(1) << 30;
constexpr auto kLingerGap = std::chrono::seconds(5);
constexpr auto kLingerTime = std::chrono::seconds(30);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- Routes -----------------------------------------------------------------

// A POST route's handler: a whole reply, or a job to stream (Service::Prepare).
using PrepareFn = std::function<std::variant<HttpReply, std::unique_ptr<Service::Job>>(
    Service&, std::string_view)>;

struct Route {
  const char* method;
  const char* path;
  // GET routes run on the loop thread (cheap, never blocking); POST routes on a worker.
  std::function<HttpReply(Service&)> inline_reply;
  PrepareFn prepare;
  bool json_body = false;           // POST with a JSON body: 415 for other content types
  bool needs_prepare_slot = false;  // parses, renders or compiles: bounded by prepare_concurrency
};

// Every route k3 serves: the cheap GET routes, then each dialect's POST
// route (and its count_tokens route) from the dialect table (dialect.h).
const std::vector<Route>& Routes() {
  static const std::vector<Route> routes = [] {
    std::vector<Route> r = {
        {"GET", "/health", [](Service& s) { return s.Health(); }, nullptr},
        {"GET", "/metrics", [](Service& s) { return s.MetricsText(); }, nullptr},
        {"GET", "/v1/models", [](Service& s) { return s.Models(); }, nullptr},
        {"GET", "/", [](Service& s) { return s.Page(); }, nullptr},
    };
    for (const Dialect* d : Dialects()) {
      r.push_back({"POST", d->path, nullptr,
                   [d](Service& s, std::string_view body) { return s.Prepare(*d, body); }, true, true});
      if (d->count_tokens_path) {
        r.push_back({"POST", d->count_tokens_path, nullptr,
                     [d](Service& s, std::string_view body) -> std::variant<HttpReply, std::unique_ptr<Service::Job>> {
                       return s.CountTokens(*d, body);
                     },
                     true, true});
      }
    }
    return r;
  }();
  return routes;
}

// The metrics label of a path: a route's own path, else "unmatched" (bounded
// label values whatever clients send).
std::string RouteLabel(std::string_view path) {
  for (const Route& r : Routes()) {
    if (path == r.path) return r.path;
  }
  return path.empty() ? "-" : "unmatched";
}

// A refusal by the HTTP layer, in the shape of the dialect owning the path.
HttpReply ErrorFor(std::string_view path, int status, std::string type, std::string message,
                   std::string code = {}) {
  return DialectForPath(path).error(MakeApiError(status, std::move(type), std::move(message), std::move(code)), -1);
}

const char* Reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    case 529:
      return "Overloaded";
    default:
      return status < 400 ? "OK" : "Error";
  }
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "host[:port]" or "[v6]:port" -> the host, lower-cased.
std::string HostName(std::string_view host_header) {
  if (!host_header.empty() && host_header.front() == '[') {
    size_t close = host_header.find(']');
    return Lower(
        host_header.substr(0, close == std::string_view::npos ? host_header.size() : close + 1));
  }
  return Lower(host_header.substr(0, host_header.find(':')));
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  if (inet_pton(AF_INET, host.c_str(), buf) == 1) return true;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1;
  }
  return false;
}

// ---- Connections ------------------------------------------------------------

enum class Phase {
  kIdle,     // between requests (or before the first byte)
  kHead,     // reading a request head
  kBody,     // reading a body to keep
  kDiscard,  // reading a body to throw away; `reply` goes out after it
  kWorker,   // a worker owns the socket
  kWrite,    // the loop flushes `out`, then goes on (or closes)
  kLinger,   // response sent, write side shut: draining what the client still sends, then close
};

struct Conn {
  int fd = -1;
  uint64_t id = 0;
  std::string peer;  // client address, for the per-client cap and the access log
  Phase phase = Phase::kIdle;
  std::string in;   // received, not yet consumed
  std::string out;  // to send (loop-owned phases)
  size_t out_off = 0;
  bool peer_eof = false;     // the client shut its write side (or left)
  bool close_after = false;  // close once `out` is sent
  bool in_epoll_out = false;
  bool registered = false;  // in the epoll set (not while a worker owns it)
  size_t lingered_bytes = 0;
  uint64_t linger_allowance = 0;    // bytes Linger reads before it gives up
  Clock::time_point linger_end;     // Linger reads until then at most
  Clock::time_point deadline;       // of the current phase
  Clock::time_point last_activity;  // idle ordering for eviction
  Clock::time_point started;        // of the current request
  HeadScanner scanner;
  RequestHead head;
  std::optional<ChunkedDecoder> chunked;
  uint64_t body_left = 0;  // Content-Length bytes still to read
  std::string body;
  const Route* route = nullptr;
  HttpReply reply;  // kDiscard: the answer decided before the body
  std::string route_label;
  explicit Conn(const HttpLimits& limits) : scanner(limits) {}
};

// What a worker sends back to the loop with a connection.
struct Returned {
  std::shared_ptr<Conn> conn;
  bool keep_alive = false;
};

// Writes all of `data` to a non-blocking socket, waiting up to `timeout_ms` for
// each stretch of progress; false when the client is gone or stalled, or the
// server is being torn down (`abort`).
bool WriteAll(int fd, std::string_view data, int timeout_ms, const std::atomic<bool>& abort) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
      for (;;) {
        if (abort.load()) return false;
        pollfd p{fd, POLLOUT, 0};
        int r = ::poll(&p, 1, 200);
        if (r > 0) {
          if (p.revents & (POLLERR | POLLNVAL)) return false;
          break;
        }
        if (r < 0 && errno != EINTR) return false;
        if (Clock::now() >= until) return false;
      }
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace

struct HttpServer::Impl {
  Service& service;
  const ServerOptions& o;
  HttpLimits limits;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  int spare_fd = -1;  // given up to accept-and-close when out of descriptors
  uint64_t next_id = 1;
  std::unordered_map<int, std::shared_ptr<Conn>> conns;  // by fd; loop thread only
  std::unordered_map<std::string, int> per_client;       // loop thread only
  std::vector<std::shared_ptr<Conn>> ready;              // to Advance again; loop thread only

  // Loop <-> workers.
  std::mutex mu;
  std::condition_variable work_cv;
  struct Task {
    std::shared_ptr<Conn> conn;
  };
  std::deque<Task> tasks;
  std::vector<Returned> returned;
  int busy_workers = 0;  // under mu
  std::mutex prepare_mu;
  std::condition_variable prepare_cv;
  int prepare_free = 0;
  std::vector<std::thread> workers;

  std::atomic<bool> stop{false};
  std::atomic<bool> abort_writes{false};
  std::atomic<int> handlers{0};

  Impl(Service& s) : service(s), o(s.options()) {
    limits = o.http;
    limits.max_body_bytes = o.api.max_body_bytes;
  }
  ~Impl() {
    for (int fd : {listen_fd, epoll_fd, wake_fd, spare_fd}) {
      if (fd >= 0) ::close(fd);
    }
  }

  void Wake() {
    uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }

  // ---- epoll bookkeeping (loop thread) ----
  void Watch(Conn& c, bool want_in, bool want_out) {
    epoll_event ev{};
    ev.events = (want_in ? EPOLLIN | EPOLLRDHUP : 0u) | (want_out ? EPOLLOUT : 0u);
    ev.data.fd = c.fd;
    ::epoll_ctl(epoll_fd, c.registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.fd, &ev);
    c.registered = true;
    c.in_epoll_out = want_out;
  }
  void Unwatch(Conn& c) {
    if (c.registered) ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
    c.registered = false;
    c.in_epoll_out = false;
  }

  void Close(const std::shared_ptr<Conn>& c) {
    Unwatch(*c);
    ::close(c->fd);
    if (auto it = per_client.find(c->peer); it != per_client.end() && --it->second <= 0)
      per_client.erase(it);
    conns.erase(c->fd);
    c->fd = -1;
  }

  void Count(Conn& c, int status, const char* outcome_override = nullptr,
             const std::string& reason = {}) {
    const char* outcome = outcome_override ? outcome_override
                          : status < 400   ? "served"
                                           : "rejected";
    service.metrics().CountHttp(c.route_label.empty() ? "-" : c.route_label, outcome,
                                reason.empty() ? std::to_string(status) : reason);
  }

  void AccessLog(const Conn& c, int status, const RequestOutcome* outcome) {
    if (CurrentLogLevel() > LogLevel::kInfo) return;
    const double total = Seconds(Clock::now() - c.started);
    if (outcome) {
      K3_LOG_INFO(
          "access: %s %s %d prompt=%lld cached=%lld completion=%lld queue=%.3fs ttft=%.3fs "
          "total=%.3fs%s "
          "client=%s",
          c.head.method.c_str(), c.route_label.c_str(), status,
          static_cast<long long>(outcome->prompt_tokens),
          static_cast<long long>(outcome->cached_tokens),
          static_cast<long long>(outcome->completion_tokens), outcome->queue_wait_s,
          outcome->ttft_s < 0 ? 0.0 : outcome->ttft_s, total,
          outcome->shutdown    ? " (shutdown)"
          : outcome->cancelled ? " (client left)"
                               : "",
          c.peer.c_str());
    } else {
      K3_LOG_INFO("access: %s %s %d total=%.3fs client=%s",
                  c.head.method.empty() ? "-" : c.head.method.c_str(),
                  c.route_label.empty() ? "-" : c.route_label.c_str(), status, total,
                  c.peer.c_str());
    }
  }

  // Headers every answer carries; `extra` from the reply.
  std::string ResponseHead(const Conn& c, int status, const std::string& content_type,
                           std::optional<size_t> length, bool keep_alive,
                           const std::vector<std::pair<std::string, std::string>>& extra) const {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
    if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
    if (length) {
      h += "Content-Length: " + std::to_string(*length) + "\r\n";
    } else if (c.head.version_minor >= 1) {
      h += "Transfer-Encoding: chunked\r\n";
    }
    h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    for (const auto& [k, v] : extra) h += k + ": " + v + "\r\n";
    // CORS only for an origin the operator named (--cors-origin).
    if (std::string_view origin = c.head.Header("origin"); !origin.empty()) {
      for (const std::string& allowed : o.cors_origins) {
        if (allowed == origin) {
          h += "Access-Control-Allow-Origin: " + allowed + "\r\nVary: Origin\r\n";
          break;
        }
      }
    }
    return h + "\r\n";
  }

  std::string Serialize(const Conn& c, const HttpReply& r, bool keep_alive) const {
    std::string s = ResponseHead(c, r.status, r.content_type, r.body.size(), keep_alive, r.headers);
    if (c.head.method != "HEAD") s += r.body;
    return s;
  }

  // ---- Request admission (loop thread) ----

  // The answer to a request refused before its body matters; nullopt to go on.
  std::optional<HttpReply> Screen(Conn& c) {
    const RequestHead& h = c.head;
    const bool keyless = o.api_key.empty();
    // DNS rebinding: a page on attacker.example whose name now points at
    // 127.0.0.1 sends Host: attacker.example.
    if (keyless) {
      std::string host = HostName(h.Header("host"));
      bool ok = host.empty() ? h.version_minor == 0 : false;
      const bool wildcard = o.host == "0.0.0.0" || o.host == "::" || o.host == "[::]";
      if (!ok) {
        ok = host == "localhost" || host == Lower(o.host) || host == "[" + Lower(o.host) + "]" ||
             host == "127.0.0.1" || host == "[::1]" || (wildcard && IsIpLiteral(host));
      }
      for (const std::string& allowed : o.allowed_hosts)
        ok = ok || allowed == "*" || Lower(allowed) == host;
      if (!ok) {
        return ErrorFor(h.path, 403, "permission_error",
                        "Host '" + std::string(h.Header("host")) +
                            "' is not this server's (allow it with --allowed-hosts)",
                        "host_not_allowed");
      }
      // A browser names the page that sent a request; only the server's own
      // page (same origin) and --cors-origin pages may use a keyless server.
      if (h.Has("origin")) {
        std::string origin = Lower(h.Header("origin"));
        bool same = origin == "http://" + Lower(h.Header("host"));
        bool listed = std::find(o.cors_origins.begin(), o.cors_origins.end(), h.Header("origin")) !=
                      o.cors_origins.end();
        if (!same && !listed) {
          return ErrorFor(h.path, 403, "permission_error",
                          "Origin '" + std::string(h.Header("origin")) +
                              "' may not use this server (allow it with --cors-origin)",
                          "origin_not_allowed");
        }
      }
    }
    c.route = nullptr;
    bool path_known = false;
    for (const Route& r : Routes()) {
      if (h.path != r.path) continue;
      path_known = true;
      if (h.method == r.method || (h.method == "HEAD" && std::string_view(r.method) == "GET"))
        c.route = &r;
    }
    c.route_label = RouteLabel(h.path);
    if (h.method == "OPTIONS" && path_known) {
      // A CORS preflight: allowed only for a --cors-origin page.
      HttpReply r;
      r.status = 204;
      r.content_type.clear();
      std::string_view origin = h.Header("origin");
      if (!origin.empty() &&
          std::find(o.cors_origins.begin(), o.cors_origins.end(), origin) != o.cors_origins.end()) {
        r.headers = {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                     {"Access-Control-Allow-Headers",
                      "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta"},
                     {"Access-Control-Max-Age", "600"}};
      } else {
        r.headers = {{"Allow", "GET, POST, OPTIONS"}};
      }
      return r;
    }
    if (!c.route) {
      if (!path_known)
        return ErrorFor(h.path, 404, "not_found_error", "no route " + h.method + " " + h.path,
                        "not_found");
      HttpReply r =
          ErrorFor(h.path, 405, "invalid_request_error",
                   "method " + h.method + " is not allowed on " + h.path, "method_not_allowed");
      for (const Route& rt : Routes()) {
        if (h.path == rt.path) r.headers.push_back({"Allow", rt.method});
      }
      return r;
    }
    if (h.path.rfind("/v1/", 0) == 0 && !service.Authorized(h.raw_authorization, h.raw_x_api_key)) {
      return service.Unauthorized(DialectForPath(h.path));
    }
    if (c.route->json_body && h.Has("content-type")) {
      // application/json with any parameters (charset); a form or text/plain
      // body is what a page can send cross-site without a preflight.
      std::string type = Lower(h.Header("content-type"));
      type = type.substr(0, type.find(';'));
      while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.pop_back();
      if (type != "application/json") {
        return ErrorFor(h.path, 415, "invalid_request_error",
                        "Content-Type must be application/json, not '" +
                            std::string(h.Header("content-type")) + "'",
                        "unsupported_media_type");
      }
    }
    return std::nullopt;
  }

  // Queues a whole answer on a loop-owned connection.
  void Answer(const std::shared_ptr<Conn>& c, const HttpReply& r, bool keep_alive) {
    keep_alive = keep_alive && c->head.keep_alive && !c->peer_eof && !stop.load();
    Count(*c, r.status);
    AccessLog(*c, r.status, nullptr);
    c->out += Serialize(*c, r, keep_alive);
    c->close_after = !keep_alive;
    c->phase = Phase::kWrite;
    Flush(c);
  }

  // A connection-level refusal (malformed head, over a cap, timeout): answer and close.
  void Refuse(const std::shared_ptr<Conn>& c, int status, const std::string& message) {
    if (c->route_label.empty())
      c->route_label = RouteLabel(c->head.path);  // the head may be half-parsed
    HttpReply r = ErrorFor(c->head.path, status,
                           status == 408 ? "timeout_error" : "invalid_request_error", message);
    Answer(c, r, false);
  }

  void StartRequest(Conn& c) {
    c.phase = Phase::kHead;
    c.started = Clock::now();
    c.deadline = c.started + std::chrono::seconds(o.head_timeout_s);
    c.head = RequestHead();
    c.route = nullptr;
    c.route_label.clear();
    c.body.clear();
    c.chunked.reset();
    c.body_left = 0;
  }

  // Runs the connection's state machine over what is buffered.
  void Advance(const std::shared_ptr<Conn>& c) {
    for (;;) {
      if (c->fd < 0) return;
      switch (c->phase) {
        case Phase::kIdle:
          if (c->in.empty()) {
            if (c->peer_eof) return Close(c);
            return;
          }
          StartRequest(*c);
          [[fallthrough]];
        case Phase::kHead: {
          auto st = c->scanner.Feed(c->in, c->head);
          if (st == HeadScanner::State::kNeedMore) {
            if (c->peer_eof) return Close(c);  // a partial head and nothing more coming
            return;
          }
          if (st == HeadScanner::State::kError) {
            c->in.clear();
            return Refuse(c, c->scanner.error().status, c->scanner.error().message);
          }
          c->in.erase(0, c->scanner.head_bytes());
          c->scanner.Reset();
          OnHead(c);
          if (!c->out.empty() && c->phase != Phase::kWrite) Flush(c);  // 100 Continue
          continue;
        }
        case Phase::kBody:
        case Phase::kDiscard: {
          if (!ReadBody(c)) return;
          continue;
        }
        case Phase::kWorker:
        case Phase::kWrite:
        case Phase::kLinger:
          return;
      }
    }
  }

  void OnHead(const std::shared_ptr<Conn>& c) {
    std::optional<HttpReply> early = Screen(*c);
    const bool has_body = c->head.chunked || c->head.content_length > 0;
    if (c->head.chunked) c->chunked.emplace(limits);
    c->body_left = c->head.content_length;
    c->deadline = Clock::now() + std::chrono::seconds(o.read_timeout_s);
    if (early) {
      // Refused before routing: the body is read and dropped within the caps,
      // so the connection stays in step -- unless the client waits
      // for a 100 Continue, which it will not get: answer and close.
      if (has_body && c->head.expect_continue) return Answer(c, *early, false);
      c->reply = std::move(*early);
      c->phase = Phase::kDiscard;
      return;
    }
    if (has_body && c->head.expect_continue && c->in.empty())
      c->out += "HTTP/1.1 100 Continue\r\n\r\n";
    c->phase = Phase::kBody;
  }

  // Moves body bytes from `in`; true when the phase changed (go on).
  bool ReadBody(const std::shared_ptr<Conn>& c) {
    std::string* sink = c->phase == Phase::kBody ? &c->body : nullptr;
    bool done = false;
    if (c->chunked) {
      size_t used = 0;
      auto st = c->chunked->Feed(c->in, used, sink);
      c->in.erase(0, used);
      if (st == ChunkedDecoder::State::kError) {
        c->in.clear();
        Refuse(c, c->chunked->error().status, c->chunked->error().message);
        return false;
      }
      done = st == ChunkedDecoder::State::kDone;
    } else {
      size_t n = size_t(std::min<uint64_t>(c->body_left, c->in.size()));
      if (sink) sink->append(c->in, 0, n);
      c->in.erase(0, n);
      c->body_left -= n;
      done = c->body_left == 0;
    }
    if (!done) {
      if (c->peer_eof) Close(c);  // the body will never be complete
      return false;
    }
    if (c->phase == Phase::kDiscard) {
      Answer(c, c->reply, true);
      return true;
    }
    Dispatch(c);
    return true;
  }

  void Dispatch(const std::shared_ptr<Conn>& c) {
    const Route& r = *c->route;
    if (r.inline_reply) return Answer(c, r.inline_reply(service), true);
    if (stop.load()) {
      return Answer(c,
                    ErrorFor(c->head.path, 503, "server_error", "the server is shutting down",
                             "shutting_down"),
                    false);
    }
    {
      std::lock_guard lock(mu);
      // Bodies waiting for a worker are bounded: past twice the pool, 503 at once.
      if (tasks.size() < workers.size() * 2) {
        c->phase = Phase::kWorker;
        Unwatch(*c);  // the worker owns the socket; its errors must not wake the loop
        tasks.push_back({c});
        work_cv.notify_one();
        return;
      }
    }
    HttpReply busy =
        ErrorFor(c->head.path, 503, "server_error", "every worker is busy; retry later", "busy");
    busy.headers.push_back({"Retry-After", std::to_string(o.retry_after_s)});
    Answer(c, busy, true);
  }

  // Sends what `out` holds; moves kWrite on when it is all out.
  void Flush(const std::shared_ptr<Conn>& c) {
    while (c->out_off < c->out.size()) {
      ssize_t n =
          ::send(c->fd, c->out.data() + c->out_off, c->out.size() - c->out_off, MSG_NOSIGNAL);
      if (n > 0) {
        c->out_off += size_t(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!c->in_epoll_out) Watch(*c, c->phase != Phase::kWrite, true);
        if (c->phase == Phase::kWrite)
          c->deadline = Clock::now() + std::chrono::seconds(o.write_timeout_s);
        return;
      }
      return Close(c);
    }
    c->out.clear();
    c->out_off = 0;
    if (c->phase != Phase::kWrite) {
      if (c->in_epoll_out) Watch(*c, true, false);
      return;
    }
    if (c->close_after) return Linger(c);
    c->phase = Phase::kIdle;
    c->last_activity = Clock::now();
    c->deadline = c->last_activity + std::chrono::seconds(o.idle_timeout_s);
    Watch(*c, !c->peer_eof, false);
    ready.push_back(
        c);  // a pipelined request may already be buffered (the loop goes on, no recursion)
  }

  // Closing with unread bytes would send a RST that can destroy the answer
  // before the client reads it: shut the write side, drain within the bounds
  // of kMaxLingerBytes / kMaxLingerBody / kLingerGap / kLingerTime.
  void Linger(const std::shared_ptr<Conn>& c) {
    if (c->peer_eof) return Close(c);
    ::shutdown(c->fd, SHUT_WR);
    c->phase = Phase::kLinger;
    c->in.clear();
    c->linger_allowance = kMaxLingerBytes + std::min(c->head.content_length, kMaxLingerBody);
    c->linger_end = Clock::now() + kLingerTime;
    c->deadline = std::min(Clock::now() + kLingerGap, c->linger_end);
    Watch(*c, true, false);
  }

  void OnReadable(const std::shared_ptr<Conn>& c) {
    char buf[65536];
    // Bounded per wake-up so one fast sender cannot hold the loop.
    for (int round = 0; round < 4; ++round) {
      ssize_t n = ::recv(c->fd, buf, sizeof buf, 0);
      if (n > 0) {
        c->last_activity = Clock::now();
        if (c->phase == Phase::kLinger) {
          // Drained up to a bound, then closed: a client that keeps sending
          // after its refusal gets a reset, not our reading time.
          c->lingered_bytes += size_t(n);
          if (c->lingered_bytes > c->linger_allowance) return Close(c);
          c->deadline = std::min(c->last_activity + kLingerGap, c->linger_end);
          continue;
        }
        c->in.append(buf, size_t(n));
        if (c->phase == Phase::kBody || c->phase == Phase::kDiscard) {
          c->deadline = c->last_activity + std::chrono::seconds(o.read_timeout_s);
        }
        if (size_t(n) < sizeof buf) break;
        // Reading a head: parse before reading more, so a head without an end
        // is refused at its cap, not buffered.
        if (c->phase == Phase::kHead || c->phase == Phase::kIdle) break;
        continue;
      }
      if (n == 0) {
        c->peer_eof = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return Close(c);  // reset
    }
    if (c->phase == Phase::kLinger) {
      if (c->peer_eof) Close(c);
      return;
    }
    if (c->peer_eof && c->phase != Phase::kWorker) {
      // Nothing more will arrive; stop asking epoll about this socket's input.
      Watch(*c, false, c->in_epoll_out);
    }
    Advance(c);
  }

  void Accept() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if ((errno == EMFILE || errno == ENFILE) && spare_fd >= 0) {
          // Out of descriptors: accept and close one so the client is not left hanging.
          ::close(spare_fd);
          int extra = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
          if (extra >= 0) ::close(extra);
          spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
          LogOnce(&spare_fd, LogLevel::kWarn,
                  "serve: out of file descriptors; raise RLIMIT_NOFILE or lower "
                  "--max-connections");
          continue;
        }
        return;  // EAGAIN, or nothing we can do now
      }
      char host[INET6_ADDRSTRLEN] = "?";
      if (addr.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, host, sizeof host);
      } else if (addr.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, host, sizeof host);
      }
      std::string peer = host;
      if (!MakeRoom(peer)) {
        // Refused quickly: a 503 on a best-effort write, then close. Nothing
        // of a request is read yet, so the reply is serialized as for a bare
        // connection (its length counted like every other reply's).
        HttpReply busy = ErrorFor({}, 503, "server_error", "too many connections", "busy");
        busy.headers.push_back({"Retry-After", std::to_string(o.retry_after_s)});
        const std::string bytes = Serialize(Conn(limits), busy, false);
        (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::close(fd);
        service.metrics().CountHttp("-", "rejected", "503");
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // SSE chunks are small
      auto c = std::make_shared<Conn>(limits);
      c->fd = fd;
      c->id = next_id++;
      c->peer = std::move(peer);
      c->last_activity = Clock::now();
      c->deadline = c->last_activity + std::chrono::seconds(o.head_timeout_s);
      Watch(*c, true, false);
      ++per_client[c->peer];
      conns[fd] = std::move(c);
    }
  }

  // At a cap, the connection idle longest (between requests, nothing
  // buffered) gives way; false when every one is mid-request.
  bool MakeRoom(const std::string& peer) {
    const bool total_full = int(conns.size()) >= o.max_connections;
    auto it = per_client.find(peer);
    const bool client_full = it != per_client.end() && it->second >= o.max_connections_per_client;
    if (!total_full && !client_full) return true;
    std::shared_ptr<Conn> oldest;
    for (auto& [fd, c] : conns) {
      if (c->phase != Phase::kIdle || !c->in.empty()) continue;
      if (client_full && c->peer != peer) continue;
      if (!oldest || c->last_activity < oldest->last_activity) oldest = c;
    }
    if (!oldest) return false;
    Close(oldest);
    return true;
  }

  void CheckDeadlines() {
    const auto now = Clock::now();
    std::vector<std::shared_ptr<Conn>> expired;
    for (auto& [fd, c] : conns) {
      if (c->phase != Phase::kWorker && now >= c->deadline) expired.push_back(c);
    }
    for (auto& c : expired) {
      switch (c->phase) {
        case Phase::kHead:
          Refuse(c, 408,
                 "the request head took longer than " + std::to_string(o.head_timeout_s) + " s");
          break;
        case Phase::kBody:
        case Phase::kDiscard:
          Refuse(c, 408, "no body bytes for " + std::to_string(o.read_timeout_s) + " s");
          break;
        default:  // idle keep-alive, a stalled reader, the end of lingering
          Close(c);
          break;
      }
    }
  }

  // Connections handed back by workers.
  void TakeReturned() {
    std::vector<Returned> back;
    {
      std::lock_guard lock(mu);
      back.swap(returned);
    }
    for (Returned& r : back) {
      auto& c = r.conn;
      if (c->fd < 0) continue;
      if (!r.keep_alive || stop.load()) {
        c->close_after = true;
        c->phase = Phase::kWrite;
        Flush(c);
        continue;
      }
      c->phase = Phase::kIdle;
      c->last_activity = Clock::now();
      c->deadline = c->last_activity + std::chrono::seconds(o.idle_timeout_s);
      Watch(*c, !c->peer_eof, false);
      ready.push_back(c);
    }
  }

  // ---- Workers ----

  void WorkerMain() {
    for (;;) {
      Task t;
      {
        std::unique_lock lock(mu);
        work_cv.wait(lock, [&] { return !tasks.empty() || stop.load(); });
        if (tasks.empty()) return;
        t = std::move(tasks.front());
        tasks.pop_front();
        ++busy_workers;
      }
      ++handlers;
      bool keep_alive = false;
      try {
        keep_alive = Handle(*t.conn);
      } catch (const std::exception& e) {
        K3_LOG_ERROR("serve: handler failed: %s", e.what());
      }
      t.conn->body.clear();
      t.conn->body.shrink_to_fit();
      --handlers;
      {
        std::lock_guard lock(mu);
        --busy_workers;
        returned.push_back({t.conn, keep_alive});
      }
      Wake();
    }
  }

  // Runs a POST route on this worker; true when the connection may be reused.
  bool Handle(Conn& c) {
    const Route& route = *c.route;
    std::variant<HttpReply, std::unique_ptr<Service::Job>> prepared;
    {
      // Parsing, rendering and schema compilation are the costly part before
      // the queue: at most prepare_concurrency at once.
      std::unique_lock lock(prepare_mu);
      prepare_cv.wait(lock, [&] { return prepare_free > 0; });
      --prepare_free;
    }
    try {
      prepared = route.prepare(service, c.body);
    } catch (const std::exception& e) {
      prepared = ErrorFor(c.head.path, 500, "server_error", e.what());
    }
    {
      std::lock_guard lock(prepare_mu);
      ++prepare_free;
    }
    prepare_cv.notify_one();
    std::string().swap(c.body);  // the body's memory back before a long wait

    const bool keep_alive = c.head.keep_alive && !c.peer_eof && !stop.load();
    if (auto* reply = std::get_if<HttpReply>(&prepared)) {
      bool ok = WriteAll(c.fd, c.out.substr(c.out_off) + Serialize(c, *reply, keep_alive),
                         o.write_timeout_s * 1000, abort_writes);
      c.out.clear();
      c.out_off = 0;
      Count(c, reply->status, ok ? nullptr : "cancelled", ok ? std::string() : "client_gone");
      AccessLog(c, reply->status, nullptr);
      return ok && keep_alive;
    }
    std::unique_ptr<Service::Job> job =
        std::move(std::get<std::unique_ptr<Service::Job>>(prepared));
    const bool chunked = c.head.version_minor >= 1;
    const bool stream_keep_alive = keep_alive && chunked;
    std::string pending = c.out.substr(c.out_off);
    c.out.clear();
    c.out_off = 0;
    // The head goes out with the first bytes, so an answer that fails before
    // any (Service::ReplyHooks::status) carries its own status.
    int head_status = 200;
    bool head_sent = false;
    bool ok = true;
    auto write = [&](std::string_view bytes) {
      if (bytes.empty() || !ok) return ok;
      std::string frame = std::move(pending);
      pending.clear();
      if (!head_sent) {
        head_sent = true;
        frame += ResponseHead(
            c, head_status, Service::IsStream(*job) ? "text/event-stream" : "application/json; charset=utf-8",
            std::nullopt, stream_keep_alive,
            {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
      }
      if (chunked) {
        char size[32];
        std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
        frame += size;
        frame += bytes;
        frame += "\r\n";
      } else {
        frame += bytes;
      }
      ok = WriteAll(c.fd, frame, o.write_timeout_s * 1000, abort_writes);
      return ok;
    };
    Service::ReplyHooks hooks;
    hooks.status = [&](int status) { head_status = status; };
    // Whether the client is there, read without consuming: bytes or nothing
    // yet (alive), its FIN (a half-close or a client that left), an error.
    hooks.peer = [&] {
      char b;
      const ssize_t n = ::recv(c.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
        return Service::ReplyHooks::Peer::kAlive;
      return n == 0 ? Service::ReplyHooks::Peer::kEof : Service::ReplyHooks::Peer::kGone;
    };
    RequestOutcome outcome = service.RunChat(*job, write, hooks);
    if (ok && head_sent) {
      std::string end = std::move(pending);
      if (chunked) end += "0\r\n\r\n";
      if (!end.empty()) ok = WriteAll(c.fd, end, o.write_timeout_s * 1000, abort_writes);
    }
    const bool cut = outcome.cancelled || !ok;
    const int status = outcome.error_status ? outcome.error_status : outcome.shutdown ? 503 : 200;
    if (outcome.error_status) {
      Count(c, status);
    } else if (cut) {
      Count(c, status, "cancelled", outcome.shutdown ? "shutdown" : "client_gone");
    } else {
      Count(c, 200);
    }
    AccessLog(c, status, &outcome);
    return ok && head_sent && !cut && stream_keep_alive;
  }

  // ---- The loop ----

  void Loop() {
    const int nworkers =
        o.threads > 0 ? o.threads
                      : o.queue + (o.parallel > 0 ? o.parallel : engine::AutoParallel::kMax) +
                            std::max(1, o.prepare_concurrency);
    prepare_free = std::max(1, o.prepare_concurrency);
    for (int i = 0; i < nworkers; ++i) workers.emplace_back([this] { WorkerMain(); });

    std::vector<epoll_event> events(256);
    std::optional<Clock::time_point> stop_deadline;
    bool sockets_shut = false;
    for (;;) {
      int n = ::epoll_wait(epoll_fd, events.data(), int(events.size()), 200);
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == listen_fd) {
          if (!stop.load()) Accept();
          continue;
        }
        if (fd == wake_fd) {
          uint64_t v;
          (void)!::read(wake_fd, &v, sizeof v);
          continue;
        }
        auto it = conns.find(fd);
        if (it == conns.end()) continue;
        std::shared_ptr<Conn> c = it->second;
        if (c->phase == Phase::kWorker) continue;
        if (events[i].events & EPOLLOUT) Flush(c);
        if (c->fd >= 0 && (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
          OnReadable(c);
      }
      TakeReturned();
      while (!ready.empty()) {
        std::vector<std::shared_ptr<Conn>> now;
        now.swap(ready);
        for (auto& c : now) {
          if (c->fd >= 0 && c->phase == Phase::kIdle) Advance(c);
        }
      }
      CheckDeadlines();
      if (stop.load()) {
        if (!stop_deadline) {
          // Stop accepting; everything not inside a handler goes now (a client
          // trickling a body does not hold the exit).
          stop_deadline = Clock::now() + std::chrono::seconds(o.shutdown_timeout_s);
          if (listen_fd >= 0) {
            ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
            ::close(listen_fd);
            listen_fd = -1;
          }
          std::deque<Task> never_started;
          {
            std::lock_guard lock(mu);
            never_started.swap(tasks);
          }
          work_cv.notify_all();
          for (Task& t : never_started) {  // waited for a worker: answered, never dropped
            Watch(*t.conn, false, false);
            Answer(t.conn,
                   ErrorFor(t.conn->head.path, 503, "server_error", "the server is shutting down",
                            "shutting_down"),
                   false);
          }
        }
        std::vector<std::shared_ptr<Conn>> idle;
        for (auto& [fd, c] : conns) {
          // Answers being flushed get until the deadline; nothing else waits.
          if (c->phase != Phase::kWorker &&
              (c->phase != Phase::kWrite || Clock::now() >= *stop_deadline)) {
            idle.push_back(c);
          }
        }
        for (auto& c : idle) Close(c);
        if (handlers.load() == 0 && conns.empty()) break;
        if (handlers.load() == 0 && Clock::now() >= *stop_deadline) break;
        if (!sockets_shut && Clock::now() >= *stop_deadline) {
          // Handlers still running: cut their sockets so their next write fails.
          sockets_shut = true;
          abort_writes = true;
          for (auto& [fd, c] : conns) {
            if (c->phase == Phase::kWorker) ::shutdown(fd, SHUT_RDWR);
          }
          service.queue().WakeAll();
          stop_deadline = Clock::now() + std::chrono::seconds(2);
        } else if (sockets_shut && Clock::now() >= *stop_deadline) {
          break;
        }
      }
    }
    work_cv.notify_all();
    std::vector<std::thread> still;
    for (std::thread& t : workers) {
      if (handlers.load() == 0) {
        t.join();
      } else {
        still.push_back(std::move(t));
      }
    }
    // Handlers stuck past the bound are detached; the caller sees
    // handlers_running() > 0 and exits without touching the engine.
    for (std::thread& t : still) t.detach();
    workers.clear();
    for (auto& [fd, c] : conns) {
      if (c->phase != Phase::kWorker) ::close(fd);
    }
  }
};

HttpServer::HttpServer(Service& service)
    : impl_(std::make_unique<Impl>(service)), service_(service) {}

HttpServer::~HttpServer() = default;

void HttpServer::BindOrThrow() {
  const ServerOptions& o = service_.options();
  const std::string where = o.host + ":" + std::to_string(o.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(o.port);
  std::string host = o.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    throw Error(ErrorCode::kIo, "cannot resolve " + o.host + ": " + gai_strerror(rc), where);
  }
  int fd = -1;
  int last_errno = 0;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) break;
    last_errno = errno;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    throw Error(ErrorCode::kIo,
                "cannot bind " + where + ": " + std::strerror(last_errno) + " (in use?)", where);
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  Impl& m = *impl_;
  m.listen_fd = fd;
  m.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  m.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  m.spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (m.epoll_fd < 0 || m.wake_fd < 0) throw Error(ErrorCode::kIo, "epoll/eventfd failed", where);
  for (int watched : {m.listen_fd, m.wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = watched;
    ::epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, watched, &ev);
  }
}

void HttpServer::Serve() { impl_->Loop(); }

void HttpServer::Stop() {
  impl_->stop = true;
  if (impl_->wake_fd >= 0) impl_->Wake();
}

int HttpServer::handlers_running() const { return impl_->handlers.load(); }

}  // namespace k3::server
