#include "k3/core/direct_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <span>
#include <system_error>

#include "k3/core/error.h"
#include "k3/core/log.h"

namespace k3 {

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

void AlignedBuffer::Reserve(size_t n) {
  if (n <= cap_) return;
  size_t cap = (n + kAlign - 1) / kAlign * kAlign;
  void* mem = std::aligned_alloc(kAlign, cap);
  if (!mem)
    throw Error(ErrorCode::kIo, "out of memory for a " + std::to_string(cap) + "-byte block");
  p_.reset(static_cast<std::byte*>(mem));
  cap_ = cap;
}

bool ReadDirect(int fd, AlignedBuffer* buf, uint64_t off, uint64_t len, const std::string& path,
                size_t* skip) {
  const uint64_t a0 = off / AlignedBuffer::kAlign * AlignedBuffer::kAlign;
  const uint64_t a1 =
      (off + len + AlignedBuffer::kAlign - 1) / AlignedBuffer::kAlign * AlignedBuffer::kAlign;
  buf->Reserve(a1 - a0);
  uint64_t done = 0;
  while (a0 + done < off + len) {
    ssize_t n = ::pread(fd, buf->data() + done, a1 - a0 - done, static_cast<off_t>(a0 + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EINVAL && done == 0) return false;
      ThrowErrno(errno, "pread (O_DIRECT)", path, static_cast<int64_t>(a0 + done));
    }
    if (n == 0) {
      throw Error(ErrorCode::kTruncated, "file ends before the requested bytes", path,
                  static_cast<int64_t>(a0 + done));
    }
    done += static_cast<uint64_t>(n);
  }
  *skip = static_cast<size_t>(off - a0);
  return true;
}

UniqueFd ReopenDirect(const std::string& path, int fd, int access) {
  // O_NOFOLLOW: the inode check below would pass a link that leads back to
  // fd's file, and following a name that is now a link is what it refuses.
  UniqueFd d = TryOpen(path, access | O_DIRECT | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW);
  if (!d.valid()) return d;
  struct stat a {
  }, b{};
  const int fl = ::fcntl(d.get(), F_GETFL);
  if (::fstat(fd, &a) != 0 || ::fstat(d.get(), &b) != 0 || a.st_dev != b.st_dev ||
      a.st_ino != b.st_ino || fl < 0 || ::fcntl(d.get(), F_SETFL, fl & ~O_NONBLOCK) != 0) {
    d.Reset();
    errno = ESTALE;
  }
  return d;
}

DirectReader::DirectReader(const std::string& path, int buffered_fd, bool direct)
    : path_(path), buffered_fd_(buffered_fd) {
  if (direct) direct_fd_ = ReopenDirect(path, buffered_fd, O_RDONLY);
  if (!direct_fd_.valid()) ::posix_fadvise(buffered_fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

const std::byte* DirectReader::Read(uint64_t off, uint64_t len) {
  size_t skip = 0;
  if (direct_fd_.valid()) {
    if (ReadDirect(direct_fd_.get(), &buf_, off, len, path_, &skip)) return buf_.data() + skip;
    static const char kKey = 0;
    LogOnce(&kKey, LogLevel::kInfo,
            "%s: O_DIRECT refused by the filesystem; reading through the page cache",
            path_.c_str());
    direct_fd_.Reset();
  }
  buf_.Reserve(len);
  PreadFull(buffered_fd_, std::span(buf_.data(), len), off, path_);
  return buf_.data();
}

DirectWriter::DirectWriter(const std::string& path, int buffered_fd, size_t stage_bytes, bool direct,
                           size_t writes_in_flight, std::vector<AlignedBuffer>* stages)
    : path_(path), buffered_fd_(buffered_fd), stages_(stages ? stages : &own_stages_) {
  stage_cap_ = std::max<size_t>(AlignedBuffer::kAlign,
                                stage_bytes / AlignedBuffer::kAlign * AlignedBuffer::kAlign);
  // The temp file by name: only if the name still holds the file we created.
  if (direct) direct_fd_ = ReopenDirect(path, buffered_fd, O_WRONLY);
  if (!direct_fd_.valid()) return;  // everything through the buffered descriptor, in order
  const size_t n_io = std::max<size_t>(1, writes_in_flight);
  // One stage per write in flight plus the one being filled.
  if (stages_->size() < n_io + 1) stages_->resize(n_io + 1);
  jobs_ = std::make_unique<BoundedQueue<Job>>(n_io + 1);
  free_ = std::make_unique<BoundedQueue<size_t>>(n_io + 1);
  for (size_t i = 0; i <= n_io; ++i) {
    (*stages_)[i].Reserve(stage_cap_);
    if (i > 0) free_->Push(i);
  }
  cur_ = 0;
  try {
    for (size_t i = 0; i < n_io; ++i) io_.emplace_back([this] { IoThread(); });
  } catch (const std::system_error& e) {  // no destructor runs for a failed constructor
    jobs_->Close();
    free_->Close();
    for (auto& t : io_) t.join();
    throw Error(ErrorCode::kIo, std::string("cannot start a write thread (") + e.what() + ")", path);
  }
}

DirectWriter::~DirectWriter() {
  if (jobs_) {
    jobs_->Close();
    free_->Close();
  }
  for (auto& t : io_) t.join();
}

void DirectWriter::IoThread() {
  Job j;
  while (jobs_->Pop(&j)) {
    if (j.stage == SIZE_MAX) return;
    try {
      WriteChunk(j);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(err_mu_);
        if (!err_) err_ = std::current_exception();
      }
      jobs_->Close();
      free_->Close();
      return;
    }
    if (!free_->Push(j.stage)) return;
  }
}

void DirectWriter::WriteChunk(const Job& j) {
  const std::byte* p = (*stages_)[j.stage].data();
  size_t done = 0;
  while (done < j.len && direct_ok_.load()) {
    ssize_t w = ::pwrite(direct_fd_.get(), p + done, j.len - done, static_cast<off_t>(j.off + done));
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EINVAL) {
        static const char kKey = 0;
        LogOnce(&kKey, LogLevel::kInfo,
                "%s: O_DIRECT writes refused by the filesystem; writing through the page cache",
                path_.c_str());
        direct_ok_ = false;
        break;
      }
      ThrowErrno(errno, "pwrite (O_DIRECT)", path_, static_cast<int64_t>(j.off + done));
    }
    done += static_cast<size_t>(w);
  }
  if (done < j.len) PwriteFull(buffered_fd_, std::span(p + done, j.len - done), j.off + done, path_);
}

