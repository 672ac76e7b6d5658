#include "io_engine.h"

#include <errno.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

#include "k3/core/log.h"
#include "k3/core/sys.h"

namespace k3::stream::detail {
namespace {

constexpr char kDirectRefusedKey = 0;
constexpr char kNoThreadsKey = 0;

void StoreError(Load* load, Error e) {
  // One failure per expert is reported: the one nearest the start of the
  // slot (pieces complete in any order; the lowest offset is where a
  // truncated file really ends). Pool threads may race here.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!load->error || e.offset() < load->error->offset()) load->error.emplace(std::move(e));
}

}  // namespace

Next ApplyResult(FileTable& files, ReadReq& r, int64_t res, IoCounters& counters) {
  FileEntry& f = *files.files[r.file];
  const uint64_t at = r.offset + r.done;
  counters.read_ops.fetch_add(1, std::memory_order_relaxed);
  if (res == -EINTR || res == -EAGAIN) {
    counters.retries.fetch_add(1, std::memory_order_relaxed);
    if (++r.attempts > kMaxRetries) {
      StoreError(r.load, Error(ErrorCode::kIo,
                               std::string("expert read still fails with ") +
                                   (res == -EINTR ? "EINTR" : "EAGAIN") + " after " +
                                   std::to_string(kMaxRetries) + " retries",
                               f.path, static_cast<int64_t>(at)));
      return Next::kFailed;
    }
    return Next::kResubmit;
  }
  r.attempts = 0;
  if (res == -EINVAL && r.direct) {
    // The filesystem accepted O_DIRECT at open but refuses the read (FUSE,
    // some NFS): this file is read buffered from now on.
    if (f.direct_ok.exchange(false)) {
      LogOnce(&kDirectRefusedKey, LogLevel::kWarn,
              "expert streaming: O_DIRECT read refused (EINVAL) on %s; using buffered reads "
              "with posix_fadvise for such files",
              f.path.c_str());
    }
    r.direct = false;
    return Next::kResubmit;
  }
  if (res < 0) {
    StoreError(r.load, Error(ErrorCode::kIo,
                             "expert read of " + std::to_string(r.len - r.done) +
                                 " bytes failed: " + std::strerror(static_cast<int>(-res)),
                             f.path, static_cast<int64_t>(at)));
    return Next::kFailed;
  }
  if (res == 0) {
    StoreError(r.load, Error(ErrorCode::kTruncated,
                             "shard ends before the expert's bytes (" + std::to_string(r.done) +
                                 " of " + std::to_string(r.len) +
                                 " read; was the file truncated after load?)",
                             f.path, static_cast<int64_t>(at)));
    return Next::kFailed;
  }
  r.done += std::min<uint64_t>(static_cast<uint64_t>(res), r.len - r.done);
  if (r.done == r.len) return Next::kDone;
  counters.short_reads.fetch_add(1, std::memory_order_relaxed);
  // O_DIRECT needs aligned offsets and addresses; finish an odd remainder
  // through the page cache.
  if (r.direct && (((r.offset + r.done) % kDirectAlign) != 0 ||
                   (reinterpret_cast<uintptr_t>(r.dst + r.done) % kDirectAlign) != 0)) {
    r.direct = false;
  }
  return Next::kResubmit;
}

void FinishRequest(ReadReq& r) {
  Load* load = r.load;
  if (load->pending.load(std::memory_order_relaxed) == 1) {
    load->done_time.store(NowSeconds(), std::memory_order_relaxed);
  }
  load->pending.fetch_sub(1, std::memory_order_acq_rel);
}

namespace {

// ---------------------------------------------------------------------------
// io_uring: the consumer thread submits and reaps; no locks. O_DIRECT reads
// on a local filesystem complete asynchronously in the kernel, so a whole
// token's misses are in flight while the MoE computes.
class UringEngine final : public Engine {
 public:
  UringEngine(FileTable& files, const StreamOptions& options, IoCounters& counters)
      : files_(files),
        hook_(options.fault_hook),
        counters_(counters),
        depth_(static_cast<unsigned>(std::clamp(options.queue_depth, 1, 64))) {}

