// k3-bench io: cold-cache routed-expert read throughput of the streaming store
// (decode-like: 16 random experts x every MoE layer per token) against the
// drive's ceiling measured by fio in the same run, and decode s/token with a
// small expert budget against its floor (expert bytes per token / fio's
// random-read rate + resident bytes / memory bandwidth). docs/streaming.md.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/engine/engine.h"
#include "k3/model/config.h"
#include "k3/model/model.h"
#include "k3/stream/streaming_store.h"

namespace k3::bench {
namespace {

struct IoArgs {
  std::string model_dir;
  int tokens = 8;
  int reps = 5;
  int queue_depth = 8;
  int fio_runtime_s = 5;
  bool no_fio = false;
  double fio_gbps = 0;  // with --no-fio: the drive figure for the decode floor
  bool no_drop = false;
  bool no_decode = false;
  int decode_tokens = 6;
  int decode_rounds = 2;
  bool cold = true;  // the cold expert-read section (and fio)
  double decode_budget_gb = 1.0;
  uint64_t seed = 1;
  bool json = false;  // output is JSON lines either way; kept for the documented CLI
};

std::string ShellOut(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  return out;
}

// Empties the page cache so every rep reads from the drive (needs root; a
// warning otherwise, and the numbers then say so through "cold": false).
bool DropCaches() {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "3\n", 2) == 2;
  ::close(fd);
  return ok;
}

// fio's aggregate read bandwidth (bytes/s) from its JSON output.
double FioReadBps(const std::string& json) {
  const size_t k = json.find("\"bw_bytes\"");
  if (k == std::string::npos) throw Error(ErrorCode::kIo, "fio printed no bw_bytes: " + json.substr(0, 400));
  return std::strtod(json.c_str() + json.find(':', k) + 1, nullptr);
}

double RunFio(const std::string& name, const std::vector<std::string>& files, const std::string& rw,
              uint64_t bs, int qd, int runtime_s) {
  std::string list;
  for (const auto& f : files) {
    // fio separates file names with ':'; shard paths here have none.
    list += (list.empty() ? "" : ":") + f;
  }
  const std::string cmd = "fio --name=" + name + " --readonly --filename='" + list + "' --rw=" + rw +
                          " --bs=" + std::to_string(bs) + " --blockalign=4k --direct=1" +
                          " --ioengine=io_uring --iodepth=" + std::to_string(qd) +
                          " --file_service_type=random --norandommap --randrepeat=0" +
                          " --time_based --runtime=" + std::to_string(runtime_s) +
                          " --output-format=json 2>/dev/null";
  return FioReadBps(ShellOut(cmd));
}

// Read-sum bandwidth over a buffer larger than the caches, all cores.
double MemoryBandwidthBps() {
  const size_t n = (size_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n, 1);
  const int threads = std::max(1, NumOnlineCpus());
  std::vector<double> runs;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    const double t0 = NowSeconds();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        const size_t b = n * static_cast<size_t>(t) / static_cast<size_t>(threads);
        const size_t e = n * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
        uint64_t s = 0;
        for (size_t i = b; i < e; ++i) s += buf[i];
        sums[static_cast<size_t>(t)] = s;
      });
    }
    for (auto& t : ts) t.join();
    const double dt = NowSeconds() - t0;
    if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) != n) std::abort();
    runs.push_back(static_cast<double>(n * sizeof(uint64_t)) / dt);
  }
  return Median(runs);
}

struct Context {
  std::string git, cpu;
  std::string model;
};

JsonWriter Line(const Context& ctx, const char* what) {
  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "io").Field("what", what).Field("git", ctx.git).Field("cpu", ctx.cpu);
  j.Field("model", ctx.model);
  return j;
}