void DirectWriter::RethrowIfFailed() {
  std::lock_guard<std::mutex> lock(err_mu_);
  if (err_) std::rethrow_exception(err_);
}

void DirectWriter::Submit(size_t len) {
  if (!jobs_->Push({cur_, file_off_, len}) || !free_->Pop(&cur_)) {
    RethrowIfFailed();
    throw Error(ErrorCode::kInternal, "direct writer stopped", path_);
  }
  file_off_ += len;
  fill_ = 0;
}

void DirectWriter::Append(const std::byte* data, size_t n) {
  appended_ += n;
  if (!direct_fd_.valid()) {
    PwriteFull(buffered_fd_, std::span(data, n), file_off_, path_);
    file_off_ += n;
    return;
  }
  while (n > 0) {
    size_t k = std::min(n, stage_cap_ - fill_);
    std::memcpy((*stages_)[cur_].data() + fill_, data, k);
    fill_ += k;
    data += k;
    n -= k;
    if (fill_ == stage_cap_) Submit(fill_);
  }
}

void DirectWriter::Stop() {
  for (size_t i = 0; i < io_.size(); ++i) jobs_->Push({});  // (a closed queue refuses them)
  for (auto& t : io_) t.join();
  io_.clear();
}

void DirectWriter::Finish() {
  if (!direct_fd_.valid()) return;
  // The aligned part goes the direct way; the unaligned rest (< 4 KiB) is
  // written buffered once every direct write is done.
  const size_t aligned = fill_ / AlignedBuffer::kAlign * AlignedBuffer::kAlign;
  const size_t rest = fill_ - aligned;
  const size_t last = cur_;
  if (aligned > 0) {
    if (!jobs_->Push({cur_, file_off_, aligned})) {
      RethrowIfFailed();
      throw Error(ErrorCode::kInternal, "direct writer stopped", path_);
    }
  }
  Stop();
  RethrowIfFailed();
  if (rest > 0) {
    PwriteFull(buffered_fd_, std::span((*stages_)[last].data() + aligned, rest), file_off_ + aligned,
               path_);
  }
  file_off_ += fill_;
  fill_ = 0;
}

}  // namespace k3