  int Init() {
    int rc = io_uring_queue_init(std::max(8u, 2 * depth_), &ring_, 0);
    if (rc < 0) return rc;
    ring_ok_ = true;
    // Registered files save an fget/fput per read; optional (old kernels or
    // RLIMIT_NOFILE may refuse), so failure only means plain fds.
    std::vector<int> fds;
    for (auto& f : files_.files) {
      f->fixed_buffered = static_cast<int>(fds.size());
      fds.push_back(f->buffered_fd);
      if (f->direct_fd.valid()) {
        f->fixed_direct = static_cast<int>(fds.size());
        fds.push_back(f->direct_fd.get());
      }
    }
    if (!fds.empty() &&
        io_uring_register_files(&ring_, fds.data(), static_cast<unsigned>(fds.size())) == 0) {
      fixed_files_ = true;
    } else {
      for (auto& f : files_.files) f->fixed_buffered = f->fixed_direct = -1;
    }
    return 0;
  }

  ~UringEngine() override {
    if (!ring_ok_) return;
    Drain();
    io_uring_queue_exit(&ring_);
  }

  const char* name() const override { return "io_uring"; }

  void Submit(Load* load) override {
    for (ReadReq& r : load->reqs) queued_.push_back(&r);
    Pump();
  }

  void Wait(Load* load) override {
    while (load->pending.load(std::memory_order_acquire) > 0) {
      Pump();
      K3_CHECK(in_flight_ > 0);  // a pending load has queued or in-flight requests
      // submit_and_wait, not wait_cqe: SQEs a partial submit left in the ring
      // go in now instead of being waited on forever.
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
        ReapAll();
        continue;
      }
      if (rc < 0) ThrowErrno(-rc, "io_uring_submit_and_wait");
      ReapAll();
    }
  }

  void Poll() override {
    ReapAll();
    Pump();
  }

  void Drain() noexcept override {
    queued_.clear();
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc < 0) {
        // The ring is broken; nothing more will complete. Buffers the kernel
        // may still write to must not be freed, so this is fatal.
        K3_CHECK(false && "io_uring_wait_cqe failed while draining");
      }
      unsigned head;
      unsigned n = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++n;
        --in_flight_;
      }
      io_uring_cq_advance(&ring_, n);
    }
  }

 private:
  // Moves queued requests into SQEs up to the queue depth and submits them.
  void Pump() {
    unsigned added = 0;
    while (in_flight_ < depth_ && !queued_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      ReadReq* r = queued_.front();
      queued_.pop_front();
      const FileEntry& f = *files_.files[r->file];
      const bool direct = r->direct && f.direct_ok.load(std::memory_order_relaxed);
      r->direct = direct;
      const int fixed = direct ? f.fixed_direct : f.fixed_buffered;
      const int fd = fixed >= 0 ? fixed : (direct ? f.direct_fd.get() : f.buffered_fd);
      const uint64_t n = std::min(r->len - r->done, kMaxReadBytes);
      io_uring_prep_read(sqe, fd, r->dst + r->done, static_cast<unsigned>(n), r->offset + r->done);
      if (fixed >= 0) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data(sqe, r);
      ++in_flight_;
      ++added;
    }
    if (added == 0) return;
    for (;;) {
      int rc = io_uring_submit(&ring_);
      if (rc >= 0) break;
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
        // EBUSY/EAGAIN: the CQ is full or the kernel is short of memory; reap
        // what is done and try again.
        ReapAll();
        continue;
      }
      ThrowErrno(-rc, "io_uring_submit");
    }
  }

  void ReapAll() {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
      ReadReq* r = static_cast<ReadReq*>(io_uring_cqe_get_data(cqe));
      int64_t res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
      if (hook_) {
        res = hook_->OnResult(files_.files[r->file]->path, r->offset + r->done, r->len - r->done,
                              r->direct, res);
      }
      switch (ApplyResult(files_, *r, res, counters_)) {
        case Next::kResubmit:
          queued_.push_front(r);
          break;
        case Next::kDone:
        case Next::kFailed:
          FinishRequest(*r);
          break;
      }
    }
  }

  FileTable& files_;
  IoFaultHook* hook_;
  IoCounters& counters_;
  unsigned depth_;
  io_uring ring_{};
  bool ring_ok_ = false;
  bool fixed_files_ = false;
  unsigned in_flight_ = 0;
  std::deque<ReadReq*> queued_;
};

