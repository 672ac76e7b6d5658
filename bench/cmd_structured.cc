// k3-bench structured: what structured output costs in decode.
// The same engine, prompt, sampler settings and max_tokens, run by run
// interleaved: an unconstrained chat answer (the baseline) against answers
// under a response_format json_schema and a required tool call. Reports decode
// tok/s (median, min, max) of each and the constraint's share of decode time
// (Timings::constrain_s / decode_s: the logits copy, masks, steering and
// bookkeeping of every step, forced ids included).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"
#include "k3/engine/engine.h"
#include "k3/engine/structured.h"

namespace k3::bench {
namespace {

struct StructuredBenchArgs {
  std::string model_dir;
  int tokens = 96;
  int runs = 5;
  int threads = 0;
  std::string vocab_dir;  // also: the decoder alone over this tokenizer's vocabulary
  bool decoder_only = false;
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

// The decoder alone with random logits: per step the logits copy, Prepare
// (mask or forced id), the draw checks and Accept, i.e. everything
// Engine::Generate adds to a step; the draw itself is not counted. `budget`:
// max_tokens of each answer (the steering near its end included), or 0 for an
// answer that never comes near it.
struct DecoderSteps {
  std::vector<double> wall_us, cpu_us;
  std::vector<double> answer_tokens;
  uint64_t ids_hash = 14695981039346656037ull;  // FNV-1a over every answer's ids: equal = the same answers
};
DecoderSteps TimeDecoder(const tok::Tokenizer& tok, const constrain::Vocabulary& vocab,
                         const engine::StructuredOutput& spec, int runs, int tokens, bool budget) {
  const std::vector<int64_t> eos = {int64_t(tok.SpecialIdOrThrow("<|end_of_msg|>"))};
  std::vector<float> logits(tok.vocab_size()), masked;
  DecoderSteps out;
  uint64_t state = 7;
  for (int r = 0; r < runs; ++r) {
    const int64_t max_tokens = budget ? tokens : int64_t{1} << 20;
    engine::StructuredDecoder d(spec, tok, vocab, eos, tok::ChatStreamParser::Start::kResponse, max_tokens);
    model::Sampler sampler(1.0f, 1.0f, 100 + uint64_t(r));
    int i = 0;
    for (; i < tokens; ++i) {
      for (float& x : logits) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x = float(state >> 40) / float(1 << 24) * 8.0f;
      }
      const int64_t left = max_tokens - i;
      const double s0 = NowSeconds(), c0 = ThreadCpuSeconds();
      masked.assign(logits.begin(), logits.end());
      int32_t id = d.Prepare(masked, left);
      double spent = NowSeconds() - s0, cpu = ThreadCpuSeconds() - c0;
      if (id < 0) {
        // As Engine::Generate: a refused draw is masked and drawn again.
        for (int tries = 0;; ++tries) {
          id = sampler.Sample(masked);
          const double s1 = NowSeconds(), c1 = ThreadCpuSeconds();
          const bool ok = d.Allowed(id);
          if (!ok) {
            masked[size_t(id)] = -std::numeric_limits<float>::infinity();
            if (tries == 8) id = d.Fallback();
          }
          spent += NowSeconds() - s1;
          cpu += ThreadCpuSeconds() - c1;
          if (ok || tries == 8) break;
        }
      }
      const double s2 = NowSeconds(), c2 = ThreadCpuSeconds();
      d.Accept(id);
      spent += NowSeconds() - s2;
      cpu += ThreadCpuSeconds() - c2;
      out.ids_hash = (out.ids_hash ^ uint32_t(id)) * 1099511628211ull;
      out.wall_us.push_back(1e6 * spent);
      out.cpu_us.push_back(1e6 * cpu);
      if (eos[0] == id) break;
    }
    out.answer_tokens.push_back(double(std::min(i + 1, tokens)));
  }
  return out;
}

double P99(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, v.size() * 99 / 100)];
}
double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / double(v.size());
}

// Over a (real-size) vocabulary, far from the budget.
void RunVocabBench(const StructuredBenchArgs& a) {
  const tok::Tokenizer tok = tok::Tokenizer::LoadDirOrThrow(a.vocab_dir);
  const double t0 = NowSeconds();
  const constrain::Vocabulary vocab = constrain::Vocabulary::FromTokenizer(tok);
  const double build_s = NowSeconds() - t0;
  engine::StructuredOutput spec;
  spec.response = constrain::Schema::CompileOrThrow(kSchema);
  const DecoderSteps s = TimeDecoder(tok, vocab, spec, a.runs, a.tokens, false);
  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "structured_vocab");
  j.Field("git_sha", SourceRevision());
  j.Field("cpu", CpuModel());
  j.Field("vocab_size", static_cast<int64_t>(tok.vocab_size()));
  j.Field("vocabulary_build_s", build_s);
  j.Field("steps", static_cast<int64_t>(s.wall_us.size()));
  PutSummary(j, "decoder_us_per_step", s.wall_us);
  j.Field("decoder_us_per_step_p99", P99(s.wall_us));
  PutSummary(j, "decoder_cpu_us_per_step", s.cpu_us);
  j.Field("decoder_cpu_us_per_step_p99", P99(s.cpu_us));
  j.Field("decoder_cpu_us_per_step_mean", Mean(s.cpu_us));
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
}

