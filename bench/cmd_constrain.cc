// k3-bench constrain: the cost of a constrained-decoding step (AllowedMask, and
// Advance) per generated token, on the model's vocabulary and on any other
// vocabulary directories given (scripts/bench-constrain.sh builds a
// 163,840-rank one from tiktoken's o200k_base), against the decode step time of
// the model measured in the same run (the baseline: share of a decode step).
// Tokens are chosen by a seeded random walk among the allowed ones, the same
// policy as the property test (tests/constrain/constrain_drive.cc).
#include <omp.h>

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/constrain/constrain.h"
#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"
#include "k3/model/model.h"
#include "k3/quant/isa.h"
#include "k3/tokenizer/tokenizer.h"

namespace k3::bench {
namespace {

struct ConstrainBenchArgs {
  std::string model_dir;
  std::vector<std::string> vocab_dirs;
  int runs = 5;
  int tokens = 256;        // constrained tokens per run and schema
  int decode_steps = 32;   // decode steps per run
  int show_slow = 0;       // print the output before the N masks with the most CPU time (stderr)
};

// A tool call's arguments (strings, bounded numbers, an enum, an array), an
// answer that is mostly free text, a union whose alternatives start alike
// (followed in parallel), and response_format json_object.
const char* const kSchemas[][2] = {
    {"tool_args", R"({"type":"object","properties":{"query":{"type":"string","maxLength":80},
      "top_k":{"type":"integer","minimum":1,"maximum":50},"lang":{"enum":["en","fr","de","zh"]},
      "filters":{"type":"array","items":{"type":"string"},"maxItems":4},"score":{"type":"number"}},
      "required":["query","top_k"],"additionalProperties":false})"},
    {"free_text", R"({"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]})"},
    {"union", R"({"type":"array","maxItems":8,"items":{"anyOf":[
      {"type":"object","properties":{"name":{"type":"string"},"qty":{"type":"integer"}},"required":["qty"],"additionalProperties":false},
      {"type":"object","properties":{"name":{"type":"string"},"price":{"type":"number"}},"required":["price"],"additionalProperties":false},
      {"enum":["none","unknown"]},{"type":"string","maxLength":20}]}})"},
    {"json_object", nullptr},
};

struct Percentiles {
  double p50, p90, p99, max, mean;
};
Percentiles Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v.empty() ? 0.0 : v[std::min(v.size() - 1, size_t(q * double(v.size())))]; };
  double sum = 0;
  for (double x : v) sum += x;
  return {at(0.5), at(0.9), at(0.99), v.empty() ? 0 : v.back(), v.empty() ? 0 : sum / double(v.size())};
}

// Mean decode step (seconds) of each run: one token fed, last logits out.
std::vector<double> DecodeRuns(const ConstrainBenchArgs& args) {
  model::LoadOptions lo;
  lo.progress = false;
  auto m = model::Model::LoadOrThrow(args.model_dir, lo);
  model::Session session(*m, model::RunOptions{}, 64 + int64_t(args.runs) * args.decode_steps);
  std::vector<float> logits(size_t(m->config().vocab_size));
  model::ForwardOutputs out;
  out.logits_last = logits.data();
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  session.Forward(prompt, out);
  std::vector<double> runs;
  int32_t next = 9;
  for (int r = 0; r < args.runs; ++r) {
    double t0 = NowSeconds();
    for (int s = 0; s < args.decode_steps; ++s) {
      int32_t id = next;
      session.Forward(std::span<const int32_t>(&id, 1), out);
      next = model::Sampler::Argmax(logits);
    }
    runs.push_back((NowSeconds() - t0) / args.decode_steps);
  }
  return runs;
}

struct MaskStats {
  std::vector<double> mask_s, advance_s;  // per token, wall clock
  std::vector<double> mask_cpu_s;         // per token, thread CPU time
  std::vector<double> run_mean_mask_s;    // per run
  uint64_t completions = 0;
  std::vector<std::pair<double, std::string>> slowest;  // (seconds, output before the mask)
};

MaskStats MaskRuns(const constrain::CompiledSchema& schema, const constrain::Vocabulary& vocab, const ConstrainBenchArgs& args) {
  MaskStats st;
  std::vector<uint64_t> mask;
  std::vector<uint32_t> allowed, closers;
  for (int r = 0; r < args.runs; ++r) {
    std::mt19937_64 rng(uint64_t(r) + 1);
    constrain::TokenConstraint c(schema, vocab);
    int in_value = 0;
    double sum = 0;
    for (int t = 0; t < args.tokens; ++t) {
      double c0 = ThreadCpuSeconds();
      double t0 = NowSeconds();
      c.AllowedMask(mask);
      double t1 = NowSeconds();
      double c1 = ThreadCpuSeconds();
      allowed.clear();
      closers.clear();
      for (size_t w = 0; w < mask.size(); ++w)
        for (uint64_t bits = mask[w]; bits; bits &= bits - 1) {
          uint32_t id = uint32_t(w * 64 + size_t(std::countr_zero(bits)));
          allowed.push_back(id);
          std::string_view b = vocab.TokenBytes(id);
          if (b.find_first_of("\"]}") != std::string_view::npos && b.find_first_of("{[") == std::string_view::npos)
            closers.push_back(id);
        }
      if (allowed.empty() || (c.Accepting() && rng() % 8 == 0)) {
        ++st.completions;
        c.Reset();
        in_value = 0;
        continue;
      }
      const auto& pool = in_value >= 48 && !closers.empty() ? closers : allowed;
      uint32_t pick = pool[rng() % pool.size()];
      double t2 = NowSeconds();
      c.Advance(pick);
      double t3 = NowSeconds();
      ++in_value;
      st.mask_s.push_back(t1 - t0);
      st.mask_cpu_s.push_back(c1 - c0);
      if (args.show_slow > 0) {
        st.slowest.emplace_back(c1 - c0, c.text());
        std::sort(st.slowest.begin(), st.slowest.end(), std::greater<>());
        if (st.slowest.size() > size_t(args.show_slow)) st.slowest.pop_back();
      }
      st.advance_s.push_back(t3 - t2);
      sum += t1 - t0;
    }
    st.run_mean_mask_s.push_back(sum / args.tokens);
  }
  return st;
}

