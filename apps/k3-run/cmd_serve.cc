// k3-run serve: the OpenAI-compatible server and the web page (lib/server,
// docs/server.md) on one engine (lib/engine). Thin: flags -> options, bind,
// load, serve until SIGINT / SIGTERM.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <memory>
#include <string>
#include <thread>

#include "cli_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/sys.h"
#include "k3/engine/engine.h"
#include "k3/server/server.h"
#if K3_HAVE_VULKAN
#include "k3/vulkan/dense.h"
#include "k3/vulkan/tier.h"
#endif

namespace k3::run {
namespace {

struct ServeArgs {
  std::string model_dir;
  server::ServerOptions server;
  std::string sampling = "k3";
  bool no_webui = false;
  int64_t max_body_mb = 16;
  double hold_status_s = 30;
  int64_t step_tokens = 512;
  RuntimeFlags runtime;  // --threads and the --ckpt-* flags
  ClusterFlags cluster;
};

// While start-up runs, a thread takes the (blocked) stop signals and ends the
// process the way the signal's default action would have; Done() hands the
// signals back to the caller's sigwait (one still pending stays pending).
class StartupWatch {
 public:
  explicit StartupWatch(const sigset_t& signals) : signals_(signals), watch_([this] { Run(); }) {}
  ~StartupWatch() { Done(); }
  StartupWatch(const StartupWatch&) = delete;
  StartupWatch& operator=(const StartupWatch&) = delete;

  void Done() {
    done_ = true;
    if (watch_.joinable()) watch_.join();
  }

 private:
  void Run() {
    const timespec step{0, 100000000};  // 100 ms: a stop within a second, at any point
    while (!done_.load()) {
      const int sig = sigtimedwait(&signals_, nullptr, &step);
      if (sig <= 0) continue;
      if (done_.load()) {
        // Taken just as start-up ended: pending again, for the caller's sigwait.
        ::kill(::getpid(), sig);
        return;
      }
      std::fprintf(stderr, "k3-run serve: stopping (signal %d) during start-up\n", sig);
      std::fflush(stderr);
      // Unblocked on this thread with the default action: the process ends
      // as by that signal (exit status and all), not by an error exit.
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, sig);
      signal(sig, SIG_DFL);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      raise(sig);
      std::_Exit(128 + sig);  // not reached
    }
  }

