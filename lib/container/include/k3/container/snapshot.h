// A model directory: an HF snapshot or a k3 container (same layout: config.json,
// model.safetensors.index.json, shards). Opens and validates every shard header
// once, and resolves any tensor name to its shard and absolute byte offset.
//
// Index rules: every shard the index names must exist (in the directory or one of
// the extra directories, searched by basename) and hold exactly the tensors the
// index maps to it; shard names that would leave the directory are refused.
// Without an index, all *.safetensors files in the directory are used.
// Thread-safe for concurrent lookups and reads after construction.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "k3/container/safetensors.h"

namespace k3 {

struct TensorRef {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
  size_t shard_idx = 0;
  uint64_t offset = 0;  // absolute byte offset of the tensor data in its file
};

class Snapshot {
 public:
  struct Options {
    // Further directories searched for shards (K3_DIRS); first occurrence of a
    // basename wins. Metadata (config, tokenizer) always comes from the main dir.
    std::vector<std::string> extra_dirs;
  };

  static Snapshot OpenOrThrow(const std::string& dir, const Options& options);
  static Snapshot OpenOrThrow(const std::string& dir) { return OpenOrThrow(dir, Options{}); }
  Snapshot(Snapshot&&) noexcept = default;
  Snapshot& operator=(Snapshot&&) noexcept = default;

  const std::string& dir() const { return dir_; }
  // Raw text of config.json (parse with lib/model's ModelConfig).
  const std::string& config_json() const { return config_json_; }
  // "language_model." for the release layout, "" for plain text-only checkpoints.
  const std::string& prefix() const { return prefix_; }
  bool has_index() const { return has_index_; }
  // total_size from the index metadata, if any.
  std::optional<uint64_t> index_total_size() const { return index_total_size_; }

  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  size_t num_tensors() const { return by_name_.size(); }

  // Exact full name (with prefix).
  std::optional<TensorRef> FindExact(std::string_view full_name) const;
  // Name without the prefix (e.g. "model.norm.weight").
  std::optional<TensorRef> Find(std::string_view name) const;
  // Throws kNotFound naming the tensor and, where the index mentions it, its shard.
  TensorRef FindOrThrow(std::string_view name) const;

  // Like FindOrThrow, but also checks dtype and shape; errors name expected vs found.
  TensorRef FindCheckedOrThrow(std::string_view name, const std::vector<DType>& dtypes,
                               const std::vector<int64_t>& shape) const;

  // Reads a float tensor (BF16/F16/F32) as f32.
  std::vector<float> ReadF32OrThrow(std::string_view name) const;

 private:
  Snapshot() = default;
  std::string dir_;
  std::string config_json_;
  std::string prefix_;
  bool has_index_ = false;
  std::optional<uint64_t> index_total_size_;
  std::vector<SafetensorsFile> shards_;
  // Keys view TensorInfo::name inside shards_, which is never reallocated after
  // opening (moving a Snapshot moves the vector's buffer, not its elements).
  std::unordered_map<std::string_view, TensorRef> by_name_;
};

// Path of `basename` in `dir` or the first extra dir holding it; empty if none.
std::string FindShardPath(const std::string& dir, const std::vector<std::string>& extra_dirs,
                          const std::string& basename);

// Parses K3_DIRS-style lists ("a;b, c").
std::vector<std::string> SplitDirList(std::string_view list);

}  // namespace k3
