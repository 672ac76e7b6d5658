// k3-bench serve: what the HTTP server costs. One process loads the engine
// once and, interleaved run by run, times the same chat request (a) directly
// on the engine and (b) streamed through lib/server on a loopback socket,
// measured by a client: TTFT and decode tok/s, medians and ranges, the ratio.
// Then N concurrent streaming clients with --queue N: all served, none lost,
// FIFO order kept, time in queue. Then the same request on the Anthropic
// Messages route against the OpenAI route, interleaved. Each run starts from
// an empty session so both sides prefill the whole prompt.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "k3/engine/engine.h"
#include "k3/server/server.h"

namespace k3::bench {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct ServeBenchArgs {
  std::string model_dir;
  int runs = 7;
  int max_tokens = 128;
  int clients = 16;
  std::string prompt = "Explain, step by step, how a mixture-of-experts layer routes a token.";
};

// Every run starts from an empty session (no prefix reuse on either side).
class FreshBackend : public server::Backend {
 public:
  explicit FreshBackend(engine::Engine& e) : inner_(server::MakeEngineBackend(e)), engine_(e) {}
  std::vector<int32_t> PromptIds(const tok::RenderedChat& c) const override { return inner_->PromptIds(c); }
  int64_t context_limit() const override { return inner_->context_limit(); }
  engine::SamplingParams default_sampling() const override { return inner_->default_sampling(); }
  model::ExpertStoreStats expert_stats() const override { return inner_->expert_stats(); }
  engine::GenerateResult Generate(const engine::GenerateRequest& r, const engine::Callbacks& cb) override {
    engine_.ResetSession();
    return inner_->Generate(r, cb);
  }

 private:
  std::unique_ptr<server::Backend> inner_;
  engine::Engine& engine_;
};

struct Timing {
  double ttft_s = 0, decode_tok_per_s = 0;
  int64_t tokens = 0;
  double queue_wait_s = 0;
  int64_t ticket = 0, start_index = 0;
  bool ok = false;
};

int64_t IntAfter(const std::string& s, const std::string& key) {
  size_t k = s.rfind("\"" + key + "\":");
  return k == std::string::npos ? -1 : std::strtoll(s.c_str() + k + key.size() + 3, nullptr, 10);
}
double DoubleAfter(const std::string& s, const std::string& key) {
  size_t k = s.rfind("\"" + key + "\":");
  return k == std::string::npos ? -1 : std::strtod(s.c_str() + k + key.size() + 3, nullptr);
}

enum class Route { kChat, kMessages };

// A streaming client on a raw socket: TTFT is request sent -> first event with
// generated text; decode rate is (tokens - 1) / (last text event - first).
Timing StreamOnce(int port, const std::string& body, Route route = Route::kChat) {
  const bool messages = route == Route::kMessages;
  Timing t;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) ::close(fd);
    return t;
  }
  std::string req = std::string("POST ") + (messages ? "/v1/messages" : "/v1/chat/completions") +
                    " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Connection: close\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  auto t0 = Clock::now();
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != ssize_t(req.size())) {
    ::close(fd);
    return t;
  }
  std::string all;
  char buf[65536];
  double first = -1, last = -1;
  size_t scanned = 0;
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    double now = Since(t0);
    all.append(buf, size_t(n));
    // Any delta with text in what just arrived marks a token time.
    size_t pos = all.find("\"delta\":{", scanned);
    bool text = false;
    while (pos != std::string::npos) {
      size_t end = all.find('}', pos);
      std::string_view d(all.data() + pos, (end == std::string::npos ? all.size() : end) - pos);
      if (d.find(messages ? "\"text_delta\"" : "content\":\"") != std::string::npos) text = true;
      pos = all.find("\"delta\":{", pos + 1);
    }
    scanned = all.size() > 16 ? all.size() - 16 : 0;
    if (text) {
      if (first < 0) first = now;
      last = now;
    }
  }
  ::close(fd);
  t.ok = all.find(messages ? "event: message_stop" : "data: [DONE]") != std::string::npos;
  t.tokens = IntAfter(all, messages ? "output_tokens" : "completion_tokens");
  t.ttft_s = first;
  t.decode_tok_per_s = (t.tokens > 1 && last > first) ? double(t.tokens - 1) / (last - first) : 0;
  t.queue_wait_s = DoubleAfter(all, "queue_wait_s");
  t.ticket = IntAfter(all, "queue_ticket");
  t.start_index = IntAfter(all, "start_index");
  return t;
}

