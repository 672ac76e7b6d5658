// k3-bench tokenizer: single-thread encode throughput of k3's tokenizer on a
// corpus file, with an optional baseline command (tiktoken's npm/WASM build, run
// by scripts/bench-tokenizer.sh) measured in the same run, interleaved run by
// run, and the ratio of the medians.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"
#include "k3/tokenizer/tokenizer.h"

namespace k3::bench {
namespace {

struct TokenizerBenchArgs {
  std::string model_dir;
  std::string corpus;
  int runs = 7;
  std::string baseline_cmd;
  bool allow_special = false;
};

// Runs the baseline; its last stdout line must be a JSON object holding
// "median_s" and "tokens". Returns that line.
std::string RunBaseline(const std::string& cmd) {
  std::string out, last;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) ThrowErrno(errno, "popen baseline");
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  if (rc != 0) throw Error(ErrorCode::kIo, "baseline command failed (status " + std::to_string(rc) + "): " + cmd);
  size_t end = out.find_last_not_of("\r\n");
  if (end == std::string::npos) throw Error(ErrorCode::kIo, "baseline printed nothing: " + cmd);
  size_t start = out.rfind('\n', end);
  last = out.substr(start == std::string::npos ? 0 : start + 1, end + 1 - (start == std::string::npos ? 0 : start + 1));
  return last;
}

// Minimal numeric field lookup in a flat JSON line ("key": number).
double NumberField(const std::string& json, const std::string& key) {
  size_t k = json.find("\"" + key + "\"");
  if (k == std::string::npos) throw Error(ErrorCode::kCorrupt, "baseline output lacks " + key + ": " + json);
  size_t colon = json.find(':', k);
  return std::strtod(json.c_str() + colon + 1, nullptr);
}

void RunTokenizerBench(const TokenizerBenchArgs& args) {
  tok::Tokenizer tok = tok::Tokenizer::LoadDirOrThrow(args.model_dir);
  std::string text = ReadFileOrThrow(args.corpus, 1ull << 31);
  if (args.runs < 1) throw Error(ErrorCode::kInvalidArgument, "--runs must be >= 1");

  // The baseline is run once per timed run, interleaved with ours, so that load
  // from other processes on a shared machine hits both sides alike.
  std::vector<tok::TokenId> ids = tok.Encode(text, args.allow_special);  // warm-up
  size_t tokens = ids.size();
  std::vector<double> times, base_times;
  std::string baseline_json;
  for (int r = 0; r < args.runs; ++r) {
    if (!args.baseline_cmd.empty()) {
      baseline_json = RunBaseline(args.baseline_cmd);
      base_times.push_back(NumberField(baseline_json, "median_s"));
    }
    double t0 = NowSeconds();
    ids = tok.Encode(text, args.allow_special);
    times.push_back(NowSeconds() - t0);
  }
  double med = Median(times);
  // Order-sensitive checksum of the ids, computed the same way by the baseline
  // script, so the ratio is only reported for identical output.
  uint32_t ids_hash = 0;
  for (tok::TokenId id : ids) ids_hash = ids_hash * 31u + id;

  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "tokenizer");
  j.Field("git_sha", SourceRevision());
  j.Field("cpu", CpuModel());
  j.Field("threads", int64_t{1});
  j.Field("runs", int64_t{args.runs});
  j.Field("corpus_bytes", uint64_t(text.size()));
  j.Field("tokens", uint64_t(tokens));
  j.Field("median_s", med);
  j.Field("mb_per_s", double(text.size()) / med / 1e6);
  j.Field("tok_per_s", double(tokens) / med);
  j.Field("ids_hash", uint64_t(ids_hash));
  if (!baseline_json.empty()) {
    double base_s = Median(base_times);
    double base_tokens = NumberField(baseline_json, "tokens");
    j.Key("baseline").Raw(baseline_json);  // the last run's line
    j.Field("baseline_median_s", base_s);
    j.Field("baseline_mb_per_s", double(text.size()) / base_s / 1e6);
    double base_hash = NumberField(baseline_json, "ids_hash");
    j.Field("same_ids", uint64_t(base_tokens) == tokens && uint64_t(base_hash) == ids_hash);
    j.Field("ratio_vs_baseline", base_s / med);
  }
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
}

void SetupTokenizerBench(CLI::App& root) {
  auto args = std::make_shared<TokenizerBenchArgs>();
  CLI::App* cmd = root.add_subcommand("tokenizer", "Tokenizer encode throughput (one thread)");
  cmd->add_option("MODEL", args->model_dir, "directory with tiktoken.model and tokenizer_config.json")->required();
  cmd->add_option("--corpus", args->corpus, "text file to encode")->required();
  cmd->add_option("--runs", args->runs, "timed runs; the median is reported (default 7)");
  cmd->add_option("--baseline-cmd", args->baseline_cmd,
                  "shell command timing one baseline run (called once per run); last stdout line: "
                  "JSON with median_s, tokens and ids_hash");
  cmd->add_flag("--allow-special", args->allow_special, "encode with special tokens allowed");
  cmd->callback([args] { RunTokenizerBench(*args); });
}

K3_REGISTER_BENCH(SetupTokenizerBench);

}  // namespace
}  // namespace k3::bench
