// Argument parsing shared by k3-run subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace k3::run
