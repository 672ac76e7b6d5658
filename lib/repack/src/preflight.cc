// The pre-flight of a run: options, the source against its config, the
// destination's fingerprint, which shards to do (resume, --recheck) and the
// free space. Nothing here writes.
#include <climits>
#include <cstdlib>
#include <string_view>

#include "k3/core/log.h"
#include "k3/repack/checksums.h"
#include "model_check.h"
#include "runner.h"
#include "shard_checks.h"
#include "source_stats.h"
#include "shard_lock.h"

namespace k3::repack {
namespace {

std::string ExistingAncestor(std::string p) {
  while (!p.empty() && !IsDirectory(p)) {
    std::string parent = DirName(p);
    if (parent == p) break;
    p = parent;
  }
  return p.empty() ? "." : p;
}

}  // namespace

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

void ValidateBits(const QuantBits& b) {
  // Only the two layouts a container has (docs/container.md): a value in
  // between is refused, not rounded to one of them.
  for (auto [name, v] : {std::pair{"--bits", b.bits}, std::pair{"--mla-bits", b.mla_bits},
                         std::pair{"--head-bits", b.head_bits}}) {
    if (v != 4 && v != 8) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(name) + " " + std::to_string(v) +
                      ": must be 4 (int4-g64) or 8 (int8); for f32 use the source snapshot directly");
    }
  }
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

std::vector<const ShardPlan*> Runner::PlanWork(const std::vector<ShardPlan>& selected, bool force_clean,
                                                std::vector<RepackEvent>* skipped, uint64_t* reclaimable) {
  std::vector<const ShardPlan*> todo;
  // --recheck: a kept shard must also hash to what checksums.xxh128 recorded, so
  // bytes damaged after the write are found and the shard converted again.
  const bool recheck = (opt_.recheck || opt_.verify_full) && !force_clean;
  // It also re-reads the source of each such shard against k3-repack.sources:
  // a source that changed after (or while) the shard was converted makes it
  // convert again, so the repair k3-verify --full suggests repairs that too.
  // A plain rerun compares each kept shard's source stat with the one
  // k3-repack.source-stats recorded, which costs no read: a source replaced or
  // edited since (another inode, size, mtime or ctime) is re-read against its
  // digest, and the shard is converted again if its bytes changed.
  ChecksumManifest recorded, sources;
  SourceStatManifest stats;
  if (!force_clean) {
    sources = ReadChecksumManifest(JoinPath(opt_.dst, kSourcesName));
    stats = ReadSourceStats(JoinPath(opt_.dst, kSourceStatsName));
  }
  if (recheck) recorded = ReadChecksumManifest(JoinPath(opt_.dst, kChecksumsName));
  for (const auto& p : selected) {
    std::string path = JoinPath(opt_.dst, p.out_name);
    std::optional<Problem> why;  // why it is converted; --force converts every shard
    if (!force_clean) {
      why = ExistingShardProblem(path, p);
      if (!why && recheck) why = RecheckProblem(path, p.out_name, recorded);
      const auto was = stats.find(p.out_name);
      const std::optional<std::string> moved =
          was == stats.end() ? std::nullopt : DescribeSourceChange(was->second, p.src_stat);
      std::string detail = recheck ? "complete, checksum and source verified" : "complete and valid";
      if (!why && (recheck || moved)) {
        why = SourceRecheckProblem(p, sources, kMaxAutoBlockBytes);
        if (why && moved) why->detail = "source stat " + *moved + "; " + why->detail;
        if (!why && moved && !recheck) detail += "; its source was re-read after " + *moved + ": same bytes";
      }
      if (!why) {
        // A stat that changed (or was never recorded) but whose bytes were
        // just proved is recorded, so the next rerun reads nothing.
        if (moved || (recheck && was == stats.end())) restat_.emplace_back(p.out_name, p.src_stat);
        ++totals_.shards_skipped;
        RepackEvent ev;
        ev.shard = p.out_name;
        ev.detail = detail;
        ev.shard_src_bytes = p.src_bytes;
        ev.shard_out_bytes = p.file_bytes;
        skipped->push_back(ev);
        continue;
      }
    }
    // A shard not written yet (kNotFound) is no news.
    if (why && why->code != ErrorCode::kNotFound) {
      K3_LOG_WARN("%s: existing output is not usable (%s); converting it again", path.c_str(),
                  why->detail.c_str());
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

}  // namespace k3::repack
