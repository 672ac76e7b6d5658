// Page-cache-bypassing reads and writes for data read or written exactly once
// (conversion and verification streams, parked checkpoints): caching it costs a
// copy into freshly allocated page-cache memory and evicts what the rest of the
// machine needs. Falls back to buffered I/O where O_DIRECT is refused (tmpfs,
// some FUSE/NFS mounts) or when the caller says `direct = false` (K3_DIRECT=0,
// read by each tool at start-up, docs/environment.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "k3/core/file.h"

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
// full 4 KiB-aligned chunks go through an O_DIRECT descriptor from an aligned
// staging block, the unaligned tail through the buffered one. The caller's fsync
// on the buffered descriptor makes both durable. Not thread-safe.
class DirectWriter {
 public:
  // `stage` (optional) lends its memory for the staging block, so a caller
  // writing many files reuses one (fresh pages are slow to fault in on VMs);
  // it must outlive the writer. `direct` false: every byte goes through the
  // buffered descriptor.
  DirectWriter(const std::string& path, int buffered_fd, size_t stage_bytes, bool direct,
               AlignedBuffer* stage = nullptr);
  void Append(const std::byte* data, size_t n);
  void Finish();  // writes what is staged; call once, before fsync
  uint64_t bytes() const { return appended_; }

 private:
  void Flush(size_t n);  // writes the first n staged bytes (n aligned unless buffered)
  std::string path_;
  int buffered_fd_;
  UniqueFd direct_fd_;
  AlignedBuffer own_stage_;
  AlignedBuffer* stage_;  // own_stage_ or the caller's
  size_t stage_cap_;
  size_t fill_ = 0;
  uint64_t file_off_ = 0;  // file offset of stage_[0]
  uint64_t appended_ = 0;
};

}  // namespace k3