// ---------------------------------------------------------------------------
// pread pool: the fallback when io_uring is unavailable, and K3_URING=0.
class PoolEngine final : public Engine {
 public:
  PoolEngine(FileTable& files, const StreamOptions& options, IoCounters& counters)
      : files_(files), hook_(options.fault_hook), counters_(counters) {
    const int n = std::clamp(options.io_threads, 1, 16);
    try {
      for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Worker(); });
    } catch (const std::system_error& e) {
      if (threads_.empty()) {
        LogOnce(&kNoThreadsKey, LogLevel::kWarn,
                "expert streaming: cannot start loader threads (%s); reading synchronously",
                e.what());
      }
    }
  }

  ~PoolEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      queue_.clear();
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  const char* name() const override { return "pread-pool"; }

  void Submit(Load* load) override {
    if (threads_.empty()) {
      for (ReadReq& r : load->reqs) Run(r);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (ReadReq& r : load->reqs) queue_.push_back(&r);
    }
    work_cv_.notify_all();
  }

  void Wait(Load* load) override {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return load->pending.load(std::memory_order_acquire) == 0; });
  }

  void Drain() noexcept override {
    std::unique_lock<std::mutex> lock(mu_);
    queue_.clear();
    done_cv_.wait(lock, [&] { return active_ == 0; });
  }

 private:
  void Worker() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      ReadReq* r = queue_.front();
      queue_.pop_front();
      ++active_;
      lock.unlock();
      Run(*r);
      lock.lock();
      --active_;
      done_cv_.notify_all();
    }
  }

  // Reads one request to completion (or failure); never throws.
  void Run(ReadReq& r) {
    for (;;) {
      FileEntry& f = *files_.files[r.file];
      const bool direct = r.direct && f.direct_ok.load(std::memory_order_relaxed);
      r.direct = direct;
      const int fd = direct ? f.direct_fd.get() : f.buffered_fd;
      const uint64_t n = std::min(r.len - r.done, kMaxReadBytes);
      ssize_t got = ::pread(fd, r.dst + r.done, n, static_cast<off_t>(r.offset + r.done));
      int64_t res = got < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(got);
      if (hook_) res = hook_->OnResult(f.path, r.offset + r.done, r.len - r.done, direct, res);
      const Next next = ApplyResult(files_, r, res, counters_);
      if (next == Next::kResubmit) {
        if (res == -EAGAIN) std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      FinishRequest(r);
      return;
    }
  }

  FileTable& files_;
  IoFaultHook* hook_;
  IoCounters& counters_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<ReadReq*> queue_;
  int active_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<Engine> MakeUringEngine(FileTable& files, const StreamOptions& options,
                                        IoCounters& counters, int* err) {
  auto e = std::make_unique<UringEngine>(files, options, counters);
  int rc = e->Init();
  if (rc < 0) {
    *err = -rc;
    return nullptr;
  }
  return e;
}

std::unique_ptr<Engine> MakePoolEngine(FileTable& files, const StreamOptions& options,
                                       IoCounters& counters) {
  return std::make_unique<PoolEngine>(files, options, counters);
}

}  // namespace k3::stream::detail
