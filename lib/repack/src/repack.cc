#include "k3/repack/repack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "k3/container/safetensors.h"
#include "k3/container/snapshot.h"
#include "k3/core/direct_io.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/log.h"
#include "k3/core/queue.h"
#include "k3/core/sys.h"
#include "k3/model/config.h"
#include "k3/quant/quant.h"
#include "k3/repack/checksums.h"
#include "k3/repack/container.h"
#include "model_check.h"
#include "transform.h"

namespace k3::repack {
namespace {

constexpr uint64_t kMaxMetadataFileBytes = 512ull << 20;
// Blocks queued per stage of one stream's pipeline: with several streams each
// gets a share (at least 2; PipelineDepth, counted by BlocksPerStream).
constexpr size_t kPipelineDepth = 4;
// std::thread, with a failure to start one (EAGAIN: RLIMIT_NPROC, or no
// address space left for its stack under RLIMIT_AS) as a k3::Error that says
// what to lower, not an exception that escapes a thread.
template <typename Fn>
std::thread StartThread(Fn&& fn) {
  try {
    return std::thread(std::forward<Fn>(fn));
  } catch (const std::system_error& e) {
    throw Error(ErrorCode::kIo, std::string("cannot start a pipeline thread (") + e.what() +
                                    "); lower --streams, --reads or --writes");
  }
}

size_t PipelineDepth(int streams) {
  return std::max<size_t>(2, kPipelineDepth / static_cast<size_t>(std::max(1, streams)));
}

enum class Op : uint8_t { kCopy, kQuant };

// A failure that is one shard's alone (its source changed while it was read,
// or --verify-full found a difference): the shard is not published, the other
// streams go on, and the run reports it at the end.
struct ShardFailed {
  Error error;
};

// One kept source tensor, in output order.
struct Item {
  const TensorInfo* src = nullptr;
  TensorRole role = TensorRole::kPassthrough;
  Op op = Op::kCopy;
  QuantShape qshape;
  uint64_t rows = 0, cols = 0;
  size_t out_index = 0;  // first output entry (quantized: entry and entry+1)
};

// What the source file was when its header was read (pre-flight): a shard is
// published only if its source is still that at the end of the shard.
struct SourceStat {
  uint64_t size = 0;
  struct timespec mtime {};
  struct timespec ctime {};
  dev_t dev = 0;
  ino_t ino = 0;
};

SourceStat SourceStatOf(const struct stat& st) {
  SourceStat s;
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime = st.st_mtim;
  s.ctime = st.st_ctim;
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  return s;
}

struct ShardPlan {
  int64_t number = 0;
  const SafetensorsFile* src = nullptr;
  SourceStat src_stat;
  std::string out_name;
  std::vector<Item> items;
  std::vector<PlannedTensor> out;
  std::string header;       // JSON header bytes (padded)
  uint64_t src_bytes = 0;   // bytes of kept source tensors
  uint64_t file_bytes = 0;  // 8 + header + data
  uint64_t expert_bytes = 0;
};

// A contiguous piece of work in output order.
struct Segment {
  enum Kind : uint8_t { kCopy, kQuant, kScales } kind = kCopy;
  size_t item = 0;
  uint64_t src_off = 0, src_len = 0;  // absolute in the source file
  uint64_t dst_len = 0;
  uint64_t row0 = 0, rows = 0;
};

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

ShardPlan PlanShard(const SafetensorsFile& src, int64_t number, int64_t total,
                    const std::vector<bool>& is_kda, const QuantBits& bits) {
  ShardPlan p;
  p.number = number;
  p.src = &src;
  p.out_name = FormatShardName(number, total);
  std::vector<Item> non_experts;
  std::vector<std::pair<Item, std::optional<ExpertKey>>> experts;
  for (const auto& t : src.tensors()) {  // data-offset order = source order
    Item it;
    it.src = &t;
    try {
      it.role = ClassifyTensor(t.name, is_kda);
    } catch (const Error& e) {
      throw e.WithPath(src.path());
    }
    if (it.role == TensorRole::kDrop) continue;
    if (it.role == TensorRole::kExpert) {
      experts.emplace_back(it, ParseExpertName(t.name));
      continue;
    }
    if (IsQuantized(it.role)) {
      if (!IsFloatReadable(t.dtype) || t.shape.size() != 2 || t.shape[0] == 0 || t.shape[1] == 0) {
        throw Error(ErrorCode::kUnsupported,
                    "class '" + std::string(TensorRoleName(it.role)) +
                        "' must be quantized but it is " + std::string(DTypeName(t.dtype)) + " " +
                        ShapeString(t.shape) +
                        ", not a 2-D BF16/F16/F32 matrix (is the source already a container?)",
                    src.path(), static_cast<int64_t>(src.AbsoluteOffset(t)), t.name);
      }
      it.op = Op::kQuant;
      it.rows = static_cast<uint64_t>(t.shape[0]);
      it.cols = static_cast<uint64_t>(t.shape[1]);
      it.qshape.int4 = quant::UsesInt4(bits.For(it.role), it.cols);
    }
    non_experts.push_back(it);
  }
  // Experts by (id, matrix, packed before scale); names we cannot parse keep their
  // source order after the parsed ones.
  std::stable_sort(experts.begin(), experts.end(), [](const auto& a, const auto& b) {
    if (a.second.has_value() != b.second.has_value()) return a.second.has_value();
    if (!a.second) return false;
    return *a.second < *b.second;
  });
  p.items = std::move(non_experts);
  for (auto& e : experts) p.items.push_back(e.first);

  for (auto& it : p.items) {
    const TensorInfo& t = *it.src;
    it.out_index = p.out.size();
    p.src_bytes += t.nbytes();
    if (it.op == Op::kCopy) {
      p.out.push_back({t.name, t.dtype, t.shape});
      if (it.role == TensorRole::kExpert) p.expert_bytes += t.nbytes();
    } else {
      const int64_t rows = static_cast<int64_t>(it.rows);
      const int64_t qcols = static_cast<int64_t>(it.qshape.q_row_bytes(it.cols));
      p.out.push_back({t.name, DType::kU8, {rows, qcols}});
      if (it.qshape.int4) {
        p.out.push_back({t.name + ".qs", DType::kF32, {rows, static_cast<int64_t>(it.cols / 64)}});
      } else {
        p.out.push_back({t.name + ".qs", DType::kF32, {rows}});
      }
    }
  }
  p.header = BuildSafetensorsHeader(p.out);
  uint64_t data = 0;
  for (const auto& o : p.out) data += o.nbytes();
  p.file_bytes = 8 + p.header.size() + data;
  return p;
}

std::vector<Segment> Segments(const ShardPlan& p, uint64_t block_bytes) {
  std::vector<Segment> segs;
  for (size_t i = 0; i < p.items.size(); ++i) {
    const Item& it = p.items[i];
    const uint64_t at = p.src->AbsoluteOffset(*it.src);
    const uint64_t n = it.src->nbytes();
    if (it.op == Op::kCopy) {
      for (uint64_t off = 0; off < n; off += block_bytes) {
        Segment s;
        s.kind = Segment::kCopy;
        s.item = i;
        s.src_off = at + off;
        s.src_len = std::min(block_bytes, n - off);
        s.dst_len = s.src_len;
        segs.push_back(s);
      }
      continue;
    }
    const uint64_t row_bytes = it.cols * DTypeSize(it.src->dtype);
    const uint64_t rows_per_block = std::max<uint64_t>(1, block_bytes / row_bytes);
    for (uint64_t r = 0; r < it.rows; r += rows_per_block) {
      Segment s;
      s.kind = Segment::kQuant;
      s.item = i;
      s.row0 = r;
      s.rows = std::min(rows_per_block, it.rows - r);
      s.src_off = at + r * row_bytes;
      s.src_len = s.rows * row_bytes;
      s.dst_len = s.rows * it.qshape.q_row_bytes(it.cols);
      segs.push_back(s);
    }
    Segment s;
    s.kind = Segment::kScales;
    s.item = i;
    s.dst_len = it.rows * it.qshape.scales_per_row(it.cols) * 4;
    segs.push_back(s);
  }
  return segs;
}

// Why an existing output file cannot be kept, or "" when it is exactly what this
// plan would write (same header bytes, same size). Data bytes are covered by
// checksums.xxh128 and k3-verify; a final name only ever receives a complete,
// fsynced file (tmp -> rename), so a crash cannot leave a short one behind.
std::string ExistingShardProblem(const std::string& path, const ShardPlan& p) {
  UniqueFd fd = TryOpen(path, O_RDONLY);
  if (!fd.valid()) return "missing";
  try {
    uint64_t size = FileSizeOrThrow(fd.get(), path);
    if (size != p.file_bytes) {
      return "size " + std::to_string(size) + " != planned " + std::to_string(p.file_bytes);
    }
    std::string head(8 + p.header.size(), '\0');
    PreadFull(fd.get(), std::as_writable_bytes(std::span(head.data(), head.size())), 0, path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(head[i]);
    if (n != p.header.size() || std::string_view(head).substr(8) != p.header) {
      return "header differs from the planned one";
    }
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// Why a kept shard fails --recheck, or "" when it hashes to its recorded digest.
std::string RecheckProblem(const std::string& path, const std::string& name, const ChecksumManifest& recorded) {
  auto it = recorded.find(name);
  if (it == recorded.end()) return "not in " + std::string(kChecksumsName) + ", so it cannot be trusted";
  std::string have = HashFileXxh128(path);
  if (have != it->second) {
    return "XXH3-128 is " + have + " but " + std::string(kChecksumsName) + " says " + it->second +
           " (damaged after it was written)";
  }
  return {};
}

// Header fields of a freshly written temp file against the plan.
void CheckWrittenShard(const std::string& tmp_path, const ShardPlan& p) {
  SafetensorsFile f = SafetensorsFile::OpenOrThrow(tmp_path);
  if (f.file_size() != p.file_bytes || f.tensors().size() != p.out.size()) {
    throw Error(ErrorCode::kInternal, "written shard does not match its plan", tmp_path);
  }
  uint64_t off = 0;
  for (size_t i = 0; i < p.out.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    const PlannedTensor& o = p.out[i];
    if (t.name != o.name || t.dtype != o.dtype || t.shape != o.shape || t.begin != off) {
      throw Error(ErrorCode::kInternal, "written header entry differs from the plan", tmp_path,
                  static_cast<int64_t>(f.header().data_offset() + t.begin), t.name);
    }
    off = t.end;
  }
}

// "1764630000.123456789"
std::string TimeText(const struct timespec& t) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%09ld", static_cast<long long>(t.tv_sec), t.tv_nsec);
  return buf;
}

bool SameTime(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

// What changed about the source since its header was read (`was`), or "":
// size, mtime, ctime of the open file, and whether its name still leads to
// it. Free (two stats), so every shard gets it before it is published. A write
// within the filesystem's timestamp tick of the previous one can leave both
// times equal (ext4 stamps with a clock of a few ms), hence the content digest
// too (k3-repack.sources, --recheck; with --verify-full also at once).
std::string SourceChange(const ShardPlan& p) {
  const SourceStat& was = p.src_stat;
  struct stat st {};
  if (::fstat(p.src->fd(), &st) != 0) ThrowErrno(errno, "fstat", p.src->path());
  std::vector<std::string> what;
  if (static_cast<uint64_t>(st.st_size) != was.size) {
    what.push_back("size " + std::to_string(was.size) + " -> " + std::to_string(st.st_size) +
                   " bytes");
  }
  if (!SameTime(st.st_mtim, was.mtime)) {
    what.push_back("mtime " + TimeText(was.mtime) + " -> " + TimeText(st.st_mtim));
  } else if (!SameTime(st.st_ctim, was.ctime)) {
    what.push_back("ctime " + TimeText(was.ctime) + " -> " + TimeText(st.st_ctim) +
                   " (mtime kept)");
  }
  struct stat named {};
  if (::stat(p.src->path().c_str(), &named) != 0) {
    what.push_back("the name no longer exists");
  } else if (named.st_dev != was.dev || named.st_ino != was.ino) {
    what.push_back("the name now holds another file (replaced)");
  }
  std::string out;
  for (const std::string& w : what) out += (out.empty() ? "" : ", ") + w;
  return out;
}

// Calls fn(item, offset in the tensor, bytes) for the shard's kept source
// bytes in output order, block by block: the order the pipeline hashes them
// in (k3-repack.sources).
template <typename Fn>
void ForEachSourceBlock(const ShardPlan& p, uint64_t block_bytes, Fn&& fn) {
  std::vector<std::byte> buf(block_bytes);
  ::posix_fadvise(p.src->fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
  for (const Item& it : p.items) {
    const uint64_t at = p.src->AbsoluteOffset(*it.src);
    const uint64_t n = it.src->nbytes();
    for (uint64_t off = 0; off < n; off += block_bytes) {
      const size_t k = static_cast<size_t>(std::min(block_bytes, n - off));
      PreadFull(p.src->fd(), std::span(buf.data(), k), at + off, p.src->path());
      // Read once: what the rest of the machine caches matters more.
      ::posix_fadvise(p.src->fd(), static_cast<off_t>(at + off), static_cast<off_t>(k),
                      POSIX_FADV_DONTNEED);
      fn(it, off, std::span<const std::byte>(buf.data(), k));
    }
  }
}

// The digest k3-repack.sources records for `p`, from the source as it is now.
std::string HashShardSource(const ShardPlan& p, uint64_t block_bytes) {
  Xxh128 h;
  ForEachSourceBlock(p, block_bytes,
                     [&](const Item&, uint64_t, std::span<const std::byte> b) { h.Update(b); });
  return h.HexDigest();
}

// Why a kept shard's source no longer matches what it was converted from, or
// "" when it does (--recheck: one read of the source shard's kept bytes).
std::string SourceRecheckProblem(const ShardPlan& p, const ChecksumManifest& sources,
                                 uint64_t block_bytes) {
  auto it = sources.find(p.out_name);
  if (it == sources.end()) {
    return "no source digest in " + std::string(kSourcesName) +
           " (converted before k3-repack recorded them, or interrupted), so it cannot be compared "
           "with the source";
  }
  const std::string now = HashShardSource(p, block_bytes);
  if (now != it->second) {
    return "its source " + p.src->path() +
           " changed since it was converted (kept source bytes hash " + now + ", " +
           std::string(kSourcesName) + " says " + it->second + ")";
  }
  return {};
}

// --verify-full: every expert byte of the shard, source vs destination file;
// the source is re-read whole, and its digest must equal `read_digest` (what
// the pipeline converted): a source that changed while the shard was read
// differs here even when its timestamps did not move.
uint64_t CompareExperts(const ShardPlan& p, const std::string& dst_path, uint64_t block_bytes,
                        const std::string& read_digest) {
  UniqueFd dfd = OpenOrThrow(dst_path, O_RDONLY);
  std::vector<std::byte> b(block_bytes);
  // Each item's first output byte.
  std::vector<uint64_t> dst_at(p.items.size());
  uint64_t dst_off = 8 + p.header.size();
  for (size_t i = 0; i < p.items.size(); ++i) {
    const Item& it = p.items[i];
    dst_at[i] = dst_off;
    dst_off += it.op == Op::kCopy ? it.src->nbytes()
                                  : p.out[it.out_index].nbytes() + p.out[it.out_index + 1].nbytes();
  }
  uint64_t compared = 0;
  Xxh128 h;
  ForEachSourceBlock(
      p, block_bytes, [&](const Item& it, uint64_t off, std::span<const std::byte> a) {
        h.Update(a);
        if (it.role != TensorRole::kExpert) return;
        const uint64_t at = dst_at[static_cast<size_t>(&it - p.items.data())] + off;
        PreadFull(dfd.get(), std::span(b.data(), a.size()), at, dst_path);
        if (std::memcmp(a.data(), b.data(), a.size()) != 0) {
          size_t k = 0;
          while (a[k] == b[k]) ++k;
          throw Error(ErrorCode::kChecksumMismatch,
                      "expert byte differs from the source (" + p.src->path() + " offset " +
                          std::to_string(p.src->AbsoluteOffset(*it.src) + off + k) + ")",
                      dst_path, static_cast<int64_t>(at + k), it.src->name);
        }
        compared += a.size();
      });
  const std::string now = h.HexDigest();
  if (now != read_digest) {
    throw Error(ErrorCode::kChecksumMismatch,
                "source changed while the shard was converted: its kept bytes hashed " +
                    read_digest + " as read and " + now +
                    " when read again; the shard was not published",
                p.src->path());
  }
  return compared;
}

// Every tensor config.json implies, by name, dtype and shape, before anything is
// written: a config that contradicts its tensors would otherwise convert into a
// container k3-verify rejects. The problems are k3-verify's (same rules, same text).
void CheckSourceMatchesConfig(const Snapshot& snap, const ModelConfig& config, const std::string& src) {
  auto find = [&](const std::string& full) -> std::optional<FoundTensor> {
    auto r = snap.FindExact(full);
    if (!r) return std::nullopt;
    return FoundTensor{r->file->path(), static_cast<int64_t>(r->offset), r->info};
  };
  const std::string prefix = ModelPrefix([&](const std::string& n) { return snap.FindExact(n).has_value(); });
  std::vector<Problem> problems =
      CheckModelTensors(config, TensorForm::kSnapshot, find, src, prefix, /*bits=*/nullptr);
  if (problems.empty()) return;
  std::string detail = "contradicts the snapshot's tensors (" + std::to_string(problems.size()) +
                       " problem(s); nothing was written):";
  constexpr size_t kShown = 5;
  for (size_t i = 0; i < std::min(kShown, problems.size()); ++i) detail += "\n  " + problems[i].ToString();
  if (problems.size() > kShown) detail += "\n  ... and " + std::to_string(problems.size() - kShown) + " more";
  throw Error(problems.front().code, detail, JoinPath(src, "config.json"));
}

constexpr char kShardLockName[] = ".k3-repack.shards.lock";

// The process converting into `dst` now (it holds a shard lock), or 0 if none.
// Only for a pass that holds no shard lock itself yet: closing this descriptor
// would drop them.
pid_t ConvertingProcess(const std::string& dst) {
  UniqueFd fd(::open(JoinPath(dst, kShardLockName).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return 0;
  struct flock who {};
  who.l_type = F_WRLCK;
  who.l_whence = SEEK_SET;  // l_start 0, l_len 0: the whole file
  if (::fcntl(fd.get(), F_GETLK, &who) != 0 || who.l_type == F_UNLCK) return 0;
  return who.l_pid;
}

// Exclusive fcntl lock on byte `number` of DST/.k3-repack.shards.lock: held while
// a pass converts that shard, so two passes that chose the same shard never
// write it at once (one waits, then keeps what the other wrote). A separate file
// from ContainerLock's, because closing any descriptor of a file drops all of a
// process's fcntl locks on it.
class ShardLock {
 public:
  ShardLock(int fd, int64_t number, const std::string& path, const std::string& shard) : fd_(fd), number_(number) {
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
  ~ShardLock() {
    struct flock fl = Range(F_UNLCK);
    ::fcntl(fd_, F_SETLK, &fl);
  }
  ShardLock(const ShardLock&) = delete;
  ShardLock& operator=(const ShardLock&) = delete;
  bool waited() const { return waited_; }

 private:
  struct flock Range(short type) const {
    struct flock fl {};
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = static_cast<off_t>(number_);
    fl.l_len = 1;
    return fl;
  }
  int fd_;
  int64_t number_;
  bool waited_ = false;
};

// One stream's pipeline memory, kept from shard to shard: fresh pages are slow
// to fault in on VMs (~0.3-1.4 GB/s measured on the dev VM), so allocating
// ~150 MB of blocks again for every shard costs a noticeable part of it.
struct StreamBuffers {
  std::vector<AlignedBuffer> blocks[2];  // read pool, output pool
  std::vector<AlignedBuffer> stages;     // the DirectWriter's staging blocks
  std::vector<float> scratch;            // a few rows per quantizing thread as f32
};

// One shard's conversion as three stages joined by bounded queues: read (O_DIRECT
// or through the page cache, `reads` reads in flight, more while idle streams
// lend theirs: Help) -> quantize (the calling thread) -> hash + write (the
// DirectWriter keeps its own writes in flight). Read and Write run on their own
// threads; every stage runs inside Guard, so the first failure is kept and closes
// all queues (and the reorder map, ready_), which ends the other stages. `depth`
// blocks are in flight per stage; the blocks and the f32 scratch are lent by
// *bufs (KeepBuffers hands them back), and the source bytes written so far go to
// *progress. `direct_fd` (may be invalid: buffered reads) outlives the pipeline.
class ShardPipeline {
 public:
  ShardPipeline(const ShardPlan& p, std::vector<Segment> segs, uint64_t block_bytes, size_t depth,
                size_t reads, StreamBuffers* bufs, std::atomic<uint64_t>* progress,
                const UniqueFd& direct_fd, int read_delay_ms)
      : p_(p),
        segs_(std::move(segs)),
        reserve_{ReserveBytes(segs_, block_bytes, false), ReserveBytes(segs_, block_bytes, true)},
        reads_(reads),
        bufs_(bufs),
        // Read blocks: `depth` queued plus one per further read in flight.
        pool_blocks_{depth + reads - 1, depth},
        // The read pool's queue also takes the blocks helpers bring (Help).
        pools_{BoundedQueue<AlignedBuffer>(depth + reads - 1 + kMaxStreams * kMaxReadsInFlight),
               BoundedQueue<AlignedBuffer>(depth)},
        write_q_(depth),
        direct_fd_(direct_fd),
        use_direct_(direct_fd.valid()),
        src_written_(*progress),
        read_delay_ms_(read_delay_ms) {
    for (int k = 0; k < 2; ++k) {
      bufs_->blocks[k].resize(pool_blocks_[k]);
      for (AlignedBuffer& b : bufs_->blocks[k]) pools_[k].Push(std::move(b));
      bufs_->blocks[k].clear();
    }
  }

  template <typename Fn>
  void Guard(Fn&& stage) {
    try {
      stage();
    } catch (...) {
      Fail(std::current_exception());
    }
  }
  // Stops every stage and helper (a way out that is not the pipeline's own failure).
  void Abort() {
    Fail(std::make_exception_ptr(Error(ErrorCode::kInternal, "shard pipeline abandoned", p_.src->path())));
  }
  bool Failed() {
    std::lock_guard<std::mutex> lock(err_mu_);
    return err_ != nullptr;
  }
  void RethrowIfFailed() {
    std::lock_guard<std::mutex> lock(err_mu_);
    if (err_) std::rethrow_exception(err_);
  }

  // Reads every copied or quantized segment's source bytes. `reads` reader
  // threads keep that many source reads in flight (the disk serves queued reads
  // faster than one at a time), each claiming the next segment. Guards its own
  // stages.
  void Read() { RunReaders(reads_); }

  // Segments no reader has claimed yet (a helper is worth lending while > 1).
  // Lock-free: a reader may hold claim_mu_ while it waits for a block.
  size_t Unclaimed() const {
    return segs_.size() - std::min(claimed_.load(), segs_.size());
  }
  // Called under the Runner's registry lock while this pipeline is registered:
  // counts a helper in, so the owner waits for it before destroying the pipeline.
  void AddHelper() {
    std::lock_guard<std::mutex> lock(helpers_mu_);
    ++helpers_;
    ++helpers_lent_;
  }
  // An idle stream (no shard left for it) reads this shard's segments too:
  // `blocks` (its own read blocks) join the read pool for good, and `readers`
  // more readers share the pool until every segment is claimed. It brings only
  // the blocks it has: a stream helping its second shard has none left (they
  // stayed with the first), and fresh ones would be memory outside the
  // budget (PipelineBufferBytes; expert-heavy fixture: up to ~120 MiB more).
  // Several streams thus read disjoint ranges of one source file at once, while
  // the output is still quantized, hashed and written in order by this
  // pipeline. Follows AddHelper; returns when there is nothing left to claim.
  void Help(std::vector<AlignedBuffer>* blocks, size_t readers) {
    for (AlignedBuffer& b : *blocks) pools_[0].Push(std::move(b));  // (a closed pool drops them)
    blocks->clear();
    RunReaders(readers);
    std::lock_guard<std::mutex> lock(helpers_mu_);
    --helpers_;
    helpers_cv_.notify_all();
  }
  // Waits until every helper has left (the owner, after unregistering).
  void WaitHelpers() {
    std::unique_lock<std::mutex> lock(helpers_mu_);
    helpers_cv_.wait(lock, [&] { return helpers_ == 0; });
  }
  size_t helpers_lent() {
    std::lock_guard<std::mutex> lock(helpers_mu_);
    return helpers_lent_;
  }

  // Quantizes kQuant segments (their scales follow as one kScales segment) and
  // passes the rest through; threads() says how many threads each block gets
  // (the output does not depend on it).
  void Transform(const std::function<int()>& threads) {
    std::vector<float>& scratch = bufs_->scratch;
    std::vector<float> scales;  // the current quantized tensor's scales
    Block b;
    while (TakeRead(&b)) {
      if (b.seg == SIZE_MAX) {
        write_q_.Push(std::move(b));
        return;
      }
      const Segment& s = segs_[b.seg];
      const Item& it = p_.items[s.item];
      // The source bytes as read, in segment (= output) order: what the
      // shard was made from (k3-repack.sources). No second read: the block
      // is hashed here, where it is already in cache for the quantizer.
      if (s.kind != Segment::kScales)
        src_hash_.Update(std::span<const std::byte>(b.bytes.data() + b.skip, s.src_len));
      if (s.kind == Segment::kQuant) {
        if (s.row0 == 0) scales.assign(it.rows * it.qshape.scales_per_row(it.cols), 0.0f);
        Block o;
        o.seg = b.seg;
        if (!pools_[1].Pop(&o.bytes)) return;
        o.pool = 1;
        o.bytes.Reserve(reserve_[1]);
        const int n_threads = threads();
        const size_t need = QuantizeScratchFloats(it.cols, n_threads);
        if (scratch.size() < need) scratch.resize(need);
        QuantizeBlock(it.src->dtype, b.bytes.data() + b.skip, s.rows, it.cols, it.qshape, o.bytes.data(),
                      scales.data() + s.row0 * it.qshape.scales_per_row(it.cols), scratch.data(), n_threads);
        pools_[0].Push(std::move(b.bytes));
        b = std::move(o);
      } else if (s.kind == Segment::kScales) {
        b.floats = std::move(scales);
        scales.clear();
      }
      if (!write_q_.Push(std::move(b))) return;
    }
  }

  // The 8-byte length and the header, then every segment's output bytes, into
  // `sink` and `hasher`.
  void Write(DirectWriter* sink, Xxh128* hasher) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(p_.header.size() >> (8 * i));
    hasher->Update(std::as_bytes(std::span(len)));
    hasher->Update(std::as_bytes(std::span(p_.header.data(), p_.header.size())));
    sink->Append(reinterpret_cast<const std::byte*>(len), 8);
    sink->Append(reinterpret_cast<const std::byte*>(p_.header.data()), p_.header.size());
    Block b;
    while (write_q_.Pop(&b)) {
      if (b.seg == SIZE_MAX) {
        sink->Finish();
        return;
      }
      const Segment& s = segs_[b.seg];
      std::span<const std::byte> bytes = s.kind == Segment::kScales
                                             ? std::as_bytes(std::span(b.floats))
                                             : std::span<const std::byte>(b.bytes.data() + b.skip, s.dst_len);
      K3_CHECK(bytes.size() == s.dst_len);
      hasher->Update(bytes);
      sink->Append(bytes.data(), bytes.size());
      CrashPoint("repack-block-written");
      src_written_ += s.src_len;
      if (b.pool >= 0) pools_[b.pool].Push(std::move(b.bytes));
    }
  }

  // XXH3-128 of the source bytes the quantizer took, in order (after Transform).
  std::string SourceDigest() const { return src_hash_.HexDigest(); }

  // After a pipeline that finished, every block is back in its pool: hands
  // them back to the stream for its next shard (helpers' blocks included: their
  // streams have no shard left).
  void KeepBuffers() {
    for (int k = 0; k < 2; ++k) {
      AlignedBuffer b;
      while (pools_[k].TryPop(&b)) bufs_->blocks[k].push_back(std::move(b));
    }
  }

 private:
  struct Block {
    size_t seg = SIZE_MAX;  // SIZE_MAX: end of stream
    AlignedBuffer bytes;
    size_t skip = 0;            // the segment's bytes start here in `bytes`
    std::vector<float> floats;  // a tensor's scales
    int pool = -1;              // 0 = read pool, 1 = output pool, -1 none
  };

  // `n` reader loops, n - 1 of them on threads of their own.
  void RunReaders(size_t n) {
    std::vector<std::thread> threads;
    Guard([&] {  // a thread that cannot start fails the pipeline; the started ones end
      for (size_t k = 1; k < n; ++k)
        threads.push_back(StartThread([this] { Guard([&] { ReadSegments(); }); }));
    });
    Guard([&] { ReadSegments(); });
    for (auto& t : threads) t.join();
  }

  // One reader: claims the next segment and takes a block for it under one
  // lock (blocks leave the pool in segment order, so the segment the quantizer
  // waits for always has one), reads it, and files it (PutRead). Whoever claims
  // the index past the last segment files the end of the stream.
  void ReadSegments() {
    for (;;) {
      Block b;
      size_t i;
      {
        std::lock_guard<std::mutex> lock(claim_mu_);
        i = next_claim_;
        if (i > segs_.size()) return;
        ++next_claim_;
        claimed_ = next_claim_;
        if (i < segs_.size()) {
          b.seg = i;
          if (segs_[i].kind != Segment::kScales) {
            if (!pools_[0].Pop(&b.bytes)) return;
            b.pool = 0;
          }
        }
      }
      if (b.pool == 0) ReadSource(segs_[i], &b);
      if (!PutRead(i, std::move(b)) || i == segs_.size()) return;
    }
  }

  // Every block is allocated once at the size any segment (of this shard, or
  // of a whole block) needs: growing blocks segment by segment churns the heap
  // and leaves its peak above the blocks' count (PipelineBufferBytes).
  static size_t ReserveBytes(const std::vector<Segment>& segs, uint64_t block_bytes, bool quantized) {
    uint64_t n = quantized ? block_bytes / 2 : block_bytes + 2 * AlignedBuffer::kAlign;
    for (const Segment& s : segs) {
      if (!quantized) n = std::max(n, s.src_len + 2 * AlignedBuffer::kAlign);
      if (quantized && s.kind == Segment::kQuant) n = std::max(n, s.dst_len);
    }
    return static_cast<size_t>(n);
  }

  void ReadSource(const Segment& s, Block* b) {
    if (read_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(read_delay_ms_));
    b->bytes.Reserve(reserve_[0]);
    if (use_direct_.load() &&
        !ReadDirect(direct_fd_.get(), &b->bytes, s.src_off, s.src_len, p_.src->path(), &b->skip)) {
      LogOnce(&kPipelineDepth, LogLevel::kInfo,
              "%s: O_DIRECT refused by the filesystem; reading through the page cache",
              p_.src->path().c_str());
      use_direct_ = false;
    }
    if (!use_direct_.load()) {
      b->skip = 0;
      PreadFull(p_.src->fd(), std::span(b->bytes.data(), s.src_len), s.src_off, p_.src->path());
    }
  }

  // The read blocks reach the quantizer in segment order through ready_: a
  // reader files its block as soon as it is read and claims the next segment,
  // instead of waiting until every earlier segment's read is done (one slow
  // read then held every other reader, and the disk saw one read in flight).
  // ready_ has no capacity of its own: every block in it comes from the read
  // pool (scales and the end marker carry none), which bounds it. False once
  // the pipeline failed.
  bool PutRead(size_t i, Block b) {
    std::lock_guard<std::mutex> lock(ready_mu_);
    if (ready_closed_) return false;
    ready_.emplace(i, std::move(b));
    if (i == next_ready_) ready_cv_.notify_one();
    return true;
  }
  bool TakeRead(Block* b) {
    std::unique_lock<std::mutex> lock(ready_mu_);
    ready_cv_.wait(lock, [&] {
      return ready_closed_ || (!ready_.empty() && ready_.begin()->first == next_ready_);
    });
    if (ready_closed_) return false;
    *b = std::move(ready_.begin()->second);
    ready_.erase(ready_.begin());
    ++next_ready_;
    return true;
  }

  void Fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(err_mu_);
      if (!err_) err_ = e;
    }
    write_q_.Close();
    pools_[0].Close();
    pools_[1].Close();
    std::lock_guard<std::mutex> lock(ready_mu_);
    ready_closed_ = true;
    ready_cv_.notify_all();
  }

  const ShardPlan& p_;
  const std::vector<Segment> segs_;
  const size_t reserve_[2];  // bytes of a read block, of a quantized block
  const size_t reads_;
  StreamBuffers* const bufs_;
  const size_t pool_blocks_[2];
  BoundedQueue<AlignedBuffer> pools_[2];
  BoundedQueue<Block> write_q_;
  std::mutex err_mu_;
  std::exception_ptr err_;
  std::mutex claim_mu_;
  size_t next_claim_ = 0;  // next segment a reader takes; segs_.size(): the end marker
  std::atomic<size_t> claimed_{0};  // next_claim_'s last value, for Unclaimed
  std::mutex ready_mu_;
  std::condition_variable ready_cv_;
  std::map<size_t, Block> ready_;  // read, not yet quantized, by segment
  size_t next_ready_ = 0;          // the segment the quantizer takes next
  bool ready_closed_ = false;
  std::mutex helpers_mu_;
  std::condition_variable helpers_cv_;
  size_t helpers_ = 0, helpers_lent_ = 0;
  const UniqueFd& direct_fd_;
  std::atomic<bool> use_direct_;
  std::atomic<uint64_t>& src_written_;
  Xxh128 src_hash_;  // Transform's thread only
  int read_delay_ms_ = 0;
};

class Runner {
 public:
  Runner(const RepackOptions& o, const RepackObserver& obs) : opt_(o), observer_(obs) {}
  RepackEvent Run();

 private:
  void Emit(RepackEvent::Kind kind, RepackEvent ev = {});
  // Returns the shard's xxh128. Runs on a stream's thread: touches no Runner
  // state but the options and the lending registry (running_, starting_,
  // active_); source bytes written so far go to *progress.
  std::string WriteShard(const ShardPlan& p, RepackEvent* done, std::atomic<uint64_t>* progress,
                         size_t depth, size_t reads, size_t writes, StreamBuffers* bufs);
  // An idle stream's thread lends its reads to the running shards, the one with
  // the most segments left first, until none has more than one left or *stop.
  void HelpOthers(size_t reads, StreamBuffers* bufs, const std::atomic<bool>& stop);
  void FinishShard(const ShardPlan& p, AtomicFileWriter& out, uint64_t written, RepackEvent* done);
  void RemoveStaleTemps(const std::string& final_name);
  void RemoveForForce();
  void CopyMetadata();
  // checksums.xxh128 and k3-repack.sources: `fresh` adds (shard, output
  // digest, source digest) entries; `finalize` drops entries of files that are
  // gone and fills in what a killed pass published without recording.
  struct Fresh {
    std::string shard, xxh128, source_xxh128;
  };
  void UpdateChecksums(const std::vector<Fresh>& fresh, bool finalize);
  // The source digest of output shard `name` computed now, for a shard
  // published by a pass that died before recording it; "" when its source is
  // not one this pass knows or changed since the pre-flight.
  std::string SourceDigestNow(const std::string& name);
  // Pre-flight pieces of Run(), in order; none of them writes.
  void CheckOptions();
  bool CheckDestination(const Fingerprint& fp, const std::string& fp_text);
  std::vector<const ShardPlan*> PlanWork(const std::vector<ShardPlan>& selected, bool force_clean,
                                         std::vector<RepackEvent>* skipped, uint64_t* reclaimable);
  void CheckFreeSpace(const Snapshot& snap, uint64_t reclaimable);
  void ConvertShards(const std::vector<const ShardPlan*>& todo);

  const RepackOptions& opt_;
  const RepackObserver& observer_;
  PipelinePlan plan_;  // resolved once the shards to do are known
  // The plan of output shard `name` (any shard of the source, not only this
  // pass's), with its source's pre-flight stat; nullopt for a foreign name.
  std::function<std::optional<ShardPlan>(const std::string& name)> plan_for_;
  std::vector<ShardFailed> failed_;  // shards that failed on their own, in order
  RepackEvent totals_;
  double t0_ = NowSeconds();
  double convert_t0_ = 0;  // when the first shard started
  double last_progress_ = 0;
  int threads_ = 1;
  // Serialises the container lock between streams: fcntl locks belong to the
  // process, so two threads would both "hold" it (and closing one's descriptor
  // would drop the other's).
  std::mutex container_mu_;
  // Pipelines whose segments may still be claimed by a helper (HelpOthers).
  std::mutex running_mu_;
  std::vector<ShardPipeline*> running_;
  // Streams that took a shard but have not registered its pipeline yet: an
  // idle stream waits for them before it gives up lending.
  std::atomic<int> starting_{0};
  std::atomic<int> active_{0};  // shards between their pipeline's start and end
};

void Runner::Emit(RepackEvent::Kind kind, RepackEvent ev) {
  if (!observer_) return;
  ev.kind = kind;
  ev.shards_selected = totals_.shards_selected;
  ev.shards_todo = totals_.shards_todo;
  ev.shards_done = totals_.shards_done;
  ev.shards_skipped = totals_.shards_skipped;
  ev.shards_failed = totals_.shards_failed;
  ev.bytes_todo = totals_.bytes_todo;
  ev.bytes_done = totals_.bytes_done;
  ev.out_bytes_planned = totals_.out_bytes_planned;
  ev.free_bytes = totals_.free_bytes;
  ev.pipeline = plan_;
  ev.elapsed_seconds = NowSeconds() - t0_;
  if (kind == RepackEvent::Kind::kShardStart && convert_t0_ == 0) convert_t0_ = NowSeconds();
  ev.convert_seconds = convert_t0_ > 0 ? NowSeconds() - convert_t0_ : 0;
  observer_(ev);
}

void Runner::RemoveStaleTemps(const std::string& final_name) {
  // Only this pass owns `final_name` (passes are disjoint; shared files are
  // written under the lock), so any "<name>.tmp.*" is left over from a crash.
  const std::string prefix = final_name + ".tmp.";
  for (const auto& s : ListDirectory(opt_.dst)) {
    if (s.starts_with(prefix)) ::unlink(JoinPath(opt_.dst, s).c_str());
  }
}

void Runner::RemoveForForce() {
  std::vector<std::string> victims;
  for (const std::string& name : ListDirectory(opt_.dst)) {
    std::string base = name.substr(0, name.find(".tmp."));
    bool ours = ParseShardName(base).has_value() || base == kIndexName || base == kChecksumsName ||
                base == kFingerprintName || base == kSourcesName;
    for (auto m : kMetadataFiles) ours = ours || base == m;
    if (ours) victims.push_back(name);
  }
  for (const auto& v : victims) {
    std::string path = JoinPath(opt_.dst, v);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) ThrowErrno(errno, "unlink", path);
  }
  FsyncDirOrThrow(opt_.dst);
}

std::string Runner::SourceDigestNow(const std::string& name) {
  std::optional<ShardPlan> p = plan_for_ ? plan_for_(name) : std::nullopt;
  if (!p || !SourceChange(*p).empty()) return {};
  return HashShardSource(*p, kMaxAutoBlockBytes);
}

void Runner::CopyMetadata() {
  for (auto name : kMetadataFiles) {
    std::string from = JoinPath(opt_.src, name);
    if (!PathExists(from)) continue;
    std::string content = ReadFileOrThrow(from, kMaxMetadataFileBytes);
    std::string to = JoinPath(opt_.dst, name);
    RemoveStaleTemps(std::string(name));
    if (PathExists(to) && ReadFileOrThrow(to, kMaxMetadataFileBytes) == content) continue;
    WriteFileAtomic(to, content);
  }
}

void Runner::UpdateChecksums(const std::vector<Fresh>& fresh, bool finalize) {
  const std::string path = JoinPath(opt_.dst, kChecksumsName);
  const std::string sources_path = JoinPath(opt_.dst, kSourcesName);
  RemoveStaleTemps(std::string(kChecksumsName));
  RemoveStaleTemps(std::string(kSourcesName));
  ChecksumManifest m = ReadChecksumManifest(path);
  ChecksumManifest sources = ReadChecksumManifest(sources_path);
  for (const Fresh& f : fresh) {
    m[f.shard] = f.xxh128;
    sources[f.shard] = f.source_xxh128;
  }
  if (finalize) {
    ChecksumManifest kept;
    for (const auto& s : ListShardFiles(opt_.dst)) {
      auto it = sources.find(s);
      const std::string hex = it != sources.end() ? it->second : SourceDigestNow(s);
      if (!hex.empty()) kept[s] = hex;
    }
    sources = std::move(kept);
  }
  WriteFileAtomic(sources_path, RenderChecksumManifest(sources));
  if (finalize) {
    // Entries for files that are gone are dropped; shards published by a pass
    // that died before recording them are hashed now; small files are rehashed.
    std::vector<std::string> shards = ListShardFiles(opt_.dst);
    ChecksumManifest next;
    for (const auto& s : shards) {
      auto it = m.find(s);
      next[s] = it != m.end() ? it->second : HashFileXxh128(JoinPath(opt_.dst, s));
    }
    std::vector<std::string> small = {std::string(kIndexName), std::string(kFingerprintName)};
    for (auto name : kMetadataFiles) small.emplace_back(name);
    for (const auto& s : small) {
      std::string p = JoinPath(opt_.dst, s);
      if (PathExists(p)) next[s] = HashFileXxh128(p);
    }
    m = std::move(next);
  }
  CrashPoint("repack-checksums-update");
  WriteFileAtomic(path, RenderChecksumManifest(m));
}

std::string Runner::WriteShard(const ShardPlan& p, RepackEvent* done,
                               std::atomic<uint64_t>* progress, size_t depth, size_t reads,
                               size_t writes, StreamBuffers* bufs) {
  const double t_start = NowSeconds();
  const std::string final_path = JoinPath(opt_.dst, p.out_name);
  RemoveStaleTemps(p.out_name);
  AtomicFileWriter out(final_path);
  // The whole file is allocated first: ext4 (and others) serialize O_DIRECT
  // writes that extend a file, each under the inode's exclusive lock, so the
  // writes in flight to one shard went one at a time (fio, 8 writers to one
  // file beside a reader: 95-118 MB/s extending, 587-620 MB/s allocated
  // first; docs/PERFORMANCE.md). A full disk is also found here, before the
  // shard is read. Filesystems without fallocate write as before.
  if (opt_.direct && !PreallocateOrThrow(out.fd(), p.file_bytes, out.temp_path())) {
    static const char kKey = 0;
    LogOnce(&kKey, LogLevel::kInfo, "%s: no fallocate on this filesystem; writing without it",
            out.temp_path().c_str());
  }

  // Source reads bypass the page cache (O_DIRECT) unless K3_DIRECT=0 or the
  // filesystem refuses: every byte is read once, so caching it only costs a copy
  // and evicts what the rest of the machine needs.
  UniqueFd direct_fd;
  // The same file the header was read from, or none (buffered reads of it).
  if (opt_.direct) direct_fd = ReopenDirect(p.src->path(), p.src->fd(), O_RDONLY);
  if (!direct_fd.valid()) ::posix_fadvise(p.src->fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
  ShardPipeline pipe(p, Segments(p, plan_.block_bytes), plan_.block_bytes, depth, reads, bufs,
                     progress, direct_fd, opt_.test_read_delay_ms);
  // Open to helpers while it runs; on every way out (a failure included) no
  // new helper can join and the ones inside have left before `pipe` goes.
  struct Lent {
    Runner* r;
    ShardPipeline* pipe;
    bool finished = false;
    ~Lent() {
      if (!finished) pipe->Abort();  // helpers blocked on this pipeline return
      {
        std::lock_guard<std::mutex> lock(r->running_mu_);
        std::erase(r->running_, pipe);
      }
      pipe->WaitHelpers();
    }
  } lent{this, &pipe};
  {
    std::lock_guard<std::mutex> lock(running_mu_);
    running_.push_back(&pipe);
  }
  --starting_;
  Xxh128 hasher;
  // Output bypasses the page cache too (aligned chunks O_DIRECT, tail buffered).
  DirectWriter sink(out.temp_path(), out.fd(), plan_.block_bytes, opt_.direct, writes, &bufs->stages);

  {
    // The cores are shared among the shards being quantized now, so the last
    // shard left running gets all of them (a dense-layer shard at the end no
    // longer runs on its one stream's share).
    struct Active {
      std::atomic<int>& n;
      explicit Active(std::atomic<int>& a) : n(a) { ++n; }
      ~Active() { --n; }
    } active(active_);
    const auto threads = [this] {
      const int n = std::max(1, active_.load());
      return std::max(1, (threads_ + n - 1) / n);
    };
    std::thread reader = StartThread([&] { pipe.Read(); });
    std::thread writer;
    try {
      writer = StartThread([&] { pipe.Guard([&] { pipe.Write(&sink, &hasher); }); });
    } catch (...) {
      pipe.Abort();
      reader.join();
      throw;
    }
    pipe.Guard([&] { pipe.Transform(threads); });
    reader.join();
    writer.join();
  }
  pipe.RethrowIfFailed();
  lent.finished = true;
  done->streams_lent = pipe.helpers_lent();
  pipe.WaitHelpers();  // their blocks are back in the pool once they left
  pipe.KeepBuffers();
  done->source_xxh128 = pipe.SourceDigest();
  FinishShard(p, out, sink.bytes(), done);
  done->shard_seconds = NowSeconds() - t_start;
  return hasher.HexDigest();
}

void Runner::HelpOthers(size_t reads, StreamBuffers* bufs, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    ShardPipeline* target = nullptr;
    {
      std::lock_guard<std::mutex> lock(running_mu_);
      size_t most = 1;  // lending for the last segment gains nothing
      for (ShardPipeline* p : running_) {
        const size_t left = p->Unclaimed();
        if (left > most) most = left, target = p;
      }
      if (target) target->AddHelper();
    }
    if (!target) {
      if (starting_.load() == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    target->Help(&bufs->blocks[0], reads);
  }
}

// Size check, fsync, re-read of the header, the optional full comparison, then
// the atomic publish: nothing is renamed into place before all of it passed.
void Runner::FinishShard(const ShardPlan& p, AtomicFileWriter& out, uint64_t written, RepackEvent* done) {
  if (written != p.file_bytes || FileSizeOrThrow(out.fd(), out.temp_path()) != p.file_bytes) {
    throw Error(ErrorCode::kInternal,
                "wrote " + std::to_string(written) + " bytes, planned " + std::to_string(p.file_bytes),
                out.temp_path());
  }
  CrashPoint("repack-shard-written");
  FsyncOrThrow(out.fd(), out.temp_path());
  CheckWrittenShard(out.temp_path(), p);
  // From here a failure is this shard's alone (ShardFailed): the pass goes on.
  try {
    if (const std::string changed = SourceChange(p); !changed.empty()) {
      throw Error(ErrorCode::kChecksumMismatch,
                  "source shard changed while it was converted (" + changed +
                      "); the shard was not published: rerun once the source is stable",
                  p.src->path());
    }
    if (opt_.verify_full) {
      // Drop the just-written pages so the comparison reads what reached the disk.
      ::posix_fadvise(out.fd(), 0, 0, POSIX_FADV_DONTNEED);
      done->expert_bytes_verified =
          CompareExperts(p, out.temp_path(), plan_.block_bytes, done->source_xxh128);
    }
  } catch (const Error& e) {
    throw ShardFailed{e};
  }
  out.Commit();  // crash points "before-rename" / "after-rename" inside
  CrashPoint("repack-shard-committed");
  done->shard_out_bytes = p.file_bytes;
}

std::string ExistingAncestor(std::string p) {
  while (!p.empty() && !IsDirectory(p)) {
    std::string parent = DirName(p);
    if (parent == p) break;
    p = parent;
  }
  return p.empty() ? "." : p;
}


void Runner::CheckOptions() {
  ValidateBits(opt_.bits);
  if (opt_.worker_count < 1 || opt_.worker_index < 0 || opt_.worker_index >= opt_.worker_count) {
    throw Error(ErrorCode::kInvalidArgument, "--worker I/N needs 0 <= I < N");
  }
  if (opt_.block_bytes != 0 && (opt_.block_bytes < 4096 || opt_.block_bytes > kMaxBlockBytes)) {
    throw Error(ErrorCode::kInvalidArgument,
                "--block-mib: block size " + std::to_string(opt_.block_bytes) + " bytes is outside 4 KiB .. " +
                    std::to_string(kMaxBlockBytes >> 20) + " MiB");
  }
  if (opt_.mem_budget_bytes != 0 && opt_.mem_budget_bytes < kMinMemBudgetBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "--mem-mb " + std::to_string(opt_.mem_budget_bytes >> 20) + ": must be at least " +
                    std::to_string(kMinMemBudgetBytes >> 20) + " (MiB of pipeline buffers)");
  }
  if (opt_.reads_in_flight < 0 || opt_.reads_in_flight > kMaxReadsInFlight) {
    throw Error(ErrorCode::kInvalidArgument,
                "--reads " + std::to_string(opt_.reads_in_flight) + ": must be 0 (automatic) .. " +
                    std::to_string(kMaxReadsInFlight));
  }
  if (opt_.writes_in_flight < 0 || opt_.writes_in_flight > kMaxWritesInFlight) {
    throw Error(ErrorCode::kInvalidArgument,
                "--writes " + std::to_string(opt_.writes_in_flight) + ": must be 0 (automatic) .. " +
                    std::to_string(kMaxWritesInFlight));
  }
  if (opt_.streams < 0 || opt_.streams > kMaxStreams) {
    throw Error(ErrorCode::kInvalidArgument,
                "--streams " + std::to_string(opt_.streams) + ": must be 0 (automatic) .. " +
                    std::to_string(kMaxStreams));
  }
  threads_ = opt_.threads > 0 ? opt_.threads : std::max(1, NumOnlineCpus());
  {
    char a[PATH_MAX], b[PATH_MAX];
    if (::realpath(opt_.src.c_str(), a) && ::realpath(opt_.dst.c_str(), b) &&
        std::string_view(a) == std::string_view(b)) {
      throw Error(ErrorCode::kInvalidArgument, "destination is the source directory", opt_.dst);
    }
  }
}

// An existing destination must be this conversion (same fingerprint), or --force.
// Returns whether what it holds is to be discarded.
bool Runner::CheckDestination(const Fingerprint& fp, const std::string& fp_text) {
  const std::string fp_path = JoinPath(opt_.dst, kFingerprintName);
  if (opt_.force) {
    if (const pid_t other = ConvertingProcess(opt_.dst); other != 0) {
      throw Error(ErrorCode::kExists,
                  "process " + std::to_string(other) +
                      " (another k3-repack) is converting into this destination now, and --force would delete "
                      "what it writes: wait for it to end",
                  opt_.dst);
    }
  }
  bool force_clean = false;
  if (PathExists(fp_path)) {
    std::string have = ReadFileOrThrow(fp_path, 64u << 20);
    if (have != fp_text) {
      std::string why;
      try {
        why = Fingerprint::ParseOrThrow(have, fp_path).Difference(fp);
      } catch (const Error& e) {
        why = e.what();
      }
      if (why.empty()) why = "fingerprint differs";
      if (const pid_t other = ConvertingProcess(opt_.dst); other != 0) {
        throw Error(ErrorCode::kExists,
                    why + "; process " + std::to_string(other) +
                        " (another k3-repack) is converting into this destination with those parameters now: "
                        "rerun with its parameters to join it, or wait for it to end",
                    fp_path);
      }
      if (!opt_.force) {
        throw Error(
            ErrorCode::kExists,
            why + "; rerun with the same parameters to resume, or add --force to start over",
            fp_path);
      }
      force_clean = true;
    }
  } else if (!ListShardFiles(opt_.dst).empty()) {
    if (!opt_.force) {
      throw Error(ErrorCode::kExists,
                  "the destination holds shards but no " + std::string(kFingerprintName) +
                      " (not a k3-repack output); add --force to replace them",
                  opt_.dst);
    }
    force_clean = true;
  }
  if (opt_.force && PathExists(opt_.dst)) force_clean = true;
  return force_clean;
}

// Which selected shards to convert (the rest are complete, or --recheck proved them).
std::vector<const ShardPlan*> Runner::PlanWork(const std::vector<ShardPlan>& selected, bool force_clean,
                                                std::vector<RepackEvent>* skipped, uint64_t* reclaimable) {
  std::vector<const ShardPlan*> todo;
  // --recheck: a kept shard must also hash to what checksums.xxh128 recorded, so
  // bytes damaged after the write are found and the shard converted again.
  const bool recheck = (opt_.recheck || opt_.verify_full) && !force_clean;
  // It also re-reads the source of each such shard against k3-repack.sources:
  // a source that changed after (or while) the shard was converted makes it
  // convert again, so the repair k3-verify --full suggests repairs that too.
  ChecksumManifest recorded, sources;
  if (recheck) {
    recorded = ReadChecksumManifest(JoinPath(opt_.dst, kChecksumsName));
    sources = ReadChecksumManifest(JoinPath(opt_.dst, kSourcesName));
  }
  for (const auto& p : selected) {
    std::string path = JoinPath(opt_.dst, p.out_name);
    std::string why = force_clean ? std::string("--force") : ExistingShardProblem(path, p);
    if (why.empty() && recheck) why = RecheckProblem(path, p.out_name, recorded);
    if (why.empty() && recheck) why = SourceRecheckProblem(p, sources, kMaxAutoBlockBytes);
    if (why.empty()) {
      ++totals_.shards_skipped;
      RepackEvent ev;
      ev.shard = p.out_name;
      ev.detail = recheck ? "complete, checksum and source verified" : "complete and valid";
      ev.shard_src_bytes = p.src_bytes;
      ev.shard_out_bytes = p.file_bytes;
      skipped->push_back(ev);
      continue;
    }
    if (why != "missing" && why != "--force") {
      K3_LOG_WARN("%s: existing output is not usable (%s); converting it again", path.c_str(),
                  why.c_str());
    }
    if (PathExists(path)) *reclaimable += FileSizeOrThrow(path);
    todo.push_back(&p);
    totals_.bytes_todo += p.src_bytes;
    totals_.out_bytes_planned += p.file_bytes;
  }
  totals_.shards_selected = selected.size();
  totals_.shards_todo = todo.size();
  return todo;
}

void Runner::CheckFreeSpace(const Snapshot& snap, uint64_t reclaimable) {
  uint64_t need = totals_.out_bytes_planned + (1u << 20) + snap.num_tensors() * 160;
  for (auto name : kMetadataFiles) {
    std::string p = JoinPath(opt_.src, name);
    if (PathExists(p)) need += FileSizeOrThrow(p);
  }
  totals_.free_bytes = FreeSpaceBytes(ExistingAncestor(opt_.dst)) + reclaimable;
  if (opt_.space_check && need > totals_.free_bytes) {
    throw Error(ErrorCode::kNoSpace,
                "the plan needs " + FormatBytes(need) + " but only " +
                    FormatBytes(totals_.free_bytes) +
                    " is free: " + FormatBytes(need - totals_.free_bytes) + " missing",
                opt_.dst);
  }
}

// Converts the planned shards under their shard locks, recording each checksum:
// `streams` threads take the next shard in order, each running its own
// pipeline; the calling thread emits their events (and the progress) in the
// order they happen. A failure stops the others from starting another shard and
// is rethrown once the shards in flight are finished.
void Runner::ConvertShards(const std::vector<const ShardPlan*>& todo) {
  const std::string shard_lock_path = JoinPath(opt_.dst, kShardLockName);
  UniqueFd shard_lock_fd = OpenOrThrow(shard_lock_path, O_RDWR | O_CREAT, 0644);
  if (todo.empty()) return;
  const size_t streams = static_cast<size_t>(plan_.streams);  // <= todo.size()
  const size_t depth = PipelineDepth(plan_.streams);
  const size_t reads = static_cast<size_t>(plan_.reads);
  const size_t writes = static_cast<size_t>(plan_.writes);

  struct Posted {
    RepackEvent::Kind kind;
    RepackEvent ev;
    size_t slot;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Posted> posted;
  std::exception_ptr err;
  size_t running = streams;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::vector<std::atomic<uint64_t>> progress(streams);
  auto post = [&](RepackEvent::Kind kind, const RepackEvent& ev, size_t slot) {
    std::lock_guard<std::mutex> lock(mu);
    posted.push_back({kind, ev, slot});
    cv.notify_one();
  };

  auto stream = [&](size_t slot) {
    StreamBuffers bufs;
    try {
      for (size_t i = next++; i < todo.size() && !stop.load(); i = next++) {
        const ShardPlan* p = todo[i];
        ++starting_;  // until WriteShard registers its pipeline (or the shard is skipped)
        RepackEvent ev;
        ev.shard = p->out_name;
        ev.shard_src_bytes = p->src_bytes;
        ShardLock shard_lock(shard_lock_fd.get(), p->number, shard_lock_path, p->out_name);
        if (shard_lock.waited() &&
            ExistingShardProblem(JoinPath(opt_.dst, p->out_name), *p).empty()) {
          --starting_;
          ev.detail = "converted by a concurrent pass";
          ev.shard_out_bytes = p->file_bytes;
          post(RepackEvent::Kind::kShardSkipped, ev, slot);
          continue;
        }
        progress[slot] = 0;
        post(RepackEvent::Kind::kShardStart, ev, slot);
        try {
          ev.shard_xxh128 = WriteShard(*p, &ev, &progress[slot], depth, reads, writes, &bufs);
        } catch (ShardFailed& f) {
          // Its temp file is gone, nothing was published: the next shard.
          ev.detail = f.error.what();
          {
            std::lock_guard<std::mutex> lock(mu);
            failed_.push_back(std::move(f));
          }
          post(RepackEvent::Kind::kShardFailed, ev, slot);
          continue;
        }
        {
          std::lock_guard<std::mutex> container(container_mu_);
          ContainerLock lock(opt_.dst);
          UpdateChecksums({{p->out_name, ev.shard_xxh128, ev.source_xxh128}}, /*finalize=*/false);
        }
        post(RepackEvent::Kind::kShardDone, ev, slot);
      }
      // No shard left for this stream: its reads go to the shards still
      // running, so the last big one is not read by one stream alone.
      HelpOthers(reads, &bufs, stop);
    } catch (...) {
      stop = true;
      std::lock_guard<std::mutex> lock(mu);
      if (!err) err = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    --running;
    cv.notify_one();
  };
  std::vector<std::thread> workers;
  try {
    for (size_t i = 0; i < streams; ++i) workers.push_back(StartThread([&stream, i] { stream(i); }));
  } catch (...) {
    stop = true;  // the started streams finish the shard they took
    for (auto& w : workers) w.join();
    throw;
  }

  // The calling thread: the observer's events, in the order they were posted.
  std::vector<std::string> active(streams);  // shard being converted per slot
  std::vector<uint64_t> active_bytes(streams, 0);
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    cv.wait_for(lock, std::chrono::milliseconds(100),
                [&] { return !posted.empty() || running == 0; });
    while (!posted.empty()) {
      Posted e = std::move(posted.front());
      posted.pop_front();
      lock.unlock();
      if (e.kind == RepackEvent::Kind::kShardSkipped) {
        ++totals_.shards_skipped;
      } else if (e.kind == RepackEvent::Kind::kShardStart) {
        active[e.slot] = e.ev.shard;
        active_bytes[e.slot] = e.ev.shard_src_bytes;
      } else if (e.kind == RepackEvent::Kind::kShardDone) {
        active[e.slot].clear();
        ++totals_.shards_done;
        totals_.bytes_done += e.ev.shard_src_bytes;
      } else if (e.kind == RepackEvent::Kind::kShardFailed) {
        active[e.slot].clear();
        ++totals_.shards_failed;
      }
      Emit(e.kind, e.ev);
      lock.lock();
    }
    if (running == 0) break;
    const double now = NowSeconds();
    if (now - last_progress_ >= 0.5) {
      last_progress_ = now;
      RepackEvent ev;
      uint64_t in_flight = 0;
      for (size_t i = 0; i < streams; ++i) {
        if (active[i].empty()) continue;
        in_flight += progress[i].load();
        ev.shard = active[i];  // one of the shards in flight is named
        ev.shard_src_bytes = active_bytes[i];
      }
      if (!ev.shard.empty()) {
        lock.unlock();
        const uint64_t saved = totals_.bytes_done;
        totals_.bytes_done += in_flight;
        Emit(RepackEvent::Kind::kProgress, ev);
        totals_.bytes_done = saved;
        lock.lock();
      }
    }
  }
  lock.unlock();
  for (auto& w : workers) w.join();
  if (err) std::rethrow_exception(err);
}

RepackEvent Runner::Run() {
  CheckOptions();

  // --- Pre-flight: nothing below writes until the source, the plan, the
  // fingerprint and the free space have all been checked.
  Snapshot snap = Snapshot::OpenOrThrow(opt_.src);  // every shard of the index, validated
  ModelConfig config =
      ModelConfig::ParseOrThrow(snap.config_json(), JoinPath(opt_.src, "config.json"));
  CheckSourceMatchesConfig(snap, config, opt_.src);

  struct Src {
    int64_t number;
    const SafetensorsFile* file;
  };
  std::vector<Src> sources;
  for (const auto& f : snap.shards()) {
    auto n = ParseShardName(BaseName(f.path()));
    if (!n) {
      throw Error(ErrorCode::kUnsupported,
                  "source shard name is not model-XXXXX-of-NNNNN.safetensors", f.path());
    }
    sources.push_back({n->number, &f});
  }
  std::sort(sources.begin(), sources.end(),
            [](const Src& a, const Src& b) { return a.number < b.number; });
  for (size_t i = 1; i < sources.size(); ++i) {
    if (sources[i].number == sources[i - 1].number) {
      throw Error(ErrorCode::kCorrupt,
                  "two source shards share number " + std::to_string(sources[i].number),
                  sources[i].file->path());
    }
  }
  // Output shards: source shards with at least one kept tensor.
  std::vector<const Src*> kept;
  for (const auto& s : sources) {
    for (const auto& t : s.file->tensors()) {
      if (ClassifyTensor(t.name, config.is_kda) != TensorRole::kDrop) {
        kept.push_back(&s);
        break;
      }
    }
  }
  if (kept.empty())
    throw Error(ErrorCode::kNotFound, "no text-model tensors in the source", opt_.src);
  const int64_t out_total = static_cast<int64_t>(kept.size());

  Fingerprint fp;
  fp.bits = opt_.bits;
  fp.output_shards = out_total;
  std::string index_path = JoinPath(opt_.src, "model.safetensors.index.json");
  fp.source_index_xxh128 = PathExists(index_path) ? HashFileXxh128(index_path) : std::string();
  std::map<const SafetensorsFile*, SourceStat> src_stats;
  for (const auto& s : sources) {
    const auto& f = *s.file;
    // Stat before reading the header: a change after this is seen at the end of the shard.
    struct stat st {};
    if (::fstat(f.fd(), &st) != 0) ThrowErrno(errno, "fstat", f.path());
    src_stats[&f] = SourceStatOf(st);
    std::vector<std::byte> head(f.header().data_offset());
    PreadFull(f.fd(), head, 0, f.path());
    fp.source_shards.push_back({BaseName(f.path()), f.file_size(), Xxh128Hex(head)});
  }
  plan_for_ = [&, out_total](const std::string& name) -> std::optional<ShardPlan> {
    const std::optional<ShardName> n = ParseShardName(name);
    if (!n || n->total != out_total) return std::nullopt;
    for (const Src* s : kept) {
      if (s->number != n->number) continue;
      ShardPlan p = PlanShard(*s->file, s->number, out_total, config.is_kda, opt_.bits);
      p.src_stat = src_stats.at(s->file);
      return p;
    }
    return std::nullopt;
  };
  const std::string fp_text = fp.Render();

  // Selection: --shards, then --worker I/N over what is left.
  std::vector<ShardPlan> selected;
  {
    std::vector<const Src*> chosen;
    if (opt_.shards.empty()) {
      chosen = kept;
    } else {
      for (int64_t want : opt_.shards) {
        auto s = std::find_if(sources.begin(), sources.end(),
                              [&](const Src& x) { return x.number == want; });
        if (s == sources.end()) {
          throw Error(ErrorCode::kInvalidArgument,
                      "--shards names source shard " + std::to_string(want) +
                          ", which the snapshot does not have",
                      opt_.src);
        }
        if (std::find(kept.begin(), kept.end(), &*s) == kept.end()) {
          K3_LOG_INFO("source shard %lld holds no text-model tensors (vision); nothing to do",
                      static_cast<long long>(want));
          continue;
        }
        if (std::find(chosen.begin(), chosen.end(), &*s) == chosen.end()) chosen.push_back(&*s);
      }
      std::sort(chosen.begin(), chosen.end(),
                [](const Src* a, const Src* b) { return a->number < b->number; });
    }
    for (size_t i = 0; i < chosen.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(opt_.worker_count)) != opt_.worker_index)
        continue;
      selected.push_back(
          PlanShard(*chosen[i]->file, chosen[i]->number, out_total, config.is_kda, opt_.bits));
      selected.back().src_stat = src_stats.at(chosen[i]->file);
    }
  }

  const bool force_clean = CheckDestination(fp, fp_text);

  std::vector<RepackEvent> skipped;  // reported after the start event
  uint64_t reclaimable = 0;
  std::vector<const ShardPlan*> todo = PlanWork(selected, force_clean, &skipped, &reclaimable);
  CheckFreeSpace(snap, reclaimable);
  plan_ = ResolvePipeline(opt_, todo.size(), MemAvailableBytes(), AddressSpaceLimitBytes());

  Emit(RepackEvent::Kind::kStart);
  for (const auto& ev : skipped) Emit(RepackEvent::Kind::kShardSkipped, ev);

  // --- From here on the destination is written.
  const std::string fp_path = JoinPath(opt_.dst, kFingerprintName);
  MakeDirs(opt_.dst);
  {
    ContainerLock lock(opt_.dst);
    if (force_clean) RemoveForForce();
    RemoveStaleTemps(std::string(kFingerprintName));
    if (!PathExists(fp_path)) {
      WriteFileAtomic(fp_path, fp_text);
    } else if (ReadFileOrThrow(fp_path, 64u << 20) != fp_text) {
      // Another pass with other parameters won the race to create it.
      throw Error(ErrorCode::kExists, "a concurrent pass created a different fingerprint", fp_path);
    }
    CopyMetadata();
  }

  ConvertShards(todo);

  RepackEvent summary;
  {
    ContainerLock lock(opt_.dst);
    RemoveStaleTemps(std::string(kIndexName));
    IndexSummary is = RebuildIndex(opt_.dst);
    UpdateChecksums({}, /*finalize=*/true);
    summary.index_shards = is.num_shards;
    summary.index_tensors = is.num_tensors;
    summary.index_total_size = is.total_size;
  }
  summary.peak_rss_bytes = PeakRssBytes();
  Emit(RepackEvent::Kind::kSummary, summary);
  if (!failed_.empty()) {
    // What was published is indexed and recorded above; the failed shards are
    // missing, so a rerun converts them (once their source is stable).
    const Error& first = failed_.front().error;
    throw Error(first.code(),
                std::to_string(failed_.size()) + " shard(s) not published, the first: " +
                    first.detail() + (failed_.size() > 1 ? " (the others are in the log)" : ""),
                first.path(), first.offset(), first.object());
  }
  summary.kind = RepackEvent::Kind::kSummary;
  summary.shards_selected = totals_.shards_selected;
  summary.shards_done = totals_.shards_done;
  summary.shards_skipped = totals_.shards_skipped;
  summary.shards_failed = totals_.shards_failed;
  summary.bytes_done = totals_.bytes_done;
  summary.elapsed_seconds = NowSeconds() - t0_;
  return summary;
}

}  // namespace

size_t BlocksPerStream(int streams, int reads, int writes) {
  const size_t depth = PipelineDepth(streams);
  const size_t read_pool = depth + static_cast<size_t>(std::max(1, reads)) - 1;
  // Quantized blocks are at most half their source block (int8 from BF16/F16;
  // a quarter from F32, less for int4), and are allocated at that size.
  const size_t out_pool = (depth + 1) / 2;
  const size_t stages = static_cast<size_t>(std::max(1, writes)) + 1;
  return read_pool + out_pool + stages;
}

uint64_t PipelineBufferBytes(int streams, int reads, int writes, uint64_t block_bytes) {
  return static_cast<uint64_t>(std::max(1, streams)) * BlocksPerStream(streams, reads, writes) *
         block_bytes;
}

namespace {
std::string BlockText(uint64_t bytes) {
  return bytes % (1 << 20) == 0 ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}
}  // namespace

PipelinePlan ResolvePipeline(const RepackOptions& o, size_t shards_todo, uint64_t mem_available,
                             uint64_t address_space) {
  PipelinePlan p;
  p.budget_given = o.mem_budget_bytes > 0;
  if (p.budget_given) {
    p.budget_bytes = o.mem_budget_bytes;
  } else {
    // A quarter of what the machine has free, at most the default: the budget
    // is for buffers, and the page cache and other processes need the rest.
    p.budget_bytes = kDefaultMemBudgetBytes;
    if (mem_available > 0) {
      p.budget_bytes = std::min(p.budget_bytes, std::max(kMinMemBudgetBytes, mem_available / 4));
    }
    // Under an address-space limit (ulimit -v), the buffers share it with a
    // stack per pipeline thread, the malloc arenas and the mapped binary.
    if (address_space > 0) {
      const uint64_t fit = std::max(kMinMemBudgetBytes, address_space / 8 * 3);
      if (fit < p.budget_bytes) {
        p.budget_bytes = fit;
        p.budget_by_address_space = true;
      }
    }
  }
  const int cap = static_cast<int>(std::clamp<size_t>(shards_todo, 1, kMaxStreams));
  p.streams_auto = o.streams <= 0;
  p.reads_auto = o.reads_in_flight <= 0;
  p.writes_auto = o.writes_in_flight <= 0;
  p.block_auto = o.block_bytes == 0;
  p.streams = std::min(p.streams_auto ? kDefaultStreams : o.streams, cap);
  auto bytes = [&] { return PipelineBufferBytes(p.streams, p.reads, p.writes, p.block_bytes); };
  // The disk measured in docs/PERFORMANCE.md rewards bytes in flight, in
  // blocks of 8 MiB or more: the first of these that fits the budget is taken,
  // the block size before the count (automatic reads and writes are equal).
  //   block 8 MiB, in flight 16 down to 4; then 4 MiB, 16 down to 4; ... 1 MiB;
  //   then 1 MiB with 3 down to 1 in flight; then fewer automatic streams.
  auto try_counts = [&](int hi, int lo) {
    for (int n = hi; n >= lo; --n) {
      p.reads = p.reads_auto ? n : o.reads_in_flight;
      p.writes = p.writes_auto ? n : o.writes_in_flight;
      if (bytes() <= p.budget_bytes) return true;
      if (!p.reads_auto && !p.writes_auto) return false;
    }
    return false;
  };
  bool fits = false;
  for (uint64_t b = kMaxAutoBlockBytes; !fits && b >= kMinAutoBlockBytes; b /= 2) {
    p.block_bytes = p.block_auto ? b : o.block_bytes;
    fits = try_counts(kDefaultReadsInFlight, kMinAutoInFlight);
    if (!p.block_auto) break;
  }
  while (!fits) {
    fits = try_counts(kMinAutoInFlight - 1, 1);
    if (fits || !p.streams_auto || p.streams == 1) break;
    --p.streams;
    fits = try_counts(kDefaultReadsInFlight, 1);
  }
  if (!fits && p.reads_auto) p.reads = 1;
  if (!fits && p.writes_auto) p.writes = 1;
  p.buffer_bytes = bytes();
  if (p.budget_given && p.buffer_bytes > p.budget_bytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "--mem-mb " + std::to_string(p.budget_bytes >> 20) + ": --streams " +
                    std::to_string(p.streams) + " --reads " + std::to_string(p.reads) + " --writes " +
                    std::to_string(p.writes) + " with " + BlockText(p.block_bytes) +
                    " blocks need " + std::to_string((p.buffer_bytes + (1 << 20) - 1) >> 20) +
                    " MiB of buffers; raise --mem-mb or lower the flags given (0 = automatic)");
  }
  return p;
}

std::string PipelinePlan::Describe() const {
  auto src = [](bool a) { return a ? "" : " (given)"; };
  char buf[512];
  const uint64_t mib = 1 << 20;
  const std::string automatic =
      budget_by_address_space
          ? std::string("automatic: 3/8 of the address-space limit, RLIMIT_AS")
          : "automatic: the smaller of " + std::to_string(kDefaultMemBudgetBytes / mib) + " MiB and MemAvailable / 4";
  const std::string block = BlockText(block_bytes);
  std::snprintf(buf, sizeof buf,
                "%d stream(s)%s x %d read(s)%s and %d write(s)%s in flight, %s blocks%s: buffers "
                "<= %llu MiB of a %llu MiB budget (%s)",
                streams, src(streams_auto), reads, src(reads_auto), writes, src(writes_auto),
                block.c_str(), src(block_auto),
                static_cast<unsigned long long>((buffer_bytes + mib - 1) / mib),
                static_cast<unsigned long long>(budget_bytes / mib),
                budget_given                  ? "--mem-mb"
                : buffer_bytes > budget_bytes ? "automatic; the flags given exceed it"
                                              : automatic.c_str());
  return buf;
}

void ValidateBits(const QuantBits& b) {
  // Only the two layouts a container has (docs/container.md): values in between
  // used to be accepted and silently rounded to one of them.
  for (auto [name, v] : {std::pair{"--bits", b.bits}, std::pair{"--mla-bits", b.mla_bits},
                         std::pair{"--head-bits", b.head_bits}}) {
    if (v != 4 && v != 8) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(name) + " " + std::to_string(v) +
                      ": must be 4 (int4-g64) or 8 (int8); for f32 use the source snapshot directly");
    }
  }
}

RepackEvent RunRepack(const RepackOptions& options, const RepackObserver& observer) {
  Runner r(options, observer);
  return r.Run();
}

}  // namespace k3::repack
