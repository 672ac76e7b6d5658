// Read engines of the streaming store: io_uring (one consumer thread reaps) and a pread thread pool.
//
// Both take batches of ReadReq (one expert = one Load = 1..7 requests), check
// every result the same way (ApplyResult: resubmit remainders of short reads,
// retry EAGAIN/EINTR, fall back from O_DIRECT on EINVAL, turn the rest into a
// k3::Error naming file and offset) and mark a Load complete when its last
// request finishes. Engines are driven by the store's single consumer thread;
// the pool's workers only touch requests, their Load's counters and FileTable
// atomics. Buffers must outlive the requests: Drain() before freeing them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/stream/streaming_store.h"

namespace k3::stream::detail {

inline constexpr uint64_t kDirectAlign = 4096;
// Kernel reads move at most ~2 GiB; keep each request well under it.
inline constexpr uint64_t kMaxReadBytes = 1ull << 30;
// EAGAIN/EINTR on one request this many times in a row is reported as kIo
// rather than spinning forever.
inline constexpr int kMaxRetries = 1000;

// One shard: the snapshot's buffered fd (borrowed) and our O_DIRECT twin.
struct FileEntry {
  std::string path;
  int buffered_fd = -1;
  UniqueFd direct_fd;
  uint64_t size = 0;
  std::atomic<bool> direct_ok{false};  // cleared when the kernel refuses O_DIRECT
  int fixed_buffered = -1;             // io_uring registered-file indices, -1: none
  int fixed_direct = -1;
};

struct Load;

struct ReadReq {
  Load* load = nullptr;
  uint32_t file = 0;  // index into the FileTable
  bool direct = false;
  uint64_t offset = 0;  // absolute file offset of dst[0]
  uint64_t len = 0;
  std::byte* dst = nullptr;
  uint64_t done = 0;  // bytes already in dst
  int attempts = 0;   // consecutive EAGAIN/EINTR
};

// One expert being read. `reqs` is fixed before submission (stable addresses).
struct Load {
  std::vector<ReadReq> reqs;
  std::atomic<int> pending{0};      // requests not yet finished
  std::optional<Error> error;       // first failure; written before `pending` drops
  std::atomic<double> done_time{0}; // NowSeconds() when the last request finished
  uint64_t bytes = 0;               // sum of request lengths
};

struct FileTable {
  std::vector<std::unique_ptr<FileEntry>> files;
};

struct IoCounters {
  std::atomic<uint64_t> read_ops{0};
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> short_reads{0};
};

enum class Next { kDone, kResubmit, kFailed };

// Interprets one result (`res` = bytes or -errno, after the fault hook) for
// `r`; on kFailed the error is stored in r.load (first one wins).
Next ApplyResult(FileTable& files, ReadReq& r, int64_t res, IoCounters& counters);

// Marks one request of a load finished (error already stored if any).
void FinishRequest(ReadReq& r);

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const char* name() const = 0;
  // Queues every request of `load` (pending must be set by the caller).
  virtual void Submit(Load* load) = 0;
  // Blocks until load->pending == 0. Throws kIo only for engine failures; read
  // errors are left in load->error for the caller.
  virtual void Wait(Load* load) = 0;
  // Non-blocking progress (reap finished reads).
  virtual void Poll() {}
  // Forgets queued requests and waits for those in flight (errors ignored).
  virtual void Drain() noexcept = 0;
};

// io_uring engine; returns null with `err` = -errno when no ring can be made.
std::unique_ptr<Engine> MakeUringEngine(FileTable& files, const StreamOptions& options,
                                        IoCounters& counters, int* err);
std::unique_ptr<Engine> MakePoolEngine(FileTable& files, const StreamOptions& options,
                                       IoCounters& counters);

}  // namespace k3::stream::detail
