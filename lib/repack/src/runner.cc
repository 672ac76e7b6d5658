#include "runner.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>

#include "k3/core/log.h"
#include "k3/model/config.h"
#include "k3/repack/checksums.h"

namespace k3::repack {

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

RepackEvent RunRepack(const RepackOptions& options, const RepackObserver& observer) {
  Runner r(options, observer);
  return r.Run();
}

}  // namespace k3::repack
