#include "k3/core/direct_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <span>

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

DirectReader::DirectReader(const std::string& path, int buffered_fd, bool direct)
    : path_(path), buffered_fd_(buffered_fd) {
  if (direct) direct_fd_ = TryOpen(path, O_RDONLY | O_DIRECT);
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
                           AlignedBuffer* stage)
    : path_(path), buffered_fd_(buffered_fd), stage_(stage ? stage : &own_stage_) {
  stage_cap_ = std::max<size_t>(AlignedBuffer::kAlign,
                                stage_bytes / AlignedBuffer::kAlign * AlignedBuffer::kAlign);
  if (direct) direct_fd_ = TryOpen(path, O_WRONLY | O_DIRECT);
  if (direct_fd_.valid()) stage_->Reserve(stage_cap_);
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
    std::memcpy(stage_->data() + fill_, data, k);
    fill_ += k;
    data += k;
    n -= k;
    if (fill_ == stage_cap_) Flush(fill_);
  }
}

void DirectWriter::Flush(size_t n) {
  size_t done = 0;
  while (done < n && direct_fd_.valid()) {
    ssize_t w = ::pwrite(direct_fd_.get(), stage_->data() + done, n - done,
                         static_cast<off_t>(file_off_ + done));
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EINVAL) {
        static const char kKey = 0;
        LogOnce(&kKey, LogLevel::kInfo,
                "%s: O_DIRECT writes refused by the filesystem; writing through the page cache",
                path_.c_str());
        direct_fd_.Reset();
        break;
      }
      ThrowErrno(errno, "pwrite (O_DIRECT)", path_, static_cast<int64_t>(file_off_ + done));
    }
    done += static_cast<size_t>(w);
  }
  if (done < n) {
    PwriteFull(buffered_fd_, std::span(stage_->data() + done, n - done), file_off_ + done, path_);
  }
  // Keep any unflushed remainder at the start of the stage.
  std::memmove(stage_->data(), stage_->data() + n, fill_ - n);
  fill_ -= n;
  file_off_ += n;
}

void DirectWriter::Finish() {
  if (fill_ == 0) return;
  const size_t aligned = fill_ / AlignedBuffer::kAlign * AlignedBuffer::kAlign;
  if (aligned > 0 && direct_fd_.valid()) Flush(aligned);
  if (fill_ > 0) {
    PwriteFull(buffered_fd_, std::span(stage_->data(), fill_), file_off_, path_);
    file_off_ += fill_;
    fill_ = 0;
  }
}

}  // namespace k3
