// k3-bench agent: an agent session replayed from a recorded trace
// (bench/traces/*.json, written by bench/traces/record_claude_trace.py from
// the pinned Claude Code: a main conversation that spawns two sub-agents,
// which run beside it), on an engine with --parallel N against the same
// session on a --parallel 1 engine (the serialised server), in the same run.
//
// The trace keeps the pattern, not the text: per request its conversation,
// the request of that conversation it extends, the characters of its system
// prompt + tools (a preamble hash: equal hashes share the preamble's ids) and
// messages, and what had been answered before it was sent. Replayed with
// random ids of those lengths (characters / 4 x --scale tokens); a request
// that extends another is that request's prompt + its generated answer + the
// new messages' ids, so prefix reuse and checkpoints see what they would see.
// A request is sent once the requests it depends on are answered: the one it
// extends; a new conversation's spawner (the request answered last before it
// was sent); and the sub-agents that finished between the answer it extends
// and its sending (their results reach the main conversation). Every answer
// is --answer tokens, greedy, ignore_eos.
//
// Printed: session wall time, the main conversation's time to first token
// (its first request, the mean and the longest over its requests), the same
// for sub-agents, per mode (median and range over --runs, the two modes in
// alternating order), their ratios, and whether every request's ids were the
// same in both modes (they must be: docs/engine.md "Steps").
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/engine/engine.h"

namespace k3::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct AgentArgs {
  std::string model_dir;
  std::string trace;
  int parallel = 4;
  double scale = 0.1;
  int answer = 32;
  int runs = 2;
  int64_t step_tokens = 512;
};

struct TraceRequest {
  int n = 0;
  std::string role;
  int conversation = 0;
  int extends = -1;
  std::string preamble;
  int64_t preamble_chars = 0;
  int64_t messages_chars = 0;
  double arrive_s = 0, answered_s = 0;
  std::vector<int> answered_before;
  std::vector<int> deps;  // computed
};

std::vector<TraceRequest> ReadTrace(const std::string& path) {
  simdjson::ondemand::parser parser;
  const simdjson::padded_string text =
      simdjson::padded_string(ReadFileOrThrow(path, uint64_t{64} << 20));
  std::vector<TraceRequest> out;
  try {
    simdjson::ondemand::document doc = parser.iterate(text);
    for (simdjson::ondemand::object r : doc["requests"].get_array()) {
      TraceRequest t;
      t.n = static_cast<int>(int64_t(r["n"]));
      t.arrive_s = double(r["arrive_s"]);
      t.role = std::string(std::string_view(r["role"]));
      t.conversation = static_cast<int>(int64_t(r["conversation"]));
      for (int64_t b : r["answered_before"].get_array()) t.answered_before.push_back(int(b));
      simdjson::ondemand::value ext = r["extends"];
      t.extends = ext.is_null() ? -1 : static_cast<int>(int64_t(ext));
      t.preamble_chars = int64_t(r["system_chars"]) + int64_t(r["tools_chars"]);
      t.preamble = std::string(std::string_view(r["preamble"]));
      t.messages_chars = int64_t(r["messages_chars"]);
      t.answered_s = double(r["answered_s"]);
      out.push_back(std::move(t));
    }
  } catch (const simdjson::simdjson_error& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("trace: ") + e.what(), path);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].n != static_cast<int>(i) || out[i].extends >= static_cast<int>(i)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "trace: request " + std::to_string(i) + " is out of order", path);
    }
  }
  // Dependencies (see the top of the file).
  std::map<int, int> last_of;  // conversation -> its last request
  for (const TraceRequest& t : out) last_of[t.conversation] = t.n;
  for (TraceRequest& t : out) {
    if (t.extends >= 0) {
      t.deps.push_back(t.extends);
      const double since = out[static_cast<size_t>(t.extends)].answered_s;
      for (int b : t.answered_before) {
        const TraceRequest& x = out[static_cast<size_t>(b)];
        if (x.conversation != t.conversation && last_of[x.conversation] == x.n &&
            x.answered_s > since) {
          t.deps.push_back(b);
        }
      }
    } else if (!t.answered_before.empty()) {
      int spawner = t.answered_before.front();
      for (int b : t.answered_before) {
        if (out[static_cast<size_t>(b)].answered_s > out[static_cast<size_t>(spawner)].answered_s)
          spawner = b;
      }
      t.deps.push_back(spawner);
    }
  }
  return out;
}

double Secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Outcome {
  double wall_s = 0;
  double main_first_ttft_s = 0, main_mean_ttft_s = 0, main_max_ttft_s = 0;
  double sub_mean_ttft_s = 0, sub_max_ttft_s = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  std::vector<std::vector<int32_t>> ids;  // per request
};

