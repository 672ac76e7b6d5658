// Streaming expert store: routed experts read through io_uring (or a pread pool) into a per-layer LRU.
//
// Plugs into the model's ExpertStore protocol (k3/model/expert_store.h). At
// BeginLayer the misses of the pass (one token, or the union of a prefill
// chunk) are submitted as one batch in the caller's disk-offset order, so the
// drive sees a forward sweep at full queue depth while the MoE computes the
// experts that are already resident; Acquire() blocks only for the expert it
// asks for. Reads use O_DIRECT by default into 4 KiB-aligned buffers (the
// aligned superset of the slot is read and the inner span used), with graceful
// fallbacks, each announced once:
//   io_uring unavailable (ENOSYS/EPERM, seccomp, K3_URING=0) -> pread on a thread pool;
//   O_DIRECT refused (EINVAL: tmpfs, some NFS/FUSE)          -> buffered reads + posix_fadvise.
// Every completion is checked: short reads are resubmitted for the remainder,
// -EAGAIN/-EINTR retried, anything else becomes a k3::Error naming the shard
// and the byte offset (end of file: kTruncated; errno: kIo).
//
// Ownership: the store owns its ExpertTable, slot buffers, O_DIRECT twin fds,
// the ring / threads; it borrows the Snapshot (its buffered fds), which must
// outlive it. Thread-safety: one consumer thread, as the protocol says; the
// store's own I/O threads never touch the cache. After an exception from
// BeginLayer/Acquire the pass is abandoned (in-flight reads drained) and the
// next BeginLayer starts clean.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "k3/container/snapshot.h"
#include "k3/model/config.h"
#include "k3/model/expert_store.h"

namespace k3 {
class JsonWriter;
namespace model {
class Model;
}
}  // namespace k3

namespace k3::stream {

// Test hook on the raw result of every read (bytes, or -errno) before the
// store interprets it; lets tests inject short reads, EAGAIN, EINTR and EIO
// without a fake kernel. Must be thread-safe (pool threads call it).
class IoFaultHook {
 public:
  virtual ~IoFaultHook() = default;
  // `len` bytes were asked for at `offset` of `path` (through the O_DIRECT fd
  // if `direct`); `res` is what the kernel returned. Return what the store
  // should see (res <= len).
  virtual int64_t OnResult(const std::string& path, uint64_t offset, uint64_t len, bool direct,
                           int64_t res) = 0;
};

struct StreamOptions {
  // Expert cache budget in bytes (K3_EXPERT_GB x 1e9). Negative: size it from
  // the machine (MemAvailable minus the resident model and `reserve_bytes`).
  // Either way at least one slot per MoE layer and at most every expert.
  double budget_bytes = -1;
  double reserve_bytes = 3.7e9;  // page cache 2.5 GB + activations 1.2 GB (spec §8.2)
  bool direct = true;            // K3_DIRECT: O_DIRECT reads
  bool uring = true;             // K3_URING: io_uring, else the pread pool
  bool pipe = true;              // K3_PIPE: compute expert j while j+1.. are read
  int io_threads = 4;            // K3_IO_THREADS: pread pool size (1..16)
  int queue_depth = 8;           // K3_QD: io_uring reads in flight (1..64)
  int window = 32;               // K3_WINDOW: miss buffers outstanding per pass (>= 1)
  // K3_READ_CHUNK_MB: split each expert read into pieces of this size (4 KiB
  // multiple) so that, with several reads in flight, experts complete in
  // submission order and the first one is ready sooner. 0: one read each.
  uint64_t read_chunk_bytes = 0;
  // K3_PREFAULT: a low-priority thread touches the cache's buffers (every slot
  // plus the read window) after construction, so that a cold pass does not
  // fault them in on the compute thread.
  bool prefault = true;
  // K3_READ_AHEAD: honour the model's Prefetch hint (a large prefill window's
  // next MoE layer): read those experts into the layer's free cache capacity
  // on `ahead_threads` pread threads while the trunk computes; the pass then
  // finds them resident or in flight.
  bool ahead = true;
  int ahead_threads = 2;
  bool log_projection = true;    // print the cache projection at construction
  IoFaultHook* fault_hook = nullptr;  // borrowed; tests only
  // k3::engine::EngineOptions::FromEnv fills these from K3_EXPERT_GB, K3_DIRECT,
  // K3_URING, K3_PIPE, K3_IO_THREADS, K3_QD, K3_WINDOW, K3_READ_CHUNK_MB, K3_PREFAULT
  // (docs/environment.md).
};

// Counters of one forward step (one decode token, or one prefill chunk).
struct StepStats {
  uint64_t bytes_read = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t unique_experts = 0;  // sum over layers of the pass's union size
  double io_wait_s = 0;         // consumer blocked waiting for reads
  double compute_s = 0;         // inside layer passes, not waiting
  double io_busy_s = 0;         // wall time with reads outstanding
  uint64_t ahead_used = 0;      // read-ahead experts the pass used (also in misses)
  uint64_t ahead_unused = 0;    // read-ahead experts no pass asked for (bytes in bytes_read)
};

struct StreamStats {
  StepStats total;
  std::vector<StepStats> steps;  // in order
  uint64_t read_ops = 0;         // completed read requests (incl. resubmits)
  uint64_t retries = 0;          // EAGAIN/EINTR resubmissions
  uint64_t short_reads = 0;      // remainders resubmitted
  double read_gbps() const {
    return total.io_busy_s > 0 ? static_cast<double>(total.bytes_read) / total.io_busy_s / 1e9 : 0;
  }
};

// The cache projection (decimal bytes) the store was sized with.
struct CachePlan {
  int64_t slots_per_layer = 1;
  int64_t moe_layers = 0;
  uint64_t slot_bytes = 0;
  uint64_t cache_bytes = 0;     // slots x layers x slot
  uint64_t resident_bytes = 0;  // process peak RSS when sized
  uint64_t available_bytes = 0; // MemAvailable when sized
  bool from_env = false;        // budget given (else sized from the machine)
  bool lowered = false;         // the given budget exceeded the machine: lowered
};

class StreamingExpertStore final : public model::ExpertStore {
 public:
  StreamingExpertStore(const Snapshot& snapshot, const ModelConfig& config,
                       StreamOptions options);
  ~StreamingExpertStore() override;
  StreamingExpertStore(const StreamingExpertStore&) = delete;
  StreamingExpertStore& operator=(const StreamingExpertStore&) = delete;

