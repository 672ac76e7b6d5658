// The k3 container directory (docs/container.md): shard file names, the index
// rebuilt from the shards present, the fingerprint of a conversion run, and the
// lock that serialises updates of the shared files between concurrent passes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "k3/repack/classify.h"

namespace k3::repack {

inline constexpr std::string_view kIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kFingerprintName = "k3-repack.fingerprint.json";
inline constexpr std::string_view kLockName = ".k3-repack.lock";
// Per output shard, the XXH3-128 of the source bytes it was converted from
// (its kept tensors in output order, as read): "<32 hex>  <shard name>" lines,
// sorted. Not file checksums (xxhsum cannot check them): --recheck re-reads
// the source and compares, so a source that changed after (or while) a shard
// was converted is found and the shard converted again (docs/repack.md).
inline constexpr std::string_view kSourcesName = "k3-repack.sources";

// Non-weight files a runtime needs, copied verbatim when the source has them.
inline constexpr std::string_view kMetadataFiles[] = {
    "config.json",    "generation_config.json", "tokenizer_config.json",
    "tiktoken.model", "tokenizer.json",         "encoding_k3.py",
};

// "model-00003-of-000094.safetensors" -> {3, 94}. Digits: 5 and 6 as released,
// but any count of digits is accepted so other snapshots parse too.
struct ShardName {
  int64_t number = 0;
  int64_t total = 0;
};
std::optional<ShardName> ParseShardName(std::string_view file_name);
std::string FormatShardName(int64_t number, int64_t total);

// Output shard files in `dir`, sorted by name. Temp files are never listed.
std::vector<std::string> ListShardFiles(const std::string& dir);

// What an index rebuild produced.
struct IndexSummary {
  size_t num_shards = 0;
  size_t num_tensors = 0;
  uint64_t total_size = 0;  // sum of tensor bytes over all shards
};

// Renders the index (2-space indented JSON, weight_map sorted by tensor name)
// from the shards in `dir`. Every shard is opened and validated; a tensor in two
// shards, an invalid shard or mixed "-of-N" totals throw and nothing is written.
std::string BuildIndexJson(const std::string& dir, IndexSummary* summary);

// BuildIndexJson, then publish atomically (tmp -> fsync -> rename -> fsync dir).
// The caller holds the ContainerLock.
IndexSummary RebuildIndex(const std::string& dir);

// Exclusive advisory lock on DST/.k3-repack.lock (fcntl, so it also works over
// NFS with lockd/NFSv4). Blocks until acquired; released on destruction.
class ContainerLock {
 public:
  explicit ContainerLock(const std::string& dst_dir);
  ~ContainerLock();
  ContainerLock(const ContainerLock&) = delete;
  ContainerLock& operator=(const ContainerLock&) = delete;

 private:
  struct Impl;
  Impl* impl_;
};

// The conversion parameters and the source identity a container was made from.
// Rendered as one deterministic compact JSON line; no paths, no times, so every
// host converting the same snapshot with the same flags writes the same bytes.
struct Fingerprint {
  QuantBits bits;
  int64_t output_shards = 0;        // NNNNNN
  std::string source_index_xxh128;  // hash of the source index file ("" if none)
  struct SourceShard {
    std::string name;
    uint64_t size = 0;
    std::string header_xxh128;  // hash of the 8-byte length + JSON header
  };
  std::vector<SourceShard> source_shards;

  std::string Render() const;
  static Fingerprint ParseOrThrow(std::string_view text, const std::string& path);
  // Empty when equal; otherwise a sentence saying what differs.
  std::string Difference(const Fingerprint& wanted) const;
};

}  // namespace k3::repack
