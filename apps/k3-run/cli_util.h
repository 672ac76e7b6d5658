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
  // Checkpoints (issue 13): --ckpt-slots, --ckpt-dir, --ckpt-disk-gb, --ckpt-every.
  int64_t ckpt_slots = -1;  // -1: sized from free memory; 0: off
  std::string ckpt_dir;
  double ckpt_disk_gb = 50.0;
  int64_t ckpt_every = 1024;
};
// Adds --temp, --top-p, --seed, --threads, --quiet and the --ckpt-* flags with range checks;
// `temp_default` / `top_p_default` are only named in the help text.
void AddRuntimeFlags(CLI::App* cmd, RuntimeFlags& flags, const std::string& temp_default,
                     const std::string& top_p_default);
// Only the --ckpt-* flags (into flags.ckpt_*): the one definition that
// generate, chat (through AddRuntimeFlags) and serve share.
void AddCheckpointFlags(CLI::App* cmd, RuntimeFlags& flags);
// EngineOptions::FromEnv plus the flags (threads, quiet, checkpoints).
engine::EngineOptions EngineOptionsFor(const std::string& model_dir, const RuntimeFlags& flags);

// --cluster and its options (docs/cluster.md): generate, chat and serve.
struct ClusterFlags {
  bool on = false;
  cluster::ClusterOptions options;
  double ram_gb = 0;  // this rank's capacity; 0 on every rank: equal shares
  double disk_gbps = 0;
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
