// Argument parsing shared by k3-run subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "k3/cluster/cluster.h"
#include "k3/core/error.h"
#include "k3/engine/engine.h"

namespace k3::run {

// Parses a list of token ids separated by commas and/or spaces ("1,2 3",
// "1, 2"). An item that is not a decimal in [0, INT32_MAX], or an empty item
// ("1,,2", a leading or trailing comma), throws Error(kInvalidArgument) naming
// --ids and the item's position.
std::vector<int32_t> ParseIdList(const std::string& csv);

// The flags generate and chat share: sampling, threads, quiet.
struct RuntimeFlags {
  float temperature = 0.0f;
  float top_p = 1.0f;
  uint64_t seed = 1;
  int threads = 0;  // 0: every CPU
  bool quiet = false;
  // Checkpoints (docs/checkpoints.md): --ckpt-slots, --ckpt-dir, --ckpt-disk-gb, --ckpt-every.
  int64_t ckpt_slots = -1;  // -1: sized from free memory; 0: off
  std::string ckpt_dir;
  double ckpt_disk_gb = 50.0;
  int64_t ckpt_every = 1024;
  // --prefill-mem-gb: the prefill window budget, GB; < 0: K3_PREFILL_GB or from MemAvailable.
  double prefill_mem_gb = -1;
  // The prefill progress line on stderr: -1 when stderr is a TTY (and not
  // --quiet), 1 --progress, 0 --no-progress.
  int progress_line = -1;
};
// Adds --temp, --top-p, --seed, --threads, --quiet and the --ckpt-* flags with range checks;
// `temp_default` / `top_p_default` are only named in the help text.
void AddRuntimeFlags(CLI::App* cmd, RuntimeFlags& flags, const std::string& temp_default,
                     const std::string& top_p_default);
// Only the --ckpt-* flags (into flags.ckpt_*): the one definition that
// generate, chat (through AddRuntimeFlags) and serve share.
void AddCheckpointFlags(CLI::App* cmd, RuntimeFlags& flags);
// --prefill-mem-gb (generate, chat and serve).
void AddPrefillFlags(CLI::App* cmd, RuntimeFlags& flags);
// EngineOptions::FromEnv plus the flags (threads, quiet, checkpoints, prefill budget).
engine::EngineOptions EngineOptionsFor(const std::string& model_dir, const RuntimeFlags& flags);

// The `prefill 4096/16384 tokens · layer 41/93 · 12.3 GB read · 310 tok/s · ETA 0:52`
// line: one line, rewritten in place with \r at most every 0.2 s,
// on stderr; cleared by Clear() (before output follows, and at the end).
class PrefillProgressLine {
 public:
  // Enabled when flags.progress_line says 1, or -1 with stderr a TTY and not --quiet.
  explicit PrefillProgressLine(const RuntimeFlags& flags);
  ~PrefillProgressLine() { Clear(); }
  // For Callbacks::on_prefill: draws (throttled) and returns true.
  bool Update(const engine::PrefillProgress& p);
  void Clear();
  static std::string Format(const engine::PrefillProgress& p);

 private:
  bool enabled_ = false;
  bool tty_ = false;
  bool shown_ = false;
  double last_draw_ = -1;
  size_t last_len_ = 0;
};
// --cluster and its options (docs/cluster.md): generate, chat and serve.
struct ClusterFlags {
  bool on = false;
  cluster::ClusterOptions options;
  // This rank's capacity: a number, or "auto" (measured at start); "0" on
  // every rank: equal shares.
  std::string ram_gb = "0";
  std::string disk_gbps = "0";
};
void AddClusterFlags(CLI::App* cmd, ClusterFlags& flags);
// With --cluster: starts MPI. A worker rank serves the coordinator until its
// BYE and returns true (the command is done). Rank 0 returns false with the
// coordinator's install chained into eo.on_model_loaded. Without --cluster:
// false, nothing changed.
bool RunClusterRole(const ClusterFlags& flags, engine::EngineOptions& eo, bool stop_handler);
// The coordinator installed in the engine's model, or null.
cluster::ClusterExecutor* ClusterOf(engine::Engine& engine);
// A request failed because a cluster worker was lost (kUnavailable): park the
// checkpoints (a restarted job resumes from them) and say so; the caller
// rethrows, which ends the process with exit 75 (docs/cluster.md).
void OnClusterLoss(engine::Engine& engine, const Error& e);
// After a lost worker: the process must not wait in MPI_Finalize.
void AbandonCluster();

}  // namespace k3::run
