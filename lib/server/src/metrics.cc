#include "k3/server/metrics.h"

#include <cstdio>

namespace k3::server {
namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void Counter(std::string& out, const char* name, const char* help, uint64_t v) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " +
         std::to_string(v) + "\n";
}
void Gauge(std::string& out, const char* name, const char* help, double v) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " + Num(v) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Render(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + Num(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + Num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}),
      decode_({0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}),
      queue_wait_({0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300}) {}

void Metrics::CountRequest() {
  std::lock_guard lock(mu_);
  ++requests_;
}

void Metrics::CountRejected(int status) {
  std::lock_guard lock(mu_);
  ++rejected_;
  for (auto& [s, n] : rejected_by_status_) {
    if (s == status) {
      ++n;
      return;
    }
  }
  rejected_by_status_.emplace_back(status, 1);
}

void Metrics::CountHttp(const std::string& route, const char* outcome, const std::string& reason) {
  std::lock_guard lock(mu_);
  for (HttpKey& k : http_) {
    if (k.route == route && k.outcome == outcome && k.reason == reason) {
      ++k.n;
      return;
    }
  }
  http_.push_back({route, outcome, reason, 1});
}

void Metrics::CountFinished(const RequestOutcome& o) {
  std::lock_guard lock(mu_);
  if (o.error_status) {  // failed after the 200: a rejection with the error's status
    ++rejected_;
    bool found = false;
    for (auto& [s, n] : rejected_by_status_) {
      if (s == o.error_status) found = (++n, true);
    }
    if (!found) rejected_by_status_.emplace_back(o.error_status, 1);
  } else if (o.cancelled) {
    ++cancelled_;
    ++cancelled_by_phase_[o.cancel_phase];
  } else {
    ++completed_;
  }
  prompt_tokens_ += uint64_t(o.prompt_tokens);
  completion_tokens_ += uint64_t(o.completion_tokens);
  cached_tokens_ += uint64_t(o.cached_tokens);
  if (o.prefill_tokens > 0 && o.prefill_s > 0) {
    prefill_tokens_ += uint64_t(o.prefill_tokens);
    prefill_s_ += o.prefill_s;
    last_prefill_tok_per_s_ = double(o.prefill_tokens) / o.prefill_s;
  }
  if (o.ttft_s >= 0) ttft_.Observe(o.ttft_s);
  if (o.decode_s_per_token >= 0) decode_.Observe(o.decode_s_per_token);
  queue_wait_.Observe(o.queue_wait_s);
}

uint64_t Metrics::cancelled() const {
  std::lock_guard lock(mu_);
  return cancelled_;
}

