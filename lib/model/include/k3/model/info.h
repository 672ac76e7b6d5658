// What a model directory is, for `k3-run info`: an HF snapshot or a k3
// container (complete or not), its shards and sizes, quantization, experts,
// tokenizer, fingerprint, and the memory a run would hold. Reads headers and
// small files only (no tensor data). Plain value; thread-safe once built.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "k3/model/config.h"

namespace k3 {

struct ModelInfo {
  std::string dir;
  std::string kind;    // "container" (k3-repack output) or "snapshot" (HF)
  std::string status;  // "complete", or why it cannot be run as is
  size_t shards = 0;
  size_t tensors = 0;
  uint64_t file_bytes = 0;    // the shard files
  uint64_t tensor_bytes = 0;  // their tensor data
  std::string prefix;         // "language_model." or ""
  std::optional<ModelConfig> config;
  std::string weights;  // "int8 (bits 8, mla-bits 8, head-bits 8)", "bf16 (not quantized)", ...
  int64_t output_shards = -1;           // the fingerprint's; -1 without one
  int64_t fingerprint_source_shards = -1;
  int64_t experts = 0;                  // routed experts stored, all layers
  uint64_t expert_bytes = 0;
  uint64_t resident_bytes = 0;          // every other tensor: held in memory for a run
  uint64_t expert_cache_bytes = 0;      // the budget given (K3_EXPERT_GB)
  int64_t tokenizer_ranks = -1;         // tiktoken.model lines; -1 without one
  bool has_tokenizer_config = false;

  // Resident weights plus the expert cache (capped at what the experts take).
  uint64_t projected_bytes() const;
};

// Throws k3::Error only when `dir` is not a model directory at all.
ModelInfo DescribeModelOrThrow(const std::string& dir, uint64_t expert_cache_bytes);

// Human-readable lines, or one JSON object (json = true), newline-terminated.
std::string RenderModelInfo(const ModelInfo& info, bool json);

}  // namespace k3
