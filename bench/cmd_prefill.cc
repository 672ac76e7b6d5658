// k3-bench prefill (docs/PERFORMANCE.md, "Prefill"): cold-cache prefill of long prompts against
// the two floors measured in the same run -- the I/O floor (one pass over the
// distinct experts the prompt routes to / the best O_DIRECT rate of several
// passes, one stream and the store's queue depth of streams, read by this
// bench from the model's own shards) and the compute floor (the prompt's multiply-adds / the IDOT roof,
// quant::RoofLoop on every thread; a second floor adds MLA attention's T^2
// multiply-adds at the FMA roof) -- alternating with chunks of 32 tokens
// (K3_CHUNK=32) in the same run. That baseline at long prompts would run for
// hours, so it is measured on a prefix (--baseline-prefix tokens; its cost per
// chunk is flat) and extrapolated linearly to the prompt; the line says so.
// The roofs are the best of several passes (before the first prefill and after
// every one): a pass that meets a busy host reads low, and a low roof would
// flatter every ratio. Beside the floors, a bound estimate: the same
// multiply-adds at the ceilings of the IDOT tile's instruction mix measured on
// one core (bench/cmd_mix.cc) scaled by the all-thread roof, per weight format,
// plus attention at the FMA roof (bound_per_token says what it assumes).
#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"
#include "k3/engine/engine.h"
#include "k3/model/config.h"
#include "k3/model/model.h"
#include "k3/model/weights.h"
#include "k3/quant/isa.h"
#include "k3/quant/roof.h"

namespace k3::bench {
namespace {

struct PrefillArgs {
  std::string model_dir;
  std::vector<int> lengths = {512, 2048, 8192};
  int runs = 1;
  int chunk = 0;              // the measured setting: 0 = automatic windows (the budget's choice)
  int baseline_chunk = 32;    // K3_CHUNK of the baseline
  int baseline_prefix = 512;  // tokens the baseline is timed on (0: the whole prompt)
  double disk_gb = 2;         // GB of each O_DIRECT disk pass
  int disk_passes = 3;        // passes of each kind (sequential, parallel)
  int threads = 0;            // 0: every CPU
  bool no_drop = false;
  bool no_baseline = false;
  bool no_settle = false;
};

// Empties the page cache (needs root; false otherwise, reported as cold=false).
bool DropPageCache() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "3\n", 2) == 2;
  ::close(fd);
  return ok;
}

// The process's peak RSS since the last ResetPeakRss (VmHWM), bytes.
uint64_t PeakRssBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}
void ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

// The model directory's files, largest first.
std::vector<std::pair<uint64_t, std::string>> LargestFiles(const std::string& dir) {
  std::vector<std::pair<uint64_t, std::string>> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file()) files.emplace_back(e.file_size(), e.path().string());
  }
  std::sort(files.rbegin(), files.rend());
  return files;
}

