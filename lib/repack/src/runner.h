// The conversion run behind RunRepack: pre-flight (preflight.cc), the shards
// through their pipelines (convert.cc), and what it writes into DST besides
// shards (destination.cc). Private to lib/repack.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "k3/container/snapshot.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/sys.h"
#include "k3/model/config.h"
#include "k3/repack/container.h"
#include "k3/repack/repack.h"
#include "shard_pipeline.h"
#include "shard_plan.h"

namespace k3::repack {

// A failure that is one shard's alone (its source changed while it was read,
// or --verify-full found a difference): the shard is not published, the other
// streams go on, and the run reports it at the end.
struct ShardFailed {
  Error error;
};

// Every tensor config.json implies, by name, dtype and shape, before anything is
// written: a config that contradicts its tensors would otherwise convert into a
// container k3-verify rejects. The problems are k3-verify's (same rules, same
// text); throws the first one's code with up to five of them.
void CheckSourceMatchesConfig(const Snapshot& snap, const ModelConfig& config, const std::string& src);

// One RunRepack call. Run(), the pre-flight and every event are on the calling
// thread; WriteShard, HelpOthers and UpdateChecksums also run on the streams'
// threads (see each for what it may touch).
class Runner {
 public:
  Runner(const RepackOptions& o, const RepackObserver& obs) : opt_(o), observer_(obs) {}
  RepackEvent Run();

 private:
  // runner.cc: every event goes through here, on the calling thread.
  void Emit(RepackEvent::Kind kind, RepackEvent ev = {});

  // preflight.cc: the pieces of Run() before the first write, in order; none
  // of them writes.
  void CheckOptions();
  // An existing destination must be this conversion (same fingerprint), or
  // --force; returns whether what it holds is to be discarded.
  bool CheckDestination(const Fingerprint& fp, const std::string& fp_text);
  // Which selected shards to convert (the rest are complete, or --recheck
  // proved them); the others become kShardSkipped events in *skipped.
  std::vector<const ShardPlan*> PlanWork(const std::vector<ShardPlan>& selected, bool force_clean,
                                         std::vector<RepackEvent>* skipped, uint64_t* reclaimable);
  void CheckFreeSpace(const Snapshot& snap, uint64_t reclaimable);

  // convert.cc: the streams, their pipelines and the publish of each shard.
  void ConvertShards(const std::vector<const ShardPlan*>& todo);
  // Returns the shard's xxh128. Runs on a stream's thread: touches no Runner
  // state but the options and the lending registry (running_, starting_,
  // active_); source bytes written so far go to *progress.
  std::string WriteShard(const ShardPlan& p, RepackEvent* done, std::atomic<uint64_t>* progress,
                         size_t depth, size_t reads, size_t writes, StreamBuffers* bufs);
  // An idle stream's thread lends its reads to the running shards, the one with
  // the most segments left first, until none has more than one left or *stop.
  void HelpOthers(size_t reads, StreamBuffers* bufs, const std::atomic<bool>& stop);
  void FinishShard(const ShardPlan& p, AtomicFileWriter& out, uint64_t written, RepackEvent* done);

  // destination.cc: DST's files besides shards.
  void RemoveStaleTemps(const std::string& final_name);
  void RemoveForForce();
  void CopyMetadata();
  // checksums.xxh128, k3-repack.sources and k3-repack.source-stats: `fresh`
  // adds (shard, output digest, source digest, source stat) entries;
  // `finalize` drops entries of files that are gone, records the stats PlanWork
  // re-proved (restat_) and fills in what a killed pass published without
  // recording. The caller holds the ContainerLock.
  struct Fresh {
    std::string shard, xxh128, source_xxh128;
    SourceStat source_stat;
  };
  void UpdateChecksums(const std::vector<Fresh>& fresh, bool finalize);
  // The plan of output shard `name` when its source is one this pass knows
  // and is unchanged since the pre-flight (so its digest and stat computed now
  // are what the shard was made from), for a shard published by a pass that
  // died before recording it; nullopt otherwise.
  std::optional<ShardPlan> UnchangedSourcePlan(const std::string& name);

  const RepackOptions& opt_;
  const RepackObserver& observer_;
  PipelinePlan plan_;  // resolved once the shards to do are known
  // The plan of output shard `name` (any shard of the source, not only this
  // pass's), with its source's pre-flight stat; nullopt for a foreign name.
  std::function<std::optional<ShardPlan>(const std::string& name)> plan_for_;
  std::vector<ShardFailed> failed_;  // shards that failed on their own, in order
  // Kept shards whose source stat changed but whose source bytes were re-read
  // and found the same: their new stat is recorded at the end of the run.
  std::vector<std::pair<std::string, SourceStat>> restat_;
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

}  // namespace k3::repack