std::string Metrics::Render(int queue_depth, bool busy, const model::ExpertStoreStats& experts,
                            const engine::CheckpointCacheStats& ck) const {
  std::lock_guard lock(mu_);
  std::string out;
  // Every HTTP request once: total = served + rejected + cancelled.
  uint64_t by_outcome[3] = {0, 0, 0};
  const char* outcomes[] = {"served", "rejected", "cancelled"};
  for (const HttpKey& k : http_) {
    for (int i = 0; i < 3; ++i) {
      if (k.outcome == outcomes[i]) by_outcome[i] += k.n;
    }
  }
  Counter(out, "k3_http_requests_total", "HTTP requests answered or cut, every route (served + rejected + cancelled).",
          by_outcome[0] + by_outcome[1] + by_outcome[2]);
  Counter(out, "k3_http_requests_served_total", "HTTP requests answered with 1xx-3xx to the end.", by_outcome[0]);
  Counter(out, "k3_http_requests_rejected_total", "HTTP requests answered with an error status.", by_outcome[1]);
  Counter(out, "k3_http_requests_cancelled_total", "HTTP requests cut by the client leaving or by shutdown.",
          by_outcome[2]);
  out += "# HELP k3_http_requests_by_route_total HTTP requests by route, outcome and reason (status or cause).\n"
         "# TYPE k3_http_requests_by_route_total counter\n";
  for (const HttpKey& k : http_) {
    out += "k3_http_requests_by_route_total{route=\"" + k.route + "\",outcome=\"" + k.outcome + "\",reason=\"" +
           k.reason + "\"} " + std::to_string(k.n) + "\n";
  }
  Counter(out, "k3_requests_total",
          "Generation requests received (chat completions, messages): completed + cancelled + rejected.", requests_);
  Counter(out, "k3_requests_completed_total", "Requests answered to the end.", completed_);
  Counter(out, "k3_requests_cancelled_total", "Requests whose client left (queued, prefill or decode).",
          cancelled_);
  const char* phases[] = {"queued", "prefill", "decode"};
  for (int i = 0; i < 3; ++i) {
    out += std::string("k3_requests_cancelled_by_phase_total{phase=\"") + phases[i] + "\"} " +
           std::to_string(cancelled_by_phase_[i]) + "\n";
  }
  out += "# HELP k3_requests_rejected_total Generation requests refused (admission, or an error after the 200), by HTTP status.\n"
         "# TYPE k3_requests_rejected_total counter\n";
  out += "k3_requests_rejected_total " + std::to_string(rejected_) + "\n";
  for (auto& [s, n] : rejected_by_status_) {
    out += "k3_requests_rejected_by_status_total{status=\"" + std::to_string(s) + "\"} " + std::to_string(n) + "\n";
  }
  Counter(out, "k3_prompt_tokens_total", "Prompt tokens of finished requests.", prompt_tokens_);
  Counter(out, "k3_completion_tokens_total", "Generated tokens.", completion_tokens_);
  Counter(out, "k3_cached_tokens_total", "Prompt tokens reused from the session (not prefilled).", cached_tokens_);
  // Prefill speed: rate(k3_prefill_tokens_total) / rate(k3_prefill_seconds_total)
  // over any window; the gauge is the last request's.
  Counter(out, "k3_prefill_tokens_total", "Prompt tokens prefilled (not cached).", prefill_tokens_);
  out +=
      "# HELP k3_prefill_seconds_total Seconds spent prefilling those tokens.\n"
      "# TYPE k3_prefill_seconds_total counter\nk3_prefill_seconds_total " +
      Num(prefill_s_) + "\n";
  Gauge(out, "k3_prefill_tokens_per_second",
        "Prefill speed of the last request that prefilled tokens.", last_prefill_tok_per_s_);
  Gauge(out, "k3_queue_depth", "Requests waiting for the model.", queue_depth);
  Gauge(out, "k3_busy", "1 while a request holds the model.", busy ? 1 : 0);
  ttft_.Render(out, "k3_ttft_seconds", "Time from the model starting a request to its first token.");
  decode_.Render(out, "k3_decode_seconds_per_token", "Decode time per generated token.");
  queue_wait_.Render(out, "k3_queue_wait_seconds", "Time a request waited for the model.");
  Counter(out, "k3_expert_bytes_read_total", "Expert bytes read from disk.", experts.bytes_read);
  Counter(out, "k3_experts_distinct_routed_total",
          "Distinct (layer, expert) pairs requests have routed to since load.", experts.distinct_routed);
  Counter(out, "k3_expert_pass_experts_total",
          "Experts fetched per layer pass, summed: over k3_step_rows_total x top_k x MoE layers, "
          "the share of routed (row, rank) pairs that needed an expert of their own.",
          experts.pass_experts);
  Counter(out, "k3_expert_cache_hits_total", "Expert acquisitions served from the cache.", experts.hits);
  Counter(out, "k3_expert_cache_misses_total", "Expert acquisitions that needed a read.", experts.misses);
  Gauge(out, "k3_expert_cache_hit_rate", "Expert cache hit rate since load.", experts.hit_rate());
  // Recurrent-state checkpoints (docs/checkpoints.md), since load.
  struct Line {
    bool counter;
    const char* name;
    const char* help;
    double value;
  };
  const Line lines[] = {
      {true, "k3_checkpoint_hits_total", "Prompts that restored a checkpoint (one restore each).",
       double(ck.hits)},
      {true, "k3_checkpoint_misses_total", "Prompt lookups that found no checkpoint.", double(ck.misses)},
      {true, "k3_checkpoint_restored_tokens_total", "Prompt positions restored instead of prefilled.",
       double(ck.restored_tokens)},
      {true, "k3_checkpoint_disk_loads_total", "Restores read back from a parked file.",
       double(ck.disk_loads)},
      {true, "k3_checkpoint_saves_total", "Checkpoints taken.", double(ck.saves)},
      {true, "k3_checkpoint_evictions_total", "RAM slots given up (parked or dropped).",
       double(ck.evictions)},
      {true, "k3_checkpoint_parks_total", "Checkpoint files written.", double(ck.parks)},
      {true, "k3_checkpoint_refused_total", "Checkpoint files refused (damaged or foreign).",
       double(ck.refused)},
      {false, "k3_checkpoint_ram_checkpoints", "Checkpoints held in RAM.", double(ck.ram_checkpoints)},
      {false, "k3_checkpoint_ram_bytes", "Bytes of checkpoints in RAM (shared MLA rows once).",
       double(ck.ram_bytes)},
      {false, "k3_checkpoint_disk_checkpoints", "Checkpoint files parked on disk.",
       double(ck.disk_checkpoints)},
      {false, "k3_checkpoint_disk_bytes", "Bytes of parked checkpoint files.", double(ck.disk_bytes)},
  };
  for (const Line& l : lines) {
    if (l.counter) {
      Counter(out, l.name, l.help, static_cast<uint64_t>(l.value < 0 ? 0 : l.value));
    } else {
      Gauge(out, l.name, l.help, l.value);
    }
  }
  return out;
}

