// k3-fixture: writes K3-shaped HF snapshots of any size (tiny / small / real-layer)
// and checks any snapshot against its config and the release layout.
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "k3/container/snapshot.h"
#include "k3/core/cli_registry.h"
#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/core/tool.h"
#include "k3/fixture/check.h"
#include "k3/fixture/spec.h"
#include "k3/fixture/writer.h"
#include "k3/model/config.h"
#include "k3/quant/isa_info.h"
#include "k3/toolenv/toolenv.h"

namespace {

int RunCheck(const std::string& dir) {
  const double t0 = k3::NowSeconds();
  k3::Snapshot snapshot = k3::Snapshot::OpenOrThrow(dir);
  const double open_s = k3::NowSeconds() - t0;
  k3::ModelConfig config =
      k3::ModelConfig::ParseOrThrow(snapshot.config_json(), dir + "/config.json");
  k3::fixture::CheckReport r = k3::fixture::CheckSnapshot(snapshot, k3::fixture::DimsFromConfig(config),
                                                          config.bos_token_id, config.eos_token_ids);
  std::printf("snapshot   %s (headers parsed in %.3f s, checked in %.3f s)\n", dir.c_str(), open_s,
              k3::NowSeconds() - t0 - open_s);
  std::printf("prefix     '%s'\n", snapshot.prefix().c_str());
  std::printf("shards     %zu, tensors %zu (text %zu, vision %zu), %s of tensor data\n",
              r.num_shards, r.num_tensors, r.num_text_tensors, r.num_vision_tensors,
              k3::FormatBytes(r.tensor_bytes).c_str());
  std::printf("layers     %" PRId64 " (KDA %" PRId64 ", MLA %" PRId64 ", MoE %" PRId64
              "), hidden %" PRId64 ", vocab %" PRId64 "\n",
              config.num_hidden_layers, r.kda_layers, r.mla_layers, r.moe_layers,
              config.hidden_size, config.vocab_size);
  std::printf("experts    %" PRId64 " per MoE layer, %s, %s\n", r.experts_per_layer,
              k3::FormatBytes(r.expert_bytes).c_str(),
              r.experts_id_ordered ? "id-ordered on disk" : "shuffled on disk (release order)");
  if (r.tokenizer_ranks >= 0) {
    std::printf("tokenizer  %" PRId64 " ranks + 256 specials\n", r.tokenizer_ranks);
  }
  for (const auto& w : r.warnings) std::printf("warning: %s\n", w.c_str());
  for (const auto& p : r.problems) std::printf("PROBLEM: %s\n", p.c_str());
  if (!r.ok()) {
    std::printf("result     INVALID (%zu problems)\n", r.num_problems);
    return k3::ExitCodeFor(k3::ErrorCode::kCorrupt);
  }
  std::printf("result     OK\n");
  return 0;
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"k3-fixture: K3-shaped HF snapshots for tests and benchmarks"};
  k3::cli::InitApp(app, "k3-fixture", k3::quant::KernelsVersionDetail);
  std::string preset_name, out_dir, check_dir;
  uint64_t seed = 0;
  int64_t experts = 0, layers = 0;
  int threads = 0;
  bool force = false, quiet = false;
  app.add_option("--preset", preset_name, "tiny | small | real-layer");
  app.add_option("--out", out_dir, "output directory (created)");
  app.add_option("--seed", seed, "weights and expert order (default 0)");
  app.add_option("--experts", experts, "routed experts per MoE layer (default: preset's)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--layers", layers, "number of layers (default: preset's)")
      ->check(CLI::Range(int64_t{1}, int64_t{128}));
  app.add_option("--threads", threads, "generator threads (default min(4, CPUs))")
      ->check(CLI::Range(0, 256));
  app.add_flag("--force", force, "replace the snapshot in a non-empty --out");
  app.add_flag("-q,--quiet", quiet, "no progress lines");
  CLI::App* check = app.add_subcommand("check", "validate a snapshot; non-zero exit on problems");
  check->add_option("dir", check_dir, "snapshot directory")->required();
  CLI::App* list = app.add_subcommand("presets", "list the presets");
  app.require_subcommand(0, 1);

  // K3_LOG, the kernel variables and the crash hook, before parsing: --version
  // reports the configured kernels, and a bad value is refused before anything
  // is written.
  if (const int rc = k3::toolenv::ApplyFromEnvOrReport("k3-fixture")) return rc;
  try {
    app.parse(argc, argv);
    if (check->parsed()) return RunCheck(check_dir);
    if (list->parsed()) {
      for (const auto& n : k3::fixture::PresetNames()) {
        std::printf("%-11s %s\n", n.c_str(), k3::fixture::PresetOrThrow(n).description.c_str());
      }
      return 0;
    }
    if (preset_name.empty() || out_dir.empty()) {
      throw CLI::RequiredError("--preset and --out (or a subcommand)");
    }
    k3::fixture::Preset preset = k3::fixture::PresetOrThrow(preset_name);
    k3::fixture::OverrideDims(preset, layers, experts);
    k3::fixture::WriteOptions opt;
    opt.seed = seed;
    opt.threads = threads;
    opt.force = force;
    if (!quiet) {
      opt.progress = [](size_t i, size_t n, uint64_t bytes) {
        std::fprintf(stderr, "k3-fixture: shard %zu/%zu written (%s so far)\n", i + 1, n,
                     k3::FormatBytes(bytes).c_str());
      };
    }
    k3::fixture::WriteStats st = k3::fixture::WriteFixtureOrThrow(preset, out_dir, opt);
    std::printf("k3-fixture: %s preset -> %s: %zu shards, %zu tensors, %s in %.2f s (%.0f MB/s)\n",
                preset.name.c_str(), out_dir.c_str(), st.num_shards, st.num_tensors,
                k3::FormatBytes(st.file_bytes).c_str(), st.seconds,
                st.seconds > 0 ? st.file_bytes / st.seconds / 1e6 : 0.0);
  } catch (const CLI::ParseError& e) {
    return k3::cli::UsageExit(app, e);
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "k3-fixture: error: %s\n", e.what());
    return k3::ExitCodeFor(e.code());
  } catch (const std::exception& e) {  // docs/errors.md: any other exception is internal (70)
    std::fprintf(stderr, "k3-fixture: internal error: %s\n", e.what());
    return k3::ExitCodeFor(k3::ErrorCode::kInternal);
  }
  return 0;
}

int main(int argc, char** argv) { return k3::FinishStdout("k3-fixture", Main(argc, argv)); }
