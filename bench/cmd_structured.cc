// k3-bench structured: what structured output (issue 16) costs in decode.
// The same engine, prompt, sampler settings and max_tokens, run by run
// interleaved: an unconstrained chat answer (the baseline) against answers
// under a response_format json_schema and a required tool call. Reports decode
// tok/s (median, min, max) of each and the constraint's share of decode time
// (Timings::constrain_s / decode_s: the logits copy, masks, steering and
// bookkeeping of every step, forced ids included).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"
#include "k3/engine/engine.h"

namespace k3::bench {
namespace {

struct StructuredBenchArgs {
  std::string model_dir;
  int tokens = 96;
  int runs = 5;
  int threads = 0;
};

// A tool / structured-output schema of the usual shape: required and optional
// keys, an enum, bounds, a nested array of objects.
constexpr const char* kSchema =
    R"({"type":"object","properties":{"title":{"type":"string","maxLength":40},)"
    R"("priority":{"enum":["low","medium","high"]},"estimate":{"type":"integer","minimum":1,"maximum":100},)"
    R"("steps":{"type":"array","maxItems":4,"items":{"type":"object","properties":{"text":{"type":"string"},)"
    R"("done":{"type":"boolean"}},"required":["text"],"additionalProperties":false}}},)"
    R"("required":["title","priority"],"additionalProperties":false})";

struct Run {
  double decode_tps = 0, share = 0, us_per_token = 0;
  int64_t tokens = 0;
};

Run Generate(engine::Engine& e, const std::vector<int32_t>& prompt,
             std::shared_ptr<const engine::StructuredOutput> spec, int n, uint64_t seed) {
  e.ResetSession();
  engine::GenerateRequest req;
  req.prompt_ids = prompt;
  req.chat_start = tok::ChatStreamParser::Start::kResponse;
  req.max_tokens = n;
  req.sampling.temperature = 1.0f;
  req.sampling.seed = seed;
  req.structured = std::move(spec);
  const engine::GenerateResult g = e.Generate(req);
  Run r;
  r.decode_tps = g.timings.decode_tok_per_s;
  r.tokens = g.usage.completion_tokens;
  r.share = g.timings.decode_s > 0 ? g.timings.constrain_s / g.timings.decode_s : 0;
  r.us_per_token = r.tokens > 0 ? 1e6 * g.timings.constrain_s / double(r.tokens) : 0;
  return r;
}

void Stats(JsonWriter& j, const std::string& key, const std::vector<double>& v) {
  j.Field(key + "_median", Median(v));
  j.Field(key + "_min", *std::min_element(v.begin(), v.end()));
  j.Field(key + "_max", *std::max_element(v.begin(), v.end()));
}

void RunStructuredBench(const StructuredBenchArgs& a) {
  if (a.runs < 1 || a.tokens < 8) throw Error(ErrorCode::kInvalidArgument, "need --runs >= 1, --tokens >= 8");
  engine::EngineOptions eo = engine::EngineOptions::FromEnv(a.model_dir);
  eo.progress = false;
  eo.threads = a.threads;
  auto e = engine::Engine::LoadOrThrow(eo);
  if (!e->tokenizer()) throw Error(ErrorCode::kNotFound, "the model directory has no tiktoken.model", a.model_dir);
  tok::RenderedChat chat = tok::RenderChatRequestOrThrow(
      R"({"messages":[{"role":"user","content":"Plan the release as JSON."}],"options":{"thinking":false}})");
  const std::vector<int32_t> prompt = e->ChatPromptIds(chat);

  auto json = std::make_shared<engine::StructuredOutput>();
  json->response = constrain::Schema::CompileOrThrow(kSchema);
  auto call = std::make_shared<engine::StructuredOutput>();
  call->tools.push_back({"plan", constrain::Schema::CompileOrThrow(kSchema)});
  call->calls = engine::StructuredOutput::Calls::kRequired;

  // Warm-up (expert cache, the vocabulary's first build).
  Generate(*e, prompt, nullptr, a.tokens, 1);
  Generate(*e, prompt, json, a.tokens, 1);
  std::vector<double> free_tps, json_tps, call_tps, json_share, call_share, json_us, call_us, json_n, call_n, free_n;
  for (int r = 0; r < a.runs; ++r) {
    const uint64_t seed = 100 + uint64_t(r);
    // Rotate the order so no side always follows the same one.
    for (int k = 0; k < 3; ++k) {
      switch ((k + r) % 3) {
        case 0: {
          Run x = Generate(*e, prompt, nullptr, a.tokens, seed);
          free_tps.push_back(x.decode_tps);
          free_n.push_back(double(x.tokens));
          break;
        }
        case 1: {
          Run x = Generate(*e, prompt, json, a.tokens, seed);
          json_tps.push_back(x.decode_tps);
          json_share.push_back(x.share);
          json_us.push_back(x.us_per_token);
          json_n.push_back(double(x.tokens));
          break;
        }
        default: {
          Run x = Generate(*e, prompt, call, a.tokens, seed);
          call_tps.push_back(x.decode_tps);
          call_share.push_back(x.share);
          call_us.push_back(x.us_per_token);
          call_n.push_back(double(x.tokens));
          break;
        }
      }
    }
  }
  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "structured");
  j.Field("git_sha", SourceRevision());
  j.Field("cpu", CpuModel());
  j.Field("threads", static_cast<int64_t>(a.threads > 0 ? a.threads : NumOnlineCpus()));
  j.Field("runs", static_cast<int64_t>(a.runs));
  j.Field("max_tokens", static_cast<int64_t>(a.tokens));
  j.Field("vocab_size", static_cast<int64_t>(e->tokenizer()->vocab_size()));
  Stats(j, "free_decode_tok_per_s", free_tps);
  Stats(j, "json_decode_tok_per_s", json_tps);
  Stats(j, "call_decode_tok_per_s", call_tps);
  Stats(j, "json_constrain_share", json_share);
  Stats(j, "call_constrain_share", call_share);
  Stats(j, "json_constrain_us_per_token", json_us);
  Stats(j, "call_constrain_us_per_token", call_us);
  j.Field("free_tokens_median", Median(free_n));
  j.Field("json_tokens_median", Median(json_n));
  j.Field("call_tokens_median", Median(call_n));
  j.Field("ratio_json_vs_free_decode", Median(json_tps) / Median(free_tps));
  j.Field("ratio_call_vs_free_decode", Median(call_tps) / Median(free_tps));
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
}

void SetupStructuredBench(CLI::App& root) {
  auto args = std::make_shared<StructuredBenchArgs>();
  CLI::App* cmd = root.add_subcommand(
      "structured", "decode tok/s with and without structured output (json_schema, a required call)");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container directory")->required();
  cmd->add_option("--tokens", args->tokens, "max_tokens per answer (default 96)");
  cmd->add_option("--runs", args->runs, "timed runs of each kind, interleaved (default 5)");
  cmd->add_option("--threads", args->threads, "compute threads (default: every CPU)")->check(CLI::Range(1, 1024));
  cmd->callback([args] { RunStructuredBench(*args); });
}

K3_REGISTER_BENCH(SetupStructuredBench);

}  // namespace
}  // namespace k3::bench
