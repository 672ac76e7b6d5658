#include "shard_checks.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/repack/container.h"

namespace k3::repack {
namespace {

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

// A problem with the whole of `file` (no tensor, no offset).
Problem ShardProblem(ErrorCode code, const std::string& file, std::string detail) {
  Problem p;
  p.code = code;
  p.file = file;
  p.detail = std::move(detail);
  return p;
}

}  // namespace

std::optional<Problem> ExistingShardProblem(const std::string& path, const ShardPlan& p) {
  UniqueFd fd = TryOpen(path, O_RDONLY);
  if (!fd.valid()) return ShardProblem(ErrorCode::kNotFound, path, "missing");
  try {
    uint64_t size = FileSizeOrThrow(fd.get(), path);
    if (size != p.file_bytes) {
      return ShardProblem(
          ErrorCode::kCorrupt, path,
          "size " + std::to_string(size) + " != planned " + std::to_string(p.file_bytes));
    }
    std::string head(8 + p.header.size(), '\0');
    PreadFull(fd.get(), std::as_writable_bytes(std::span(head.data(), head.size())), 0, path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(head[i]);
    if (n != p.header.size() || std::string_view(head).substr(8) != p.header) {
      return ShardProblem(ErrorCode::kCorrupt, path, "header differs from the planned one");
    }
  } catch (const Error& e) {
    return ShardProblem(e.code(), path, e.what());
  }
  return std::nullopt;
}

std::optional<Problem> RecheckProblem(const std::string& path, const std::string& name,
                                      const ChecksumManifest& recorded) {
  auto it = recorded.find(name);
  if (it == recorded.end()) {
    return ShardProblem(ErrorCode::kChecksumMismatch, path,
                        "not in " + std::string(kChecksumsName) + ", so it cannot be trusted");
  }
  std::string have = HashFileXxh128(path);
  if (have != it->second) {
    return ShardProblem(ErrorCode::kChecksumMismatch, path,
                        "XXH3-128 is " + have + " but " + std::string(kChecksumsName) + " says " +
                            it->second + " (damaged after it was written)");
  }
  return std::nullopt;
}

std::optional<Problem> SourceChange(const ShardPlan& p) {
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
  if (what.empty()) return std::nullopt;
  Problem changed = ShardProblem(ErrorCode::kChecksumMismatch, p.src->path(), "");
  for (const std::string& w : what) changed.detail += (changed.detail.empty() ? "" : ", ") + w;
  return changed;
}

std::string HashShardSource(const ShardPlan& p, uint64_t block_bytes) {
  Xxh128 h;
  ForEachSourceBlock(p, block_bytes,
                     [&](const Item&, uint64_t, std::span<const std::byte> b) { h.Update(b); });
  return h.HexDigest();
}

std::optional<Problem> SourceRecheckProblem(const ShardPlan& p, const ChecksumManifest& sources,
                                            uint64_t block_bytes) {
  auto it = sources.find(p.out_name);
  if (it == sources.end()) {
    return ShardProblem(
        ErrorCode::kChecksumMismatch, p.src->path(),
        "no source digest in " + std::string(kSourcesName) +
            " (converted before k3-repack recorded them, or interrupted), so it cannot "
            "be compared with the source");
  }
  const std::string now = HashShardSource(p, block_bytes);
  if (now != it->second) {
    return ShardProblem(ErrorCode::kChecksumMismatch, p.src->path(),
                        "its source " + p.src->path() +
                            " changed since it was converted (kept source bytes hash " + now +
                            ", " + std::string(kSourcesName) + " says " + it->second + ")");
  }
  return std::nullopt;
}

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

}  // namespace k3::repack