// Replays the trace on `e`: one thread per request, each waiting for its deps.
Outcome Replay(engine::Engine& e, const std::vector<TraceRequest>& trace, const AgentArgs& a) {
  const int64_t vocab = e.config().vocab_size;
  auto ids_for = [&](const std::string& key, int64_t n) {
    std::mt19937_64 rng(std::hash<std::string>{}(key));
    std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
    std::vector<int32_t> v(static_cast<size_t>(std::max<int64_t>(n, 1)));
    for (auto& id : v) id = d(rng);
    return v;
  };
  auto tokens = [&](int64_t chars) {
    return static_cast<int64_t>(static_cast<double>(chars) / 4.0 * a.scale);
  };
  const size_t n = trace.size();
  std::vector<std::vector<int32_t>> prompt(n);
  std::vector<engine::GenerateResult> res(n);
  std::vector<bool> done(n, false);
  std::vector<double> ttft(n, 0);
  std::mutex mu;
  std::condition_variable cv;
  const auto t0 = Clock::now();
  Clock::time_point t_end = t0;
  const bool serial = e.step_stats().parallel == 1;
  uint64_t next_ticket = 0, serving = 0;
  auto run_one = [&](size_t i) {
    const TraceRequest& t = trace[i];
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] {
        return std::all_of(t.deps.begin(), t.deps.end(),
                           [&](int d) { return done[static_cast<size_t>(d)]; });
      });
      if (t.extends >= 0) {
        const size_t x = static_cast<size_t>(t.extends);
        prompt[i] = prompt[x];
        prompt[i].insert(prompt[i].end(), res[x].ids.begin(), res[x].ids.end());
        const std::vector<int32_t> add =
            ids_for("turn " + std::to_string(i),
                    std::max<int64_t>(8, tokens(t.messages_chars - trace[x].messages_chars)));
        prompt[i].insert(prompt[i].end(), add.begin(), add.end());
      } else {
        prompt[i] = ids_for("preamble " + t.preamble, tokens(t.preamble_chars));
        const std::vector<int32_t> first =
            ids_for("conversation " + std::to_string(t.conversation), tokens(t.messages_chars));
        prompt[i].insert(prompt[i].end(), first.begin(), first.end());
      }
    }
    // The serialised server: one request at a time, in arrival order (its
    // queue); a --parallel 1 engine must not be called from two threads.
    uint64_t ticket = 0;
    if (serial) {
      std::unique_lock lock(mu);
      ticket = next_ticket++;
    }
    engine::GenerateRequest r;
    r.prompt_ids = prompt[i];
    r.max_tokens = a.answer;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    const auto sent = Clock::now();
    bool first = true;
    engine::Callbacks cb;
    cb.on_delta = [&](const engine::Delta&) {
      if (first) ttft[i] = Secs(sent, Clock::now());
      first = false;
      return true;
    };
    if (serial) {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return serving == ticket; });
    }
    engine::GenerateResult out = e.Generate(r, cb);
    std::lock_guard lock(mu);
    res[i] = std::move(out);
    done[i] = true;
    if (serial) ++serving;
    t_end = std::max(t_end, Clock::now());
    cv.notify_all();
  };
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) threads.emplace_back(run_one, i);
  for (auto& th : threads) th.join();
  Outcome o;
  o.wall_s = Secs(t0, t_end);
  int mains = 0, subs = 0;
  bool first_main = true;
  for (size_t i = 0; i < n; ++i) {
    o.prompt_tokens += res[i].usage.prompt_tokens;
    o.cached_tokens += res[i].usage.cached_tokens;
    o.ids.push_back(res[i].ids);
    if (trace[i].role == "main") {
      if (first_main) o.main_first_ttft_s = ttft[i];
      first_main = false;
      o.main_mean_ttft_s += ttft[i];
      o.main_max_ttft_s = std::max(o.main_max_ttft_s, ttft[i]);
      ++mains;
    } else {
      o.sub_mean_ttft_s += ttft[i];
      o.sub_max_ttft_s = std::max(o.sub_max_ttft_s, ttft[i]);
      ++subs;
    }
  }
  o.main_mean_ttft_s /= std::max(1, mains);
  o.sub_mean_ttft_s /= std::max(1, subs);
  return o;
}

void PutStat(JsonWriter& j, const char* name, const std::vector<double>& v) {
  j.Key(name).BeginObject();
  j.Field("median", Median(v))
      .Field("min", *std::min_element(v.begin(), v.end()))
      .Field("max", *std::max_element(v.begin(), v.end()));
  j.EndObject();
}

