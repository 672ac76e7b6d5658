// Page-cache-bypassing reads and writes for data read or written exactly once
// (conversion and verification streams, parked checkpoints): caching it costs a
// copy into freshly allocated page-cache memory and evicts what the rest of the
// machine needs. Falls back to buffered I/O where O_DIRECT is refused (tmpfs,
// some FUSE/NFS mounts) or when the caller says `direct = false` (K3_DIRECT=0,
// read by each tool at start-up, docs/environment.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "k3/core/file.h"
#include "k3/core/queue.h"

namespace k3 {

// Heap block aligned for O_DIRECT; contents uninitialised. Grows, never shrinks.
class AlignedBuffer {
 public:
  static constexpr size_t kAlign = 4096;
  void Reserve(size_t n);
  std::byte* data() const { return p_.get(); }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> p_;
  size_t cap_ = 0;
};

// A second descriptor, with O_DIRECT, of the file `fd` has open as `path`
// (access: O_RDONLY or O_WRONLY). Invalid (errno kept) when the filesystem
// refuses O_DIRECT or when `path` no longer names that file: the open is
// O_NONBLOCK (a FIFO put there would block it) and O_NOFOLLOW (a link there is
// refused with ELOOP, even one that leads back to fd's file), and its device
// and inode must equal fd's, so a name swapped for a link, a hard link or a
// FIFO since `fd` was opened is never read or written through. The caller
// keeps using `fd`.
UniqueFd ReopenDirect(const std::string& path, int fd, int access);

// O_DIRECT read of [off, off+len) through the aligned superset of the range;
// *skip is where the range starts in `buf`. Returns false (nothing thrown) when
// the filesystem refuses direct I/O; throws k3::Error on real errors.
bool ReadDirect(int fd, AlignedBuffer* buf, uint64_t off, uint64_t len, const std::string& path,
                size_t* skip);

// One file read block by block, directly when possible. Not thread-safe.
class DirectReader {
 public:
  // `buffered_fd` stays owned by the caller and is used after a fallback (and
  // throughout when `direct` is false).
  DirectReader(const std::string& path, int buffered_fd, bool direct);
  // Reads [off, off+len) and returns a pointer to it, valid until the next Read.
  const std::byte* Read(uint64_t off, uint64_t len);

 private:
  std::string path_;
  int buffered_fd_;
  UniqueFd direct_fd_;
  AlignedBuffer buf_;
};

// Appends a stream to a file opened elsewhere (the AtomicFileWriter's temp file):
// full 4 KiB-aligned chunks go through an O_DIRECT descriptor from aligned
// staging blocks, the unaligned tail through the buffered one. A full staging
// block is handed to one of `writes_in_flight` I/O threads (pwrite at its own
// offset) and the next one is filled meanwhile, so the caller's hashing and
// copying overlap the disk's writes and the disk sees several at once, as it
// does reads. The caller's fsync on the buffered descriptor makes both durable.
// Append and Finish are for one thread; they rethrow the first I/O thread's
// error (k3::Error). Destroying a writer that was not finished stops its
// threads; what was queued may be partly written (the caller discards the file).
class DirectWriter {
 public:
  // `stages` (optional) lends its memory for the staging blocks, so a caller
  // writing many files reuses them (fresh pages are slow to fault in on VMs);
  // it must outlive the writer. It ends up with writes_in_flight + 1 blocks.
  // `direct` false: every byte goes through the buffered descriptor.
  DirectWriter(const std::string& path, int buffered_fd, size_t stage_bytes, bool direct,
               size_t writes_in_flight = 1, std::vector<AlignedBuffer>* stages = nullptr);
  ~DirectWriter();
  DirectWriter(const DirectWriter&) = delete;
  DirectWriter& operator=(const DirectWriter&) = delete;
  void Append(const std::byte* data, size_t n);
  void Finish();  // writes what is staged and waits for every write; call once, before fsync
  uint64_t bytes() const { return appended_; }

 private:
  struct Job {
    size_t stage = SIZE_MAX;  // SIZE_MAX: the I/O thread stops
    uint64_t off = 0;
    size_t len = 0;
  };
  void IoThread();
  void WriteChunk(const Job& j);     // on an I/O thread: O_DIRECT, or buffered after a refusal
  void Submit(size_t len);           // queues the first len bytes of the current stage
  void Stop();                       // ends the I/O threads (queued jobs first unless failed)
  void RethrowIfFailed();
  std::string path_;
  int buffered_fd_;
  UniqueFd direct_fd_;
  std::vector<AlignedBuffer> own_stages_;
  std::vector<AlignedBuffer>* stages_;  // own_stages_ or the caller's
  size_t stage_cap_;
  size_t cur_ = 0;   // stage being filled
  size_t fill_ = 0;  // bytes in it
  uint64_t file_off_ = 0;  // file offset of the current stage's first byte
  uint64_t appended_ = 0;
  std::unique_ptr<BoundedQueue<Job>> jobs_;
  std::unique_ptr<BoundedQueue<size_t>> free_;  // stages not being written
  std::vector<std::thread> io_;
  std::atomic<bool> direct_ok_{true};
  std::mutex err_mu_;
  std::exception_ptr err_;
};
}  // namespace k3
