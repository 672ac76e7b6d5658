// k3::Error — the one typed error of the project: a code, the file, the byte offset,
// the object (tensor, key, expert) and a human detail.
//
// Cold paths throw it; expected per-item outcomes are returned as values (see
// Issue below) so tools can report them all and carry on. Library code never
// calls exit(). Thread-safe: plain value type.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace k3 {

// Documented in docs/errors.md; apps map them to exit codes via ExitCodeFor().
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument,   // bad flag, bad environment variable, bad API use
  kNotFound,          // a file, tensor, key that must exist does not
  kCorrupt,           // bytes present but inconsistent (bad JSON, overlap, hole, ...)
  kTruncated,         // the file ends before the bytes it promises
  kIo,                // a syscall failed (errno in detail)
  kUnsupported,       // well-formed but outside what k3 handles (dtype, shape)
  kChecksumMismatch,  // content differs from its recorded hash or its source
  kNoSpace,           // ENOSPC / EDQUOT, or the plan needs more than is free
  kExists,            // refusing to overwrite / mismatching fingerprint
  kBusy,              // a lock is held by someone else
  kCancelled,         // user interrupt
  kInternal,          // broken invariant that is not worth aborting for
  kUnavailable,       // a peer the run depends on is gone or late (a cluster worker): restart
};

std::string_view ErrorCodeName(ErrorCode code);

// Process exit code for an error code (docs/errors.md). 0 only for kOk.
int ExitCodeFor(ErrorCode code);

class Error : public std::exception {
 public:
  static constexpr int64_t kNoOffset = -1;

  Error(ErrorCode code, std::string detail, std::string path = {},
        int64_t offset = kNoOffset, std::string object = {});

  ErrorCode code() const { return code_; }
  const std::string& path() const { return path_; }
  int64_t offset() const { return offset_; }
  const std::string& object() const { return object_; }
  const std::string& detail() const { return detail_; }

  // "path: offset 123: tensor 'x': detail [kCorrupt]"
  const char* what() const noexcept override { return what_.c_str(); }

  // Copies with a field filled in when the thrower did not know it.
  Error WithPath(std::string path) const;
  Error WithObject(std::string object) const;

 private:
  void Format();
  ErrorCode code_;
  std::string detail_;
  std::string path_;
  int64_t offset_;
  std::string object_;
  std::string what_;
};

// Throws kIo with strerror(err) appended to `what`.
[[noreturn]] void ThrowErrno(int err, std::string_view what, std::string path = {},
                             int64_t offset = Error::kNoOffset);

// Broken invariant: print file:line and abort. For bugs, never for bad input.
[[noreturn]] void CheckFailed(const char* expr, const char* file, int line);

}  // namespace k3

#define K3_CHECK(cond) \
  ((cond) ? (void)0 : ::k3::CheckFailed(#cond, __FILE__, __LINE__))
