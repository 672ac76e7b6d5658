// k3-bench engine: what lib/engine's Generate() costs over driving the model
// directly. Baseline, measured in the same run on the same loaded model and
// expert store, interleaved run by run: a bare model::Session loop (Forward the
// prompt, then argmax + Forward one token at a time), which is what k3-run
// generate did before the engine. Reports prefill and decode tok/s medians and
// ranges of both, the ratio, and whether both produced the same ids.
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
#include "k3/model/model.h"

namespace k3::bench {
namespace {

struct EngineBenchArgs {
  std::string model_dir;
  int prompt_tokens = 64;
  int decode_tokens = 64;
  int runs = 5;
  int threads = 0;  // 0: every CPU
};

struct Sample {
  double prefill_tps = 0, decode_tps = 0;
  std::vector<int32_t> ids;
};

// The pre-engine loop: prefill, then greedy decode, nothing else.
Sample BareLoop(model::Model& m, const model::RunOptions& ro, const std::vector<int32_t>& prompt,
                int n) {
  model::Session s(m, ro);
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  model::ForwardOutputs out;
  out.logits_last = logits.data();
  Sample r;
  const double t0 = NowSeconds();
  s.Forward(prompt, out);
  const double t1 = NowSeconds();
  r.prefill_tps = static_cast<double>(prompt.size()) / (t1 - t0);
  double t_first = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t id = model::Sampler::Argmax(logits);
    r.ids.push_back(id);
    if (i == 0) t_first = NowSeconds();
    if (i + 1 == n) break;
    s.Forward(std::span<const int32_t>(&id, 1), out);
  }
  const double decode_s = NowSeconds() - t_first;
  r.decode_tps = n > 1 ? static_cast<double>(n - 1) / decode_s : 0;
  return r;
}

Sample EngineRun(engine::Engine& e, const std::vector<int32_t>& prompt, int n) {
  e.ResetSession();  // a full prefill each run, as the baseline does
  engine::GenerateRequest req;
  req.prompt_ids = prompt;
  req.max_tokens = n;
  req.sampling.temperature = 0;
  // Ids only: the engine then only tracks them, the text path costs nothing.
  const engine::GenerateResult g = e.Generate(req);
  Sample r;
  r.prefill_tps = g.timings.prefill_tok_per_s;
  r.decode_tps = g.timings.decode_tok_per_s;
  r.ids = g.ids;
  return r;
}

void RunEngineBench(const EngineBenchArgs& a) {
  if (a.runs < 1 || a.prompt_tokens < 1 || a.decode_tokens < 2) {
    throw Error(ErrorCode::kInvalidArgument, "need --runs >= 1, --prompt-tokens >= 1, --decode-tokens >= 2");
  }
  engine::EngineOptions eo = engine::EngineOptions::FromEnv(a.model_dir);
  eo.progress = false;
  eo.threads = a.threads;
  auto e = engine::Engine::LoadOrThrow(eo);
  // A fixed pseudo-random prompt of ordinary ids (no EOS, so neither side stops early).
  std::vector<int32_t> prompt;
  uint32_t state = 12345;
  const uint32_t ordinary = e->tokenizer() ? e->tokenizer()->num_ranks()
                                           : static_cast<uint32_t>(e->config().vocab_size);
  while (static_cast<int>(prompt.size()) < a.prompt_tokens) {
    state = state * 1103515245u + 12345u;
    prompt.push_back(static_cast<int32_t>((state >> 8) % ordinary));
  }
  // Warm-up: fills the expert cache for both sides.
  EngineRun(*e, prompt, a.decode_tokens);
  BareLoop(e->model(), eo.run, prompt, a.decode_tokens);
  std::vector<double> ep, ed, bp, bd;
  bool same = true;
  for (int r = 0; r < a.runs; ++r) {
    // Alternate which side goes first, so neither always inherits the other's
    // cache and frequency state.
    Sample b, g;
    if (r % 2 == 0) {
      b = BareLoop(e->model(), eo.run, prompt, a.decode_tokens);
      g = EngineRun(*e, prompt, a.decode_tokens);
    } else {
      g = EngineRun(*e, prompt, a.decode_tokens);
      b = BareLoop(e->model(), eo.run, prompt, a.decode_tokens);
    }
    // Engine ids end at an EOS the bare loop runs past: compare the common part.
    same = same && std::equal(g.ids.begin(), g.ids.end(), b.ids.begin());
    bp.push_back(b.prefill_tps);
    bd.push_back(b.decode_tps);
    ep.push_back(g.prefill_tps);
    ed.push_back(g.decode_tps);
  }
  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "engine");
  j.Field("git_sha", SourceRevision());
  j.Field("cpu", CpuModel());
  j.Field("threads", static_cast<int64_t>(a.threads > 0 ? a.threads : NumOnlineCpus()));
  j.Field("runs", static_cast<int64_t>(a.runs));
  j.Field("prompt_tokens", static_cast<int64_t>(a.prompt_tokens));
  j.Field("decode_tokens", static_cast<int64_t>(a.decode_tokens));
  PutSummary(j, "engine_prefill_tok_per_s", ep);
  PutSummary(j, "engine_decode_tok_per_s", ed);
  PutSummary(j, "bare_prefill_tok_per_s", bp);
  PutSummary(j, "bare_decode_tok_per_s", bd);
  j.Field("ratio_prefill_engine_vs_bare", Median(ep) / Median(bp));
  j.Field("ratio_decode_engine_vs_bare", Median(ed) / Median(bd));
  j.Field("same_ids", same);
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
}

void SetupEngineBench(CLI::App& root) {
  auto args = std::make_shared<EngineBenchArgs>();
  CLI::App* cmd = root.add_subcommand(
      "engine", "Engine::Generate vs a bare Session loop on the same model (prefill, decode tok/s)");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container directory")->required();
  cmd->add_option("--prompt-tokens", args->prompt_tokens, "prompt length (default 64)");
  cmd->add_option("--decode-tokens", args->decode_tokens, "tokens generated per run (default 64)");
  cmd->add_option("--runs", args->runs, "timed runs of each side, interleaved (default 5)");
  cmd->add_option("--threads", args->threads, "compute threads (default: every CPU)")
      ->check(CLI::Range(1, 1024));
  cmd->callback([args] { RunEngineBench(*args); });
}

K3_REGISTER_BENCH(SetupEngineBench);

}  // namespace
}  // namespace k3::bench
