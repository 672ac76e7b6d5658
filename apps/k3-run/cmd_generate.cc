// k3-run generate: prefill a prompt, then sample tokens one at a time, with
// optional logits/trace dumps for validation against the oracle (docs/model.md).
#include <cstdio>
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
#include "k3/model/model.h"
#include "k3/stream/streaming_store.h"
#include "k3/tokenizer/tokenizer.h"
#if K3_HAVE_VULKAN
#include "k3/vulkan/tier.h"
#endif

namespace k3::run {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt;
  std::string ids_csv;
  int ngen = 32;
  float temperature = 0.0f;
  float top_p = 1.0f;
  uint64_t seed = 1;
  std::string logits_path;
  std::string trace_path;
  bool json = false;
  bool no_bos = false;
};

void WriteFloats(const std::string& path, const std::vector<float>& v) {
  AtomicFileWriter w(path);
  w.Write(std::as_bytes(std::span(v)));
  w.Commit();
}

void RunGenerate(const GenerateArgs& args) {
  model::LoadOptions lo = model::LoadOptions::FromEnv();
  model::RunOptions ro = model::RunOptions::FromEnv();
  Snapshot::Options so;
  if (auto dirs = GetEnv("K3_DIRS")) so.extra_dirs = SplitDirList(*dirs);
  std::unique_ptr<model::Model> m = model::Model::LoadOrThrow(args.model_dir, lo, so);
  const ModelConfig& c = m->config();
  // Routed experts: io_uring streaming store sized by K3_EXPERT_GB or the machine.
  stream::StreamingExpertStore& streaming = stream::InstallStreamingStoreFromEnv(*m);
#if K3_HAVE_VULKAN
  // Routed experts on a Vulkan device when K3_VK=1 (docs/vulkan.md).
  const vulkan::VulkanTier* vk = vulkan::InstallTier(*m, vulkan::TierOptions::FromEnv());
#endif

  // The tokenizer is optional with --ids (a container may not ship tiktoken.model).
  std::optional<tok::Tokenizer> tokenizer;
  if (PathExists(JoinPath(args.model_dir, "tiktoken.model"))) {
    tokenizer.emplace(tok::Tokenizer::LoadDirOrThrow(args.model_dir));
  }
  std::vector<int32_t> ids;
  if (!args.ids_csv.empty()) {
    if (!args.prompt.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "give either PROMPT or --ids, not both");
    }
    ids = ParseIdList(args.ids_csv);
  } else {
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
  for (int32_t id : ids) {
    if (id >= c.vocab_size) {
      throw Error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                   " outside the vocabulary [0, " +
                                                   std::to_string(c.vocab_size) + ")");
    }
  }
  if (!m->weights().has_head && (args.ngen > 0 || !args.logits_path.empty())) {
    throw Error(ErrorCode::kUnsupported,
                "model has no head (model.norm.weight missing): only --trace with --ngen 0 works");
  }

  const size_t T = ids.size();
  const size_t V = static_cast<size_t>(c.vocab_size);
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t L = static_cast<size_t>(c.num_hidden_layers);
  const int64_t max_t = GetEnvInt("K3_MAXT", static_cast<int64_t>(T) + std::max(args.ngen, 0));
  model::Session session(*m, ro, max_t);
  std::vector<float> logits_all, trace, last(V);
  model::ForwardOutputs out;
  if (!args.logits_path.empty()) {
    logits_all.resize(T * V);
    out.logits_all = logits_all.data();
  }
  if (!args.trace_path.empty()) {
    trace.resize(T * L * D);
    out.trace = trace.data();
  }
  if (m->weights().has_head) out.logits_last = last.data();

  const double t_prefill = NowSeconds();
  session.Forward(ids, out);
  const double prefill_s = NowSeconds() - t_prefill;
  if (!args.logits_path.empty()) WriteFloats(args.logits_path, logits_all);
  if (!args.trace_path.empty()) WriteFloats(args.trace_path, trace);

  model::Sampler sampler(args.temperature, args.top_p, args.seed);
  tok::Utf8StreamDecoder utf8;
  std::vector<int32_t> generated;
  const double t_decode = NowSeconds();
  int decode_steps = 0;
  for (int i = 0; i < args.ngen; ++i) {
    int32_t id = sampler.Sample(last);
    generated.push_back(id);
    if (tokenizer && !args.json) {
      std::string text = utf8.Push(tokenizer->TokenBytes(static_cast<tok::TokenId>(id)));
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    bool eos = false;
    for (int64_t e : c.eos_token_ids) eos |= e == id;
    if (eos || i + 1 == args.ngen) break;
    model::ForwardOutputs step;
    step.logits_last = last.data();
    session.Forward(std::span<const int32_t>(&id, 1), step);
    ++decode_steps;
  }
  const double decode_s = NowSeconds() - t_decode;
  if (tokenizer && !args.json) {
    std::string rest = utf8.Flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    if (!generated.empty()) std::fputc('\n', stdout);
  }

  model::ExpertStoreStats es = m->experts().stats();
  const double prefill_tps = prefill_s > 0 ? static_cast<double>(T) / prefill_s : 0;
  const double decode_spt = decode_steps > 0 ? decode_s / decode_steps : 0;
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
    j.Key("stats").BeginObject();
    j.Field("load_s", m->load_seconds());
    j.Field("prefill_tokens", static_cast<int64_t>(T));
    j.Field("prefill_s", prefill_s);
    j.Field("prefill_tok_per_s", prefill_tps);
    j.Field("decode_steps", static_cast<int64_t>(decode_steps));
    j.Field("decode_s_per_token", decode_spt);
    j.Field("expert_bytes_read", es.bytes_read);
    j.Field("expert_hits", es.hits);
    j.Field("expert_misses", es.misses);
    j.Field("expert_hit_rate", es.hit_rate());
    j.Field("peak_rss_bytes", PeakRssBytes());
    j.Field("idot", ro.idot);
    j.Field("chunk", static_cast<int64_t>(ro.chunk));
    stream::WriteStreamStatsJson(
        streaming,
        static_cast<uint64_t>(T) * static_cast<uint64_t>(c.num_experts_per_token) *
            static_cast<uint64_t>(c.num_moe_layers()),
        (T + static_cast<size_t>(ro.chunk) - 1) / static_cast<size_t>(ro.chunk), j);
#if K3_HAVE_VULKAN
    vulkan::WriteTierStatsJson(vk, j);
#endif
    j.EndObject();
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
  } else if (!tokenizer) {
    std::string line;
    for (int32_t id : generated) line += (line.empty() ? "" : ",") + std::to_string(id);
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);  // the text must land before the stats line on a shared terminal
  std::fprintf(
      stderr,
      "k3-run: load %.2f s | prefill %zu tok, %.2f tok/s | decode %d steps, %.4f s/token | "
      "experts read %s, hit rate %.1f%% | peak RSS %s\n",
      m->load_seconds(), T, prefill_tps, decode_steps, decode_spt,
      FormatBytes(es.bytes_read).c_str(), 100.0 * es.hit_rate(),
      FormatBytes(PeakRssBytes()).c_str());
