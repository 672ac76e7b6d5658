// Service without sockets, on a scripted backend: loading, admission (400 /
// 429 / 503), FIFO order, cancel while queued / in prefill / in decode, the
// streamed and whole answers agreeing, auth and metrics. The real model and
// sockets are covered by tests/server (black-box against `k3-run serve`).
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "k3/server/dialect.h"
#include "k3/server/server.h"

namespace k3::server {
namespace {

// Emits the same deltas for every request; can hold a request in prefill
// until released, and records the order requests reached it.
class ScriptedBackend : public Backend {
 public:
  std::vector<int32_t> PromptIds(const tok::RenderedChat& chat) const override {
    std::vector<int32_t> ids = {1};
    for (const tok::ChatSegment& s : chat.segments) ids.push_back(int32_t(s.text.size()));
    return ids;
  }
  int64_t context_limit() const override { return 4096; }
  engine::SamplingParams default_sampling() const override { return {}; }
  model::ExpertStoreStats expert_stats() const override { return {}; }

  engine::GenerateResult Generate(const engine::GenerateRequest& req, const engine::Callbacks& cb) override {
    {
      std::unique_lock lock(mu);
      order.push_back(req.max_tokens);  // tests tag requests by max_tokens
      ++entered;
      cv.notify_all();
    }
    engine::GenerateResult r;
    r.usage.prompt_tokens = int64_t(req.prompt_ids.size());
    r.usage.cached_tokens = cached;
    r.timings.prefill_s = 0.5;
    for (int64_t layer = 0; layer < 3; ++layer) {
      // An engine with full reports (prefill windows) or one that counts
      // tokens only: the service must serve both.
      engine::PrefillProgress p{};
      p.prompt_tokens = r.usage.prompt_tokens;
      p.cached_tokens = cached;
      p.total = r.usage.prompt_tokens - cached;
      p.done = layer * p.total / 3;
      p.layers = 61;
      p.units_done = layer * 61;
      p.units_total = 3 * 61;
      p.window_tokens = p.total;
      p.expert_bytes_read = uint64_t(layer) * 1000000;
      p.elapsed_s = 0.25 * double(layer);
      p.eta_s = layer == 0 ? -1 : 0.25 * double(3 - layer);
      bool go = full_progress ? (!cb.on_prefill || cb.on_prefill(p))
                              : (!cb.on_prefill_progress || cb.on_prefill_progress(layer, 3));
      if (!go) {
        r.finish = engine::FinishReason::kCancelled;
        return r;
      }
      if (layer == 0 && hold) {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return !hold; });
      }
    }
    if (fail_after_prefill) throw Error(ErrorCode::kUnavailable, "cluster: rank 1 did not answer layer 2 within 3 s");
    std::vector<engine::Delta> script(3);
    script[0].reasoning = "hmm, ";
    script[1].reasoning = "ok";
    script[2].content = "Hello, 世界";
    for (const engine::Delta& d : script) {
      ++r.usage.completion_tokens;
      if (!cb.on_delta(d)) {
        r.finish = engine::FinishReason::kCancelled;
        return r;
      }
    }
    r.usage.reasoning_tokens = 2;
    r.finish = engine::FinishReason::kStop;
    return r;
  }

  void Release() {
    std::lock_guard lock(mu);
    hold = false;
    cv.notify_all();
  }
  void WaitEntered(int n) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return entered >= n; });
  }

  std::mutex mu;
  std::condition_variable cv;
  bool hold = false;
  bool full_progress = false;  // report through on_prefill, not on_prefill_progress
  bool fail_after_prefill = false;  // then throw as a lost cluster worker does
  int64_t cached = 0;
  int entered = 0;
  std::vector<int64_t> order;
};

ServerOptions Options(int queue) {
  ServerOptions o;
  o.queue = queue;
  o.model_id = "k3-test";
  o.heartbeat_ms = 5;
  return o;
}

std::string Chat(const std::string& extra) {
  return R"({"model":"x","messages":[{"role":"user","content":"hi"}])" + (extra.empty() ? "" : "," + extra) + "}";
}

