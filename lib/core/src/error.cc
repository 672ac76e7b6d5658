#include "k3/core/error.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace k3 {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid-argument";
    case ErrorCode::kNotFound: return "not-found";
    case ErrorCode::kCorrupt: return "corrupt";
    case ErrorCode::kTruncated: return "truncated";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kChecksumMismatch: return "checksum-mismatch";
    case ErrorCode::kNoSpace: return "no-space";
    case ErrorCode::kExists: return "exists";
    case ErrorCode::kBusy: return "busy";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kUnavailable: return "unavailable";
  }
  return "unknown";
}

int ExitCodeFor(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return 0;
    case ErrorCode::kInvalidArgument: return 2;
    case ErrorCode::kNotFound: return 3;
    case ErrorCode::kCorrupt:
    case ErrorCode::kTruncated: return 4;
    case ErrorCode::kChecksumMismatch: return 5;
    case ErrorCode::kNoSpace: return 6;
    case ErrorCode::kExists: return 7;
    case ErrorCode::kBusy: return 8;
    case ErrorCode::kUnsupported: return 9;
    case ErrorCode::kIo: return 10;
    case ErrorCode::kCancelled: return 130;
    case ErrorCode::kInternal: return 70;
    case ErrorCode::kUnavailable: return 75;  // EX_TEMPFAIL: a supervisor restarts the job
  }
  return 1;
}

Error::Error(ErrorCode code, std::string detail, std::string path, int64_t offset,
             std::string object)
    : code_(code),
      detail_(std::move(detail)),
      path_(std::move(path)),
      offset_(offset),
      object_(std::move(object)) {
  Format();
}

void Error::Format() {
  what_.clear();
  if (!path_.empty()) what_ += path_ + ": ";
  if (offset_ >= 0) what_ += "offset " + std::to_string(offset_) + ": ";
  if (!object_.empty()) what_ += "'" + object_ + "': ";
  what_ += detail_;
  what_ += " [";
  what_ += ErrorCodeName(code_);
  what_ += "]";
}

Error Error::WithPath(std::string path) const {
  Error e = *this;
  if (e.path_.empty()) e.path_ = std::move(path);
  e.Format();
  return e;
}

Error Error::WithObject(std::string object) const {
  Error e = *this;
  if (e.object_.empty()) e.object_ = std::move(object);
  e.Format();
  return e;
}

void ThrowErrno(int err, std::string_view what, std::string path, int64_t offset) {
  ErrorCode code = ErrorCode::kIo;
  if (err == ENOSPC || err == EDQUOT) code = ErrorCode::kNoSpace;
  if (err == ENOENT) code = ErrorCode::kNotFound;
  std::string detail(what);
  detail += ": ";
  detail += std::strerror(err);
  throw Error(code, std::move(detail), std::move(path), offset);
}

void CheckFailed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "k3: internal check failed: %s at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace k3
