#include "k3/core/tool.h"

#include <poll.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "k3/core/error.h"

#ifndef K3_VERSION
#define K3_VERSION "unknown"
#endif
#ifndef K3_GIT_SHA
#define K3_GIT_SHA "unknown"
#endif
#ifndef K3_BUILD_TYPE
#define K3_BUILD_TYPE "unknown"
#endif

namespace k3 {

std::string VersionLine(const char* tool) {
  return std::string(tool) + " " + K3_VERSION + " (git " + K3_GIT_SHA + ", " + K3_BUILD_TYPE + ")";
}

namespace {

// A write that failed before the final flush left no errno behind; a pipe or
// socket whose reader is gone still says so to poll().
bool ReaderGone(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) return false;
  struct pollfd p {fd, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0;
}

}  // namespace

int FinishStdout(const char* tool, int rc) {
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;
  int err = flush_failed ? errno : 0;
  if (!flush_failed && !std::ferror(stdout)) return rc;
  if (err == 0 && ReaderGone(::fileno(stdout))) err = EPIPE;
  if (err == EPIPE) return rc != 0 ? rc : kExitBrokenPipe;
  std::fprintf(stderr, "%s: error: writing to stdout: %s\n", tool,
               err != 0 ? std::strerror(err) : "a write failed");
  if (rc != 0) return rc;
  return ExitCodeFor(err == ENOSPC || err == EDQUOT ? ErrorCode::kNoSpace : ErrorCode::kIo);
}

}  // namespace k3