std::unique_ptr<Service::Job> Admit(Service& s, const std::string& body) {
  auto prepared = s.Prepare(kChatCompletionsDialect, body);
  REQUIRE(std::holds_alternative<std::unique_ptr<Service::Job>>(prepared));
  return std::move(std::get<std::unique_ptr<Service::Job>>(prepared));
}

int RejectStatus(Service& s, const std::string& body) {
  auto prepared = s.Prepare(kChatCompletionsDialect, body);
  REQUIRE(std::holds_alternative<HttpReply>(prepared));
  return std::get<HttpReply>(prepared).status;
}

// Strips heartbeats (SSE comments, JSON whitespace) and the per-request id.
std::string Run(Service& s, Service::Job& job) {
  std::string out;
  s.RunChat(job, [&](std::string_view b) {
    out += b;
    return true;
  });
  return out;
}

TEST_CASE("503 while loading, then served") {
  Service s(Options(2));
  CHECK(s.Health().status == 503);
  CHECK(RejectStatus(s, Chat("")) == 503);
  ScriptedBackend b;
  s.SetBackend(&b);
  CHECK(s.Health().status == 200);
  auto job = Admit(s, Chat(""));
  std::string body = Run(s, *job);
  CHECK(body.find("\"content\":\"Hello, 世界\"") != std::string::npos);
  CHECK(body.find("\"reasoning_content\":\"hmm, ok\"") != std::string::npos);
  CHECK(body.find("\"model\":\"k3-test\"") != std::string::npos);
}

TEST_CASE("invalid requests are 400 with an error object and take no queue place") {
  Service s(Options(0));
  ScriptedBackend b;
  s.SetBackend(&b);
  auto prepared = s.Prepare(kChatCompletionsDialect, Chat(R"("n":3)"));
  REQUIRE(std::holds_alternative<HttpReply>(prepared));
  HttpReply& r = std::get<HttpReply>(prepared);
  CHECK(r.status == 400);
  CHECK(r.body.find("\"param\":\"n\"") != std::string::npos);
  CHECK(s.queue().waiting() == 0);
}

TEST_CASE("streamed and whole answers carry the same message") {
  Service s(Options(2));
  ScriptedBackend b;
  s.SetBackend(&b);
  auto whole = Admit(s, Chat(R"("seed":5)"));
  std::string body = Run(s, *whole);
  auto streamed = Admit(s, Chat(R"("seed":5,"stream":true,"stream_options":{"include_usage":true})"));
  std::string sse = Run(s, *streamed);
  std::string content, reasoning;
  for (size_t pos = 0; (pos = sse.find("\"content\":\"", pos)) != std::string::npos; pos += 11) {
    content += sse.substr(pos + 11, sse.find('"', pos + 11) - pos - 11);
  }
  for (size_t pos = 0; (pos = sse.find("\"reasoning_content\":\"", pos)) != std::string::npos; pos += 21) {
    reasoning += sse.substr(pos + 21, sse.find('"', pos + 21) - pos - 21);
  }
  CHECK(content == "Hello, 世界");
  CHECK(reasoning == "hmm, ok");
  CHECK(body.find("\"content\":\"" + content + "\"") != std::string::npos);
  CHECK(body.find("\"reasoning_content\":\"" + reasoning + "\"") != std::string::npos);
  // Same usage in both.
  std::string usage = body.substr(body.find("\"usage\":"), body.find(",\"k3\"") - body.find("\"usage\":"));
  CHECK(sse.find(usage) != std::string::npos);
  CHECK(sse.rfind("data: [DONE]\n\n") == sse.size() - 14);
}

