// k3-bench cluster: k3-run --cluster on loopback against one host, in the same
// run, interleaved run by run: decode s/token for 1 host, 2 and 3 ranks (and
// the ratio), bytes per decoded token on the wire, round trips per token and
// the time in them, per-layer round-trip latency; a prefill window's exchange
// time against the workers' compute. Each configuration is the real binary
// (mpirun -np N k3-run generate --cluster --json), so process start-up and
// MPI's transport are what an operator gets. Loopback uses Open MPI's
// shared-memory transport (vader); docs/cluster.md projects to Ethernet.
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"

namespace k3::bench {
namespace {

struct ClusterBenchArgs {
  std::string k3_run;
  std::string model_dir = std::string(K3_SOURCE_DIR) + "/tests/data/oracle/k3-tiny";
  int runs = 5;
  int ngen = 32;
  int prompt_tokens = 128;
  int chunk = 128;
  std::vector<int> ranks = {2, 3};
  int threads = 1;
};

// The number after "key": inside the object "section" ("" = top level of
// "stats"); our own JSON, so a plain search is enough. NaN when absent.
double Field(const std::string& json, const std::string& section, const std::string& key) {
  size_t from = 0;
  if (!section.empty()) {
    from = json.find("\"" + section + "\":{");
    if (from == std::string::npos) return std::nan("");
  }
  const size_t at = json.find("\"" + key + "\":", from);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(json.c_str() + at + key.size() + 3, nullptr);
}

struct Run {
  double decode_spt = 0, prefill_tps = 0;
  double dec_passes = 0, dec_rt = 0, dec_ex = 0, dec_comp = 0, dec_bytes = 0;
  double pre_passes = 0, pre_rt = 0, pre_ex = 0, pre_comp = 0, pre_bytes = 0;
};

Run RunOnce(const ClusterBenchArgs& a, int ranks) {
  std::string ids;
  for (int i = 0; i < a.prompt_tokens; ++i)
    ids += (i ? "," : "") + std::to_string((i * 37 + 11) % 2000 + 40);
  std::string cmd = "K3_LOG=warn K3_CHUNK=" + std::to_string(a.chunk) +
                    " OMP_NUM_THREADS=" + std::to_string(a.threads) + " ";
  if (ranks > 0) {
    cmd +=
        "mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -x K3_LOG "
        "-x K3_CHUNK "
        "-x OMP_NUM_THREADS -np " +
        std::to_string(ranks) + " ";
  }
  cmd += "'" + a.k3_run + "' generate '" + a.model_dir + "' --ids " + ids + " --ngen " +
         std::to_string(a.ngen) + " --json --threads " + std::to_string(a.threads) +
         " --ckpt-slots 0" + (ranks > 0 ? " --cluster" : "") + " 2>/dev/null";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) ThrowErrno(errno, "popen k3-run");
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (pclose(p) != 0 || out.find("\"stats\"") == std::string::npos) {
    throw Error(ErrorCode::kInternal, "k3-run failed: " + cmd);
  }
  Run r;
  r.decode_spt = Field(out, "stats", "decode_s_per_token");
  r.prefill_tps = Field(out, "stats", "prefill_tok_per_s");
  if (ranks > 0) {
    r.dec_passes = Field(out, "decode", "passes");
    r.dec_rt = Field(out, "decode", "round_trips");
    r.dec_ex = Field(out, "decode", "exchange_s");
    r.dec_comp = Field(out, "decode", "compute_s");
    r.dec_bytes = Field(out, "decode", "bytes");
    r.pre_passes = Field(out, "prefill", "passes");
    r.pre_rt = Field(out, "prefill", "round_trips");
    r.pre_ex = Field(out, "prefill", "exchange_s");
    r.pre_comp = Field(out, "prefill", "compute_s");
    r.pre_bytes = Field(out, "prefill", "bytes");
  }
  return r;
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) ThrowErrno(errno, "readlink /proc/self/exe");
  return DirName(std::string(buf, static_cast<size_t>(n)));
}

