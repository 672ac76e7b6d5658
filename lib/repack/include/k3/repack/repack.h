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
  // Re-hash kept shards against checksums.xxh128, and re-read their sources
  // against k3-repack.sources; reconvert the ones that differ.
  bool recheck = false;
  int threads = 0;           // quantization threads; 0 = all online CPUs
  bool force = false;        // discard a DST made with other parameters / source
  bool space_check = true;   // false: skip the free-space pre-flight (statvfs lies on some NAS)
  // Source bytes per pipeline block (also the unit of every read and write in
  // flight); 0 = the largest of 8, 4, 2, 1 MiB whose buffers fit the memory
  // budget with 4 or more reads and writes in flight (ResolvePipeline).
  uint64_t block_bytes = 0;
  // Bound on the pipeline's buffers (every block and staging block of every
  // stream, PipelineBufferBytes); 0 = automatic:
  // kDefaultMemBudgetBytes, or a quarter of MemAvailable or 3/8 of RLIMIT_AS
  // when that is less.
  // Automatic streams, reads, writes and block size are sized to fit it; with
  // a budget given, flags that cannot fit are refused.
  uint64_t mem_budget_bytes = 0;
  // Source reads and shard writes bypass the page cache (O_DIRECT) where the
  // filesystem allows it; the tool sets it from K3_DIRECT at start-up.
  bool direct = true;
  // Source shards converted at once, each its own read -> quantize -> write
  // pipeline (output bytes do not depend on it); 0 = kDefaultStreams. Disks
  // and network filesystems serve parallel streams faster than one
  // (docs/PERFORMANCE.md); each stream adds BlocksPerStream blocks of buffers.
  int streams = 0;
  // Source reads in flight per stream (one reader thread each, blocks handed on
  // in order); 0 = automatic, up to kDefaultReadsInFlight (ResolvePipeline).
  // Each adds one block of memory.
  int reads_in_flight = 0;
  // Output writes in flight per stream (O_DIRECT, each a block at its own
  // offset, hashed in order before); 0 = automatic, up to
  // kDefaultWritesInFlight (ResolvePipeline). Each adds one
  // block of memory.
  int writes_in_flight = 0;
  // Tests only (k3-repack --test-read-delay-ms): each source read of a shard
  // waits this long first, so a test can change the source while it is read.
  int test_read_delay_ms = 0;
};

// Streams when RepackOptions::streams is 0 (never more than the shards to do).
// The defaults come from docs/PERFORMANCE.md ("Against the disk's own limit"):
// the virtio disk measured there rewards bytes in flight across streams, in
// blocks of 8 MiB or more, so the automatic values put as many 8 MiB reads and
// writes in flight as the memory budget holds (ResolvePipeline).
inline constexpr int kDefaultStreams = 4;
inline constexpr int kMaxStreams = 16;
inline constexpr int kDefaultReadsInFlight = 16;
inline constexpr int kMaxReadsInFlight = 16;
inline constexpr int kDefaultWritesInFlight = 16;
inline constexpr int kMaxWritesInFlight = 16;
inline constexpr int kMinAutoInFlight = 4;  // before the block shrinks below 8 MiB
inline constexpr uint64_t kDefaultMemBudgetBytes = 768ull << 20;
inline constexpr uint64_t kMinMemBudgetBytes = 16ull << 20;
inline constexpr uint64_t kMaxAutoBlockBytes = 8ull << 20;
inline constexpr uint64_t kMinAutoBlockBytes = 1ull << 20;
inline constexpr uint64_t kMaxBlockBytes = 256ull << 20;  // --block-mib

// Blocks one stream's pipeline may hold at once: its read pool (2 queued plus
// one per further read in flight; 4 with one stream), the quantized-output
// pool (2 half blocks, 4 with one stream) and the writer's staging blocks (one
// per write in flight plus the one being filled). The quantizer's f32 scratch
// is a few rows per thread (< 2 MiB per thread for rows up to 64 Ki values).
size_t BlocksPerStream(int streams, int reads, int writes);
// The worst case of every stream's buffers together.
uint64_t PipelineBufferBytes(int streams, int reads, int writes, uint64_t block_bytes);

