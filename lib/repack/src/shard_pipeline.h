// One shard's conversion as a threaded read -> quantize -> hash + write
// pipeline, with the buffers a stream keeps from shard to shard.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "k3/core/direct_io.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/queue.h"
#include "k3/repack/checksums.h"
#include "shard_plan.h"

namespace k3::repack {

// std::thread, with a failure to start one (EAGAIN: RLIMIT_NPROC, or no
// address space left for its stack under RLIMIT_AS) as a k3::Error that says
// what to lower, not an exception that escapes a thread.
template <typename Fn>
std::thread StartThread(Fn&& fn) {
  try {
    return std::thread(std::forward<Fn>(fn));
  } catch (const std::system_error& e) {
    throw Error(ErrorCode::kIo, std::string("cannot start a pipeline thread (") + e.what() +
                                    "); lower --streams, --reads or --writes");
  }
}

// One stream's pipeline memory, kept from shard to shard: fresh pages are slow
// to fault in on VMs, so allocating a stream's blocks again for every shard
// costs a noticeable part of it (docs/repack.md, "Performance").
struct StreamBuffers {
  std::vector<AlignedBuffer> blocks[2];  // read pool, output pool
  std::vector<AlignedBuffer> stages;     // the DirectWriter's staging blocks
  std::vector<float> scratch;            // a few rows per quantizing thread as f32
};

// One shard's conversion as three stages joined by bounded queues: read (O_DIRECT
// or through the page cache, `reads` reads in flight, more while idle streams
// lend theirs: Help) -> quantize (the calling thread) -> hash + write (the
// DirectWriter keeps its own writes in flight). Read and Write run on their own
// threads; every stage runs inside Guard, so the first failure is kept and closes
// all queues (and the reorder map, ready_), which ends the other stages. `depth`
// blocks are in flight per stage; the blocks and the f32 scratch are lent by
// *bufs (KeepBuffers hands them back), and the source bytes written so far go to
// *progress. `direct_fd` (may be invalid: buffered reads) outlives the pipeline.
class ShardPipeline {
 public:
  ShardPipeline(const ShardPlan& p, std::vector<Segment> segs, uint64_t block_bytes, size_t depth,
                size_t reads, StreamBuffers* bufs, std::atomic<uint64_t>* progress,
                const UniqueFd& direct_fd, int read_delay_ms);

  template <typename Fn>
  void Guard(Fn&& stage) {
    try {
      stage();
    } catch (...) {
      Fail(std::current_exception());
    }
  }
  // Stops every stage and helper (a way out that is not the pipeline's own failure).
  void Abort();
  bool Failed();
  void RethrowIfFailed();

  // Reads every copied or quantized segment's source bytes. `reads` reader
  // threads keep that many source reads in flight (the disk serves queued reads
  // faster than one at a time), each claiming the next segment. Guards its own
  // stages.
  void Read() { RunReaders(reads_); }

  // Segments no reader has claimed yet (a helper is worth lending while > 1).
  // Lock-free: a reader may hold claim_mu_ while it waits for a block.
  size_t Unclaimed() const { return segs_.size() - std::min(claimed_.load(), segs_.size()); }
  // Called under the Runner's registry lock while this pipeline is registered:
  // counts a helper in, so the owner waits for it before destroying the pipeline.
  void AddHelper();
  // An idle stream (no shard left for it) reads this shard's segments too:
  // `blocks` (its own read blocks) join the read pool for good, and `readers`
  // more readers share the pool until every segment is claimed. It brings only
  // the blocks it has: a stream helping its second shard has none left (they
  // stayed with the first), and fresh ones would be memory outside the
  // budget (PipelineBufferBytes). Several streams thus read disjoint ranges of
  // one source file at once, while the output is still quantized, hashed and
  // written in order by this pipeline. Follows AddHelper; returns when there is
  // nothing left to claim.
  void Help(std::vector<AlignedBuffer>* blocks, size_t readers);
  // Waits until every helper has left (the owner, after unregistering).
  void WaitHelpers();
  size_t helpers_lent();

  // Quantizes kQuant segments (their scales follow as one kScales segment) and
  // passes the rest through; threads() says how many threads each block gets
  // (the output does not depend on it).
  void Transform(const std::function<int()>& threads);

  // The 8-byte length and the header, then every segment's output bytes, into
  // `sink` and `hasher`.
  void Write(DirectWriter* sink, Xxh128* hasher);

  // XXH3-128 of the source bytes the quantizer took, in order (after Transform).
  std::string SourceDigest() const { return src_hash_.HexDigest(); }

  // After a pipeline that finished, every block is back in its pool: hands
  // them back to the stream for its next shard (helpers' blocks included: their
  // streams have no shard left).
  void KeepBuffers();

 private:
  struct Block {
    size_t seg = SIZE_MAX;  // SIZE_MAX: end of stream
    AlignedBuffer bytes;
    size_t skip = 0;            // the segment's bytes start here in `bytes`
    std::vector<float> floats;  // a tensor's scales
    int pool = -1;              // 0 = read pool, 1 = output pool, -1 none
  };

  // `n` reader loops, n - 1 of them on threads of their own.
  void RunReaders(size_t n);
  // One reader: claims the next segment and takes a block for it under one
  // lock (blocks leave the pool in segment order, so the segment the quantizer
  // waits for always has one), reads it, and files it (PutRead). Whoever claims
  // the index past the last segment files the end of the stream.
  void ReadSegments();
  // Every block is allocated once at the size any segment (of this shard, or
  // of a whole block) needs: growing blocks segment by segment churns the heap
  // and leaves its peak above the blocks' count (PipelineBufferBytes).
  static size_t ReserveBytes(const std::vector<Segment>& segs, uint64_t block_bytes, bool quantized);
  void ReadSource(const Segment& s, Block* b);
  // The read blocks reach the quantizer in segment order through ready_: a
  // reader files its block as soon as it is read and claims the next segment,
  // so one slow read does not hold every other reader and the disk keeps
  // several reads in flight. ready_ has no capacity of its own: every block in
  // it comes from the read pool (scales and the end marker carry none), which
  // bounds it. False once the pipeline failed.
  bool PutRead(size_t i, Block b);
  bool TakeRead(Block* b);
  void Fail(std::exception_ptr e);

  const ShardPlan& p_;
  const std::vector<Segment> segs_;
  const size_t reserve_[2];  // bytes of a read block, of a quantized block
  const size_t reads_;
  StreamBuffers* const bufs_;
  const size_t pool_blocks_[2];
  BoundedQueue<AlignedBuffer> pools_[2];
  BoundedQueue<Block> write_q_;
  std::mutex err_mu_;
  std::exception_ptr err_;
  std::mutex claim_mu_;
  size_t next_claim_ = 0;  // next segment a reader takes; segs_.size(): the end marker
  std::atomic<size_t> claimed_{0};  // next_claim_'s last value, for Unclaimed
  std::mutex ready_mu_;
  std::condition_variable ready_cv_;
  std::map<size_t, Block> ready_;  // read, not yet quantized, by segment
  size_t next_ready_ = 0;          // the segment the quantizer takes next
  bool ready_closed_ = false;
  std::mutex helpers_mu_;
  std::condition_variable helpers_cv_;
  size_t helpers_ = 0, helpers_lent_ = 0;
  const UniqueFd& direct_fd_;
  std::atomic<bool> use_direct_;
  std::atomic<uint64_t>& src_written_;
  Xxh128 src_hash_;  // Transform's thread only
  int read_delay_ms_ = 0;
};

}  // namespace k3::repack