  sigset_t signals_;
  std::atomic<bool> done_{false};
  std::thread watch_;
};

void RunServe(ServeArgs args) {
  server::ServerOptions& o = args.server;
  if (o.api_key.empty()) {
    if (auto key = GetEnv("K3_API_KEY")) o.api_key = *key;
  }
  if (args.sampling != "k3" && args.sampling != "free") {
    throw Error(ErrorCode::kInvalidArgument, "--sampling must be k3 or free, not '" + args.sampling + "'");
  }
  o.api.sampling_free = args.sampling == "free";
  o.webui = !args.no_webui;
  if (args.max_body_mb < 1 || args.max_body_mb > 1024) {
    throw Error(ErrorCode::kInvalidArgument, "--max-body-mb must be 1..1024");
  }
  o.api.max_body_bytes = size_t(args.max_body_mb) << 20;
  if (o.queue < 0) throw Error(ErrorCode::kInvalidArgument, "--queue must be >= 0");
  if (o.parallel < 0 || o.parallel > 256) {
    throw Error(ErrorCode::kInvalidArgument, "--parallel must be 0..256 (0: from memory)");
  }
  if (args.step_tokens < 1 || args.step_tokens > (1 << 20)) {
    throw Error(ErrorCode::kInvalidArgument, "--step-tokens must be 1..1048576");
  }
  if (!(args.hold_status_s >= 0 && args.hold_status_s <= 3600)) {
    throw Error(ErrorCode::kInvalidArgument, "--hold-status must be 0..3600 seconds");
  }
  o.hold_status_ms = int(args.hold_status_s * 1000);
  for (const auto& [value, name, lo, hi] : {std::tuple{o.max_connections, "--max-connections", 2, 1 << 20},
                                            {o.max_connections_per_client, "--max-connections-per-client", 1, 1 << 20},
                                            {o.head_timeout_s, "--head-timeout", 1, 3600},
                                            {o.read_timeout_s, "--read-timeout", 1, 3600},
                                            {o.write_timeout_s, "--write-timeout", 1, 3600},
                                            {o.idle_timeout_s, "--idle-timeout", 1, 3600},
                                            {o.shutdown_timeout_s, "--shutdown-timeout", 0, 3600},
                                            {o.prepare_concurrency, "--prepare-concurrency", 1, 256}}) {
    if (value < lo || value > hi) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(name) + " must be " + std::to_string(lo) + ".." + std::to_string(hi));
    }
  }
  if (o.api.default_max_tokens < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "--max-tokens must be >= 0 (0: up to the context limit)");
  }
  if (o.model_id.empty()) {
    std::string dir = args.model_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    o.model_id = dir.substr(dir.find_last_of('/') + 1);
  }
  // The same runtime as generate and chat (EngineOptionsFor, the same --ckpt-*
  // flags): checkpoints sized from free memory unless --ckpt-slots says, so a
  // follow-up whose re-rendered history differs from the generated ids still
  // resumes from the end of its last prompt, and the Vulkan tier when K3_VK=1.
  engine::EngineOptions eo = EngineOptionsFor(args.model_dir, args.runtime);
  eo.parallel = o.parallel;
  eo.step_tokens = args.step_tokens;
  if (RunClusterRole(args.cluster, eo, /*stop_handler=*/false)) return;  // a worker rank
  // /metrics shows the cluster's placement and traffic once it is up.
  // So do the Vulkan tier and the trunk's placement (k3_vk_*) when K3_VK=1.
  std::atomic<cluster::ClusterExecutor*> cl{nullptr};
  std::atomic<model::Model*> vk_model{nullptr};
  o.extra_metrics = [&cl, &vk_model] {
    cluster::ClusterExecutor* c = cl.load();
    std::string text = c ? cluster::RenderClusterMetrics(c->stats()) : std::string();
#if K3_HAVE_VULKAN
    if (model::Model* m = vk_model.load()) {
      text += vulkan::RenderVulkanMetrics(vulkan::InstalledTier(*m), vulkan::InstalledDense(*m));
    }
#endif
    return text;
  };

  // SIGINT / SIGTERM are taken by sigwait on this thread once the model is
  // up; every thread started below inherits the blocked mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Until then (binding, a load that may take minutes) a stop signal ends the
  // process within StartupWatch's step: nothing is served or held that a stop
  // would have to finish, and parked checkpoints survive a kill by design.
  StartupWatch startup(stop_signals);

  server::Service service(o);
  server::HttpServer http(service);
  http.BindOrThrow();  // /health answers 503 while the model loads
  std::fprintf(stderr,
               "k3-run serve: listening on http://%s:%d (model id %s, parallel %s, queue %d%s)\n",
               o.host.c_str(), http.port(), o.model_id.c_str(),
               o.parallel > 0 ? std::to_string(o.parallel).c_str() : "from memory", o.queue,
               o.api_key.empty() ? "" : ", API key required");
  std::fflush(stderr);
  std::thread serving([&] { http.Serve(); });

  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<server::Backend> backend;
  try {
    StallPoint("serve-load");
    engine = engine::Engine::LoadOrThrow(eo);
    if (!engine->tokenizer()) {
      throw Error(ErrorCode::kNotFound, "serve needs tiktoken.model in the model directory", args.model_dir);
    }
    backend = server::MakeEngineBackend(*engine);
    std::fprintf(stderr, "k3-run serve: %s\n", engine->DescribeCheckpoints().c_str());
    cl.store(ClusterOf(*engine));
    vk_model.store(&engine->model());
    // Before the first request can be admitted: a signal from here on is
    // sigwait's, the ordinary stop below that answers every request.
    startup.Done();
    service.SetBackend(backend.get());
    std::fprintf(stderr, "k3-run serve: ready (parallel %d)\n", engine->step_stats().parallel);
    std::fflush(stderr);
  } catch (...) {
    startup.Done();
    http.Stop();
    serving.join();
    throw;
  }
  int sig = 0;
  if (cl.load() == nullptr) {
    sigwait(&stop_signals, &sig);
  } else {
    // A lost worker ends the server too (exit 75), after the in-flight
    // request got its 503; a SIGTERM (mpirun's answer to a dead rank) fails
    // the exchange in flight at once, so its client still hears 503.
    const timespec step{0, 100000000};
    while ((sig = sigtimedwait(&stop_signals, nullptr, &step)) < 0 && !cl.load()->failed()) {
    }
    // The executor marks itself failed before its error reaches the request
    // being answered: give that answer a moment to be written.
    if (sig < 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    if (sig == SIGTERM) {
      cluster::RequestStop();
      AbandonCluster();  // MPI_Finalize would wait for the dead rank
    }
  }
  // Bounded whatever the clients do: no new connections; queued requests
  // answered 503 within a heartbeat; the running one cancelled at its next
  // token or prefill step; sockets still being read closed at once; handlers
  // get --shutdown-timeout, then their sockets are cut (docs/server.md).
  std::fprintf(stderr, "k3-run serve: stopping (%s)\n",
               sig > 0 ? ("signal " + std::to_string(sig)).c_str() : "a cluster worker was lost");
  std::fflush(stderr);
  const auto stop_start = std::chrono::steady_clock::now();
  service.BeginShutdown();
  http.Stop();
  serving.join();
  if (int left = http.handlers_running(); left > 0) {
    // A handler still inside the engine: parking now would race it.
    std::fprintf(stderr, "k3-run serve: %d requests did not stop in time; exiting without parking\n", left);
    std::fflush(stderr);
    std::_Exit(1);
  }
  service.SetBackend(nullptr);
  // Nothing runs on the engine any more: park its RAM checkpoints so that the
  // next start resumes these conversations (docs/checkpoints.md).
  if (const int64_t parked = engine->ParkCheckpoints(); parked > 0) {
    std::fprintf(stderr, "k3-run serve: parked %lld checkpoints in %s\n",
                 static_cast<long long>(parked), eo.checkpoints.disk_dir.c_str());
  }
  std::fprintf(stderr, "k3-run serve: stopped in %.2f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_start).count());
  if (cl.load() && cl.load()->failed()) {
    throw Error(ErrorCode::kUnavailable,
                "a cluster worker was lost: restart the job (docs/cluster.md)");
  }
}

void SetupServe(CLI::App& root) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = root.add_subcommand("serve", "OpenAI-compatible HTTP server and web chat page (docs/server.md)");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container with tiktoken.model")->required();
  cmd->add_option("--host", args->server.host, "address to bind (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", args->server.port, "port (0: any free port, printed on stderr)");
  cmd->add_option("--api-key", args->server.api_key,
                  "require Authorization: Bearer KEY on /v1 (default: K3_API_KEY, else no key)");
  args->server.parallel = 0;
  cmd->add_option("--parallel", args->server.parallel,
                  "requests that run at once, batched in steps; each gets the tokens it would get "
                  "alone (1: one at a time, prompts in windows; default 0: as many as memory "
                  "holds at 32768 positions each, at most 4, printed at start)");
  cmd->add_option(
      "--step-tokens", args->step_tokens,
      "with --parallel > 1: rows per step, every decoding request's token plus slices of "
      "prompts; smaller = lower latency for the others, more expert reads per prompt "
      "(default 512)");
  cmd->add_option("--queue", args->server.queue,
                  "requests that may wait behind the running ones; more get 429");
  cmd->add_option("--model-id", args->server.model_id, "model id served (default: the directory name)");
  cmd->add_option("--sampling", args->sampling,
                  "k3: temperature/top_p locked to K3's values (as Moonshot's API); free: any value");
  cmd->add_flag("--no-webui", args->no_webui, "do not serve the web page at /");
  cmd->add_option("--max-tokens", args->server.api.default_max_tokens,
                  "completion cap for requests that set no max_tokens (default 0: none, up to the "
                  "context limit)");
  cmd->add_option("--max-body-mb", args->max_body_mb, "request body cap in MiB; larger is 413 (default 16)");
  cmd->add_option("--read-timeout", args->server.read_timeout_s,
                  "seconds a client may stall while sending a request body (default 10)");
  cmd->add_option("--head-timeout", args->server.head_timeout_s,
                  "seconds for a whole request head, from its first byte; then 408 (default 10)");
  cmd->add_option("--idle-timeout", args->server.idle_timeout_s,
                  "seconds a kept-alive connection may idle between requests (default 30)");
  cmd->add_option("--hold-status", args->hold_status_s,
                  "seconds a non-streamed answer writes nothing, so a failure in that time gets its own "
                  "status (503, 500); then JSON whitespace keeps idle timers alive (0: at once; default 30)");
  cmd->add_option("--write-timeout", args->server.write_timeout_s,
                  "seconds a client may stop reading before it is dropped (default 30)");
  cmd->add_option("--max-connections", args->server.max_connections,
                  "open connections at once; past it the longest-idle one is closed, else 503 (default 1024)");
  cmd->add_option("--max-connections-per-client", args->server.max_connections_per_client,
                  "open connections per client address, the same way (default 128)");
  cmd->add_option("--prepare-concurrency", args->server.prepare_concurrency,
                  "requests parsed/rendered/schema-compiled at once, before the queue (default 2)");
  cmd->add_option("--shutdown-timeout", args->server.shutdown_timeout_s,
                  "SIGTERM: seconds running requests get before their sockets are cut (default 10)");
  cmd->add_option("--allowed-hosts", args->server.allowed_hosts,
                  "without --api-key: Host names accepted besides the bound address and localhost "
                  "(comma-separated; * for any)")
      ->delimiter(',');
  cmd->add_option("--cors-origin", args->server.cors_origins,
                  "a web origin (https://app.example) allowed to call the API from a browser, with CORS "
                  "headers; repeatable (default: none, only the server's own page)")
      ->delimiter(',');
  cmd->add_option("--threads", args->runtime.threads, "compute threads (default: every CPU)")
      ->check(CLI::Range(1, 1024));
  AddCheckpointFlags(cmd, args->runtime);
  AddPrefillFlags(cmd, args->runtime);
  AddClusterFlags(cmd, args->cluster);
  cmd->callback([args] { RunServe(*args); });
}

K3_REGISTER_COMMAND(SetupServe);

}  // namespace
}  // namespace k3::run
