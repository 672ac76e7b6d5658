// k3-repack: converts an HF snapshot into a k3 container (spec §7, docs/repack.md).
// One streaming read of each source shard; experts copied byte for byte in id
// order, the big BF16 matrices quantized with lib/quant (§6.2), the rest passed
// through. Every output file is published atomically; reruns resume, disjoint
// concurrent passes (several hosts, one NFS directory) are safe.
//
// RunRepack throws k3::Error on the first failure (cold path; shards being
// converted by other streams are finished, no new one is started); the observer
// sees events on the calling thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "k3/repack/classify.h"

namespace k3::repack {

struct RepackOptions {
  std::string src;
  std::string dst;
  QuantBits bits;
  std::vector<int64_t> shards;  // source shard numbers; empty = all
  int worker_index = 0;         // --worker I/N: this pass takes every N-th selected shard
  int worker_count = 1;
  bool verify_full = false;  // re-read every expert byte of src and dst and compare; implies recheck
  bool recheck = false;      // re-hash kept shards against checksums.xxh128; reconvert the bad ones
  int threads = 0;           // quantization threads; 0 = all online CPUs
  bool force = false;        // discard a DST made with other parameters / source
  bool space_check = true;   // false: skip the free-space pre-flight (statvfs lies on some NAS)
  uint64_t block_bytes = 16u << 20;  // source bytes per pipeline block
  // Source reads and shard writes bypass the page cache (O_DIRECT) where the
  // filesystem allows it; the tool sets it from K3_DIRECT at start-up.
  bool direct = true;
  // Source shards converted at once, each its own read -> quantize -> write
  // pipeline (output bytes do not depend on it); 0 = kDefaultStreams. Disks
  // and network filesystems serve parallel streams faster than one
  // (docs/PERFORMANCE.md); each stream adds ~100-200 MB of buffers.
  int streams = 0;
  // Source reads in flight per stream (one reader thread each, blocks handed on
  // in order); 0 = kDefaultReadsInFlight. Each adds one block of memory.
  int reads_in_flight = 0;
  // Output writes in flight per stream (O_DIRECT, each a block at its own
  // offset, hashed in order before); 0 = kDefaultWritesInFlight. Each adds one
  // block of memory.
  int writes_in_flight = 0;
};

// Streams when RepackOptions::streams is 0 (never more than the shards to do).
inline constexpr int kDefaultStreams = 2;
inline constexpr int kMaxStreams = 16;
inline constexpr int kDefaultReadsInFlight = 2;
inline constexpr int kMaxReadsInFlight = 16;
inline constexpr int kDefaultWritesInFlight = 2;
inline constexpr int kMaxWritesInFlight = 16;

// Parses "1,2,5-9" into shard numbers; throws kInvalidArgument.
std::vector<int64_t> ParseShardList(const std::string& list);
// Parses "I/N" (0 <= I < N); throws kInvalidArgument.
void ParseWorker(const std::string& spec, int* index, int* count);
// Checks bits values: 4 (int4-g64) or 8 (int8), nothing else; throws kInvalidArgument.
void ValidateBits(const QuantBits& bits);

struct RepackEvent {
  enum class Kind { kStart, kShardSkipped, kShardStart, kProgress, kShardDone, kSummary };
  Kind kind = Kind::kStart;
  std::string shard;             // output shard file name (shard events)
  std::string detail;            // skip reason, etc.
  uint64_t shard_src_bytes = 0;  // source bytes of this shard (its kept tensors)
  uint64_t shard_out_bytes = 0;  // output file size
  std::string shard_xxh128;
  double shard_seconds = 0;
  size_t streams_lent = 0;  // idle streams that read for this shard too (kShardDone)
  uint64_t expert_bytes_verified = 0;
  // Run totals (all events).
  size_t shards_selected = 0;
  size_t shards_todo = 0;
  size_t shards_done = 0;
  size_t shards_skipped = 0;
  uint64_t bytes_todo = 0;  // source bytes this run will read
  uint64_t bytes_done = 0;
  uint64_t out_bytes_planned = 0;
  uint64_t free_bytes = 0;
  double elapsed_seconds = 0;
  double convert_seconds = 0;  // since the first shard started (0 before): the rate's clock
  // Summary only.
  size_t index_shards = 0;
  size_t index_tensors = 0;
  uint64_t index_total_size = 0;
  uint64_t peak_rss_bytes = 0;
};

using RepackObserver = std::function<void(const RepackEvent&)>;

// The TTY progress line for a kProgress event: starts with "\r\033[K" (back to
// column 0, erase the line) so nothing of a longer previous line remains. The
// ETA comes from the conversion's own rate (pre-flight hashing excluded) and is
// "--" until a second of converting has passed.
std::string ProgressLine(const RepackEvent& e);

// Runs the conversion; returns the summary event (also sent to the observer).
RepackEvent RunRepack(const RepackOptions& options, const RepackObserver& observer);

}  // namespace k3::repack
