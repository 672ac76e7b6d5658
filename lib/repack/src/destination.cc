// What the runner writes into DST besides shards, and the cleanup before it
// writes: stale temp files, --force's removal, the metadata copies and the two
// manifests (checksums.xxh128, k3-repack.sources).
#include <unistd.h>

#include <cerrno>

#include "k3/repack/checksums.h"
#include "runner.h"
#include "source_stats.h"
#include "shard_checks.h"

namespace k3::repack {
namespace {

constexpr uint64_t kMaxMetadataFileBytes = 512ull << 20;

}  // namespace

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
                base == kFingerprintName || base == kSourcesName ||
                base == kSourceStatsName;
    for (auto m : kMetadataFiles) ours = ours || base == m;
    if (ours) victims.push_back(name);
  }
  for (const auto& v : victims) {
    std::string path = JoinPath(opt_.dst, v);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) ThrowErrno(errno, "unlink", path);
  }
  FsyncDirOrThrow(opt_.dst);
}

std::optional<ShardPlan> Runner::UnchangedSourcePlan(const std::string& name) {
  std::optional<ShardPlan> p = plan_for_ ? plan_for_(name) : std::nullopt;
  if (!p || SourceChange(*p)) return std::nullopt;
  return p;
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
  const std::string stats_path = JoinPath(opt_.dst, kSourceStatsName);
  RemoveStaleTemps(std::string(kChecksumsName));
  RemoveStaleTemps(std::string(kSourcesName));
  RemoveStaleTemps(std::string(kSourceStatsName));
  ChecksumManifest m = ReadChecksumManifest(path);
  ChecksumManifest sources = ReadChecksumManifest(sources_path);
  SourceStatManifest stats = ReadSourceStats(stats_path);
  for (const Fresh& f : fresh) {
    m[f.shard] = f.xxh128;
    sources[f.shard] = f.source_xxh128;
    stats[f.shard] = f.source_stat;
  }
  if (finalize) {
    for (const auto& [shard, st] : restat_) stats[shard] = st;
    ChecksumManifest kept;
    SourceStatManifest kept_stats;
    for (const auto& s : ListShardFiles(opt_.dst)) {
      if (auto it = sources.find(s); it != sources.end()) {
        kept[s] = it->second;
        if (auto st = stats.find(s); st != stats.end()) kept_stats[s] = st->second;
      } else if (std::optional<ShardPlan> p = UnchangedSourcePlan(s)) {
        kept[s] = HashShardSource(*p, kMaxAutoBlockBytes);
        kept_stats[s] = p->src_stat;
      }
    }
    sources = std::move(kept);
    stats = std::move(kept_stats);
  }
  // A stat is trusted only beside a digest. Stats first: a pass killed
  // between the two leaves a stat without a digest, which makes a rerun re-read
  // (or, at the end, re-hash) that source; the other order would leave a digest
  // without a stat, and that shard's source would never be stat-checked again.
  WriteFileAtomic(stats_path, RenderSourceStats(stats));
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

}  // namespace k3::repack