// One O_DIRECT pass over the largest files, up to `limit` bytes, in `block`
// byte preads from `streams` threads at once (piece k of the pass to thread
// k mod streams, so with several streams the drive sees that many reads in
// flight, as the expert store's io_uring queue keeps it): GB/s.
double DiskPassGbps(const std::vector<std::pair<uint64_t, std::string>>& files, uint64_t limit,
                    int streams, size_t block) {
  struct Piece {
    const std::string* path;
    uint64_t off;
  };
  std::vector<Piece> pieces;
  uint64_t planned = 0;
  for (const auto& [size, path] : files) {
    for (uint64_t off = 0; off + block <= size && planned < limit; off += block) {
      pieces.push_back({&path, off});
      planned += block;
    }
    if (planned >= limit) break;
  }
  if (pieces.empty()) throw Error(ErrorCode::kIo, "nothing to read for the disk rate");
  std::vector<uint64_t> done(static_cast<size_t>(streams), 0);
  std::vector<std::string> failed(static_cast<size_t>(streams));
  const double t0 = NowSeconds();
  std::vector<std::thread> pool;
  for (int s = 0; s < streams; ++s) {
    pool.emplace_back([&, s] {
      void* buf = nullptr;
      if (posix_memalign(&buf, 4096, block) != 0) {
        failed[static_cast<size_t>(s)] = "posix_memalign";
        return;
      }
      std::unique_ptr<void, decltype(&std::free)> owner(buf, &std::free);
      const std::string* open_path = nullptr;
      int fd = -1;
      for (size_t k = static_cast<size_t>(s); k < pieces.size(); k += static_cast<size_t>(streams)) {
        if (pieces[k].path != open_path) {
          if (fd >= 0) ::close(fd);
          open_path = pieces[k].path;
          fd = ::open(open_path->c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
          if (fd < 0) {
            failed[static_cast<size_t>(s)] = "open O_DIRECT " + *open_path + ": " + strerror(errno);
            return;
          }
        }
        ssize_t n;
        do {
          n = ::pread(fd, buf, block, static_cast<off_t>(pieces[k].off));
        } while (n < 0 && errno == EINTR);
        if (n <= 0) break;
        done[static_cast<size_t>(s)] += static_cast<uint64_t>(n);
      }
      if (fd >= 0) ::close(fd);
    });
  }
  for (auto& t : pool) t.join();
  const double secs = NowSeconds() - t0;
  for (const std::string& f : failed) {
    if (!f.empty()) throw Error(ErrorCode::kIo, f);
  }
  const uint64_t total = std::accumulate(done.begin(), done.end(), uint64_t{0});
  if (total == 0) throw Error(ErrorCode::kIo, "nothing read for the disk rate");
  return static_cast<double>(total) / secs / 1e9;
}

// The disk rates the I/O floor divides by: several passes of one sequential
// 8 MiB stream and of `streams` parallel 4 MiB streams (the store's queue
// depth), O_DIRECT (no page cache between passes). The floor takes the best
// pass of either kind: a pass that meets a busy host reads low, and a low
// rate would flatter every ratio, as a low roof would.
struct DiskRates {
  std::vector<double> sequential, parallel;
  int streams = 1;
  double Best() const {
    double b = 0;
    for (double v : sequential) b = std::max(b, v);
    for (double v : parallel) b = std::max(b, v);
    return b;
  }
};
DiskRates MeasureDisk(const std::string& dir, uint64_t limit, int passes, int streams) {
  const auto files = LargestFiles(dir);
  DiskRates d;
  d.streams = streams;
  for (int i = 0; i < passes; ++i) {
    d.sequential.push_back(DiskPassGbps(files, limit, 1, size_t{8} << 20));
    d.parallel.push_back(DiskPassGbps(files, limit, streams, size_t{4} << 20));
  }
  return d;
}

// All-thread roof of `op` (wall-clock GMAC/s), each thread ~0.3 s of CPU.
double RoofGmacs(quant::RoofOp op, int threads) {
  uint64_t macs = 0;
  const double t0 = NowSeconds();
#pragma omp parallel num_threads(threads) reduction(+ : macs)
  {
    const double c0 = ThreadCpuSeconds();
    do {
      macs += quant::RoofLoop(op, 1 << 13);
    } while (ThreadCpuSeconds() - c0 < 0.3);
  }
  return static_cast<double>(macs) / (NowSeconds() - t0) / 1e9;
}

// Every roof pass of the run; the floors divide by the best one.
struct Roofs {
  int threads = 1;
  std::vector<double> idot, fma;
  void Measure(int passes) {
    for (int i = 0; i < passes; ++i) {
      idot.push_back(RoofGmacs(quant::RoofOp::kIdot, threads));
      fma.push_back(RoofGmacs(quant::RoofOp::kFma, threads));
    }
  }
  double Idot() const { return *std::max_element(idot.begin(), idot.end()); }
  double Fma() const { return *std::max_element(fma.begin(), fma.end()); }
};

// Multiply-adds of the quantized matmuls per prompt token, spec shapes
// (../shared/spec/k3-reference.md §2): KDA q/k/v/g/o, MLA q_a/q_b/kv_a/o/g,
// MoE routed (K experts x gate, up, down), latent down/up, shared experts,
// router; dense MLP. Attention's O(T^2) part and the KDA scan are not in it.
double MacsPerToken(const ModelConfig& c) {
  const double d = double(c.hidden_size);
  const double kda = 5.0 * double(c.kda_proj()) * d;
  const double heads = double(c.num_attention_heads);
  const double mla =
      double(c.q_lora_rank) * d + heads * double(c.qk_head_dim()) * double(c.q_lora_rank) +
      double(c.kv_lora_rank + c.qk_rope_head_dim) * d + 2.0 * heads * double(c.v_head_dim) * d;
  const double lt = double(c.routed_expert_hidden_size), mi = double(c.moe_intermediate_size);
  const double moe = double(c.num_experts_per_token) * 3.0 * lt * mi + 2.0 * lt * d +
                     3.0 * double(c.shared_intermediate()) * d + double(c.num_experts) * d;
  const double dense = 3.0 * double(c.intermediate_size) * d;
  const int64_t layers = c.num_hidden_layers, mla_layers = c.num_mla_layers();
  const int64_t moe_layers = c.num_moe_layers();
  return double(layers - mla_layers) * kda + double(mla_layers) * mla + double(moe_layers) * moe +
         double(layers - moe_layers) * dense;
}

// MacsPerToken's multiply-adds by the path the loaded model runs them on: the
// IDOT tile with int4-g64, MXFP4 (the routed experts) or int8 weights, and the
// f32 path (f32 weights such as the router; every matrix when K3_IDOT=0).
struct FormatMacs {
  double int4 = 0, mxfp4 = 0, int8 = 0, f32 = 0;
};
FormatMacs MacsByFormat(const model::Model& m, bool idot) {
  const ModelConfig& c = m.config();
  FormatMacs f;
  auto add = [&](const model::Matrix& w) {
    if (w.empty()) return;
    const double macs = double(w.rows()) * double(w.cols());
    const quant::WeightFormat fmt = w.format();
    if (!idot || fmt == quant::WeightFormat::kF32 || w.cols() % 32 != 0) {
      f.f32 += macs;
    } else if (fmt == quant::WeightFormat::kInt8) {
      f.int8 += macs;
    } else if (fmt == quant::WeightFormat::kMxfp4) {
      f.mxfp4 += macs;
    } else {
      f.int4 += macs;
    }
  };
  for (const model::LayerWeights& l : m.weights().layers) {
    if (l.is_kda) {
      for (const model::Matrix* w : {&l.kda.q, &l.kda.k, &l.kda.v, &l.kda.g, &l.kda.o}) add(*w);
    } else {
      for (const model::Matrix* w : {&l.mla.q_a, &l.mla.q_b, &l.mla.kv_a, &l.mla.o, &l.mla.g}) add(*w);
    }
    if (l.is_moe) {
      // Routed experts: MXFP4 as released, K of them per token.
      const double routed = double(c.num_experts_per_token) * 3.0 *
                            double(c.routed_expert_hidden_size) * double(c.moe_intermediate_size);
      (idot ? f.mxfp4 : f.f32) += routed;
      for (const model::Matrix* w : {&l.moe.latent_down, &l.moe.latent_up, &l.moe.shared.gate,
                                     &l.moe.shared.up, &l.moe.shared.down, &l.moe.router}) {
        add(*w);
      }
    } else {
      for (const model::Matrix* w : {&l.dense.gate, &l.dense.up, &l.dense.down}) add(*w);
    }
  }
  return f;
}

// Multiply-adds of MLA attention's O(T^2) part over a T-token prompt (the
// absorbed form the engine runs, docs/model.md): per MLA layer, head and
// (query, visible row) pair, the latent and rope score (kv_lora + rope) and the
// weighted latent sum (kv_lora). They run on the f32 path, so the floor that
// counts them divides them by the FMA roof.
double AttnMacs(const ModelConfig& c, int64_t T) {
  const double pairs = double(T) * double(T + 1) / 2.0;
  const double per_pair = double(c.num_attention_heads) *
                          double(2 * c.kv_lora_rank + c.qk_rope_head_dim);
  return double(c.num_mla_layers()) * per_pair * pairs;
}

struct Run {
  double prefill_s = 0;
  double expert_wait_s = 0;  // the compute thread blocked on expert reads
  uint64_t bytes = 0, loads = 0;
  uint64_t distinct = 0, slot_bytes = 0;  // experts the prompt routed to, bytes of each
  uint64_t peak_rss = 0;
  int64_t window = 0, windows = 0;  // the largest window and how many the prefill took
  double budget_bytes = 0;          // the window budget the engine sized
  model::PhaseTimes phases;         // the forward pass by part
};

// One cold prefill of `prompt` (one generated token) on a fresh engine.
Run Prefill(const PrefillArgs& a, int chunk, const std::vector<int32_t>& prompt, bool drop) {
  // The engines before this one freed their buffers, but glibc keeps most of
  // them (7 GB after a 6 GB expert cache): MemAvailable, and with it the
  // window budget this engine sizes at load, would read about half of what a
  // fresh process sees (an 8192-token prompt then took two windows).
  ::malloc_trim(0);
  engine::EngineOptions eo = engine::EngineOptions::FromEnv(a.model_dir);
  eo.progress = false;
  eo.threads = a.threads;
  eo.run.chunk = chunk;
  auto e = engine::Engine::LoadOrThrow(eo);
  if (!a.no_settle) {
    // The expert cache's buffers first touched (K3_PREFAULT), as they are by
    // a server's first request; on a VM whose fresh pages fault in far below
    // memory speed, a prefill that races the prefault thread measures that
    // instead (docs/PERFORMANCE-history.md, twelfth prefill session). Bounded: a
    // store that cannot finish is timed as is.
    const double t0 = NowSeconds();
    while (!e->streaming().prefault_done() && NowSeconds() - t0 < 600) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (drop) DropPageCache();
  ResetPeakRss();
  engine::GenerateRequest req;
  req.prompt_ids = prompt;
  req.max_tokens = 1;
  req.sampling.temperature = 0;
  const engine::GenerateResult g = e->Generate(req);
  Run r;
  r.prefill_s = g.timings.prefill_s;
  r.bytes = g.experts.bytes_read;
  r.loads = g.experts.misses;
  r.distinct = g.experts.distinct_routed;
  r.slot_bytes = e->model().experts().table().slot_bytes();
  r.expert_wait_s = g.experts.blocked_seconds;
  r.peak_rss = PeakRssBytes();
  r.window = g.timings.prefill_window;
  r.windows = g.timings.prefill_windows;
  r.budget_bytes = e->options().run.prefill_budget_bytes;
  r.phases = g.timings.prefill_phases;
  return r;
}

void RunPrefillBench(const PrefillArgs& a) {
  if (a.runs < 1 || a.lengths.empty() || a.chunk < 0 || a.baseline_chunk < 1) {
    throw Error(ErrorCode::kInvalidArgument, "need --runs >= 1, --lengths, --chunk >= 0, --baseline-chunk >= 1");
  }
  const int threads = a.threads > 0 ? a.threads : NumOnlineCpus();
  const std::string git = SourceRevision(), cpu = CpuModel();
  // The config and the tokenizer's ordinary ids, from one load (not timed).
  ModelConfig config;
  uint32_t ordinary = 0;
  FormatMacs by_format;
  int streams = 8;
  {
    engine::EngineOptions eo = engine::EngineOptions::FromEnv(a.model_dir);
    eo.progress = false;
    streams = eo.stream.queue_depth;
    auto e = engine::Engine::LoadOrThrow(eo);
    config = e->config();
    ordinary =
        e->tokenizer() ? e->tokenizer()->num_ranks() : static_cast<uint32_t>(config.vocab_size);
    by_format = MacsByFormat(e->model(), eo.run.idot);
  }
  const bool cold = a.no_drop ? false : DropPageCache();
  const DiskRates disk =
      MeasureDisk(a.model_dir, static_cast<uint64_t>(a.disk_gb * 1e9), a.disk_passes, streams);
  const double disk_gbps = disk.Best();
  Roofs roofs;
  roofs.threads = threads;
  roofs.Measure(3);
  const MixCeiling mix = MeasureMixCeiling(0.2, 5);
  const double macs_tok = MacsPerToken(config);
  // The bound estimate, seconds per prompt token: the floor's multiply-adds at
  // the ceilings `k3-bench mix` measures for the IDOT tile's instruction mix and
  // the f32 ones at the FMA roof; the roofs are read when a line is written, so
  // every pass so far counts. An estimate, not a proof: the ceilings come from
  // one thread's register-only loops of the mix (AVX-512: vpdpbusd with each
  // 512-column block's float work, cvt + fma for int8, one more multiply for
  // int4-g64's two-float factor; AVX2: maddubs + madd with each 256-column
  // set's, the nibble formats' integer part cheaper than the roof's), scaled by
  // the all-thread roof; it assumes this tile's numerics (one float step per 8
  // or 16 group sums) and ignores loads, so another instruction mix or a better
  // overlap could run below it. On AVX-512 MXFP4 experts are held to the int8
  // ceiling (their power-of-two weight scale could be applied by an integer
  // add; on Zen 5 that add was no faster than the multiply,
  // docs/PERFORMANCE-history.md, sixteenth prefill session); the AVX2 tile
  // runs them as nibbles.
  auto bound_per_token = [&] {
    const double idot = roofs.Idot() * 1e9, fma = roofs.Fma() * 1e9;
    return by_format.int4 / (idot * mix.nibble) + by_format.mxfp4 / (idot * mix.mxfp4) +
           by_format.int8 / (idot * mix.int8) + by_format.f32 / fma;
  };
  // The facts every line ends with, then the line.
  auto Finish = [&](JsonWriter& j) {
    j.Field("threads", int64_t(threads))
        .Field("cold", cold)
        .Field("git", git)
        .Field("cpu", cpu)
        .EndObject();
    std::printf("%s\n", j.str().c_str());
    std::fflush(stdout);
  };
  {
    JsonWriter j;
    j.BeginObject()
        .Field("bench", "prefill")
        .Field("what", "floors")
        .Field("disk_read_gbps", disk_gbps)
        .Field("disk_passes", int64_t(a.disk_passes))
        .Field("disk_pass_gb", a.disk_gb)
        .Field("disk_streams", int64_t(disk.streams));
    PutSummary(j, "disk_sequential_gbps", disk.sequential);
    PutSummary(j, "disk_parallel_gbps", disk.parallel);
    j.Field("idot_roof_gmacs", roofs.Idot())
        .Field("fma_roof_gmacs", roofs.Fma())
        .Field("roof_passes", int64_t(roofs.idot.size()))
        .Field("idot_roof_min_gmacs", *std::min_element(roofs.idot.begin(), roofs.idot.end()))
        .Field("macs_per_token", macs_tok)
        .Field("macs_per_token_int4", by_format.int4)
        .Field("macs_per_token_mxfp4", by_format.mxfp4)
        .Field("macs_per_token_int8", by_format.int8)
        .Field("macs_per_token_f32", by_format.f32)
        .Field("mix_measured", mix.measured)
        .Field("mix_ceiling_nibble", mix.nibble)
        .Field("mix_ceiling_int8", mix.int8)
        .Field("mix_ceiling_mxfp4", mix.mxfp4)
        .Field("mix_isa", mix.isa)
        .Field("isa", quant::IsaName(quant::ActiveIsa()));
    Finish(j);
  }
  for (int len : a.lengths) {
    std::vector<int32_t> prompt;
    uint32_t state = 12345;
    while (static_cast<int>(prompt.size()) < len) {
      state = state * 1103515245u + 12345u;
      prompt.push_back(static_cast<int32_t>((state >> 8) % ordinary));
    }
    const int prefix = a.baseline_prefix > 0 ? std::min(a.baseline_prefix, len) : len;
    const std::vector<int32_t> head(prompt.begin(), prompt.begin() + prefix);
    const double scale = double(len) / double(prefix);
    std::vector<double> secs, waits, base_secs, speedup;
    std::vector<uint64_t> bytes;
    const double attn_macs = AttnMacs(config, len);
    std::vector<model::PhaseTimes> phases;
    Run last, base_last;
    for (int r = 0; r < a.runs; ++r) {
      // Alternate which setting goes first.
      Run one, base;
      const bool base_first = r % 2 == 1 && !a.no_baseline;
      if (base_first) base = Prefill(a, a.baseline_chunk, head, cold);
      one = Prefill(a, a.chunk, prompt, cold);
      roofs.Measure(1);
      if (!base_first && !a.no_baseline) base = Prefill(a, a.baseline_chunk, head, cold);
      secs.push_back(one.prefill_s);
      waits.push_back(one.expert_wait_s);
      phases.push_back(one.phases);
      bytes.push_back(one.bytes);
      if (!a.no_baseline) {
        base_secs.push_back(base.prefill_s * scale);
        speedup.push_back(base.prefill_s * scale / one.prefill_s);
      }
      last = one;
      base_last = base;
    }
    // Floors from the best roof of every pass so far (the last ones ran after
    // this length's prefills).
    const double roof = roofs.Idot(), fma_roof = roofs.Fma();
    const double compute_floor = macs_tok * len / (roof * 1e9);
    // The compute floor with attention: the GEMMs at the IDOT roof plus MLA's
    // T^2 multiply-adds at the FMA roof (the plain compute floor counts the GEMMs only).
    const double attn_floor = attn_macs / (fma_roof * 1e9);
    const double bound = bound_per_token() * len + attn_floor;
    // The I/O floor: one pass over the distinct experts the prompt routes to at
    // the best disk rate -- not the bytes this implementation read, which
    // read-ahead and re-reads would add to (and so raise its own floor).
    const uint64_t distinct_bytes = last.distinct * last.slot_bytes;
    const double io_floor = double(distinct_bytes) / (disk_gbps * 1e9);
    std::vector<double> ratio_floor, ratio_floor_attn, ratio_bound;
    for (size_t r = 0; r < secs.size(); ++r) {
      ratio_floor.push_back(secs[r] / std::max(io_floor, compute_floor));
      ratio_floor_attn.push_back(secs[r] / std::max(io_floor, compute_floor + attn_floor));
      ratio_bound.push_back(secs[r] / std::max(io_floor, bound));
    }
    JsonWriter j;
    j.BeginObject()
        .Field("bench", "prefill")
        .Field("tokens", int64_t(len))
        .Field("chunk", int64_t(a.chunk))
        // One window: each routed expert is acquired once per MoE layer, so on
        // a fresh engine expert_loads is the number of distinct (layer, expert)
        // the prompt routes to and expert_bytes one pass over them.
        .Field("window", last.window)
        .Field("windows", last.windows)
        .Field("one_window", last.windows == 1)
        .Field("window_budget_bytes", last.budget_bytes)
        .Field("runs", int64_t(a.runs))
        .Field("expert_bytes", last.bytes)
        .Field("expert_loads", last.loads)
        .Field("experts_distinct", last.distinct)
        .Field("expert_bytes_distinct", distinct_bytes)
        .Field("read_vs_distinct", distinct_bytes > 0 ? double(last.bytes) / double(distinct_bytes) : 0.0)
        .Field("io_floor_s", io_floor)
        .Field("compute_floor_s", compute_floor)
        .Field("attn_macs", attn_macs)
        .Field("compute_floor_attn_s", compute_floor + attn_floor)
        .Field("idot_roof_gmacs", roof)
        .Field("fma_roof_gmacs", fma_roof);
    if (mix.measured) {
      // The prefill goal (1.25x max(floors), docs/PERFORMANCE.md) against the
      // bound estimate: below 1, the goal asks for less time than the
      // estimate gives this tile's arithmetic here.
      j.Field("bound_estimate_s", bound)
          .Field("goal_s", 1.25 * std::max(io_floor, compute_floor))
          .Field("goal_vs_bound_estimate", 1.25 * std::max(io_floor, compute_floor) / std::max(io_floor, bound));
    }
    PutSummary(j, "prefill_s", secs);
    PutSummary(j, "vs_floor", ratio_floor);
    PutSummary(j, "vs_floor_attn", ratio_floor_attn);
    if (mix.measured) PutSummary(j, "vs_bound_estimate", ratio_bound);
    PutSummary(j, "expert_wait_s", waits);
    // The run with the median prefill time, by part (seconds and shares of the
    // prefill, so that MLA attention's and the KDA scan's shares show).
    {
      std::vector<size_t> idx(secs.size());
      std::iota(idx.begin(), idx.end(), size_t{0});
      std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return secs[x] < secs[y]; });
      const size_t mid = idx[idx.size() / 2];
      const model::PhaseTimes& ph = phases[mid];
      const double total = secs[mid];
      const std::pair<const char*, double> parts[] = {
          {"attn_proj", ph.attn_proj},         {"kda_scan", ph.kda_scan},
          {"mla_attn", ph.mla_attn},           {"moe_router", ph.moe_router},
          {"moe_experts", ph.moe_experts},     {"moe_latent_up", ph.moe_latent_up},
          {"mlp", ph.mlp},                     {"residual", ph.residual},
          {"head", ph.head},                   {"other", total - ph.Total()}};
      j.Key("phases_s").BeginObject();
      for (const auto& [name, v] : parts) j.Field(name, v);
      j.EndObject();
      j.Key("phase_shares").BeginObject();
      for (const auto& [name, v] : parts) j.Field(name, total > 0 ? v / total : 0.0);
      j.EndObject();
    }
    j.Field("peak_rss_bytes", last.peak_rss);
    if (!a.no_baseline) {
      j.Field("baseline_chunk", int64_t(a.baseline_chunk))
          .Field("baseline_tokens_timed", int64_t(prefix))
          .Field("baseline_extrapolated", prefix < len)
          .Field("baseline_expert_bytes", uint64_t(double(base_last.bytes) * scale))
          .Field("baseline_expert_loads", uint64_t(double(base_last.loads) * scale))
          .Field("baseline_peak_rss_bytes", base_last.peak_rss);
      PutSummary(j, "baseline_prefill_s", base_secs);
      PutSummary(j, "speedup", speedup);
    }
    Finish(j);
  }
}

