// k3-run generate: prefill a prompt, then sample tokens one at a time, with
// optional logits/trace dumps for validation against the oracle (docs/model.md).
#include <cstdio>
#include <span>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/engine/engine.h"
#include "k3/model/model.h"
#include "k3/stream/streaming_store.h"
#include "k3/tokenizer/tokenizer.h"
#if K3_HAVE_VULKAN
#include "k3/vulkan/dense.h"
#include "k3/vulkan/tier.h"
#endif

namespace k3::run {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt;
  std::string ids_csv;
  int64_t ngen = 32;
  RuntimeFlags flags;  // greedy by default
  std::string logits_path;
  std::string trace_path;
  bool json = false;
  bool no_bos = false;
  ClusterFlags cluster;
};

void WriteFloats(const std::string& path, const std::vector<float>& v) {
  AtomicFileWriter w(path);
  w.Write(std::as_bytes(std::span(v)));
  w.Commit();
}

void RunGenerate(const GenerateArgs& args) {
  // A malformed --ids is refused before the model loads (minutes for K3).
  std::vector<int32_t> ids;
  if (!args.ids_csv.empty()) {
    if (!args.prompt.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "give either PROMPT or --ids, not both");
    }
    ids = ParseIdList(args.ids_csv);
  }
  engine::EngineOptions eo = EngineOptionsFor(args.model_dir, args.flags);
  if (RunClusterRole(args.cluster, eo, /*stop_handler=*/true)) return;  // a worker rank
  std::unique_ptr<engine::Engine> eng = engine::Engine::LoadOrThrow(eo);
  cluster::ClusterExecutor* cl = ClusterOf(*eng);
  const ModelConfig& c = eng->config();
#if K3_HAVE_VULKAN
  // The tier EngineOptionsFor's hook installed when K3_VK=1 (docs/vulkan.md).
  const vulkan::VulkanTier* vk = vulkan::InstalledTier(eng->model());
  const vulkan::DenseTier* vk_dense = vulkan::InstalledDense(eng->model());