// Streams, reads, writes and block size as a run uses them, with the budget
// they were sized to and why. Automatic values (0 in the options) take the
// first of these whose buffers fit the budget: 8 MiB blocks with 16, 15, ... 4
// reads and writes in flight each; the same at 4, 2, 1 MiB; 1 MiB with 3, 2,
// 1; then one automatic stream fewer, and again. Explicit values are never
// changed: with an explicit
// budget they must fit it (kInvalidArgument naming --mem-mb otherwise), with
// the automatic one they are taken as asked and the budget reported as exceeded.
struct PipelinePlan {
  int streams = 1;
  int reads = 1;
  int writes = 1;
  uint64_t block_bytes = 0;
  uint64_t budget_bytes = 0;
  bool budget_given = false;  // --mem-mb, not automatic
  bool budget_by_address_space = false;  // automatic, lowered to fit RLIMIT_AS
  uint64_t buffer_bytes = 0;  // PipelineBufferBytes of the above
  // Which values were chosen here (the rest were given).
  bool streams_auto = true, reads_auto = true, writes_auto = true, block_auto = true;
  // One line for the start of a run: the values, which were chosen and the budget.
  std::string Describe() const;
};
// `shards_todo` caps the streams (at least 1); `mem_available` is MemAvailable
// (0 if unknown) and `address_space` RLIMIT_AS (0 if unlimited) for the
// automatic budget: at most a quarter of the one and 3/8 of the other (thread
// stacks, arenas and the binary need the rest of an address space).
PipelinePlan ResolvePipeline(const RepackOptions& options, size_t shards_todo,
                             uint64_t mem_available, uint64_t address_space = 0);

// Checks bits values: 4 (int4-g64) or 8 (int8), nothing else; throws kInvalidArgument.
void ValidateBits(const QuantBits& bits);

struct RepackEvent {
  // kShardFailed: that shard was not published (its source changed while it
  // was read, or --verify-full found a difference); the pass goes on with the
  // others and RunRepack throws at the end. `detail` is the error.
  enum class Kind {
    kStart,
    kShardSkipped,
    kShardStart,
    kProgress,
    kShardDone,
    kShardFailed,
    kSummary
  };
  Kind kind = Kind::kStart;
  std::string shard;             // output shard file name (shard events)
  std::string detail;            // skip reason, etc.
  uint64_t shard_src_bytes = 0;  // source bytes of this shard (its kept tensors)
  uint64_t shard_out_bytes = 0;  // output file size
  std::string shard_xxh128;
  std::string source_xxh128;  // of the source bytes converted (kShardDone; k3-repack.sources)
  double shard_seconds = 0;
  size_t streams_lent = 0;  // idle streams that read for this shard too (kShardDone)
  uint64_t expert_bytes_verified = 0;
  // Run totals (all events).
  size_t shards_selected = 0;
  size_t shards_todo = 0;
  size_t shards_done = 0;
  size_t shards_skipped = 0;
  size_t shards_failed = 0;
  uint64_t bytes_todo = 0;  // source bytes this run will read
  uint64_t bytes_done = 0;
  uint64_t out_bytes_planned = 0;
  uint64_t free_bytes = 0;
  PipelinePlan pipeline;  // kStart (and the summary): what this run uses
  double elapsed_seconds = 0;
  double convert_seconds = 0;  // since the first shard started (0 before): the rate's clock
  // Summary only.
  size_t index_shards = 0;
  size_t index_tensors = 0;
  uint64_t index_total_size = 0;
  uint64_t peak_rss_bytes = 0;
};

using RepackObserver = std::function<void(const RepackEvent&)>;

// Runs the conversion; returns the summary event (also sent to the observer).
// Shards that failed on their own (kShardFailed) are reported at the end: once
// the index and manifests of what was published are written, the first one's
// error is thrown (kChecksumMismatch), with how many failed.
RepackEvent RunRepack(const RepackOptions& options, const RepackObserver& observer);

}  // namespace k3::repack
