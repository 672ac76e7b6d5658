#include "k3/core/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "k3/core/error.h"

namespace k3 {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void DropFromPageCache(const std::string& path) {
  UniqueFd fd = OpenOrThrow(path, O_RDONLY);
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
}

UniqueFd TryOpen(const std::string& path, int flags, int mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return UniqueFd(fd);
}

UniqueFd OpenOrThrow(const std::string& path, int flags, int mode) {
  UniqueFd fd = TryOpen(path, flags, mode);
  if (!fd.valid()) ThrowErrno(errno, "open", path);
  return fd;
}

namespace {

const char* FileTypeName(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFIFO:
      return "a FIFO";
    case S_IFDIR:
      return "a directory";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "not a regular file";
  }
}

}  // namespace

UniqueFd OpenRegularFileOrThrow(const std::string& path, struct ::stat* st_out) {
  UniqueFd fd = TryOpen(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
  if (!fd.valid()) {
    // O_NOFOLLOW on a link: ELOOP (Linux), EMLINK / EFTYPE elsewhere.
    if (errno == ELOOP || errno == EMLINK) {
      throw Error(ErrorCode::kUnsupported, "is a symbolic link, not a regular file (not followed)",
                  path);
    }
    ThrowErrno(errno, "open", path);
  }
  struct ::stat st {};
  if (::fstat(fd.get(), &st) != 0) ThrowErrno(errno, "fstat", path);
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kUnsupported,
                std::string("is ") + FileTypeName(st.st_mode) + ", not a regular file", path);
  }
  // Regular files never block; later reads should not see EAGAIN either.
  const int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0) ThrowErrno(errno, "fcntl", path);
  if (st_out) *st_out = st;
  return fd;
}

uint64_t FileSizeOrThrow(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) ThrowErrno(errno, "fstat", path);
  return static_cast<uint64_t>(st.st_size);
}

uint64_t FileSizeOrThrow(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) ThrowErrno(errno, "stat", path);
  return static_cast<uint64_t>(st.st_size);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

size_t PreadUpTo(int fd, std::span<std::byte> buf, uint64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < buf.size()) {
    size_t want = buf.size() - done;
    if (want > (size_t{1} << 30)) want = size_t{1} << 30;
    ssize_t n = ::pread(fd, buf.data() + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      ThrowErrno(errno, "pread", path, static_cast<int64_t>(offset + done));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

void PreadFull(int fd, std::span<std::byte> buf, uint64_t offset, const std::string& path) {
  size_t got = PreadUpTo(fd, buf, offset, path);
  if (got != buf.size()) {
    throw Error(ErrorCode::kTruncated,
                "file ends after " + std::to_string(offset + got) + " bytes, needed " +
                    std::to_string(buf.size()) + " bytes from here",
                path, static_cast<int64_t>(offset));
  }
}

void WriteFull(int fd, std::span<const std::byte> buf, const std::string& path) {
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::write(fd, buf.data() + done, buf.size() - done);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      ThrowErrno(errno, "write", path);
    }
    done += static_cast<size_t>(n);
  }
}

void PwriteFull(int fd, std::span<const std::byte> buf, uint64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::pwrite(fd, buf.data() + done, buf.size() - done,
                         static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      ThrowErrno(errno, "pwrite", path, static_cast<int64_t>(offset + done));
    }
    done += static_cast<size_t>(n);
  }
}

std::string ReadFileOrThrow(const std::string& path, uint64_t max_bytes) {
  UniqueFd fd = OpenOrThrow(path, O_RDONLY);
  uint64_t size = FileSizeOrThrow(fd.get(), path);
  if (size > max_bytes) {
    throw Error(ErrorCode::kCorrupt,
                "file is " + std::to_string(size) + " bytes, limit " + std::to_string(max_bytes),
                path);
  }
  std::string out(size, '\0');
  PreadFull(fd.get(), std::as_writable_bytes(std::span(out.data(), out.size())), 0, path);
  return out;
}

void FsyncOrThrow(int fd, const std::string& path) {
  if (::fsync(fd) != 0) ThrowErrno(errno, "fsync", path);
}

bool PreallocateOrThrow(int fd, uint64_t bytes, const std::string& path) {
  if (bytes == 0) return true;
  int rc;
  do {
    rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return true;
  if (errno == EOPNOTSUPP || errno == ENOSYS) return false;
  ThrowErrno(errno, "fallocate " + std::to_string(bytes) + " bytes", path);
}

void FsyncDirOrThrow(const std::string& dir) {
  UniqueFd fd = OpenOrThrow(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
  // Some filesystems (e.g. certain FUSE/NFS setups) refuse fsync on directories.
  if (::fsync(fd.get()) != 0 && errno != EINVAL && errno != EROFS) {
    ThrowErrno(errno, "fsync directory", dir);
  }
}

std::vector<std::string> ListDirectoryOrThrow(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) ThrowErrno(errno, "list directory", dir);
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(std::move(name));
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) ThrowErrno(err, "read directory", dir);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> ListDirectory(const std::string& dir) {
  try {
    return ListDirectoryOrThrow(dir);
  } catch (const Error&) {
    return {};
  }
}

void MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    const std::string partial = dir.substr(0, i);
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) ThrowErrno(errno, "mkdir", partial);
  }
  if (!IsDirectory(dir)) throw Error(ErrorCode::kExists, "exists and is not a directory", dir);
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (!b.empty() && b.front() == '/') return std::string(b);
  std::string out(a);
  if (out.back() != '/') out += '/';
  out += b;
  return out;
}

