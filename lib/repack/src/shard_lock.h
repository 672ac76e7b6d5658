// Inter-process locks on one shard of a destination: concurrent passes (other
// hosts on one NFS directory) never write the same shard at once.
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

namespace k3::repack {

// In DST; byte N is locked while a pass converts output shard N.
inline constexpr char kShardLockName[] = ".k3-repack.shards.lock";

// The process converting into `dst` now (it holds a shard lock), or 0 if none.
// Only for a pass that holds no shard lock itself yet: closing this descriptor
// would drop them.
pid_t ConvertingProcess(const std::string& dst);

// Exclusive fcntl lock on byte `number` of DST/.k3-repack.shards.lock: held while
// a pass converts that shard, so two passes that chose the same shard never
// write it at once (one waits, then keeps what the other wrote). A separate file
// from ContainerLock's, because closing any descriptor of a file drops all of a
// process's fcntl locks on it. `fd` (open read-write on that file) outlives the
// lock. Throws k3::Error when the lock cannot be taken for another reason than
// a holder.
class ShardLock {
 public:
  ShardLock(int fd, int64_t number, const std::string& path, const std::string& shard);
  ~ShardLock();
  ShardLock(const ShardLock&) = delete;
  ShardLock& operator=(const ShardLock&) = delete;
  // Whether another process held it first (it may have published the shard).
  bool waited() const { return waited_; }

 private:
  struct flock Range(short type) const;
  int fd_;
  int64_t number_;
  bool waited_ = false;
};

}  // namespace k3::repack