void RunClusterBench(ClusterBenchArgs a) {
  if (a.k3_run.empty()) a.k3_run = JoinPath(SelfDir(), "k3-run");
  std::vector<int> configs = {0};
  configs.insert(configs.end(), a.ranks.begin(), a.ranks.end());
  std::vector<std::vector<Run>> runs(configs.size());
  for (int i = 0; i < a.runs; ++i) {
    for (size_t c = 0; c < configs.size(); ++c) runs[c].push_back(RunOnce(a, configs[c]));
  }
  const double decode_tokens = a.ngen - 1;  // the first token comes from the prefill
  std::vector<double> base;
  for (const Run& r : runs[0]) base.push_back(r.decode_spt);
  const double base_med = Median(base);
  for (size_t c = 0; c < configs.size(); ++c) {
    auto col = [&](double Run::*f, double scale = 1.0) {
      std::vector<double> v;
      for (const Run& r : runs[c]) v.push_back(r.*f * scale);
      return v;
    };
    std::vector<double> spt = col(&Run::decode_spt), ratio;
    for (double s : spt) ratio.push_back(s / base_med);
    JsonWriter j;
    j.BeginObject();
    j.Field("bench", std::string("cluster"));
    j.Field("git", SourceRevision());
    j.Field("cpu", CpuModel());
    j.Field("model", a.model_dir);
    j.Field("ranks", static_cast<int64_t>(configs[c]));
    j.Field("threads_per_rank", static_cast<int64_t>(a.threads));
    j.Field("prompt_tokens", static_cast<int64_t>(a.prompt_tokens));
    j.Field("prefill_window", static_cast<int64_t>(a.chunk));
    j.Field("decode_tokens", decode_tokens);
    j.Field("runs", static_cast<int64_t>(a.runs));
    PutSummary(j, "decode_s_per_token", spt);
    PutSummary(j, "decode_ratio_vs_1host", ratio);
    PutSummary(j, "prefill_tok_per_s", col(&Run::prefill_tps));
    if (configs[c] > 0) {
      std::vector<double> bytes_tok, rt_tok, rt_s_tok, rt_us, wire_us, pre_ex, pre_comp, pre_bytes;
      for (const Run& r : runs[c]) {
        const double toks = r.dec_passes > 0 ? decode_tokens : 0;
        bytes_tok.push_back(toks ? r.dec_bytes / toks : 0);
        rt_tok.push_back(toks ? r.dec_rt / toks : 0);
        rt_s_tok.push_back(toks ? r.dec_ex / toks : 0);
        rt_us.push_back(r.dec_rt ? 1e6 * r.dec_ex / r.dec_rt : 0);
        wire_us.push_back(r.dec_rt ? 1e6 * (r.dec_ex - r.dec_comp) / r.dec_rt : 0);
        const double windows = r.pre_passes;
        pre_ex.push_back(windows ? r.pre_ex / windows : 0);
        pre_comp.push_back(windows ? r.pre_comp / windows : 0);
        pre_bytes.push_back(windows ? r.pre_bytes / windows : 0);
      }
      PutSummary(j, "decode_wire_bytes_per_token", bytes_tok);
      PutSummary(j, "decode_round_trips_per_token", rt_tok);
      PutSummary(j, "decode_exchange_s_per_token", rt_s_tok);
      PutSummary(j, "decode_layer_round_trip_us", rt_us);
      PutSummary(j, "decode_layer_wire_us",
                 wire_us);  // round trip minus the slowest worker's compute
      PutSummary(j, "prefill_layer_exchange_s", pre_ex);
      PutSummary(j, "prefill_layer_compute_s", pre_comp);
      PutSummary(j, "prefill_layer_wire_bytes", pre_bytes);
    }
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
    std::fflush(stdout);
  }
}

void SetupCluster(CLI::App& root) {
  auto a = std::make_shared<ClusterBenchArgs>();
  CLI::App* cmd =
      root.add_subcommand("cluster",
                          "k3-run --cluster on loopback (mpirun) against one host: decode s/token, "
                          "wire bytes and round "
                          "trips per token, per-layer latency, prefill exchange vs compute");
  cmd->add_option("--k3-run", a->k3_run, "k3-run binary (default: beside k3-bench)");
  cmd->add_option("--model", a->model_dir, "model directory (default: the oracle's k3-tiny)");
  cmd->add_option("--runs", a->runs, "runs per configuration, interleaved (default 5)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--ngen", a->ngen, "tokens generated per run (default 32)")
      ->check(CLI::Range(2, 100000));
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "prompt length (default 128)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--window", a->chunk, "prefill window, K3_CHUNK (default 128)")
      ->check(CLI::Range(1, 512));
  cmd->add_option("--ranks", a->ranks, "rank counts to run (default 2,3)")->delimiter(',');
  cmd->add_option("--threads", a->threads, "compute threads per rank (default 1)")
      ->check(CLI::Range(1, 1024));
  cmd->callback([a] { RunClusterBench(*a); });
}

K3_REGISTER_BENCH(SetupCluster);

}  // namespace
}  // namespace k3::bench