#if K3_HAVE_VULKAN
  vulkan::LogTierSummary(vk);
#endif
}

void SetupGenerate(CLI::App& root) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd =
      root.add_subcommand("generate", "Prefill a prompt and generate tokens (greedy by default)");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container directory")->required();
  cmd->add_option("PROMPT", args->prompt, "prompt text (BOS is prepended)");
  cmd->add_option("--ids", args->ids_csv, "prompt as token ids, e.g. 1,2,3 (no BOS added)");
  cmd->add_option("--ngen", args->ngen, "tokens to generate (default 32)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temp", args->temperature, "temperature; <= 0 is greedy (default 0)");
  cmd->add_option("--top-p", args->top_p, "nucleus mass in (0, 1] (default 1)");
  cmd->add_option("--seed", args->seed, "sampling seed (default 1)");
  cmd->add_option("--logits", args->logits_path, "write f32 LE [T][vocab] prompt logits here");
  cmd->add_option("--trace", args->trace_path,
                  "write f32 LE [T][layers][hidden] layer outputs here");
  cmd->add_flag("--json", args->json, "print one JSON object with ids and stats at the end");
  cmd->add_flag("--no-bos", args->no_bos, "do not prepend BOS to a text PROMPT");
  cmd->callback([args] { RunGenerate(*args); });
}

K3_REGISTER_COMMAND(SetupGenerate);

}  // namespace
}  // namespace k3::run
