// k3-bench parallel: many requests at once (--parallel, docs/engine.md
// "Steps") on one engine, against the same requests one after another on the
// same engine (what --parallel 1 serves), in the same run.
//
// Throughput: N requests of --prompt ids + --tokens generated each (raw
// mode, greedy, ignore_eos, distinct random prompts), all at once vs one
// after another (an untimed run first, then the two sides in alternating
// order; the concurrent side on N threads kept for the case, as a server's
// workers); the ratio of the walls is the speedup, printed beside the
// byte ceiling for that N: a step of N decode rows reads the trunk once and
// the union of their experts, so N x (T + E) / (T + N f E), with T the
// resident (trunk) bytes, E the expert bytes one token routes to and f the
// run's own share of distinct experts per routed (row, rank) pair
// (ExpertStoreStats::pass_experts over rows x top_k x MoE layers).
//
// Latency: one interactive request decoding while another client's cold
// --long-token prompt is read: the gaps between its tokens (p50, p99, the
// longest), against the same request alone.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "k3/engine/engine.h"

namespace k3::bench {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct ParallelArgs {
  std::string model_dir;
  std::vector<int> streams = {1, 2, 4, 8};
  int prompt = 16;
  int tokens = 32;
  int runs = 3;
  int64_t step_tokens = 512;
  int long_prompt = 2048;
};

engine::GenerateRequest Request(int64_t vocab, int prompt, int tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  engine::GenerateRequest r;
  r.prompt_ids.resize(static_cast<size_t>(prompt));
  for (auto& id : r.prompt_ids) id = d(rng);
  r.max_tokens = tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  return r;
}

// Token arrival times of one request (on_delta; raw mode delivers each
// token's bytes, whole UTF-8 characters: a split character joins the next).
struct Timed {
  engine::GenerateResult res;
  std::vector<double> at;
};
Timed RunTimed(engine::Engine& e, const engine::GenerateRequest& r, Clock::time_point t0) {
  Timed t;
  engine::Callbacks cb;
  cb.on_delta = [&](const engine::Delta&) {
    t.at.push_back(Since(t0));
    return true;
  };
  t.res = e.Generate(r, cb);
  return t;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

void RunParallelBench(const ParallelArgs& a) {
  const int nmax = *std::max_element(a.streams.begin(), a.streams.end());
  engine::EngineOptions eo = engine::EngineOptions::FromEnv(a.model_dir);
  eo.progress = false;
  eo.parallel = std::max(2, nmax);
  eo.step_tokens = a.step_tokens;
  auto e = engine::Engine::LoadOrThrow(eo);
  const ModelConfig& c = e->config();
  const double T = static_cast<double>(e->model().weights().resident_bytes);
  const double slot = static_cast<double>(model::ExpertTable::SlotBytesFor(c));
  const double K = static_cast<double>(c.num_experts_per_token);
  const double Lm = static_cast<double>(c.num_moe_layers());
  const double E = K * Lm * slot;
  uint64_t seed = 1;

  // Warm-up: every expert the runs may touch read once (a long prompt).
  e->Generate(Request(c.vocab_size, std::max(a.long_prompt, 256), 1, 999));

  for (int n : a.streams) {
    std::vector<double> serial_s, together_s, ratio, fshare, ceiling;
    // The requests of every run, made up front; a run's together side runs
    // on N threads kept for the whole case (as a server's workers are: a
    // fresh thread would also pay for its fresh OpenMP team and per-thread
    // scratch), started and stopped by a barrier with this thread.
    std::vector<std::vector<engine::GenerateRequest>> reqs(static_cast<size_t>(a.runs) + 1);
    for (auto& rs : reqs) {
      for (int i = 0; i < n; ++i) rs.push_back(Request(c.vocab_size, a.prompt, a.tokens, seed++));
    }
    std::barrier sync(n + 1);
    size_t current = 0;
    std::vector<std::thread> workers;
    for (int i = 0; i < n; ++i) {
      workers.emplace_back([&, i] {
        for (size_t r = 0; r < reqs.size(); ++r) {
          sync.arrive_and_wait();
          e->Generate(reqs[current][static_cast<size_t>(i)]);
          sync.arrive_and_wait();
        }
      });
    }
    auto serially = [&](size_t r) {
      const auto t0 = Clock::now();
      for (const auto& q : reqs[r]) e->Generate(q);
      return Since(t0);
    };
    model::ExpertStoreStats s0, s1;
    engine::Engine::StepStats k0, k1;
    auto together = [&](size_t r) {
      current = r;
      s0 = e->expert_stats();
      k0 = e->step_stats();
      const auto t0 = Clock::now();
      sync.arrive_and_wait();  // go
      sync.arrive_and_wait();  // all done
      const double sec = Since(t0);
      s1 = e->expert_stats();
      k1 = e->step_stats();
      return sec;
    };
    // Run 0 is untimed (both sides: warm threads); every run's requests are
    // first run once untimed, so both sides find the same experts cached
    // (with a cache smaller than a run's experts, both read them again);
    // then the two sides in alternating order.
    for (size_t r = 0; r < reqs.size(); ++r) {
      serially(r);
      double serial, tog;
      if (r % 2 == 0) {
        serial = serially(r);
        tog = together(r);
      } else {
        tog = together(r);
        serial = serially(r);
      }
      if (r == 0) continue;
      const double rows = static_cast<double>(k1.rows - k0.rows);
      const double f =
          rows > 0 ? static_cast<double>(s1.pass_experts - s0.pass_experts) / (rows * K * Lm) : 1;
      serial_s.push_back(serial);
      together_s.push_back(tog);
      ratio.push_back(serial / tog);
      fshare.push_back(f);
      ceiling.push_back(static_cast<double>(n) * (T + E) / (T + static_cast<double>(n) * f * E));
    }
    for (auto& w : workers) w.join();
    JsonWriter j;
    j.BeginObject()
        .Field("bench", "parallel")
        .Field("case", "throughput")
        .Field("git_sha", SourceRevision());
    j.Field("cpu", CpuModel()).Field("streams", int64_t(n)).Field("runs", int64_t(a.runs));
    j.Field("prompt", int64_t(a.prompt)).Field("tokens", int64_t(a.tokens));
    j.Field("step_tokens", a.step_tokens);
    j.Field("trunk_bytes", T).Field("expert_bytes_per_token", E);
    PutSummary(j, "serial_s", serial_s);
    PutSummary(j, "together_s", together_s);
    PutSummary(j, "speedup", ratio);
    PutSummary(j, "distinct_share", fshare);
    PutSummary(j, "ceiling", ceiling);
    std::vector<double> of(ratio.size());
    for (size_t i = 0; i < of.size(); ++i) of[i] = ratio[i] / ceiling[i];
    PutSummary(j, "of_ceiling", of);
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
    std::fflush(stdout);
  }

  if (a.long_prompt <= 0) return;
  // Latency: an interactive request alone, then beside a cold long prompt.
  std::vector<double> alone_gaps, mixed_gaps;
  double long_s = 0;
  for (int run = 0; run < a.runs; ++run) {
    const engine::GenerateRequest inter = Request(c.vocab_size, a.prompt, a.tokens * 4, seed++);
    auto gaps = [](const Timed& t, std::vector<double>& out) {
      for (size_t i = 1; i < t.at.size(); ++i) out.push_back(t.at[i] - t.at[i - 1]);
    };
    gaps(RunTimed(*e, inter, Clock::now()), alone_gaps);
    const engine::GenerateRequest big = Request(c.vocab_size, a.long_prompt, 1, seed++);
    const auto t0 = Clock::now();
    Timed mixed;
    std::thread talk([&] { mixed = RunTimed(*e, inter, t0); });
    // The long prompt arrives once the interactive one is decoding.
    while (Since(t0) < 5 && e->step_stats().running < 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto tl = Clock::now();
    e->Generate(big);
    long_s += Since(tl);
    talk.join();
    gaps(mixed, mixed_gaps);
  }
  JsonWriter j;
  j.BeginObject()
      .Field("bench", "parallel")
      .Field("case", "latency")
      .Field("git_sha", SourceRevision());
  j.Field("cpu", CpuModel())
      .Field("runs", int64_t(a.runs))
      .Field("long_prompt", int64_t(a.long_prompt));
  j.Field("step_tokens", a.step_tokens).Field("long_prompt_s", long_s / a.runs);
  j.Field("alone_p50_s", Percentile(alone_gaps, 0.5))
      .Field("alone_p99_s", Percentile(alone_gaps, 0.99));
  j.Field("alone_max_s", Percentile(alone_gaps, 1.0));
  j.Field("mixed_p50_s", Percentile(mixed_gaps, 0.5))
      .Field("mixed_p99_s", Percentile(mixed_gaps, 0.99));
  j.Field("mixed_max_s", Percentile(mixed_gaps, 1.0));
  j.Field("p99_ratio", Percentile(mixed_gaps, 0.99) / std::max(1e-9, Percentile(alone_gaps, 0.99)));
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
}

void SetupParallelBench(CLI::App& root) {
  auto args = std::make_shared<ParallelArgs>();
  CLI::App* cmd = root.add_subcommand(
      "parallel",
      "many requests at once (--parallel): throughput vs one after another, and the "
      "latency of a stream beside a long prompt");
  cmd->add_option("MODEL", args->model_dir, "model directory (e.g. a real-layer fixture)")
      ->required();
  cmd->add_option("--streams", args->streams, "concurrent requests per case (default 1 2 4 8)")
      ->delimiter(',');
  cmd->add_option("--prompt", args->prompt, "prompt ids per request (default 16)");
  cmd->add_option("--tokens", args->tokens, "tokens generated per request (default 32)");
  cmd->add_option("--runs", args->runs, "runs per case (default 3)");
  cmd->add_option("--step-tokens", args->step_tokens, "rows per step (default 512)");
  cmd->add_option("--long", args->long_prompt,
                  "the long prompt of the latency case, tokens (default 2048; 0: skip the case)");
  cmd->callback([args] { RunParallelBench(*args); });
}

K3_REGISTER_BENCH(SetupParallelBench);

}  // namespace
}  // namespace k3::bench
