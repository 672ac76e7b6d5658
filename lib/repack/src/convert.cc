// The shards through their pipelines: streams that each take the next shard,
// lend their reads once none is left, and publish each shard atomically.
#include <fcntl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <thread>

#include "k3/core/log.h"
#include "memory_plan.h"
#include "runner.h"
#include "shard_checks.h"
#include "shard_lock.h"

namespace k3::repack {

// Converts the planned shards under their shard locks, recording each checksum:
// `streams` threads take the next shard in order, each running its own
// pipeline; the calling thread emits their events (and the progress) in the
// order they happen. A failure stops the others from starting another shard and
// is rethrown once the shards in flight are finished.
void Runner::ConvertShards(const std::vector<const ShardPlan*>& todo) {
  const std::string shard_lock_path = JoinPath(opt_.dst, kShardLockName);
  UniqueFd shard_lock_fd = OpenOrThrow(shard_lock_path, O_RDWR | O_CREAT, 0644);
  if (todo.empty()) return;
  const size_t streams = static_cast<size_t>(plan_.streams);  // <= todo.size()
  const size_t depth = PipelineDepth(plan_.streams);
  const size_t reads = static_cast<size_t>(plan_.reads);
  const size_t writes = static_cast<size_t>(plan_.writes);

  struct Posted {
    RepackEvent::Kind kind;
    RepackEvent ev;
    size_t slot;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Posted> posted;
  std::exception_ptr err;
  size_t running = streams;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::vector<std::atomic<uint64_t>> progress(streams);
  auto post = [&](RepackEvent::Kind kind, const RepackEvent& ev, size_t slot) {
    std::lock_guard<std::mutex> lock(mu);
    posted.push_back({kind, ev, slot});
    cv.notify_one();
  };

  auto stream = [&](size_t slot) {
    StreamBuffers bufs;
    try {
      for (size_t i = next++; i < todo.size() && !stop.load(); i = next++) {
        const ShardPlan* p = todo[i];
        ++starting_;  // until WriteShard registers its pipeline (or the shard is skipped)
        RepackEvent ev;
        ev.shard = p->out_name;
        ev.shard_src_bytes = p->src_bytes;
        ShardLock shard_lock(shard_lock_fd.get(), p->number, shard_lock_path, p->out_name);
        if (shard_lock.waited() &&
            !ExistingShardProblem(JoinPath(opt_.dst, p->out_name), *p)) {
          --starting_;
          ev.detail = "converted by a concurrent pass";
          ev.shard_out_bytes = p->file_bytes;
          post(RepackEvent::Kind::kShardSkipped, ev, slot);
          continue;
        }
        progress[slot] = 0;
        post(RepackEvent::Kind::kShardStart, ev, slot);
        try {
          ev.shard_xxh128 = WriteShard(*p, &ev, &progress[slot], depth, reads, writes, &bufs);
        } catch (ShardFailed& f) {
          // Its temp file is gone, nothing was published: the next shard.
          ev.detail = f.error.what();
          {
            std::lock_guard<std::mutex> lock(mu);
            failed_.push_back(std::move(f));
          }
          post(RepackEvent::Kind::kShardFailed, ev, slot);
          continue;
        }
        {
          std::lock_guard<std::mutex> container(container_mu_);
          ContainerLock lock(opt_.dst);
          UpdateChecksums({{p->out_name, ev.shard_xxh128, ev.source_xxh128, p->src_stat}},
                          /*finalize=*/false);
        }
        post(RepackEvent::Kind::kShardDone, ev, slot);
      }
      // No shard left for this stream: its reads go to the shards still
      // running, so the last big one is not read by one stream alone.
      HelpOthers(reads, &bufs, stop);
    } catch (...) {
      stop = true;
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    --running;
    cv.notify_one();
  };
  std::vector<std::thread> workers;
  try {
    for (size_t i = 0; i < streams; ++i) workers.push_back(StartThread([&stream, i] { stream(i); }));
  } catch (...) {
    stop = true;  // the started streams finish the shard they took
    for (auto& w : workers) w.join();
    throw;
  }

  // The calling thread: the observer's events, in the order they were posted.
  std::vector<std::string> active(streams);  // shard being converted per slot
  std::vector<uint64_t> active_bytes(streams, 0);
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    cv.wait_for(lock, std::chrono::milliseconds(100),
                [&] { return !posted.empty() || running == 0; });
    while (!posted.empty()) {
      Posted e = std::move(posted.front());
      posted.pop_front();
      lock.unlock();
      if (e.kind == RepackEvent::Kind::kShardSkipped) {
        ++totals_.shards_skipped;
      } else if (e.kind == RepackEvent::Kind::kShardStart) {
        active[e.slot] = e.ev.shard;
        active_bytes[e.slot] = e.ev.shard_src_bytes;
      } else if (e.kind == RepackEvent::Kind::kShardDone) {
        active[e.slot].clear();
        ++totals_.shards_done;
        totals_.bytes_done += e.ev.shard_src_bytes;
      } else if (e.kind == RepackEvent::Kind::kShardFailed) {
        active[e.slot].clear();
        ++totals_.shards_failed;
      }
      Emit(e.kind, e.ev);
      lock.lock();
    }
    if (running == 0) break;
    const double now = NowSeconds();
    if (now - last_progress_ >= 0.5) {
      last_progress_ = now;
      RepackEvent ev;
      uint64_t in_flight = 0;
      for (size_t i = 0; i < streams; ++i) {
        if (active[i].empty()) continue;
        in_flight += progress[i].load();
        ev.shard = active[i];  // one of the shards in flight is named
        ev.shard_src_bytes = active_bytes[i];
      }
      if (!ev.shard.empty()) {
        lock.unlock();
        const uint64_t saved = totals_.bytes_done;
        totals_.bytes_done += in_flight;
        Emit(RepackEvent::Kind::kProgress, ev);
        totals_.bytes_done = saved;
        lock.lock();
      }
    }
  }
  lock.unlock();
  for (auto& w : workers) w.join();
  if (err) std::rethrow_exception(err);
}

std::string Runner::WriteShard(const ShardPlan& p, RepackEvent* done,
                               std::atomic<uint64_t>* progress, size_t depth, size_t reads,
                               size_t writes, StreamBuffers* bufs) {
  const double t_start = NowSeconds();
  const std::string final_path = JoinPath(opt_.dst, p.out_name);
  RemoveStaleTemps(p.out_name);
  AtomicFileWriter out(final_path);
  // The whole file is allocated first: ext4 (and others) serialize O_DIRECT
  // writes that extend a file, each under the inode's exclusive lock, so the
  // writes in flight to one shard would go one at a time (docs/repack.md,
  // "Performance"). A full disk is also found here, before the shard is read.
  // Filesystems without fallocate write without it.
  if (opt_.direct && !PreallocateOrThrow(out.fd(), p.file_bytes, out.temp_path())) {
    static const char kKey = 0;
    LogOnce(&kKey, LogLevel::kInfo, "%s: no fallocate on this filesystem; writing without it",
            out.temp_path().c_str());
  }

  // Source reads bypass the page cache (O_DIRECT) unless K3_DIRECT=0 or the
  // filesystem refuses: every byte is read once, so caching it only costs a copy
  // and evicts what the rest of the machine needs.
  UniqueFd direct_fd;
  // The same file the header was read from, or none (buffered reads of it).
  if (opt_.direct) direct_fd = ReopenDirect(p.src->path(), p.src->fd(), O_RDONLY);
  if (!direct_fd.valid()) ::posix_fadvise(p.src->fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
  ShardPipeline pipe(p, Segments(p, plan_.block_bytes), plan_.block_bytes, depth, reads, bufs,
                     progress, direct_fd, opt_.test_read_delay_ms);
  // Open to helpers while it runs; on every way out (a failure included) no
  // new helper can join and the ones inside have left before `pipe` goes.
  struct Lent {
    Runner* r;
    ShardPipeline* pipe;
    bool finished = false;
    ~Lent() {
      if (!finished) pipe->Abort();  // helpers blocked on this pipeline return
      {
        std::lock_guard<std::mutex> lock(r->running_mu_);
        std::erase(r->running_, pipe);
      }
      pipe->WaitHelpers();
    }
  } lent{this, &pipe};
  {
    std::lock_guard<std::mutex> lock(running_mu_);
    running_.push_back(&pipe);
  }
  --starting_;
  Xxh128 hasher;
  // Output bypasses the page cache too (aligned chunks O_DIRECT, tail buffered).
  DirectWriter sink(out.temp_path(), out.fd(), plan_.block_bytes, opt_.direct, writes, &bufs->stages);

  {
    // The cores are shared among the shards being quantized now, so the last
    // shard left running gets all of them, not its one stream's share.
    struct Active {
      std::atomic<int>& n;
      explicit Active(std::atomic<int>& a) : n(a) { ++n; }
      ~Active() { --n; }
    } active(active_);
    const auto threads = [this] {
      const int n = std::max(1, active_.load());
      return std::max(1, (threads_ + n - 1) / n);
    };
    std::thread reader = StartThread([&] { pipe.Read(); });
    std::thread writer;
    try {
      writer = StartThread([&] { pipe.Guard([&] { pipe.Write(&sink, &hasher); }); });
    } catch (...) {
      pipe.Abort();
      reader.join();
      throw;
    }
    pipe.Guard([&] { pipe.Transform(threads); });
    reader.join();
    writer.join();
  }
  pipe.RethrowIfFailed();
  lent.finished = true;
  done->streams_lent = pipe.helpers_lent();
  pipe.WaitHelpers();  // their blocks are back in the pool once they left
  pipe.KeepBuffers();
  done->source_xxh128 = pipe.SourceDigest();
  FinishShard(p, out, sink.bytes(), done);
  done->shard_seconds = NowSeconds() - t_start;
  return hasher.HexDigest();
}

void Runner::HelpOthers(size_t reads, StreamBuffers* bufs, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    ShardPipeline* target = nullptr;
    {
      std::lock_guard<std::mutex> lock(running_mu_);
      size_t most = 1;  // lending for the last segment gains nothing
      for (ShardPipeline* p : running_) {
        const size_t left = p->Unclaimed();
        if (left > most) most = left, target = p;
      }
      if (target) target->AddHelper();
    }
    if (!target) {
      if (starting_.load() == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    target->Help(&bufs->blocks[0], reads);
  }
}

// Size check, fsync, re-read of the header, the optional full comparison, then
// the atomic publish: nothing is renamed into place before all of it passed.
void Runner::FinishShard(const ShardPlan& p, AtomicFileWriter& out, uint64_t written, RepackEvent* done) {
  if (written != p.file_bytes || FileSizeOrThrow(out.fd(), out.temp_path()) != p.file_bytes) {
    throw Error(ErrorCode::kInternal,
                "wrote " + std::to_string(written) + " bytes, planned " + std::to_string(p.file_bytes),
                out.temp_path());
  }
  CrashPoint("repack-shard-written");
  FsyncOrThrow(out.fd(), out.temp_path());
  CheckWrittenShard(out.temp_path(), p);
  // From here a failure is this shard's alone (ShardFailed): the pass goes on.
  try {
    if (const std::optional<Problem> changed = SourceChange(p)) {
      throw Error(ErrorCode::kChecksumMismatch,
                  "source shard changed while it was converted (" + changed->detail +
                      "); the shard was not published: rerun once the source is stable",
                  p.src->path());
    }
    if (opt_.verify_full) {
      // Drop the just-written pages so the comparison reads what reached the disk.
      ::posix_fadvise(out.fd(), 0, 0, POSIX_FADV_DONTNEED);
      done->expert_bytes_verified =
          CompareExperts(p, out.temp_path(), plan_.block_bytes, done->source_xxh128);
    }
  } catch (const Error& e) {
    throw ShardFailed{e};
  }
  out.Commit();  // crash points "before-rename" / "after-rename" inside
  CrashPoint("repack-shard-committed");
  done->shard_out_bytes = p.file_bytes;
}

}  // namespace k3::repack
