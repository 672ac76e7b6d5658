// POSIX file helpers: RAII owners for fds and mappings, complete reads/writes
// (short counts, EINTR), atomic publication (tmp -> fsync -> rename -> fsync dir),
// advisory locks and named crash points for kill tests.
//
// All functions throw k3::Error naming the path and offset on failure.
// Objects are movable, not copyable; none are shared between threads unless noted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <string_view>

struct stat;

namespace k3 {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) { Reset(); fd_ = o.Release(); }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { int f = fd_; fd_ = -1; return f; }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// open(2) with O_CLOEXEC; throws kNotFound / kIo naming the path.
UniqueFd OpenOrThrow(const std::string& path, int flags, int mode = 0644);
// Returns an invalid fd instead of throwing (errno preserved).
UniqueFd TryOpen(const std::string& path, int flags, int mode = 0644);
// Opens an existing file for reading only if it is a regular file, without
// following a symbolic link at its last component and without blocking: the
// open is O_RDONLY | O_NONBLOCK | O_NOFOLLOW (a FIFO opens at once instead of
// waiting for a writer), fstat must say S_IFREG, then O_NONBLOCK is cleared.
// For files a hostile local user may have replaced (parked checkpoints).
// Throws kNotFound, kUnsupported ("is a FIFO / directory / symbolic link ...,
// not a regular file") or kIo, naming the path. `st` (optional) gets the fstat.
UniqueFd OpenRegularFileOrThrow(const std::string& path, struct ::stat* st = nullptr);

// Asks the kernel to drop `path`'s clean pages from the page cache (for cold
// reads in benchmarks and tests; dirty pages stay until written back).
void DropFromPageCache(const std::string& path);

uint64_t FileSizeOrThrow(int fd, const std::string& path_for_errors);
uint64_t FileSizeOrThrow(const std::string& path);
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
// The names in `dir` ("." and ".." excluded), sorted. The OrThrow form throws
// (ThrowErrno: the errno and `dir`) when it cannot be read; the
// other returns nothing then.
std::vector<std::string> ListDirectoryOrThrow(const std::string& dir);
std::vector<std::string> ListDirectory(const std::string& dir);
// mkdir -p: creates `dir` and its missing parents (0755). Throws kIo naming the
// component that failed, kExists when `dir` exists but is not a directory.
void MakeDirs(const std::string& dir);

// Reads exactly buf.size() bytes at `offset`; retries EINTR and short reads.
// Throws kTruncated if the file ends first, kIo on errors.
void PreadFull(int fd, std::span<std::byte> buf, uint64_t offset, const std::string& path);
// Reads up to buf.size() bytes; returns how many were read (short only at EOF).
size_t PreadUpTo(int fd, std::span<std::byte> buf, uint64_t offset, const std::string& path);
// Writes all bytes at the current position (or at `offset` with PwriteFull).
void WriteFull(int fd, std::span<const std::byte> buf, const std::string& path);
void PwriteFull(int fd, std::span<const std::byte> buf, uint64_t offset, const std::string& path);

std::string ReadFileOrThrow(const std::string& path, uint64_t max_bytes);
void FsyncOrThrow(int fd, const std::string& path);
// Allocates [0, bytes) of a file about to be written (fallocate, mode 0: the
// size becomes `bytes`, the blocks unwritten until written). False where the
// filesystem cannot (EOPNOTSUPP: some NFS and FUSE); throws otherwise (ENOSPC
// or EDQUOT as kNoSpace, naming the file and the bytes).
bool PreallocateOrThrow(int fd, uint64_t bytes, const std::string& path);
void FsyncDirOrThrow(const std::string& dir);
std::string DirName(const std::string& path);
std::string BaseName(const std::string& path);
std::string JoinPath(std::string_view a, std::string_view b);

// Writes a file so that its final name only ever holds complete content:
// data goes to "<path>.tmp.<pid>", Commit() fsyncs it, renames it over <path>
// and fsyncs the directory. Destruction without Commit() unlinks the temp file.
// Hostile directories: the temp file is created with O_CREAT | O_EXCL |
// O_NOFOLLOW, so a symbolic link (or anything else) planted at the temp name is
// never followed or written through: the name is unlinked (removing a link
// never touches its target) and the create retried, up to 3 times, then
// kExists. Create, rename, unlink and the directory fsync all go through one
// descriptor of the directory opened at construction (openat/renameat), so a
// directory swapped for a link meanwhile does not redirect them; rename(2)
// replaces a link planted at the final name instead of following it.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string final_path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void Write(std::span<const std::byte> bytes);
  void Write(std::string_view text);
  uint64_t bytes_written() const { return bytes_written_; }
  int fd() const { return fd_.get(); }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }
  // fsync, rename over the final name, fsync the directory.
  void Commit();
  // Unlink the temp file (idempotent).
  void Abort() noexcept;

 private:
  std::string final_path_;
  std::string temp_path_;
  UniqueFd dir_fd_;  // the directory holding both names
  UniqueFd fd_;
  uint64_t bytes_written_ = 0;
  bool done_ = false;
};

// Convenience: atomically replace `path` with `content`.
void WriteFileAtomic(const std::string& path, std::string_view content);

// Read-only shared mapping of a whole file. Empty files map to an empty span.
class MappedFile {
 public:
  MappedFile() = default;
  static MappedFile OpenOrThrow(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Exclusive advisory lock (flock) on a lock file, held for the object's life.
// Works across processes on one host and, with NFSv4 byte-range emulation,
// across hosts; we use fcntl(F_SETLKW) locks for that reason.
class FileLock {
 public:
  explicit FileLock(const std::string& lock_path);  // blocks until acquired
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  UniqueFd fd_;
  std::string path_;
};

// Named crash point: once armed for `name` (SetCrashPoint), the N-th pass
// through CrashPoint(name) (1-based) kills the process with SIGKILL. Used by
// tests to prove crash safety; the tools arm it at start-up from
// K3_CRASH_AT=name[:N] (k3::toolenv). Free while disarmed (the default).
void CrashPoint(const char* name);
// Arms the crash point `name` for its `nth` pass (nth <= 1: the first); an
// empty name disarms. Resets the pass count. Call before the threads that may
// pass crash points start.
void SetCrashPoint(std::string_view name, long nth = 1);

// Named stall point, the crash point's twin for slow paths: once armed for
// `name` (SetStallPoint), every pass through StallPoint(name) sleeps `seconds`
// (tests of what a long start-up must still do, e.g. stop at a signal); armed
// at start-up from K3_STALL_AT=name:seconds (k3::toolenv). Free while disarmed.
void StallPoint(const char* name);
// Arms the stall point `name` (empty: disarms). Call before threads start.
void SetStallPoint(std::string_view name, double seconds);

// Free bytes available to an unprivileged writer on the filesystem of `path`.
uint64_t FreeSpaceBytes(const std::string& path);

}  // namespace k3