void SetupPrefillBench(CLI::App& root) {
  auto args = std::make_shared<PrefillArgs>();
  CLI::App* cmd = root.add_subcommand(
      "prefill",
      "cold long-prompt prefill vs max(I/O floor, compute floor), vs an estimate of the bound the IDOT "
      "tile's arithmetic sets, and vs the old K3_CHUNK=32");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container directory")->required();
  cmd->add_option("--lengths", args->lengths, "prompt lengths (default 512,2048,8192)")
      ->delimiter(',');
  cmd->add_option("--runs", args->runs, "runs per length and setting (median reported)");
  cmd->add_option("--chunk", args->chunk,
                  "prefill chunk of the measured setting (default 0: automatic windows from the memory budget, "
                  "K3_PREFILL_GB)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--baseline-chunk", args->baseline_chunk, "the old default chunk (32)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--baseline-prefix", args->baseline_prefix,
                  "tokens the baseline is timed on, extrapolated to the prompt (0: all)");
  cmd->add_flag("--no-baseline", args->no_baseline, "skip the old-default runs");
  cmd->add_option("--disk-gb", args->disk_gb, "GB of each O_DIRECT disk pass (default 2)");
  cmd->add_option("--disk-passes", args->disk_passes,
                  "passes of each kind, one stream and K3_QD streams (default 3; the best is the rate)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--threads", args->threads, "compute threads (default: every CPU)")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--no-drop", args->no_drop, "do not drop the page cache (warm runs)");
  cmd->add_flag("--no-settle", args->no_settle,
                "time the prefill right after load, while the expert cache's buffers are still "
                "being faulted in (default: wait for K3_PREFAULT to finish first)");
  cmd->callback([args] { RunPrefillBench(*args); });
}

K3_REGISTER_BENCH(SetupPrefillBench);

}  // namespace
}  // namespace k3::bench