TEST_CASE("FIFO: requests reach the model in arrival order; beyond the queue 429 with Retry-After") {
  Service s(Options(3));
  ScriptedBackend b;
  b.hold = true;
  s.SetBackend(&b);
  std::vector<std::unique_ptr<Service::Job>> jobs;
  std::vector<std::thread> threads;
  jobs.push_back(Admit(s, Chat(R"("max_tokens":1)")));
  threads.emplace_back([&, j = jobs.back().get()] { Run(s, *j); });
  b.WaitEntered(1);  // request 1 holds the model
  for (int i = 2; i <= 4; ++i) {
    jobs.push_back(Admit(s, Chat("\"max_tokens\":" + std::to_string(i))));
    threads.emplace_back([&, j = jobs.back().get()] { Run(s, *j); });
  }
  CHECK(s.queue().waiting() == 3);
  auto prepared = s.Prepare(kChatCompletionsDialect, Chat(R"("max_tokens":5)"));
  REQUIRE(std::holds_alternative<HttpReply>(prepared));
  HttpReply& r = std::get<HttpReply>(prepared);
  CHECK(r.status == 429);
  bool retry_after = false;
  for (auto& [k, v] : r.headers) retry_after |= (k == "Retry-After" && v == "1");
  CHECK(retry_after);
  b.Release();
  for (auto& t : threads) t.join();
  CHECK(b.order == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(s.MetricsText().body.find("k3_requests_rejected_by_status_total{status=\"429\"} 1") != std::string::npos);
}

// A service whose model a first request (max_tokens 1) holds in prefill until
// Release(), so that the next requests queue.
struct HeldModel {
  Service s{Options(3)};
  ScriptedBackend b;
  std::unique_ptr<Service::Job> first;
  std::thread t1;
  HeldModel() {
    b.hold = true;
    s.SetBackend(&b);
    first = Admit(s, Chat(R"("max_tokens":1)"));
    t1 = std::thread([this] { Run(s, *first); });
    b.WaitEntered(1);
  }
  void Release() {
    b.Release();
    t1.join();
  }
  ~HeldModel() {
    if (t1.joinable()) Release();
  }
};

TEST_CASE("a client gone while queued leaves the queue and never reaches the model") {
  HeldModel held;
  Service& s = held.s;
  ScriptedBackend& b = held.b;
  auto gone = Admit(s, Chat(R"("max_tokens":2)"));
  std::atomic<int> writes{0};
  std::thread t2([&] {
    s.RunChat(*gone, [&](std::string_view) { return ++writes < 3; });  // fails on the third heartbeat
  });
  t2.join();
  CHECK(s.queue().waiting() == 0);
  held.Release();
  CHECK(b.order == std::vector<int64_t>{1});
  CHECK(s.metrics().cancelled() == 1);
  CHECK(s.MetricsText().body.find("k3_requests_cancelled_by_phase_total{phase=\"queued\"} 1") != std::string::npos);
}

TEST_CASE("a queued stream's heartbeats name its place in line, which moves up") {
  HeldModel held;
  Service& s = held.s;
  auto second = Admit(s, Chat(R"("max_tokens":2,"stream":true)"));
  auto third = Admit(s, Chat(R"("max_tokens":3,"stream":true)"));
  std::mutex mu;
  std::string out2, out3;
  auto sink = [&](std::string& out) {
    return [&](std::string_view bytes) {
      std::lock_guard lock(mu);
      out += bytes;
      return true;
    };
  };
  std::thread t2([&] { s.RunChat(*second, sink(out2)); });
  // The third arrives once the second is in line.
  while (s.queue().waiting() < 1) std::this_thread::yield();
  std::thread t3([&] { s.RunChat(*third, sink(out3)); });
  auto seen = [&](const std::string& out, const char* what) {
    for (int i = 0; i < 2000; ++i) {
      {
        std::lock_guard lock(mu);
        if (out.find(what) != std::string::npos) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  };
  CHECK(seen(out2, ": queued position 1\n"));
  CHECK(seen(out3, ": queued position 2\n"));
  CHECK(second->ticket->position() == 1);
  CHECK(third->ticket->position() == 2);
  held.Release();
  t2.join();
  t3.join();
  CHECK(held.b.order == std::vector<int64_t>{1, 2, 3});
}

TEST_CASE("a client gone during prefill or decode cancels the generation") {
  Service s(Options(3));
  ScriptedBackend b;
  s.SetBackend(&b);
  // Write 1 is the opening role chunk (its failure is seen by the next
  // write), 2-3 prefill heartbeats, 4 the first delta.
  for (int fail_at : {1, 2, 3, 4}) {
    CAPTURE(fail_at);
    auto job = Admit(s, Chat(R"("stream":true)"));
    int writes = 0;
    std::string out;
    s.RunChat(*job, [&](std::string_view bytes) {
      if (++writes >= fail_at) return false;
      out += bytes;
      return true;
    });
    CHECK(out.find("[DONE]") == std::string::npos);
  }
  CHECK(s.metrics().cancelled() == 4);
  std::string m = s.MetricsText().body;
  CHECK(m.find("k3_requests_cancelled_by_phase_total{phase=\"prefill\"} 3") != std::string::npos);
  CHECK(m.find("k3_requests_cancelled_by_phase_total{phase=\"decode\"} 1") != std::string::npos);
  // The service still serves afterwards.
  auto job = Admit(s, Chat(""));
  CHECK(Run(s, *job).find("Hello") != std::string::npos);
}

TEST_CASE("auth: constant-time Bearer compare; no key means any header is ignored") {
  ServerOptions o = Options(1);
  Service open(o);
  CHECK(open.Authorized(""));
  CHECK(open.Authorized("Bearer whatever"));
  o.api_key = "sk-local";
  Service keyed(o);
  CHECK(keyed.Authorized("Bearer sk-local"));
  CHECK_FALSE(keyed.Authorized("Bearer sk-loca"));
  CHECK_FALSE(keyed.Authorized("Bearer sk-local2"));
  CHECK_FALSE(keyed.Authorized(""));
  HttpReply r = keyed.Unauthorized(kChatCompletionsDialect);
  CHECK(r.status == 401);
  CHECK(r.body.find("\"type\":\"authentication_error\"") != std::string::npos);
}

TEST_CASE("metrics name every required series") {
  Service s(Options(1));
  ScriptedBackend b;
  s.SetBackend(&b);
  auto job = Admit(s, Chat(""));
  Run(s, *job);
  std::string m = s.MetricsText().body;
  for (const char* name :
       {"k3_requests_total 1", "k3_requests_cancelled_total 0", "k3_requests_rejected_total 0",
        "k3_prompt_tokens_total", "k3_completion_tokens_total 3", "k3_cached_tokens_total",
        "k3_queue_depth 0", "k3_ttft_seconds_bucket", "k3_decode_seconds_per_token_count",
        "k3_expert_bytes_read_total", "k3_experts_distinct_routed_total",
        "k3_expert_cache_hit_rate", "k3_prefill_tokens_total",
        "k3_prefill_seconds_total 0.5", "k3_prefill_tokens_per_second"}) {
    CAPTURE(name);
    CHECK(m.find(name) != std::string::npos);
  }
}

// The data events of a stream (SSE comments dropped), one JSON text each.
std::vector<std::string> DataEvents(const std::string& sse) {
  std::vector<std::string> out;
  for (size_t at = sse.find("data: "); at != std::string::npos; at = sse.find("data: ", at)) {
    size_t end = sse.find("\n\n", at);
    out.push_back(sse.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

TEST_CASE("liveness: the role chunk goes out at admission, every heartbeat is also a data event") {
  Service s(Options(2));
  ScriptedBackend b;
  s.SetBackend(&b);
  auto job = Admit(s, Chat(R"("stream":true)"));
  std::vector<std::string> writes;
  s.RunChat(*job, [&](std::string_view bytes) {
    writes.emplace_back(bytes);
    return true;
  });
  REQUIRE(writes.size() > 4);
  // Before the queue turn: the first chunk, role only (what an OpenAI-SDK
  // client's idle timer counts; an SSE comment never reaches it).
  std::vector<std::string> first = DataEvents(writes[0]);
  REQUIRE(first.size() == 1);
  CHECK(first[0].find(R"("delta":{"role":"assistant","content":""})") != std::string::npos);
  // Each prefill heartbeat: the progress as a comment plus an empty delta.
  CHECK(writes[1].rfind(": prefill 0/3 tokens", 0) == 0);
  std::vector<std::string> beat = DataEvents(writes[1]);
  REQUIRE(beat.size() == 1);
  CHECK(beat[0].find(R"("delta":{})") != std::string::npos);
  // Exactly one chunk carries the role.
  std::string all;
  for (const std::string& w : writes) all += w;
  size_t roles = 0;
  for (const std::string& e : DataEvents(all)) roles += e.find("\"role\"") != std::string::npos;
  CHECK(roles == 1);
  CHECK(all.find("Hello, 世界") != std::string::npos);
}

TEST_CASE("return_progress: llama-server's prompt_progress chunks from full engine reports") {
  Service s(Options(2));
  ScriptedBackend b;
  b.full_progress = true;
  b.cached = 1;
  s.SetBackend(&b);
  auto job = Admit(s, Chat(R"("stream":true,"return_progress":true)"));
  std::string out = Run(s, *job);
  std::vector<std::string> progress;
  for (const std::string& e : DataEvents(out)) {
    if (e.find("prompt_progress") != std::string::npos) progress.push_back(e);
  }
  // The first two reports always go out (heartbeat 5 ms: later ones may too).
  REQUIRE(progress.size() >= 2);
  const int64_t prompt = int64_t(job->prompt_ids.size());
  std::string expect0 =
      R"("prompt_progress":{"total":)" + std::to_string(prompt) +
      R"(,"cache":1,"processed":1,"time_ms":0,"eta_ms":null,"layers":61,"units_done":0,"units_total":183,)"
      R"("window_tokens":)" +
      std::to_string(prompt - 1) + R"(,"expert_bytes_read":0})";
  CHECK(progress[0].find(expect0) != std::string::npos);
  CHECK(progress[0].find(R"("object":"chat.completion.chunk")") != std::string::npos);
  CHECK(progress[0].find(R"("delta":{})") != std::string::npos);
  CHECK(progress[1].find(R"("time_ms":250,"eta_ms":500,"layers":61,"units_done":61)") !=
        std::string::npos);
  // The comment heartbeat carries the same report as text.
  CHECK(out.find(": prefill 0/" + std::to_string(prompt - 1) +
                 " tokens (0%), 1 cached, 61 layers") != std::string::npos);
  // Without return_progress: no prompt_progress, keepalive chunks instead.
  auto plain = Admit(s, Chat(R"("stream":true)"));
  std::string out2 = Run(s, *plain);
  CHECK(out2.find("prompt_progress") == std::string::npos);
  CHECK(out2.find(R"("delta":{})") != std::string::npos);
  // A whole answer keeps whitespace heartbeats only.
  auto whole = Admit(s, Chat(R"("return_progress":true)"));
  std::string out3 = Run(s, *whole);
  CHECK(out3.find("prompt_progress") == std::string::npos);
  CHECK(out3.find_first_not_of(' ') != std::string::npos);
  CHECK(out3[out3.find_first_not_of(' ')] == '{');
  // return_progress must be a boolean.
  CHECK(RejectStatus(s, Chat(R"("return_progress":1)")) == 400);
}

TEST_CASE("a token-counting engine's reports become the same progress objects") {
  Service s(Options(2));
  ScriptedBackend b;  // on_prefill_progress(layer, 3): 3 tokens to prefill
  s.SetBackend(&b);
  auto job = Admit(s, Chat(R"("stream":true,"return_progress":true)"));
  std::string out = Run(s, *job);
  const int64_t prompt = int64_t(job->prompt_ids.size());
  std::string total = R"("prompt_progress":{"total":)" + std::to_string(prompt) + R"(,"cache":)" +
                      std::to_string(prompt - 3) + R"(,"processed":)" + std::to_string(prompt - 3);
  CHECK(out.find(total) != std::string::npos);
}

// A connection as the HTTP layer gives it: bytes, the status of the head, and
// what a peek at the socket says.
struct FakeConn {
  std::string out;
  int status = 200;
  int writes = 0;
  Service::ReplyHooks::Peer peer = Service::ReplyHooks::Peer::kAlive;
  int peeks = 0;
  RequestOutcome Run(Service& s, Service::Job& job) {
    Service::ReplyHooks hooks;
    hooks.peer = [this] {
      ++peeks;
      return peer;
    };
    hooks.status = [this](int st) {
      if (out.empty()) status = st;
    };
    return s.RunChat(job, [this](std::string_view b) {
      if (!b.empty()) ++writes;
      out += b;
      return peer != Service::ReplyHooks::Peer::kGone;
    }, hooks);
  }
};

TEST_CASE("a whole answer holds its status: a failure during prefill is its own 503, not a 200 body") {
  Service s(Options(2));  // hold_status_ms: the default 30 s
  ScriptedBackend b;
  b.fail_after_prefill = true;
  s.SetBackend(&b);
  auto job = Admit(s, Chat(""));
  FakeConn conn;
  RequestOutcome o = conn.Run(s, *job);
  CHECK(o.error_status == 503);
  CHECK(conn.status == 503);
  CHECK(conn.peeks >= 1);  // the prefill heartbeats only looked at the socket
  CHECK(conn.writes == 1);
  REQUIRE(!conn.out.empty());
  CHECK(conn.out[0] == '{');
  CHECK(conn.out.find("\"code\":\"unavailable\"") != std::string::npos);
  CHECK(conn.out.find("rank 1") != std::string::npos);

  // A streamed answer's 200 went out at admission: the error is an SSE event.
  auto streamed = Admit(s, Chat(R"("stream":true)"));
  FakeConn sse;
  o = sse.Run(s, *streamed);
  CHECK(o.error_status == 503);
  CHECK(sse.status == 200);
  CHECK(sse.out.find("unavailable") != std::string::npos);

  // A whole answer that succeeds sends one write: the object, no whitespace.
  b.fail_after_prefill = false;
  auto ok = Admit(s, Chat(""));
  FakeConn fine;
  o = fine.Run(s, *ok);
  CHECK(o.error_status == 0);
  CHECK(fine.status == 200);
  CHECK(fine.writes == 1);
  CHECK(fine.out[0] == '{');
}

TEST_CASE("a whole answer writes whitespace once the hold is over, or once the client shut its side") {
  ScriptedBackend b;
  b.fail_after_prefill = true;
  {
    ServerOptions opt = Options(2);
    opt.hold_status_ms = 0;  // whitespace from the start: the error is in the 200 body
    Service s(opt);
    s.SetBackend(&b);
    auto job = Admit(s, Chat(""));
    FakeConn conn;
    conn.Run(s, *job);
    CHECK(conn.status == 200);
    CHECK(conn.out[0] == ' ');
    CHECK(conn.out.find("unavailable") != std::string::npos);
  }
  {
    // A FIN (a half-close, or a client that left) is answered with a write:
    // only its outcome tells the two apart.
    Service s(Options(2));
    s.SetBackend(&b);
    auto job = Admit(s, Chat(""));
    FakeConn conn;
    conn.peer = Service::ReplyHooks::Peer::kEof;
    conn.Run(s, *job);
    CHECK(conn.status == 200);
    CHECK(conn.out[0] == ' ');
  }
  {
    // A reset seen by the peek cancels the request without a byte written.
    Service s(Options(2));
    b.fail_after_prefill = false;
    s.SetBackend(&b);
    auto job = Admit(s, Chat(""));
    FakeConn conn;
    conn.peer = Service::ReplyHooks::Peer::kGone;
    RequestOutcome o = conn.Run(s, *job);
    CHECK(o.cancelled);
    CHECK(conn.writes == 0);
  }
}

}  // namespace
}  // namespace k3::server