// The model's own vocabulary (or --vocab-dir's) with the real budget
// (max_tokens = --tokens, so short answers lie in the steering window): no
// forward pass, so a profile of it is the decoder's alone.
void RunDecoderBench(const StructuredBenchArgs& a) {
  const tok::Tokenizer tok = tok::Tokenizer::LoadDirOrThrow(a.vocab_dir.empty() ? a.model_dir : a.vocab_dir);
  const constrain::Vocabulary vocab = constrain::Vocabulary::FromTokenizer(tok);
  engine::StructuredOutput json;
  json.response = constrain::Schema::CompileOrThrow(kSchema);
  engine::StructuredOutput call;
  call.tools.push_back({"plan", constrain::Schema::CompileOrThrow(kSchema)});
  call.calls = engine::StructuredOutput::Calls::kRequired;
  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "structured_decoder");
  j.Field("git_sha", SourceRevision());
  j.Field("cpu", CpuModel());
  j.Field("vocab_size", static_cast<int64_t>(tok.vocab_size()));
  j.Field("max_tokens", static_cast<int64_t>(a.tokens));
  j.Field("runs", static_cast<int64_t>(a.runs));
  for (const auto& [name, spec] : {std::pair<const char*, const engine::StructuredOutput*>{"json", &json}, {"call", &call}}) {
    const DecoderSteps s = TimeDecoder(tok, vocab, *spec, a.runs, a.tokens, true);
    const std::string k = name;
    PutSummary(j, k + "_cpu_us_per_step", s.cpu_us);
    j.Field(k + "_cpu_us_per_step_mean", Mean(s.cpu_us));
    j.Field(k + "_cpu_us_per_step_p99", P99(s.cpu_us));
    j.Field(k + "_tokens_median", Median(s.answer_tokens));
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(s.ids_hash));
    j.Field(k + "_ids_fnv", std::string(hash));
  }
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
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
  struct Series {
    std::vector<double> tps, share, us, n;
    void Add(const Run& x) {
      tps.push_back(x.decode_tps);
      share.push_back(x.share);
      us.push_back(x.us_per_token);
      n.push_back(double(x.tokens));
    }
  } free, json_s, call_s;
  for (int r = 0; r < a.runs; ++r) {
    const uint64_t seed = 100 + uint64_t(r);
    // Rotate the order so no kind always follows the same one.
    for (int k = 0; k < 3; ++k) {
      const int kind = (k + r) % 3;
      if (kind == 0) free.Add(Generate(*e, prompt, nullptr, a.tokens, seed));
      if (kind == 1) json_s.Add(Generate(*e, prompt, json, a.tokens, seed));
      if (kind == 2) call_s.Add(Generate(*e, prompt, call, a.tokens, seed));
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
  PutSummary(j, "free_decode_tok_per_s", free.tps);
  j.Field("free_tokens_median", Median(free.n));
  for (const auto& [name, x] : {std::pair<const char*, const Series*>{"json", &json_s}, {"call", &call_s}}) {
    const std::string k = name;
    PutSummary(j, k + "_decode_tok_per_s", x->tps);
    PutSummary(j, k + "_constrain_share", x->share);
    PutSummary(j, k + "_constrain_us_per_token", x->us);
    j.Field(k + "_tokens_median", Median(x->n));
    j.Field("ratio_" + k + "_vs_free_decode", Median(x->tps) / Median(free.tps));
  }
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
  cmd->add_option("--vocab-dir", args->vocab_dir,
                  "also time the decoder alone over this tokenizer directory's vocabulary (needs the XTML specials)");
  cmd->add_flag("--decoder-only", args->decoder_only,
                "only the decoder with random logits (no forward pass) over the model's vocabulary or --vocab-dir's, max_tokens = --tokens");
  cmd->callback([args] {
    if (args->decoder_only) {
      RunDecoderBench(*args);
      return;
    }
    RunStructuredBench(*args);
    if (!args->vocab_dir.empty()) RunVocabBench(*args);
  });
}

K3_REGISTER_BENCH(SetupStructuredBench);

}  // namespace
}  // namespace k3::bench
