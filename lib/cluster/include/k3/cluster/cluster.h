// k3 on several hosts: expert-parallel inference over MPI (docs/cluster.md).
//
// Rank 0 is the coordinator: it runs everything a single host runs (tokenizer,
// trunk, attention state, router, shared experts, head, server) and swaps the
// model's ExpertExecutor for a ClusterExecutor that ships each MoE layer's
// routed pairs to the ranks that own the experts (Placement) and scatters the
// answers back, per pair, in f32: the model's combine then sums them in its
// own fixed order, so tokens and logits are bit-identical to one host. The
// other ranks run RunWorkerOrThrow: a snapshot, an expert store that only ever
// reads the experts the rank owns, and the CPU executor.
//
// Every exchange has a deadline; a worker that dies, hangs or is late fails
// the in-flight call with kUnavailable naming the rank, and the executor stays
// failed (MPI is fail-stop: the job must be restarted). A worker's own error
// (a disk read) comes back as its typed error, naming the rank.
//
// Thread-safety: the executor is driven by the Session's thread; stats() may be
// called from any thread. All MPI traffic goes through Comm (comm.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "k3/cluster/comm.h"
#include "k3/cluster/placement.h"
#include "k3/container/snapshot.h"
#include "k3/model/expert_executor.h"
#include "k3/model/model.h"
#include "k3/stream/streaming_store.h"

namespace k3 {
class JsonWriter;
}

namespace k3::cluster {

// The apps' --cluster-* flags (docs/cluster.md); every rank parses the same
// command line, and each rank's own capacity flags describe that rank.
struct ClusterOptions {
  bool symmetric = false;    // rank 0 owns experts too (--cluster-symmetric)
  double deadline_s = 60.0;  // one exchange (--cluster-deadline)
  double startup_s = 600.0;  // workers opening and checking their share
  bool reduced = false;      // bf16 replies (--cluster-reduced): not bit-exact
  Capacity capacity;         // this rank's (--cluster-ram-gb, --cluster-disk-gbps)
  // "auto" for those flags: this rank measures at start (MeasureCapacity).
  bool measure_ram = false;
  bool measure_disk = false;
  double measure_seconds = 2.0;   // the disk read: at most this long
  uint64_t measure_bytes = 2000000000;  // and at most this many bytes
  // Test hook (--cluster-fault RANK:KIND@N): on worker RANK, at its N-th work
  // message (1-based), KIND = kill (SIGKILL itself), stop (SIGSTOP itself),
  // exit (exit 1 without answering) or disk (every expert read from then on
  // returns EIO through the streaming store).
  std::string fault;
};

// A timed read of expert bytes (MeasureDiskRate).
struct DiskRate {
  double bytes_per_s = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  bool direct = true;  // O_DIRECT everywhere (else buffered, page cache dropped first)
  int errors = 0;      // opens or reads that failed
};
// Reads expert bytes of `table`'s files (holes skipped), `threads` reads in
// flight, until `max_seconds` or `max_bytes`.
DiskRate MeasureDiskRate(const model::ExpertTable& table, double max_seconds, uint64_t max_bytes,
                         int threads);
// This rank's capacity: `given`, with the RAM (the expert cache it would size,
// `cache_bytes`) and the disk rate measured where options.measure_* say;
// rounded down to two significant digits, logged.
Capacity MeasureCapacity(const model::ExpertTable& table, uint64_t cache_bytes, Capacity given,
                         const ClusterOptions& options, int rank);

// What a worker needs besides the options (the engine's own choices).
struct WorkerSetup {
  std::string model_dir;
  Snapshot::Options snapshot;    // K3_DIRS
  stream::StreamOptions stream;  // K3_EXPERT_GB and the other store knobs
  bool progress = true;
};

struct WorkerStats {
  int rank = 0;
  std::string host;
  int64_t owned_experts = 0;
  uint64_t owned_bytes = 0;
  uint64_t exchanges = 0;                         // work messages sent to it
  uint64_t pairs = 0;                             // (token, rank) pairs it computed
  uint64_t bytes_sent = 0;                        // coordinator -> worker
  uint64_t bytes_received = 0;                    // worker -> coordinator
  uint64_t bytes_read = 0, hits = 0, misses = 0;  // its expert store, cumulative
  double compute_s = 0;                           // inside its executor
  double hit_rate() const {
    const uint64_t n = hits + misses;
    return n ? static_cast<double>(hits) / static_cast<double>(n) : 0.0;
  }
};

// One kind of pass: decode (one token) or prefill (a window of several).
struct PhaseStats {
  uint64_t passes = 0;       // MoE layer passes
  uint64_t round_trips = 0;  // passes that waited for at least one worker
  uint64_t tokens = 0;       // tokens over those passes
  double exchange_s = 0;     // first send to last answer, summed
  double compute_s = 0;      // the slowest worker's executor time per pass, summed
  uint64_t bytes = 0;        // both directions
};

struct ClusterStats {
  int ranks = 1;
  bool symmetric = false;
  bool reduced = false;
  uint64_t placement_fp = 0;
  std::string placement;      // Placement::Describe
  uint64_t layer_passes = 0;  // Run() calls
  uint64_t round_trips = 0;   // passes that waited for at least one worker
  double exchange_s = 0;      // first send to last reply, summed over passes
  double local_s = 0;         // rank 0's own experts (symmetric)
  uint64_t bytes_sent = 0, bytes_received = 0;
  int failed_rank = -1;  // the rank that was lost, -1 if none
  PhaseStats decode, prefill;
  std::vector<WorkerStats> workers;  // per owner rank (rank 0 first when symmetric)
};

class ClusterExecutor final : public model::ExpertExecutor {
 public:
  ~ClusterExecutor() override;
  void Run(const model::ExpertBatch& batch, model::ExpertStore& store) override;
  // Read-ahead only for the experts rank 0 computes itself (the workers read
  // their own when the work arrives).
  void Prefetch(int64_t layer, std::span<const int32_t> likely, model::ExpertStore& store) override;
  // Rank 0's own experts first, then each worker's answer: pairs reach the
  // combine (ExpertBatch::Emit) in no one order, and it sums them in expert
  // order whatever order they came in.
  model::PairOrder pair_order() const override { return model::PairOrder::kAnyOrder; }
  ClusterStats stats() const;
  const Placement& placement() const { return placement_; }
  // True after a worker was lost: every later Run() throws the same error.
  bool failed() const { return failed_.load(); }
  // Tells every worker to exit (BYE); called by the destructor unless failed.
  void Shutdown() noexcept;

