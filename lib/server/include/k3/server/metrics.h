// Server counters and histograms, rendered as Prometheus text (GET /metrics).
// Thread-safe: every update takes one mutex (a few per request).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "k3/engine/checkpoint_cache.h"
#include "k3/engine/engine.h"
#include "k3/model/expert_store.h"

namespace k3::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // name_bucket{le=...}, name_sum, name_count lines.
  void Render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct RequestOutcome {
  bool cancelled = false;
  bool shutdown = false;     // cancelled (or refused from the queue) by SIGTERM
  int error_status = 0;      // failed after the 200 went out: the error's status
  enum Phase { kQueued, kPrefill, kDecode } cancel_phase = kDecode;  // where the client left
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  double ttft_s = -1;         // < 0: no token was generated
  double decode_s_per_token = -1;
  double queue_wait_s = 0;
  // Prompt tokens the engine prefilled (not cached) and the seconds it took.
  int64_t prefill_tokens = 0;
  double prefill_s = 0;
};

class Metrics {
 public:
  Metrics();
  // Generation routes (k3_requests_*): every request received is counted
  // once as completed, cancelled or rejected (total = the sum).
  void CountRequest();                      // every generation request received
  void CountRejected(int status);           // refused in admission (400 / 413 / 429 / 503)
  void CountFinished(const RequestOutcome& o);
  // Every HTTP request, whatever its route, once when its answer ends
  // (k3_http_requests_*): `outcome` served / rejected / cancelled, `reason` the
  // status or why it was cut ("client_gone", "shutdown").
  void CountHttp(const std::string& route, const char* outcome, const std::string& reason);
  // `queue_depth`, the store's and the checkpoint cache's cumulative stats are
  // sampled at render time.
  std::string Render(int queue_depth, bool busy, const model::ExpertStoreStats& experts,
                     const engine::CheckpointCacheStats& checkpoints = {}) const;

  uint64_t cancelled() const;

 private:
  mutable std::mutex mu_;
  uint64_t requests_ = 0, cancelled_ = 0, rejected_ = 0, completed_ = 0;
  uint64_t cancelled_by_phase_[3] = {0, 0, 0};
  std::vector<std::pair<int, uint64_t>> rejected_by_status_;
  struct HttpKey {
    std::string route, outcome, reason;
    uint64_t n = 0;
  };
  std::vector<HttpKey> http_;  // few distinct keys: routes are a fixed table
  uint64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  uint64_t prefill_tokens_ = 0;
  double prefill_s_ = 0;
  double last_prefill_tok_per_s_ = 0;  // of the last request that prefilled anything
  Histogram ttft_, decode_, queue_wait_;
};

// Continuous batching (docs/server.md "Many users at once"): requests on the
// model now, steps, rows per step (histogram), admission, sequence memory.
void RenderStepMetrics(std::string& out, int running, const engine::Engine::StepStats& st);

}  // namespace k3::server