AtomicFileWriter::AtomicFileWriter(std::string final_path)
    : final_path_(std::move(final_path)),
      temp_path_(final_path_ + ".tmp." + std::to_string(::getpid())) {
  // The temp name is ours, not the caller's: errors name the file they asked for.
  auto fail = [&](int err) {
    ThrowErrno(err, "cannot create " + final_path_ + (err == ENOENT ? " (its directory does not exist)" : ""),
               final_path_);
  };
  dir_fd_ = TryOpen(DirName(final_path_), O_RDONLY | O_DIRECTORY);
  if (!dir_fd_.valid()) fail(errno);
  const std::string leaf = BaseName(temp_path_);
  for (int attempt = 0;; ++attempt) {
    int fd;
    do {
      fd = ::openat(dir_fd_.get(), leaf.c_str(),
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) {
      fd_.Reset(fd);
      break;
    }
    const int err = errno;
    if (err != EEXIST || attempt == 3) {
      if (err == EEXIST) {
        throw Error(
            ErrorCode::kExists,
            "cannot create " + final_path_ + ": its temp name " + leaf +
                " keeps reappearing (another writer with this pid, or someone planting links)",
            final_path_);
      }
      fail(err);
    }
    // A leftover of a killed process that had our pid, or a planted link or
    // file: the name goes, whatever it points to is never opened.
    if (::unlinkat(dir_fd_.get(), leaf.c_str(), 0) != 0 && errno != ENOENT) fail(errno);
  }
}

AtomicFileWriter::~AtomicFileWriter() { Abort(); }

void AtomicFileWriter::Write(std::span<const std::byte> bytes) {
  WriteFull(fd_.get(), bytes, temp_path_);
  bytes_written_ += bytes.size();
}

void AtomicFileWriter::Write(std::string_view text) {
  Write(std::as_bytes(std::span(text.data(), text.size())));
}

void AtomicFileWriter::Commit() {
  K3_CHECK(!done_);
  FsyncOrThrow(fd_.get(), temp_path_);
  fd_.Reset();
  CrashPoint("before-rename");
  // renameat replaces whatever the final name is (a planted link included)
  // and never follows it.
  if (::renameat(dir_fd_.get(), BaseName(temp_path_).c_str(), dir_fd_.get(),
                 BaseName(final_path_).c_str()) != 0) {
    ThrowErrno(errno, "rename to " + final_path_, temp_path_);
  }
  done_ = true;
  CrashPoint("after-rename");
  // Some filesystems (e.g. certain FUSE/NFS setups) refuse fsync on directories.
  if (::fsync(dir_fd_.get()) != 0 && errno != EINVAL && errno != EROFS) {
    ThrowErrno(errno, "fsync directory", DirName(final_path_));
  }
}

void AtomicFileWriter::Abort() noexcept {
  if (done_) return;
  fd_.Reset();
  if (dir_fd_.valid()) ::unlinkat(dir_fd_.get(), BaseName(temp_path_).c_str(), 0);
  done_ = true;
}

void WriteFileAtomic(const std::string& path, std::string_view content) {
  AtomicFileWriter w(path);
  w.Write(content);
  w.Commit();
}

MappedFile MappedFile::OpenOrThrow(const std::string& path) {
  UniqueFd fd = k3::OpenOrThrow(path, O_RDONLY);
  uint64_t size = FileSizeOrThrow(fd.get(), path);
  MappedFile m;
  m.path_ = path;
  m.size_ = size;
  if (size == 0) return m;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) ThrowErrno(errno, "mmap", path);
  m.data_ = static_cast<const std::byte*>(p);
  return m;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(o.data_), size_(o.size_), path_(std::move(o.path_)) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = o.data_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

FileLock::FileLock(const std::string& lock_path) : path_(lock_path) {
  fd_ = OpenOrThrow(lock_path, O_RDWR | O_CREAT, 0644);
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  while (::fcntl(fd_.get(), F_SETLKW, &fl) != 0) {
    if (errno == EINTR) continue;
    ThrowErrno(errno, "lock", lock_path);
  }
}

FileLock::~FileLock() {
  struct flock fl {};
  fl.l_type = F_UNLCK;
  fl.l_whence = SEEK_SET;
  ::fcntl(fd_.get(), F_SETLK, &fl);
}

namespace {

struct CrashState {
  std::atomic<bool> armed{false};
  std::mutex mu;
  std::string name;  // guarded by mu
  long nth = 1;      // guarded by mu
  long hits = 0;     // guarded by mu
};

CrashState& Crash() {
  static CrashState s;
  return s;
}

}  // namespace

void SetCrashPoint(std::string_view name, long nth) {
  CrashState& c = Crash();
  std::lock_guard<std::mutex> lock(c.mu);
  c.name = std::string(name);
  c.nth = nth;
  c.hits = 0;
  c.armed.store(!name.empty(), std::memory_order_release);
}

void CrashPoint(const char* name) {
  CrashState& c = Crash();
  if (!c.armed.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.name != name) return;
  if (++c.hits >= c.nth) {
    ::kill(::getpid(), SIGKILL);
  }
}

namespace {

struct StallState {
  std::atomic<bool> armed{false};
  std::string name;  // written before `armed` is set
  double seconds = 0;
};

StallState& Stall() {
  static StallState s;
  return s;
}

}  // namespace

void SetStallPoint(std::string_view name, double seconds) {
  StallState& s = Stall();
  s.armed.store(false, std::memory_order_release);
  s.name = std::string(name);
  s.seconds = seconds;
  s.armed.store(!name.empty() && seconds > 0, std::memory_order_release);
}

void StallPoint(const char* name) {
  StallState& s = Stall();
  if (!s.armed.load(std::memory_order_acquire) || s.name != name) return;
  std::this_thread::sleep_for(std::chrono::duration<double>(s.seconds));
}

uint64_t FreeSpaceBytes(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0) ThrowErrno(errno, "statvfs", path);
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

}  // namespace k3
