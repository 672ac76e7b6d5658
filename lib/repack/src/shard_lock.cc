#include "shard_lock.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/log.h"

namespace k3::repack {

pid_t ConvertingProcess(const std::string& dst) {
  UniqueFd fd(::open(JoinPath(dst, kShardLockName).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return 0;
  struct flock who {};
  who.l_type = F_WRLCK;
  who.l_whence = SEEK_SET;  // l_start 0, l_len 0: the whole file
  if (::fcntl(fd.get(), F_GETLK, &who) != 0 || who.l_type == F_UNLCK) return 0;
  return who.l_pid;
}

ShardLock::ShardLock(int fd, int64_t number, const std::string& path, const std::string& shard)
    : fd_(fd), number_(number) {
  struct flock fl = Range(F_WRLCK);
  if (::fcntl(fd_, F_SETLK, &fl) == 0) return;
  if (errno != EACCES && errno != EAGAIN) ThrowErrno(errno, "lock", path);
  struct flock who = Range(F_WRLCK);
  std::string holder = "another process";
  if (::fcntl(fd_, F_GETLK, &who) == 0 && who.l_type != F_UNLCK) {
    holder = "process " + std::to_string(who.l_pid);
  }
  K3_LOG_WARN("%s is being converted by %s (another k3-repack into this destination); waiting for it",
              shard.c_str(), holder.c_str());
  // Polled, not F_SETLKW: the kernel's deadlock check sees processes, not
  // threads, so with several streams per pass a blocked wait here plus one on
  // the container lock (another stream's, or the other pass's) looks like a
  // cycle and fails with EDEADLK, although every holder finishes and lets go.
  while (::fcntl(fd_, F_SETLK, &fl) != 0) {
    if (errno != EACCES && errno != EAGAIN && errno != EINTR) ThrowErrno(errno, "lock", path);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  waited_ = true;
}

ShardLock::~ShardLock() {
  struct flock fl = Range(F_UNLCK);
  ::fcntl(fd_, F_SETLK, &fl);
}

struct flock ShardLock::Range(short type) const {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(number_);
  fl.l_len = 1;
  return fl;
}

}  // namespace k3::repack