void RunAgentBench(const AgentArgs& a) {
  if (a.parallel < 2) throw Error(ErrorCode::kInvalidArgument, "--parallel must be >= 2");
  if (!(a.scale > 0) || a.answer < 1 || a.runs < 1) {
    throw Error(ErrorCode::kInvalidArgument, "--scale > 0, --answer >= 1 and --runs >= 1");
  }
  const std::vector<TraceRequest> trace = ReadTrace(a.trace);
  struct Mode {
    const char* name;
    int parallel;
    std::vector<Outcome> runs;
  };
  Mode modes[2] = {{"serialised", 1, {}}, {"parallel", a.parallel, {}}};
  for (int run = 0; run < a.runs; ++run) {
    for (int k = 0; k < 2; ++k) {
      Mode& m = modes[(run + k) % 2];
      engine::EngineOptions eo = engine::EngineOptions::FromEnv(a.model_dir);
      eo.progress = false;
      // As k3-run serve: checkpoints sized from free memory (the serialised
      // server resumes a conversation from them after another one ran).
      eo.checkpoints.ram_slots = -1;
      eo.parallel = m.parallel;
      eo.step_tokens = a.step_tokens;
      auto e = engine::Engine::LoadOrThrow(eo);
      {  // Untimed: the experts warm, nothing of the trace's prompts cached.
        engine::GenerateRequest w;
        std::mt19937_64 rng(12345);
        std::uniform_int_distribution<int32_t> d(0,
                                                 static_cast<int32_t>(e->config().vocab_size - 1));
        for (int i = 0; i < 1024; ++i) w.prompt_ids.push_back(d(rng));
        w.max_tokens = 1;
        e->Generate(w);
      }
      m.runs.push_back(Replay(*e, trace, a));
      std::fprintf(stderr, "agent: run %d %s: wall %.1f s, main first ttft %.2f s\n", run, m.name,
                   m.runs.back().wall_s, m.runs.back().main_first_ttft_s);
    }
  }
  bool identical = true;
  for (const Mode& m : modes) {
    for (const Outcome& o : m.runs) identical = identical && o.ids == modes[0].runs[0].ids;
  }
  JsonWriter j;
  j.BeginObject()
      .Field("bench", "agent")
      .Field("git_sha", SourceRevision())
      .Field("cpu", CpuModel())
      .Field("trace", a.trace)
      .Field("requests", int64_t(trace.size()))
      .Field("scale", a.scale)
      .Field("answer", int64_t(a.answer))
      .Field("runs", int64_t(a.runs))
      .Field("step_tokens", a.step_tokens)
      .Field("parallel", int64_t(a.parallel))
      .Field("prompt_tokens", modes[0].runs[0].prompt_tokens);
  auto series = [](const Mode& m, double Outcome::*f) {
    std::vector<double> v;
    for (const Outcome& o : m.runs) v.push_back(o.*f);
    return v;
  };
  for (const Mode& m : modes) {
    j.Key(m.name).BeginObject();
    PutStat(j, "wall_s", series(m, &Outcome::wall_s));
    PutStat(j, "main_first_ttft_s", series(m, &Outcome::main_first_ttft_s));
    PutStat(j, "main_mean_ttft_s", series(m, &Outcome::main_mean_ttft_s));
    PutStat(j, "main_max_ttft_s", series(m, &Outcome::main_max_ttft_s));
    PutStat(j, "sub_mean_ttft_s", series(m, &Outcome::sub_mean_ttft_s));
    PutStat(j, "sub_max_ttft_s", series(m, &Outcome::sub_max_ttft_s));
    j.Field("cached_tokens", m.runs[0].cached_tokens);
    j.EndObject();
  }
  auto ratio = [&](double Outcome::*f) {
    return Median(series(modes[0], f)) / std::max(1e-9, Median(series(modes[1], f)));
  };
  j.Field("wall_speedup", ratio(&Outcome::wall_s))
      .Field("main_mean_ttft_ratio", ratio(&Outcome::main_mean_ttft_s))
      .Field("main_max_ttft_ratio", ratio(&Outcome::main_max_ttft_s))
      .Field("identical_ids", identical);
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
  if (!identical) throw Error(ErrorCode::kInternal, "a request's ids differed between the modes");
}

void SetupAgentBench(CLI::App& root) {
  auto args = std::make_shared<AgentArgs>();
  CLI::App* cmd = root.add_subcommand(
      "agent",
      "an agent session (main conversation + sub-agents) replayed from a recorded trace: "
      "--parallel N against the serialised server");
  cmd->add_option("MODEL", args->model_dir, "model directory (e.g. a real-layer fixture)")
      ->required();
  cmd->add_option("--trace", args->trace,
                  "recorded trace (bench/traces/claude-code-subagents.json)")
      ->required();
  cmd->add_option("--parallel", args->parallel, "sequences of the parallel side (default 4)");
  cmd->add_option("--scale", args->scale,
                  "prompt tokens = recorded characters / 4 x this (default 0.1)");
  cmd->add_option("--answer", args->answer, "tokens generated per request (default 32)");
  cmd->add_option("--runs", args->runs, "runs per mode, alternating (default 2)");
  cmd->add_option("--step-tokens", args->step_tokens, "rows per step (default 512)");
  cmd->callback([args] { RunAgentBench(*args); });
}

K3_REGISTER_BENCH(SetupAgentBench);

}  // namespace
}  // namespace k3::bench