#endif
  // The tokenizer is optional with --ids (a container may not ship tiktoken.model).
  const tok::Tokenizer* tokenizer = eng->tokenizer();
  if (args.ids_csv.empty()) {
    if (!tokenizer) {
      throw Error(ErrorCode::kNotFound,
                  "a text PROMPT needs tiktoken.model in the model directory; use --ids",
                  args.model_dir);
    }
    // BOS is the caller's job (spec §5.1): prepend the config's, if any.
    if (c.bos_token_id >= 0 && !args.no_bos) ids.push_back(static_cast<int32_t>(c.bos_token_id));
    for (tok::TokenId id : tokenizer->Encode(args.prompt, false)) {
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  if (ids.empty()) throw Error(ErrorCode::kInvalidArgument, "empty prompt");
  if (!eng->model().weights().has_head && (args.ngen > 0 || !args.logits_path.empty())) {
    throw Error(ErrorCode::kUnsupported,
                "model has no head (model.norm.weight missing): only --trace with --ngen 0 works");
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  const int64_t limit = eng->context_limit();
  if (T < limit && args.ngen > limit - T) {
    K3_LOG_WARN("prompt %lld + --ngen %lld = %lld tokens exceeds the context length %lld "
                "(max_position_embeddings or K3_MAXT): generation stops after %lld tokens",
                static_cast<long long>(T), static_cast<long long>(args.ngen),
                static_cast<long long>(T + args.ngen), static_cast<long long>(limit),
                static_cast<long long>(limit - T));
  }

  const size_t V = static_cast<size_t>(c.vocab_size);
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t L = static_cast<size_t>(c.num_hidden_layers);
  std::vector<float> logits_all, trace;
  model::ForwardOutputs dumps;
  if (!args.logits_path.empty()) {
    logits_all.resize(static_cast<size_t>(T) * V);
    dumps.logits_all = logits_all.data();
  }
  if (!args.trace_path.empty()) {
    trace.resize(static_cast<size_t>(T) * L * D);
    dumps.trace = trace.data();
  }

  engine::GenerateRequest req;
  req.prompt_ids = ids;
  req.max_tokens = args.ngen;
  req.prefill_only = args.ngen == 0;
  req.sampling = {args.flags.temperature, args.flags.top_p, args.flags.seed};
  if (dumps.logits_all || dumps.trace) req.prefill_outputs = &dumps;
  const bool print_text = tokenizer && !args.json;
  engine::Callbacks cb;
  PrefillProgressLine progress(args.flags);
  cb.on_prefill = [&](const engine::PrefillProgress& p) { return progress.Update(p); };
  cb.on_delta = [&](const engine::Delta& d) {
    progress.Clear();
    if (print_text) {
      std::fwrite(d.content.data(), 1, d.content.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  const engine::GenerateResult r = [&] {
    try {
      return eng->Generate(req, cb);
    } catch (const Error& e) {
      OnClusterLoss(*eng, e);
      throw;
    }
  }();
  progress.Clear();
  if (!args.logits_path.empty()) WriteFloats(args.logits_path, logits_all);
  if (!args.trace_path.empty()) WriteFloats(args.trace_path, trace);
  // A clean end: the checkpoints of this prompt go to --ckpt-dir (when set),
  // so that a rerun or a longer prompt with the same start resumes from them.
  eng->ParkCheckpoints();
  const std::vector<int32_t>& generated = r.ids;
  if (print_text && !generated.empty()) std::fputc('\n', stdout);

  const double load_s = eng->model().load_seconds();
  const int64_t decode_steps = generated.empty() ? 0 : static_cast<int64_t>(generated.size()) - 1;
  const double decode_spt = decode_steps > 0 ? r.timings.decode_s / static_cast<double>(decode_steps) : 0;
  const model::ExpertStoreStats& es = r.experts;
  if (args.json) {
    JsonWriter j;
    j.BeginObject();
    j.Key("prompt_ids").BeginArray();
    for (int32_t id : ids) j.Int(id);
    j.EndArray();
    j.Key("generated_ids").BeginArray();
    for (int32_t id : generated) j.Int(id);
    j.EndArray();
    if (tokenizer) {
      std::vector<tok::TokenId> g(generated.begin(), generated.end());
      j.Field("text", tok::SanitizeUtf8(tokenizer->Decode(g)));
    }
    j.Field("finish_reason", std::string(engine::FinishReasonName(r.finish)));
    j.Key("stats").BeginObject();
    j.Field("load_s", load_s);
    j.Field("prefill_tokens", T);
    j.Field("prefill_s", r.timings.prefill_s);
    j.Field("prefill_tok_per_s", r.timings.prefill_tok_per_s);
    j.Field("decode_steps", decode_steps);
    j.Field("decode_s_per_token", decode_spt);
    j.Field("cached_tokens", r.usage.cached_tokens);
    j.Field("expert_bytes_read", es.bytes_read);
    j.Field("expert_hits", es.hits);
    j.Field("expert_misses", es.misses);
    j.Field("expert_hit_rate", es.hit_rate());
    // Distinct (layer, expert) pairs this request routed to that no earlier one
    // of the process had: one pass over them is the least the disk must read.
    j.Field("experts_distinct_routed", es.distinct_routed);
    j.Field("peak_rss_bytes", PeakRssBytes());
    j.Field("idot", eo.run.idot);
    j.Field("chunk", static_cast<int64_t>(eo.run.chunk));
    j.Field("prefill_window", r.timings.prefill_window);
    j.Field("prefill_windows", r.timings.prefill_windows);
    j.Field("prefill_expert_bytes", r.timings.prefill_expert_bytes);
    j.Field("prefill_budget_bytes", eng->options().run.prefill_budget_bytes);
    stream::WriteStreamStatsJson(
        eng->streaming(),
        static_cast<uint64_t>(T) * static_cast<uint64_t>(c.num_experts_per_token) *
            static_cast<uint64_t>(c.num_moe_layers()),
        static_cast<size_t>(r.prefill_steps), j);
#if K3_HAVE_VULKAN
    vulkan::WriteTierStatsJson(vk, j);
    vulkan::WriteDenseStatsJson(vk_dense, static_cast<uint64_t>(T + decode_steps), j);
#endif
    if (cl) cluster::WriteClusterStatsJson(cl->stats(), j);
    j.EndObject();
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
  } else if (!tokenizer) {
    std::string line;
    for (int32_t id : generated) line += (line.empty() ? "" : ",") + std::to_string(id);
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);  // the text must land before the stats line on a shared terminal
  if (args.flags.quiet) return;
  std::fprintf(
      stderr,
      "k3-run: load %.2f s | prefill %lld tok, %.2f tok/s | decode %lld steps, %.4f s/token | "
      "experts read %s, hit rate %.1f%% | peak RSS %s\n",
      load_s, static_cast<long long>(T), r.timings.prefill_tok_per_s,
      static_cast<long long>(decode_steps), decode_spt, FormatBytes(es.bytes_read).c_str(),
      100.0 * es.hit_rate(), FormatBytes(PeakRssBytes()).c_str());
#if K3_HAVE_VULKAN
  vulkan::LogTierSummary(vk);
  vulkan::LogDenseSummary(vk_dense, static_cast<uint64_t>(T + decode_steps));
#endif
  if (cl) std::fprintf(stderr, "k3-run: %s\n", cluster::DescribeClusterStats(cl->stats()).c_str());
}

void SetupGenerate(CLI::App& root) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd =
      root.add_subcommand("generate", "Prefill a prompt and generate tokens (greedy by default)");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container directory")->required();
  cmd->add_option("PROMPT", args->prompt, "prompt text (BOS is prepended)");
  cmd->add_option("--ids", args->ids_csv, "prompt as token ids, e.g. 1,2,3 (no BOS added)");
  cmd->add_option("--ngen", args->ngen,
                  "tokens to generate (default 32; stops at the model's context length)")
      ->check(CLI::NonNegativeNumber);
  AddRuntimeFlags(cmd, args->flags, "0", "1");
  cmd->add_option("--logits", args->logits_path, "write f32 LE [T][vocab] prompt logits here");
  cmd->add_option("--trace", args->trace_path,
                  "write f32 LE [T][layers][hidden] layer outputs here");
  cmd->add_flag("--json", args->json, "print one JSON object with ids and stats at the end");
  cmd->add_flag("--no-bos", args->no_bos, "do not prepend BOS to a text PROMPT");
  AddClusterFlags(cmd, args->cluster);
  cmd->callback([args] { RunGenerate(*args); });
}

K3_REGISTER_COMMAND(SetupGenerate);

}  // namespace
}  // namespace k3::run