void Print(JsonWriter& j) {
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

struct ReadResult {
  double gbps = 0;
  double seconds = 0;
  uint64_t bytes = 0;
  uint64_t misses = 0;
  std::string backend;
  bool direct = false;
};

// One rep of the decode-like pattern through a fresh store (one slot per
// layer: almost every expert is a miss, as with flat routing).
ReadResult ReadPattern(const Snapshot& snap, const ModelConfig& c, stream::StreamOptions o,
                       int tokens, uint64_t seed) {
  o.budget_bytes = 0;
  o.log_projection = false;
  stream::StreamingExpertStore store(snap, c, o);
  std::mt19937_64 rng(seed);
  const int k = static_cast<int>(std::min<int64_t>(16, c.num_experts));
  std::vector<int32_t> ids(static_cast<size_t>(c.num_experts));
  std::iota(ids.begin(), ids.end(), 0);
  const double t0 = NowSeconds();
  for (int t = 0; t < tokens; ++t) {
    for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l) {
      std::shuffle(ids.begin(), ids.end(), rng);
      std::vector<int32_t> uni(ids.begin(), ids.begin() + k);
      std::sort(uni.begin(), uni.end(), [&](int32_t a, int32_t b) {
        return store.DiskOrder(l, a) < store.DiskOrder(l, b);
      });
      store.BeginLayer(l, uni);
      for (int32_t e : uni) {
        store.Acquire(l, e);
        store.Release(l, e);
      }
      store.EndLayer(l);
    }
  }
  ReadResult r;
  r.seconds = NowSeconds() - t0;
  r.bytes = store.stream_stats().total.bytes_read;
  r.misses = store.stream_stats().total.misses;
  r.gbps = static_cast<double>(r.bytes) / r.seconds / 1e9;
  r.backend = store.backend();
  r.direct = store.direct();
  return r;
}