// The fields every line of this bench opens with.
void BeginLine(JsonWriter& j, const char* what) {
  j.BeginObject();
  j.Field("bench", "constrain");
  j.Field("what", what);
  j.Field("git_sha", SourceRevision());
  j.Field("cpu", CpuModel());
}

void RunConstrainBench(const ConstrainBenchArgs& args) {
  if (args.runs < 5) throw Error(ErrorCode::kInvalidArgument, "--runs must be >= 5 (medians of at least 5)");
  std::vector<double> decode = DecodeRuns(args);
  double decode_med = Median(decode);
  {
    JsonWriter j;
    BeginLine(j, "decode_step");
    j.Field("isa", std::string(quant::IsaName(quant::ActiveIsa())));
    j.Field("threads", int64_t{omp_get_max_threads()});
    j.Field("model", args.model_dir);
    j.Field("runs", int64_t{args.runs});
    j.Field("steps_per_run", int64_t{args.decode_steps});
    j.Field("median_s", decode_med);
    j.Field("min_s", *std::min_element(decode.begin(), decode.end()));
    j.Field("max_s", *std::max_element(decode.begin(), decode.end()));
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
    std::fflush(stdout);
  }
  std::vector<std::string> dirs = {args.model_dir};
  for (auto& d : args.vocab_dirs) dirs.push_back(d);
  for (const std::string& dir : dirs) {
    tok::Tokenizer tokenizer = tok::Tokenizer::LoadDirOrThrow(dir);
    double t0 = NowSeconds();
    constrain::Vocabulary vocab = constrain::Vocabulary::FromTokenizer(tokenizer);
    double prep_s = NowSeconds() - t0;
    for (auto& [name, text] : kSchemas) {
      constrain::CompiledSchema schema =
          text ? constrain::Schema::CompileOrThrow(text) : constrain::Schema::JsonObject();
      MaskStats st = MaskRuns(schema, vocab, args);
      for (auto& [sec, text] : st.slowest) {
        std::string q;
        AppendJsonString(q, text.size() > 120 ? text.substr(text.size() - 120) : text);
        std::fprintf(stderr, "slow mask %.0f us after ...%s\n", sec * 1e6, q.c_str());
      }
      Percentiles mp = Summarize(st.mask_s), ap = Summarize(st.advance_s), cp = Summarize(st.mask_cpu_s);
      double med = Median(st.run_mean_mask_s);
      JsonWriter j;
      BeginLine(j, "mask");
      j.Field("threads", int64_t{1});
      j.Field("vocab", dir);
      j.Field("num_ranks", uint64_t(vocab.num_ranks()));
      j.Field("vocab_prepare_s", prep_s);
      j.Field("schema", std::string(name));
      j.Field("runs", int64_t{args.runs});
      j.Field("tokens", uint64_t(st.mask_s.size()));
      j.Field("completions", st.completions);
      j.Field("mask_mean_us_median_of_runs", med * 1e6);
      j.Field("mask_mean_us_min_run", *std::min_element(st.run_mean_mask_s.begin(), st.run_mean_mask_s.end()) * 1e6);
      j.Field("mask_mean_us_max_run", *std::max_element(st.run_mean_mask_s.begin(), st.run_mean_mask_s.end()) * 1e6);
      j.Field("mask_p50_us", mp.p50 * 1e6);
      j.Field("mask_p90_us", mp.p90 * 1e6);
      j.Field("mask_p99_us", mp.p99 * 1e6);
      j.Field("mask_max_us", mp.max * 1e6);
      j.Field("mask_cpu_p50_us", cp.p50 * 1e6);
      j.Field("mask_cpu_p99_us", cp.p99 * 1e6);
      j.Field("mask_cpu_max_us", cp.max * 1e6);
      j.Field("advance_mean_us", ap.mean * 1e6);
      j.Field("decode_step_median_s", decode_med);
      j.Field("share_of_decode_step", (med + ap.mean) / decode_med);
      j.EndObject();
      std::printf("%s\n", j.str().c_str());
      std::fflush(stdout);
    }
  }
}

void SetupConstrainBench(CLI::App& root) {
  auto args = std::make_shared<ConstrainBenchArgs>();
  CLI::App* cmd = root.add_subcommand("constrain", "Constrained-decoding mask cost per token vs the decode step");
  cmd->add_option("MODEL", args->model_dir, "model directory (decode baseline and its vocabulary)")->required();
  cmd->add_option("--vocab-dir", args->vocab_dirs,
                  "more vocabularies: directories with tiktoken.model and tokenizer_config.json (repeatable)");
  cmd->add_option("--runs", args->runs, "runs; medians over runs are reported (default 5)");
  cmd->add_option("--tokens", args->tokens, "constrained tokens per run and schema (default 256)");
  cmd->add_option("--decode-steps", args->decode_steps, "decode steps per run (default 32)");
  cmd->add_option("--show-slow", args->show_slow, "print the output before the N masks with the most CPU time (stderr)");
  cmd->callback([args] { RunConstrainBench(*args); });
}

K3_REGISTER_BENCH(SetupConstrainBench);

}  // namespace
}  // namespace k3::bench