// One side of an interleaved comparison: per-run TTFT and decode rate.
struct Side {
  std::string name;
  std::vector<double> ttft, rate;
  int64_t tokens = 0;
  void Add(double ttft_s, double tok_per_s, int64_t n) {
    ttft.push_back(ttft_s);
    rate.push_back(tok_per_s);
    tokens = n;
  }
};

// Ends a comparison line begun in `j`: both sides' medians and ranges and the
// ratios other / base; prints it.
void PrintComparison(JsonWriter& j, const Side& base, const Side& other) {
  j.Field("completion_tokens_" + base.name, base.tokens).Field("completion_tokens_" + other.name, other.tokens);
  PutSummary(j, base.name + "_ttft_s", base.ttft);
  PutSummary(j, other.name + "_ttft_s", other.ttft);
  PutSummary(j, base.name + "_decode_tok_per_s", base.rate);
  PutSummary(j, other.name + "_decode_tok_per_s", other.rate);
  j.Field("ttft_ratio_" + other.name + "_vs_" + base.name, Median(other.ttft) / Median(base.ttft));
  j.Field("decode_ratio_" + other.name + "_vs_" + base.name, Median(other.rate) / Median(base.rate));
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

void RunServeBench(const ServeBenchArgs& a) {
  if (a.runs < 5) throw Error(ErrorCode::kInvalidArgument, "--runs must be >= 5 (medians of at least 5)");
  engine::EngineOptions eo = engine::EngineOptions::FromEnv(a.model_dir);
  eo.progress = false;
  std::unique_ptr<engine::Engine> engine = engine::Engine::LoadOrThrow(eo);
  FreshBackend backend(*engine);

  server::ServerOptions so;
  so.port = 0;
  so.queue = std::max(a.clients, 1);
  so.model_id = "bench";
  so.api.sampling_free = true;
  server::Service service(so);
  service.SetBackend(&backend);
  server::HttpServer http(service);
  http.BindOrThrow();
  std::thread serving([&] { http.Serve(); });

  // Greedy, thinking off, one fixed prompt: both sides generate the same tokens.
  std::string body_json = "{\"model\":\"bench\",\"messages\":[{\"role\":\"user\",\"content\":";
  AppendJsonString(body_json, a.prompt);
  body_json += "}],\"max_tokens\":" + std::to_string(a.max_tokens) +
               ",\"temperature\":0,\"thinking\":{\"type\":\"disabled\"},\"stream\":true,"
               "\"stream_options\":{\"include_usage\":true}}";
  server::ChatRequest parsed = server::ParseChatRequestOrThrow(body_json, so.api);
  engine::GenerateRequest direct;
  direct.prompt_ids = engine->ChatPromptIds(parsed.chat);
  direct.chat_start = tok::ChatStreamParser::Start::kResponse;
  direct.max_tokens = a.max_tokens;
  direct.sampling.temperature = 0;

  Side direct_side{"direct"}, server_side{"server"};
  for (int r = 0; r <= a.runs; ++r) {  // run 0 warms both paths and is not counted
    engine->ResetSession();
    auto t0 = Clock::now();
    double first = -1, last = -1;
    engine::Callbacks cb;
    cb.on_delta = [&](const engine::Delta&) {
      double now = Since(t0);
      if (first < 0) first = now;
      last = now;
      return true;
    };
    engine::GenerateResult res = engine->Generate(direct, cb);
    Timing s = StreamOnce(http.port(), body_json);
    if (!s.ok) throw Error(ErrorCode::kIo, "a streamed bench request did not complete");
    if (r == 0) continue;
    int64_t n = res.usage.completion_tokens;
    direct_side.Add(first, n > 1 && last > first ? double(n - 1) / (last - first) : 0, n);
    server_side.Add(s.ttft_s, s.decode_tok_per_s, s.tokens);
  }
  JsonWriter j;
  j.BeginObject().Field("bench", "serve").Field("case", "single").Field("git_sha", SourceRevision());
  j.Field("cpu", CpuModel()).Field("threads", int64_t(std::thread::hardware_concurrency()));
  j.Field("runs", int64_t(a.runs)).Field("prompt_tokens", int64_t(direct.prompt_ids.size()));
  PrintComparison(j, direct_side, server_side);

  // N concurrent clients, all admitted (--queue N): none lost, FIFO kept.
  std::vector<Timing> results(size_t(a.clients));
  std::vector<std::thread> threads;
  auto t0 = Clock::now();
  for (int i = 0; i < a.clients; ++i) {
    threads.emplace_back([&, i] { results[size_t(i)] = StreamOnce(http.port(), body_json); });
  }
  for (auto& t : threads) t.join();
  double wall = Since(t0);
  int served = 0;
  std::vector<std::pair<int64_t, int64_t>> order;
  std::vector<double> waits;
  int64_t tokens = 0;
  for (const Timing& t : results) {
    if (!t.ok) continue;
    ++served;
    order.emplace_back(t.ticket, t.start_index);
    waits.push_back(t.queue_wait_s);
    tokens += t.tokens;
  }
  std::sort(order.begin(), order.end());
  bool fifo = true;
  for (size_t i = 1; i < order.size(); ++i) fifo &= order[i].second > order[i - 1].second;
  JsonWriter c;
  c.BeginObject().Field("bench", "serve").Field("case", "concurrent").Field("git_sha", SourceRevision());
  c.Field("cpu", CpuModel()).Field("clients", int64_t(a.clients)).Field("queue", int64_t(so.queue));
  c.Field("served", int64_t(served)).Field("lost", int64_t(a.clients - served)).Field("fifo_kept", fifo);
  c.Field("wall_s", wall).Field("total_tokens", tokens).Field("aggregate_tok_per_s", double(tokens) / wall);
  if (!waits.empty()) PutSummary(c, "queue_wait_s", waits);
  c.EndObject();
  std::printf("%s\n", c.str().c_str());
  std::fflush(stdout);

  // The Messages route on the same request (thinking is off by default there),
  // interleaved with the OpenAI route: what the Anthropic mapping and events cost.
  std::string messages_json = "{\"model\":\"bench\",\"max_tokens\":" + std::to_string(a.max_tokens) +
                              ",\"temperature\":0,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":";
  AppendJsonString(messages_json, a.prompt);
  messages_json += "}]}";
  Side chat_side{"chat"}, messages_side{"messages"};
  for (int r = 0; r <= a.runs; ++r) {
    Timing o = StreamOnce(http.port(), body_json);
    Timing m = StreamOnce(http.port(), messages_json, Route::kMessages);
    if (!o.ok || !m.ok) throw Error(ErrorCode::kIo, "a streamed bench request (chat or messages) did not complete");
    if (r == 0) continue;
    chat_side.Add(o.ttft_s, o.decode_tok_per_s, o.tokens);
    messages_side.Add(m.ttft_s, m.decode_tok_per_s, m.tokens);
  }
  JsonWriter mj;
  mj.BeginObject().Field("bench", "serve").Field("case", "messages").Field("git_sha", SourceRevision());
  mj.Field("cpu", CpuModel()).Field("runs", int64_t(a.runs));
  PrintComparison(mj, chat_side, messages_side);
  http.Stop();
  serving.join();
  service.SetBackend(nullptr);
}

void SetupServeBench(CLI::App& root) {
  auto args = std::make_shared<ServeBenchArgs>();
  CLI::App* cmd = root.add_subcommand("serve", "HTTP server overhead: TTFT and decode tok/s vs the engine directly");
  cmd->add_option("MODEL", args->model_dir, "model directory (the tiny fixture: tests/data/oracle/k3-tiny)")
      ->required();
  cmd->add_option("--runs", args->runs, "timed runs per side, interleaved (default 7)");
  cmd->add_option("--max-tokens", args->max_tokens, "tokens per answer (default 128)");
  cmd->add_option("--clients", args->clients, "concurrent clients in the queue case (default 16)");
  cmd->add_option("--prompt", args->prompt, "the user message");
  cmd->callback([args] { RunServeBench(*args); });
}

K3_REGISTER_BENCH(SetupServeBench);

}  // namespace
}  // namespace k3::bench