void RunIo(const IoArgs& a) {
  Context ctx{SourceRevision(), CpuModel(), a.model_dir};
  Snapshot snap = Snapshot::OpenOrThrow(a.model_dir);
  const ModelConfig c = ModelConfig::ParseOrThrow(snap.config_json(), JoinPath(a.model_dir, "config.json"));
  const uint64_t slot = model::ExpertTable::SlotBytesFor(c);
  std::set<std::string> expert_files;
  {
    model::ExpertTable table(snap, c);
    for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l) {
      for (int64_t e = 0; e < c.num_experts; ++e) {
        if (table.present(l, e)) expert_files.insert(table.path(l, e));
      }
    }
  }
  if (expert_files.empty()) throw Error(ErrorCode::kNotFound, "model has no routed experts", a.model_dir);
  uint64_t expert_file_bytes = 0;
  for (const auto& f : expert_files) expert_file_bytes += FileSizeOrThrow(f);
  const bool can_drop = a.no_drop ? false : DropCaches();
  if (!a.no_drop && !can_drop) {
    K3_LOG_WARN("cannot drop the page cache (not root?): buffered numbers may be warm");
  }
  {
    JsonWriter j = Line(ctx, "setup");
    j.Field("expert_files", static_cast<uint64_t>(expert_files.size()));
    j.Field("expert_file_bytes", expert_file_bytes);
    j.Field("slot_bytes", slot);
    j.Field("moe_layers", c.num_moe_layers());
    j.Field("experts_per_layer", c.num_experts);
    j.Field("mem_total_available_bytes", MemAvailableBytes());
    j.Field("cold", can_drop);
    j.Field("queue_depth", static_cast<int64_t>(a.queue_depth));
    // Shared machines: the load says how much the CPU numbers can be trusted.
    std::string load;
    std::getline(std::ifstream("/proc/loadavg"), load);
    j.Field("loadavg", load);
    j.Field("online_cpus", static_cast<int64_t>(NumOnlineCpus()));
    Print(j);
  }

  double fio_rand = a.no_fio && a.fio_gbps > 0 ? a.fio_gbps * 1e9 : 0;
  if (a.cold) {
    // The drive's ceiling, same files, same run.
    const std::vector<std::string> files(expert_files.begin(), expert_files.end());
    const uint64_t bs17 = (slot + 4095) / 4096 * 4096;
    if (!a.no_fio) {
      const double seq = RunFio("seq4m", files, "read", 4ull << 20, a.queue_depth, a.fio_runtime_s);
      const double rnd = RunFio("rand17m", files, "randread", bs17, a.queue_depth, a.fio_runtime_s);
      const double rnd1 = RunFio("rand17m_qd1", files, "randread", bs17, 1, a.fio_runtime_s);
      fio_rand = rnd;
      JsonWriter j = Line(ctx, "fio");
      j.Field("seq_4m_gbps", seq / 1e9);
      j.Field("rand_17m_gbps", rnd / 1e9);
      j.Field("rand_17m_qd1_gbps", rnd1 / 1e9);
      j.Field("bs_rand", bs17);
      j.Field("iodepth", static_cast<int64_t>(a.queue_depth));
      j.Field("runtime_s", static_cast<int64_t>(a.fio_runtime_s));
      Print(j);
    }

    // Ours, each rep right after a fio random-read run on the same files, so a
    // drive shared with other work drifts equally for both sides of the ratio.
    struct Variant {
      const char* name;
      bool uring, direct, pipe;
      int reps;
      uint64_t chunk = 0;  // read pieces (K3_READ_CHUNK_MB); 0: whole experts
      int qd_scale = 1;    // pieces in flight = qd x this (same bytes in flight)
    };
    const Variant variants[] = {{"uring_direct", true, true, true, a.reps},
                                {"uring_direct_chunk4m_2xqd", true, true, true, a.reps, 4u << 20, 2},
                                {"pread_pool_direct", false, true, true, a.reps},
                                {"uring_buffered", true, false, true, std::max(1, a.reps / 2)}};
    std::vector<std::vector<double>> gbps(std::size(variants));
    std::vector<ReadResult> results(std::size(variants));
    std::vector<double> fio_reps;
    for (int rep = 0; rep < a.reps; ++rep) {
      if (!a.no_fio) {
        fio_reps.push_back(RunFio("rand17m", files, "randread", bs17, a.queue_depth,
                                  std::max(2, a.fio_runtime_s / 2)));
      }
      for (size_t vi = 0; vi < std::size(variants); ++vi) {
        const Variant& v = variants[vi];
        if (rep >= v.reps) continue;
        if (can_drop) DropCaches();
        stream::StreamOptions o;
        o.uring = v.uring;
        o.direct = v.direct;
        o.pipe = v.pipe;
        o.queue_depth = a.queue_depth * v.qd_scale;
        o.io_threads = a.queue_depth;
        o.read_chunk_bytes = v.chunk;
        results[vi] = ReadPattern(snap, c, o, a.tokens, a.seed + static_cast<uint64_t>(rep));
        gbps[vi].push_back(results[vi].gbps);
      }
    }
    if (!fio_reps.empty()) fio_rand = Median(fio_reps);
    if (a.no_fio && a.fio_gbps > 0) fio_rand = a.fio_gbps * 1e9;
    for (size_t vi = 0; vi < std::size(variants); ++vi) {
      const Variant& v = variants[vi];
      const std::vector<double>& g = gbps[vi];
      JsonWriter j = Line(ctx, "expert_read");
      j.Field("variant", v.name).Field("backend", results[vi].backend).Field("direct", results[vi].direct);
      j.Field("tokens", static_cast<int64_t>(a.tokens));
      j.Field("experts_per_token",
              static_cast<uint64_t>(results[vi].misses / static_cast<uint64_t>(a.tokens)));
      j.Field("bytes_per_rep", results[vi].bytes);
      j.Field("reps", static_cast<int64_t>(g.size()));
      j.Field("gbps_median", Median(g));
      j.Field("gbps_min", *std::min_element(g.begin(), g.end()));
      j.Field("gbps_max", *std::max_element(g.begin(), g.end()));
      if (fio_rand > 0) {
        j.Field("fio_rand_17m_gbps_median", fio_rand / 1e9);
        j.Field("ratio_vs_fio_rand_17m", Median(g) * 1e9 / fio_rand);
      }
      Print(j);
    }
  }

  if (a.no_decode) return;
  // Decode with a budget far below the experts' size, against its floor.
  const double mem_bw = MemoryBandwidthBps();
  const engine::EngineOptions env = engine::EngineOptions::FromEnv(a.model_dir);
  model::LoadOptions lo = env.load;
  lo.progress = false;
  auto m = model::Model::LoadOrThrow(a.model_dir, lo);
  // Pipe on (reads of expert j+1.. overlap expert j's compute) and off (each
  // block read before it is computed): the difference is the hidden I/O.
  // Interleaved rounds (off, on, chunked, off, on, chunked) with untimed warm-up steps that
  // fill the cache, so neither side gets the first-touch page faults of fresh
  // buffers or a drive/CPU phase of its own.
  struct DecodeAcc {
    std::vector<double> spt;
    uint64_t bytes = 0, hits = 0, misses = 0;
    double wait = 0, compute = 0;
    int64_t slots = 0;
    std::string backend;
    bool direct = false;
  };
  struct DecodeConfig {
    const char* name;
    bool pipe;
    uint64_t chunk;
    int qd_scale;
  };
  // The configurations the defaults choose between (K3_PIPE, K3_READ_CHUNK_MB,
  // K3_QD), then what the defaults chose on this machine.
  const DecodeConfig configs[] = {{"pipe_off", false, 0, 1},
                                  {"pipe_on", true, 0, 1},
                                  {"pipe_on_chunk4m_2xqd", true, 4u << 20, 2},
                                  {"pipe_off_chunk4m_2xqd", false, 4u << 20, 2},
                                  {"pipe_on_2xqd", true, 0, 2}};
  DecodeAcc acc[std::size(configs)];
  const model::RunOptions ro = env.run;
  constexpr int kWarmup = 3;
  for (int round = 0; round < a.decode_rounds; ++round) {
    for (size_t ci = 0; ci < std::size(configs); ++ci) {
      DecodeAcc& d = acc[ci];
      stream::StreamOptions so = env.stream;
      so.pipe = configs[ci].pipe;
      so.read_chunk_bytes = configs[ci].chunk;
      so.budget_bytes = a.decode_budget_gb * 1e9;
      so.queue_depth = a.queue_depth * configs[ci].qd_scale;
      so.log_projection = round == 0 && ci == 0;
      auto owner = std::make_unique<stream::StreamingExpertStore>(m->snapshot(), m->config(), so);
      stream::StreamingExpertStore& store = *owner;
      m->SetExpertStore(std::move(owner));
      model::Session s(*m, ro, kWarmup + a.decode_tokens + 1);
      std::vector<float> last(static_cast<size_t>(c.vocab_size));
      model::ForwardOutputs out;
      out.logits_last = last.data();
      int32_t id = 1;
      for (int w = 0; w < kWarmup; ++w) {
        s.Forward(std::span<const int32_t>(&id, 1), out);
        id = model::Sampler::Argmax(last);
      }
      const size_t first_step = store.stream_stats().steps.size();
      for (int i = 0; i < a.decode_tokens; ++i) {
        const double t0 = NowSeconds();
        s.Forward(std::span<const int32_t>(&id, 1), out);
        d.spt.push_back(NowSeconds() - t0);
        id = model::Sampler::Argmax(last);
      }
      const stream::StreamStats& st = store.stream_stats();
      for (size_t i = first_step; i < st.steps.size(); ++i) {
        d.bytes += st.steps[i].bytes_read;
        d.hits += st.steps[i].hits;
        d.misses += st.steps[i].misses;
        d.wait += st.steps[i].io_wait_s;
        d.compute += st.steps[i].compute_s;
      }
      d.slots = store.plan().slots_per_layer;
      d.backend = store.backend();
      d.direct = store.direct();
    }
  }
  const double resident = static_cast<double>(m->weights().resident_bytes);
  for (size_t ci = 0; ci < std::size(configs); ++ci) {
    const DecodeAcc& d = acc[ci];
    const bool pipe = configs[ci].pipe;
    const double n = static_cast<double>(d.spt.size());
    const double bytes_per_token = static_cast<double>(d.bytes) / n;
    const double floor_s = (fio_rand > 0 ? bytes_per_token / fio_rand : 0) + resident / mem_bw;
    JsonWriter j = Line(ctx, "decode");
    j.Field("config", configs[ci].name).Field("pipe", pipe);
    j.Field("read_chunk_bytes", configs[ci].chunk);
    j.Field("queue_depth", static_cast<int64_t>(a.queue_depth * configs[ci].qd_scale));
    j.Field("budget_gb", a.decode_budget_gb);
    j.Field("slots_per_layer", d.slots);
    j.Field("backend", d.backend).Field("direct", d.direct);
    j.Field("timed_tokens", static_cast<int64_t>(d.spt.size()));
    j.Field("warmup_tokens_per_round", static_cast<int64_t>(kWarmup));
    j.Field("s_per_token_median", Median(d.spt));
    j.Field("s_per_token_min", *std::min_element(d.spt.begin(), d.spt.end()));
    j.Field("s_per_token_max", *std::max_element(d.spt.begin(), d.spt.end()));
    // What EngineOptions::FromEnv gives here (the defaults unless K3_* are set).
    j.Field("default_pipe", env.stream.pipe)
        .Field("default_queue_depth", static_cast<int64_t>(env.stream.queue_depth))
        .Field("default_read_chunk_bytes", env.stream.read_chunk_bytes);
    j.Field("expert_bytes_per_token", bytes_per_token);
    j.Field("resident_bytes", static_cast<uint64_t>(resident));
    j.Field("mem_bw_gbps", mem_bw / 1e9);
    j.Field("hit_rate", static_cast<double>(d.hits) /
                            static_cast<double>(std::max<uint64_t>(1, d.hits + d.misses)));
    // Per timed token: time the MoE waited on reads (un-hidden I/O) and spent
    // computing experts; the rest is the resident layers.
    j.Field("io_wait_s_per_token", d.wait / n);
    j.Field("expert_compute_s_per_token", d.compute / n);
    j.Field("other_s_per_token", std::max(0.0, Median(d.spt) - (d.wait + d.compute) / n));
    if (fio_rand > 0) {
      j.Field("io_floor_s_per_token", bytes_per_token / fio_rand);
      j.Field("floor_s_per_token", floor_s);
      j.Field("ratio_vs_floor", Median(d.spt) / floor_s);
    }
    j.Field("idot", ro.idot);
    Print(j);
  }
}