  const model::ExpertTable& table() const override { return table_; }
  model::ExpertView Acquire(int64_t layer, int64_t expert) override;
  void Release(int64_t layer, int64_t expert) noexcept override;
  void EndLayer(int64_t layer) override;
  void Prefetch(int64_t layer, std::span<const int32_t> likely) override;

  const StreamStats& stream_stats() const { return stats_; }
  // Forgets the per-step records (the totals stay). Not during a pass. The
  // engine calls it per request so that a long-running server's records do
  // not grow without bound.
  void ClearSteps() { stats_.steps.clear(); }
  const CachePlan& plan() const { return plan_; }
  // "io_uring" or "pread-pool" (after any fallback).
  const char* backend() const;
  // True while at least one shard is read with O_DIRECT.
  bool direct() const;
  // True once the K3_PREFAULT thread has touched every buffer it was given
  // (or stopped, or never ran). The prefill bench waits for it, as a server's
  // first request usually does.
  bool prefault_done() const;
  const StreamOptions& options() const { return options_; }

  struct Impl;

 protected:
  model::ExpertStoreStats CounterStats() const override;
  void BeginPass(int64_t layer, std::span<const int32_t> experts) override;

 private:
  void AbandonPass() noexcept;
  void SettleAhead();
  void Bump(uint64_t StepStats::*field, uint64_t v);
  void BumpSeconds(double StepStats::*field, double v);

  model::ExpertTable table_;
  StreamOptions options_;
  CachePlan plan_;
  StreamStats stats_;
  std::unique_ptr<Impl> impl_;
};

// Sizes the cache: slots per MoE layer for a budget (or the machine, see
// StreamOptions::budget_bytes). Pure apart from reading /proc when sizing
// from the machine; exposed for tests and the bench.
CachePlan PlanCache(const ModelConfig& config, const StreamOptions& options,
                    uint64_t resident_bytes, uint64_t available_bytes);

// Builds a StreamingExpertStore with `options`, installs it in `model` (which
// owns it from then on), logs the backend once and returns it.
StreamingExpertStore& InstallStreamingStore(model::Model& model, const StreamOptions& options);

// Appends the store's stats as fields of the JSON object being written:
// "stream": {backend, direct, slots_per_layer, bytes, GB/s, hits, misses,
// io_wait_s, compute_s, prefill dedup ratio, per-step array}.
// `prefill_selections` = prompt tokens x experts per token x MoE layers, the
// reads a chunk-less prefill would have needed (for the dedup ratio);
// `prefill_steps` = how many leading steps were prefill chunks.
void WriteStreamStatsJson(const StreamingExpertStore& store, uint64_t prefill_selections,
                          size_t prefill_steps, JsonWriter& j);

}  // namespace k3::stream
