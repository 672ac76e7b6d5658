// Route logic without sockets: admission by dialect, generation, response writing.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <span>

#include "k3/core/json_writer.h"
#include "k3/core/log.h"
#include "k3/server/dialect.h"
#include "k3/server/server.h"

namespace k3::server {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

HttpReply Json(int status, std::string body) {
  HttpReply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace

Service::Service(ServerOptions options)
    : options_(std::move(options)), queue_(options_.queue, options_.parallel) {}
Service::~Service() = default;

void Service::SetBackend(Backend* backend) {
  if (backend) {
    engine::SamplingParams s = backend->default_sampling();
    options_.api.default_temperature = s.temperature;
    options_.api.default_top_p = s.top_p;
    if (options_.parallel == 0) queue_.SetSlots(backend->step_stats().parallel);
  }
  backend_.store(backend);
}

HttpReply Service::Health() const {
  if (!backend_.load()) return Json(503, "{\"status\":\"loading\"}");
  return Json(200, "{\"status\":\"ok\"}");
}

HttpReply Service::Models() const {
  JsonWriter j;
  j.BeginObject().Field("object", "list").Key("data").BeginArray().BeginObject();
  j.Field("id", options_.model_id).Field("object", "model").Field("created", int64_t(0)).Field("owned_by", "k3");
  if (Backend* b = backend_.load()) j.Field("context_length", b->context_limit());
  // The sampling policy (clients ignore unknown fields; the web page shows it).
  const ApiPolicy& api = options_.api;
  j.Key("k3").BeginObject().Field("sampling", api.sampling_free ? "free" : "k3");
  // null: no default cap (the answer runs to its end or the context's).
  if (api.default_max_tokens > 0) {
    j.Field("max_tokens", api.default_max_tokens);
  } else {
    j.Key("max_tokens").Null();
  }
  auto range = [&](const char* key, float dflt, std::span<const double> locked, double hi) {
    j.Key(key).BeginObject().Field("default", double(dflt));
    if (api.sampling_free) {
      j.Field("min", 0.0).Field("max", hi);
    } else {
      j.Key("allowed").BeginArray().Double(dflt);
      for (double v : locked) {
        if (std::fabs(v - dflt) > 1e-6) j.Double(v);
      }
      j.EndArray();
    }
    j.EndObject();
  };
  range("temperature", api.default_temperature, kLockedTemperatures, 2.0);
  range("top_p", api.default_top_p, kLockedTopP, 1.0);
  j.EndObject();
  j.EndObject().EndArray().EndObject();
  return Json(200, j.Take());
}

HttpReply Service::MetricsText() const {
  HttpReply r;
  r.content_type = "text/plain; version=0.0.4";
  Backend* b = backend_.load();
  r.body = metrics_.Render(queue_.waiting(), queue_.busy(), b ? b->expert_stats() : model::ExpertStoreStats{},
                           b ? b->checkpoint_stats() : engine::CheckpointCacheStats{});
  RenderStepMetrics(r.body, queue_.running(), b ? b->step_stats() : engine::Engine::StepStats{});
  if (options_.extra_metrics) r.body += options_.extra_metrics();
  return r;
}

HttpReply Service::Page() const {
  HttpReply r;
  if (!options_.webui) return NotFound("/");
  r.content_type = "text/html; charset=utf-8";
  r.body = std::string(WebPage());
  // The page is self-contained: nothing may load from elsewhere, and model
  // text is inserted as text (the page never uses innerHTML for it). No site
  // may frame it (clickjacking: a hidden page under a decoy's clicks);
  // X-Frame-Options says the same to browsers that ignore frame-ancestors.
  r.headers.push_back({"Content-Security-Policy",
                       "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                       "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"});
  r.headers.push_back({"X-Frame-Options", "DENY"});
  r.headers.push_back({"X-Content-Type-Options", "nosniff"});
  return r;
}

HttpReply Service::NotFound(std::string_view path) const {
  return DialectForPath(path).error(
      MakeApiError(404, "invalid_request_error", "no route " + std::string(path), "not_found"), -1);
}

HttpReply Service::ErrorReply(const Dialect& dialect, const ApiError& e) const {
  return dialect.error(e, options_.retry_after_s);
}

namespace {
// Constant time in the key: every byte of the longer string is compared.
bool SameSecret(std::string_view expected, std::string_view got) {
  size_t n = std::max(expected.size(), got.size());
  unsigned char diff = expected.size() == got.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char a = i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0;
    unsigned char b = i < got.size() ? static_cast<unsigned char>(got[i]) : 0;
    diff |= a ^ b;
  }
  return diff == 0;
}
}  // namespace

bool Service::Authorized(std::string_view authorization, std::string_view x_api_key) const {
  if (options_.api_key.empty()) return true;
  // Both are compared, so the time does not show which header was right.
  bool bearer = SameSecret("Bearer " + options_.api_key, authorization);
  bool key = !x_api_key.empty() && SameSecret(options_.api_key, x_api_key);
  return bearer || key;
}

HttpReply Service::Unauthorized(const Dialect& dialect) const {
  return ErrorReply(dialect, MakeApiError(401, "authentication_error",
                                          std::string("missing or wrong API key: send ") + dialect.key_hint,
                                          "invalid_api_key"));
}

bool Service::IsStream(const Job& job) { return job.request.stream; }

std::variant<HttpReply, std::unique_ptr<Service::Job>> Service::Prepare(const Dialect& dialect,
                                                                         std::string_view body) {
  metrics_.CountRequest();
  // Counted here, once: total = completed + cancelled + rejected.
  auto refuse = [&](const ApiError& e) {
    HttpReply r = ErrorReply(dialect, e);
    metrics_.CountRejected(r.status);
    return r;
  };
  if (stopping_.load()) {
    return refuse(MakeApiError(503, "server_error", "the server is shutting down", "shutting_down"));
  }
  Backend* backend = backend_.load();
  if (!backend) {
    return refuse(MakeApiError(503, "server_error", "the model is still loading", "loading"));
  }
  auto job = std::make_unique<Job>();
  ParsedRequest parsed;
  try {
    parsed = dialect.parse(body, options_.api);
    job->request = std::move(parsed.request);
    job->prompt_ids = backend->PromptIds(job->request.chat);
  } catch (const Error& e) {
    return refuse(ApiErrorFor(e));
  }
  int64_t limit = backend->context_limit();
  if (limit > 0 && int64_t(job->prompt_ids.size()) >= limit) {
    return refuse(MakeApiError(400, "invalid_request_error",
                               "the prompt has " + std::to_string(job->prompt_ids.size()) +
                                   " tokens; the context holds " + std::to_string(limit),
                               "context_length_exceeded", "messages"));
  }
  job->ticket = queue_.TryEnqueue();
  if (!job->ticket) {
    return refuse(MakeApiError(429, "rate_limit_error",
                               "the queue is full (" + std::to_string(queue_.capacity()) +
                                   " requests wait for the model); retry later",
                               "queue_full"));
  }
  uint64_t n = next_id_.fetch_add(1);
  char id[64];
  std::snprintf(id, sizeof id, "%s-%llx-%llu", dialect.id_prefix,
                static_cast<unsigned long long>(std::time(nullptr)), static_cast<unsigned long long>(n));
  job->meta.id = id;
  job->meta.created = int64_t(std::time(nullptr));
  job->meta.model = options_.model_id;
  job->meta.thinking = job->request.thinking;
  job->writer = parsed.writer(*job);
  return job;
}

HttpReply Service::CountTokens(const Dialect& dialect, std::string_view body) {
  Backend* backend = backend_.load();
  if (!backend) return ErrorReply(dialect, MakeApiError(503, "server_error", "the model is still loading", "loading"));
  std::vector<int32_t> ids;
  try {
    ids = backend->PromptIds(dialect.count_parse(body, options_.api));
  } catch (const Error& e) {
    return ErrorReply(dialect, ApiErrorFor(e));
  }
  JsonWriter j;
  j.BeginObject().Field("input_tokens", int64_t(ids.size())).EndObject();
  return Json(200, j.Take());
}

void Service::BeginShutdown() {
  stopping_.store(true);
  queue_.WakeAll();
}

RequestOutcome Service::RunChat(Job& job, const std::function<bool(std::string_view)>& raw_write,
                                const ReplyHooks& hooks) {
  ResponseWriter& out = *job.writer;
  bool committed = false;  // a byte went out: the status is 200 from then on
  auto write = [&](std::string_view bytes) {
    committed = committed || !bytes.empty();
    return raw_write(bytes);
  };
  // A whole answer holds its status (options_.hold_status_ms): while the
  // client is still there (hooks.peer) nothing is written. Once the hold is
  // over, or the client shut its side (a half-close, or a client that left:
  // the write after its FIN draws the RST the next one fails on), the
  // traffic goes out.
  const bool whole = !IsStream(job);
  const auto hold_until = job.arrived + std::chrono::milliseconds(options_.hold_status_ms);
  auto keep_alive = [&](const std::string& bytes) {
    if (whole && !committed && hooks.peer && Clock::now() < hold_until) {
      switch (hooks.peer()) {
        case ReplyHooks::Peer::kAlive: return true;
        case ReplyHooks::Peer::kGone: return false;
        case ReplyHooks::Peer::kEof: break;
      }
    }
    return write(bytes);
  };
  // An error answer: its own status while no byte went out, else the
  // error object in the 200 body (an SSE error event when streamed).
  auto fail = [&](const ApiError& e) {
    if (!committed && hooks.status) hooks.status(e.status);
    return write(out.Error(e));
  };
  // A heartbeat is traffic the client ignores (an SSE comment or ping, JSON
  // whitespace); a failed write shows the client left.
  auto heartbeat = [&](const char* what) { return keep_alive(out.Heartbeat(what)); };
  // message_start goes out before the wait; a failed write is seen by the first heartbeat.
  if (std::string begin = out.Begin(); !begin.empty()) write(begin);
  RequestOutcome outcome;
  outcome.prompt_tokens = int64_t(job.prompt_ids.size());
  // SIGTERM (BeginShutdown) takes a queued request out with a 503 error (in
  // the body when its 200 went out already).
  const ApiError shutting_down =
      MakeApiError(503, "server_error", "the server is shutting down; retry later", "shutting_down");
  // The queued heartbeat names the request's place in line (the web page shows it).
  auto queued = [&] {
    return !stopping_.load() &&
           heartbeat(("queued position " + std::to_string(job.ticket->position())).c_str());
  };
  bool waited = job.ticket->WaitTurn(queued,
                                     std::chrono::milliseconds(options_.heartbeat_ms));
  outcome.queue_wait_s = Seconds(Clock::now() - job.arrived);
  if (waited && stopping_.load()) {
    job.ticket.reset();
    waited = false;
  }
  if (!waited) {
    outcome.cancelled = true;
    outcome.cancel_phase = RequestOutcome::kQueued;
    outcome.prompt_tokens = 0;
    if (stopping_.load()) {
      outcome.shutdown = true;
      fail(shutting_down);
    }
    metrics_.CountFinished(outcome);
    return outcome;
  }
  Backend* backend = backend_.load();

  engine::GenerateRequest gen;
  gen.prompt_ids = job.prompt_ids;
  gen.chat_start = job.request.thinking ? tok::ChatStreamParser::Start::kThink : tok::ChatStreamParser::Start::kResponse;
  gen.max_tokens = job.request.max_tokens;
  gen.stop = job.request.stop;
  gen.ignore_eos = job.request.ignore_eos;
  gen.sampling.temperature = job.request.temperature;
  gen.sampling.top_p = job.request.top_p;
  gen.sampling.seed = job.request.seed ? *job.request.seed : std::random_device{}();
  gen.structured = job.request.structured;  // compiled at parse time

  bool client_gone = false;
  auto last_write = Clock::now();
  const auto beat = std::chrono::milliseconds(options_.heartbeat_ms);
  int prefill_calls = 0;

  engine::Callbacks cb;
  cb.on_delta = [&](const engine::Delta& d) {
    if (stopping_.load()) return false;
    std::string bytes = out.OnDelta(d);
    // Nothing to send (a whole answer, held-back UTF-8): a heartbeat per period.
    if (!bytes.empty()) {
      if (!write(bytes)) return !(client_gone = true);
      last_write = Clock::now();
    } else if (Clock::now() - last_write >= beat) {
      if (!heartbeat("decode")) return !(client_gone = true);
      last_write = Clock::now();
    }
    return true;
  };
  // Prefill progress: the engine's full report (on_prefill), or, from an
  // engine that only counts tokens (on_prefill_progress), what follows from
  // the count; once a full report came, the count is not used.
  const auto prefill_start = Clock::now();
  bool full_reports = false;
  auto progress = [&](const engine::PrefillProgress& p) {
    if (stopping_.load()) {
      outcome.cancel_phase = RequestOutcome::kPrefill;
      return false;
    }
    // The first two calls always write (a client that left before prefill
    // is seen at once: the first write after its FIN draws the RST the second
    // one fails on); later ones once per heartbeat period.
    if (prefill_calls++ >= 2 && Clock::now() - last_write < beat) return true;
    if (!keep_alive(out.Progress(p))) {
      outcome.cancel_phase = RequestOutcome::kPrefill;
      return !(client_gone = true);
    }
    last_write = Clock::now();
    return true;
  };
  cb.on_prefill = [&](const engine::PrefillProgress& p) {
    full_reports = true;
    return progress(p);
  };
  cb.on_prefill_progress = [&](int64_t done, int64_t total) {
    if (full_reports) return !client_gone;
    engine::PrefillProgress p{};
    p.prompt_tokens = int64_t(job.prompt_ids.size());
    p.total = total;
    p.cached_tokens = std::max<int64_t>(0, p.prompt_tokens - total);
    p.done = done;
    p.units_done = done;
    p.units_total = total;
    p.elapsed_s = Seconds(Clock::now() - prefill_start);
    p.eta_s = done > 0 ? p.elapsed_s * double(total - done) / double(done) : -1;
    return progress(p);
  };

  ResponseStats stats;
  stats.queue_wait_s = outcome.queue_wait_s;
  stats.queue_ticket = job.ticket->number();
  stats.start_index = job.ticket->start_index();
  try {
    engine::GenerateResult result = backend->Generate(gen, cb);
    job.ticket.reset();  // the next request may start while this one's last bytes go out
    stats.timings = result.timings;
    stats.expert_hit_rate = result.experts.hit_rate();
    stats.expert_bytes_read = result.experts.bytes_read;
    outcome.cached_tokens = result.usage.cached_tokens;
    outcome.prefill_tokens = result.usage.prompt_tokens - result.usage.cached_tokens;
    outcome.prefill_s = result.timings.prefill_s;
    outcome.completion_tokens = result.usage.completion_tokens;
    if (result.usage.completion_tokens > 0) outcome.ttft_s = result.timings.ttft_s;
    if (result.usage.completion_tokens > 1 && result.timings.decode_tok_per_s > 0) {
      outcome.decode_s_per_token = 1.0 / result.timings.decode_tok_per_s;
    }
    if (!client_gone && stopping_.load() && result.finish == engine::FinishReason::kCancelled) {
      outcome.cancelled = outcome.shutdown = true;
      fail(shutting_down);
    } else if (client_gone || result.finish == engine::FinishReason::kCancelled) {
      outcome.cancelled = true;
    } else if (!write(out.Finish(result, stats))) {
      outcome.cancelled = true;
    }
  } catch (const std::exception& ex) {
    job.ticket.reset();
    const Error* k3e = dynamic_cast<const Error*>(&ex);
    Error e = k3e ? *k3e : Error(ErrorCode::kInternal, ex.what());
    K3_LOG_WARN("serve: request %s failed during generation: %s", job.meta.id.c_str(), e.what());
    ApiError err = ApiErrorFor(e);
    outcome.error_status = err.status;
    fail(err);
  }
  metrics_.CountFinished(outcome);
  return outcome;
}

}  // namespace k3::server