void SetupIo(CLI::App& root) {
  auto a = std::make_shared<IoArgs>();
  CLI::App* cmd = root.add_subcommand(
      "io", "Cold-cache expert read throughput vs fio, and decode s/token vs its floor");
  cmd->add_option("MODEL", a->model_dir, "snapshot/container (e.g. a real-layer fixture)")->required();
  cmd->add_option("--tokens", a->tokens, "decode-like tokens per rep (16 experts x MoE layers each)");
  cmd->add_option("--reps", a->reps, "repetitions (median reported; default 5)");
  cmd->add_option("--qd", a->queue_depth, "reads in flight (ours and fio's; default 8)");
  cmd->add_option("--fio-runtime", a->fio_runtime_s, "seconds per fio job (default 5)");
  cmd->add_flag("--no-fio", a->no_fio, "skip the fio baseline");
  cmd->add_option("--fio-gbps", a->fio_gbps, "with --no-fio: a drive GB/s measured elsewhere");
  cmd->add_flag("--no-drop", a->no_drop, "do not drop the page cache between reps");
  cmd->add_flag("--no-decode", a->no_decode, "skip the decode measurement");
  cmd->add_option("--decode-tokens", a->decode_tokens, "timed decode steps (default 6)");
  cmd->add_option("--decode-rounds", a->decode_rounds,
                  "interleaved rounds over the decode configurations (default 2)");
  cmd->add_flag("!--no-cold", a->cold, "skip the cold expert-read section and fio (decode only)");
  cmd->add_option("--decode-budget-gb", a->decode_budget_gb, "K3_EXPERT_GB for decode (default 1)");
  cmd->add_option("--seed", a->seed, "routing pattern seed");
  cmd->add_flag("--json", a->json, "JSON lines (always on)");
  cmd->callback([a] { RunIo(*a); });
}

K3_REGISTER_BENCH(SetupIo);

}  // namespace
}  // namespace k3::bench