void RenderStepMetrics(std::string& out, int running, const engine::Engine::StepStats& st) {
  Gauge(out, "k3_parallel", "Requests that may run on the model at once (--parallel).",
        st.parallel);
  Gauge(out, "k3_running_requests", "Requests running on the model now.", running);
  Counter(out, "k3_steps_total", "Batched forward steps run (--parallel > 1).", st.steps);
  Counter(out, "k3_step_rows_total", "Rows fed by those steps.", st.rows);
  Counter(out, "k3_step_decode_rows_total", "Of them, decoding sequences' one-token rows.",
          st.decode_rows);
  Gauge(out, "k3_step_max_sequences", "Most sequences one step has held.",
        static_cast<double>(st.max_sequences));
  out += "# HELP k3_step_rows Rows per step.\n# TYPE k3_step_rows histogram\n";
  uint64_t cum = 0;
  for (size_t b = 0; b < st.rows_hist.size(); ++b) {
    cum += st.rows_hist[b];
    const std::string le = b + 1 == st.rows_hist.size() ? "+Inf" : std::to_string(uint64_t{1} << b);
    out += "k3_step_rows_bucket{le=\"" + le + "\"} " + std::to_string(cum) + "\n";
  }
  if (st.rows_hist.empty()) out += "k3_step_rows_bucket{le=\"+Inf\"} 0\n";
  out += "k3_step_rows_sum " + std::to_string(st.rows) + "\nk3_step_rows_count " +
         std::to_string(st.steps) + "\n";
  Counter(out, "k3_admission_waits_total",
          "Requests that waited for sequence memory before running.", st.admission_waits);
  Gauge(out, "k3_sequence_reserved_bytes", "Sequence state reserved by running requests.",
        static_cast<double>(st.reserved_bytes));
  Gauge(out, "k3_sequence_budget_bytes", "What running requests' sequences may hold.",
        static_cast<double>(st.budget_bytes));
}

}  // namespace k3::server