 private:
  friend ClusterExecutor& InstallCoordinator(model::Model&, Comm&, const ClusterOptions&);
  ClusterExecutor(Comm& comm, const ModelConfig& config, const ClusterOptions& options,
                  Placement placement);
  [[noreturn]] void Lose(int rank, const std::string& why);

  Comm& comm_;
  const ModelConfig& config_;
  ClusterOptions options_;
  Placement placement_;
  model::CpuExpertExecutor cpu_;
  uint32_t seq_ = 0;
  std::atomic<bool> failed_{false};
  std::atomic<int> failed_rank_{-1};
  std::string failure_;
  bool shut_down_ = false;
  mutable std::mutex mu_;  // guards stats_
  ClusterStats stats_;
  // Scratch reused across passes.
  std::vector<std::vector<std::byte>> send_buf_, recv_buf_;
  std::vector<float> bf16_row_;
};

// Rank 0, after the model is loaded (EngineOptions::on_model_loaded): meets
// every worker (startup deadline), checks build, kernels, model and placement
// fingerprints (kExists naming the rank and what differs), waits until each
// has verified its share, then installs a ClusterExecutor in `model` and
// returns it. `comm` must outlive the model.
ClusterExecutor& InstallCoordinator(model::Model& model, Comm& comm, const ClusterOptions& options);
// The executor InstallCoordinator put in `model`, or null.
ClusterExecutor* InstalledCoordinator(model::Model& model);

// Ranks 1..N-1: serve work until the coordinator says BYE. Throws what made
// the worker unable to start (its share lacks bytes: kNotFound/kTruncated
// naming the expert and shard), after telling the coordinator.
void RunWorkerOrThrow(Comm& comm, const WorkerSetup& setup, const ClusterOptions& options);

// The fingerprint every rank compares: config.json, shard names and sizes.
uint64_t ModelFingerprint(const Snapshot& snapshot);
// This build: version line, git sha, wire version.
uint64_t BuildId();

// The owner ranks of an N-rank job (1..N-1, and 0 when symmetric).
std::vector<int> OwnerRanks(int ranks, bool symmetric);

// Every byte range (file, offset, length) the experts `rank` owns occupy.
struct ShareRange {
  size_t shard = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
std::vector<ShareRange> ShareRanges(const model::ExpertTable& table, const Placement& placement,
                                    int rank);
// Checks that `rank` has every byte it owns: the tensors are in the index, the
// files long enough, no owned range a hole. Returns "" or what is missing.
std::string CheckShare(const model::ExpertTable& table, const Placement& placement, int rank);
// Writes `rank`'s share of `model_dir` to `out_dir`: the metadata files whole,
// every shard as a sparse file of its full size holding its header and the
// owned experts' bytes only. Returns the bytes written.
uint64_t PrepareShareOrThrow(const std::string& model_dir, const Placement& placement, int rank,
                             const std::string& out_dir);

// SIGTERM on the coordinator (mpirun's reaction to a dead rank) turns the
// current exchange into kUnavailable instead of killing the process, so the
// checkpoints can be parked first.
void InstallStopHandler();
bool StopRequested();
// The same from a thread that took SIGTERM itself (k3-run serve's sigwait).
void RequestStop();

// "cluster" object: placement, per-worker bytes read, hit rates, exchange time.
void WriteClusterStatsJson(const ClusterStats& s, JsonWriter& j);
// Prometheus text for /metrics: k3_cluster_* gauges and counters, per worker.
std::string RenderClusterMetrics(const ClusterStats& s);
// One stderr line for k3-run's summary.
std::string DescribeClusterStats(const ClusterStats& s);

}  // namespace k3::cluster
