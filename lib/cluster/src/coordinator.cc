// Rank 0's side: the handshake and the ClusterExecutor (per MoE layer: send
// every worker its rows and pairs, compute rank 0's own experts meanwhile,
// collect the answers within the deadline, scatter them per pair).
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "k3/cluster/cluster.h"
#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/quant/isa.h"
#include "poll.h"
#include "wire.h"

namespace k3::cluster {
namespace {

std::atomic<bool> g_stop{false};

void OnStop(int) { g_stop.store(true); }

std::string RankName(int rank, const std::string& host) {
  return "rank " + std::to_string(rank) + (host.empty() ? "" : " (" + host + ")");
}

std::string Hex(uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// Tests `rs` until every one is complete or `seconds` pass: true when all are.
bool DeliverAll(Comm& comm, std::vector<Comm::Request>& rs, double seconds) {
  return PollUntil(Deadline(seconds), [&] {
    bool all = true;
    for (auto& r : rs) all = comm.Test(r) && all;
    return all;
  });
}

// BYE to every worker, kept until delivered (a Request destroyed while active
// is cancelled: a cancelled BYE left workers waiting for it). True when all
// went out within `seconds`.
bool SendByeToAll(Comm& comm, double seconds) {
  std::vector<Comm::Request> bye;
  for (int r = 1; r < comm.size(); ++r) bye.push_back(comm.Isend(r, wire::kBye, nullptr, 0));
  return DeliverAll(comm, bye, seconds);
}

}  // namespace

void InstallStopHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnStop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

bool StopRequested() { return g_stop.load(); }

void RequestStop() { g_stop.store(true); }

std::vector<int> OwnerRanks(int ranks, bool symmetric) {
  std::vector<int> o;
  for (int r = symmetric ? 0 : 1; r < ranks; ++r) o.push_back(r);
  return o;
}

// --- handshake -----------------------------------------------------------------------
ClusterExecutor& InstallCoordinator(model::Model& model, Comm& comm,
                                    const ClusterOptions& options) {
  const ModelConfig& c = model.config();
  const int N = comm.size();
  if (N < 2 && !options.symmetric) {
    throw Error(ErrorCode::kInvalidArgument,
                "--cluster with one rank needs --cluster-symmetric (or mpirun -np 2 or more)");
  }
  const uint64_t build = BuildId();
  const uint64_t model_fp = ModelFingerprint(model.snapshot());
  const std::string kernels = quant::IsaName(quant::ActiveIsa());
  const Deadline startup(options.startup_s);

  // 1. Hello from every worker.
  std::vector<std::vector<std::byte>> buf(static_cast<size_t>(N));
  std::vector<Comm::Request> req(static_cast<size_t>(N));
  std::vector<size_t> got(static_cast<size_t>(N));
  for (int r = 1; r < N; ++r) {
    buf[r].resize(1024);
    req[r] = comm.Irecv(r, wire::kHello, buf[r].data(), buf[r].size());
  }
  std::vector<wire::Hello> hello(static_cast<size_t>(N));
  std::string problem;
  int bad_rank = -1;
  ErrorCode bad_code = ErrorCode::kExists;
  auto note = [&](int rank, ErrorCode code, const std::string& what) {
    if (problem.empty()) {
      problem = what;
      bad_rank = rank;
      bad_code = code;
    }
  };
  auto wait_all = [&](const char* what) {
    PollUntil(startup, [&] {
      bool all = true;
      for (int r = 1; r < N; ++r) all = comm.Test(req[r], &got[r]) && all;
      return all;
    });
    for (int r = 1; r < N; ++r) {
      if (req[r].active()) {
        note(r, ErrorCode::kUnavailable,
             "rank " + std::to_string(r) + " sent no " + what + " within " +
                 std::to_string(static_cast<int>(options.startup_s)) + " s of start-up");
      }
    }
  };
  wait_all("hello");
  for (int r = 1; r < N && problem.empty(); ++r) {
    try {
      hello[r] = wire::DecodeHello(buf[r].data(), got[r]);
    } catch (const Error& e) {
      note(r, ErrorCode::kExists, "rank " + std::to_string(r) + ": " + e.detail());
      break;
    }
    const wire::Hello& h = hello[r];
    const std::string who = RankName(r, h.host);
    if (h.rank != r)
      note(r, ErrorCode::kExists, who + " says it is rank " + std::to_string(h.rank));
    if (h.build_id != build) {
      note(r, ErrorCode::kExists,
           who + ": different k3 build (build id " + Hex(h.build_id) + ", coordinator " +
               Hex(build) + ")");
    }
    if (h.kernels != kernels) {
      note(r, ErrorCode::kExists,
           who + ": different kernels (" + h.kernels + ", coordinator " + kernels +
               "): results would differ in the last bits; set K3_FORCE_ISA to one both run");
    }
    if (h.model_fp != model_fp) {
      note(r, ErrorCode::kExists,
           who + ": different model (fingerprint " + Hex(h.model_fp) + ", coordinator " +
               Hex(model_fp) + ": config.json, shard names or sizes differ)");
    }
  }

  // 2. The plan: every owner's capacity; each rank computes the placement.
  wire::Plan plan;
  plan.owners = OwnerRanks(N, options.symmetric);
  Capacity mine = options.capacity;
  if (options.symmetric && (options.measure_ram || options.measure_disk)) {
    const auto* streaming = dynamic_cast<const stream::StreamingExpertStore*>(&model.experts());
    const uint64_t cache =
        streaming ? streaming->plan().cache_bytes
                  : stream::PlanCache(c, stream::StreamOptions{}, PeakRssBytes(), MemAvailableBytes()).cache_bytes;
    mine = MeasureCapacity(model.experts().table(), cache, options.capacity, options, 0);
  }
  for (int r : plan.owners) plan.capacity.push_back(r == 0 ? mine : hello[r].capacity);
  plan.flags = options.reduced ? uint32_t{wire::kBf16Reply} : 0u;
  std::optional<Placement> placement;
  if (problem.empty()) {
    try {
      placement = Placement::Compute(c, plan.owners, plan.capacity);
      plan.placement_fp = placement->fingerprint();
    } catch (const Error& e) {
      note(0, e.code(), e.detail());
    }
  }
  plan.refuse = problem.empty() ? 0 : 1;
  const std::vector<std::byte> plan_msg = wire::EncodePlan(plan);
  std::vector<Comm::Request> sends;
  for (int r = 1; r < N; ++r)
    sends.push_back(comm.Isend(r, wire::kPlan, plan_msg.data(), plan_msg.size()));

  // 3. Ready: each worker's placement fingerprint and share check.
  if (!problem.empty()) {
    if (DeliverAll(comm, sends, 5.0)) comm.Settle();  // every worker has the refusing plan
    throw Error(bad_code, "cluster start-up: " + problem, {}, Error::kNoOffset,
                "rank " + std::to_string(bad_rank));
  }
  for (int r = 1; r < N; ++r) {
    buf[r].assign(wire::kMaxDetail + 256, std::byte{0});
    req[r] = comm.Irecv(r, wire::kReady, buf[r].data(), buf[r].size());
  }
  wait_all("share check");
  uint64_t total_owned = 0;
  for (int r = 1; r < N && problem.empty(); ++r) {
    wire::Ready rd;
    try {
      rd = wire::DecodeReady(buf[r].data(), got[r]);
    } catch (const Error& e) {
      note(r, ErrorCode::kExists, "rank " + std::to_string(r) + ": " + e.detail());
      break;
    }
    const std::string who = RankName(r, hello[r].host);
    if (rd.placement_fp != plan.placement_fp) {
      note(r, ErrorCode::kExists,
           who + ": different placement (fingerprint " + Hex(rd.placement_fp) + ", coordinator " +
               Hex(plan.placement_fp) + "): the ranks were started with different --cluster flags");
    } else if (rd.status != 0) {
      note(r, static_cast<ErrorCode>(rd.status), who + ": " + rd.detail);
    }
    total_owned += rd.owned_bytes;
  }
  if (problem.empty() && options.symmetric) {
    const std::string missing = CheckShare(model.experts().table(), *placement, 0);
    if (!missing.empty()) note(0, ErrorCode::kNotFound, "rank 0: " + missing);
  }
  for (auto& s : sends) comm.Test(s);
  if (!problem.empty()) {
    // Log first: once the workers have their BYE and exit, mpirun may stop
    // this process before the error reaches the app's handler.
    K3_LOG_ERROR("cluster start-up: %s", problem.c_str());
    if (SendByeToAll(comm, 5.0)) comm.Settle();
    throw Error(bad_code, "cluster start-up: " + problem, {}, Error::kNoOffset,
                "rank " + std::to_string(bad_rank));
  }

  std::unique_ptr<ClusterExecutor> ex(new ClusterExecutor(comm, c, options, std::move(*placement)));
  {
    std::lock_guard<std::mutex> lock(ex->mu_);
    ClusterStats& s = ex->stats_;
    s.ranks = N;
    s.symmetric = options.symmetric;
    s.reduced = options.reduced;
    s.placement_fp = plan.placement_fp;
    const uint64_t slot = model::ExpertTable::SlotBytesFor(c);
    s.placement = ex->placement_.Describe(slot);
    for (int r : plan.owners) {
      WorkerStats w;
      w.rank = r;
      w.host = r == 0 ? comm.host() : hello[r].host;
      w.owned_experts = ex->placement_.CountOwned(r);
      w.owned_bytes = static_cast<uint64_t>(w.owned_experts) * slot;
      s.workers.push_back(w);
    }
  }
  K3_LOG_INFO("cluster: %d ranks%s, placement %s: %s", N, options.symmetric ? " (symmetric)" : "",
              Hex(plan.placement_fp).c_str(), ex->stats_.placement.c_str());
  if (options.measure_ram || options.measure_disk) {
    // Measured capacities: what `k3-run cluster-share` needs to reproduce this placement.
    std::string ram, disk;
    for (const Capacity& cap : plan.capacity) {
      char v[64];
      std::snprintf(v, sizeof v, "%s%.9g", ram.empty() ? "" : ",", static_cast<double>(cap.ram_bytes) / 1e9);
      ram += v;
      std::snprintf(v, sizeof v, "%s%.9g", disk.empty() ? "" : ",",
                    static_cast<double>(cap.disk_bytes_per_s) / 1e9);
      disk += v;
    }
    K3_LOG_INFO("cluster: placement from measured capacities (owner ranks in order): --ram-gb %s --disk-gbps %s",
                ram.c_str(), disk.c_str());
  }
  ClusterExecutor& ref = *ex;
  model.SetExpertExecutor(std::move(ex));
  return ref;
}

ClusterExecutor* InstalledCoordinator(model::Model& model) {
  return dynamic_cast<ClusterExecutor*>(model.executor());
}

// --- the executor --------------------------------------------------------------------------
ClusterExecutor::ClusterExecutor(Comm& comm, const ModelConfig& config,
                                 const ClusterOptions& options, Placement placement)
    : comm_(comm),
      config_(config),
      options_(options),
      placement_(std::move(placement)),
      cpu_(config) {
  send_buf_.resize(static_cast<size_t>(comm.size()));
  recv_buf_.resize(static_cast<size_t>(comm.size()));
}

ClusterExecutor::~ClusterExecutor() { Shutdown(); }

void ClusterExecutor::Shutdown() noexcept {
  if (shut_down_ || failed_.load()) return;
  shut_down_ = true;
  if (StopRequested()) return;  // the launcher is ending the job: nobody to wait for
  try {
    SendByeToAll(comm_, options_.deadline_s);
  } catch (const Error& e) {
    K3_LOG_WARN("cluster: shutting down: %s", e.what());
  }
}

void ClusterExecutor::Lose(int rank, const std::string& why) {
  failure_ = why;
  failed_rank_.store(rank);  // not under mu_: Run() may hold it
  failed_.store(true);
  // MPI_Finalize would wait for the lost rank; the process ends without it.
  comm_.Abandon();
  throw Error(ErrorCode::kUnavailable, why, {}, Error::kNoOffset, "rank " + std::to_string(rank));
}

void ClusterExecutor::Prefetch(int64_t layer, std::span<const int32_t> likely,
                               model::ExpertStore& store) {
  std::vector<int32_t> own;
  for (int32_t e : likely) {
    if (placement_.owner(layer, e) == 0) own.push_back(e);
  }
  if (!own.empty()) store.Prefetch(layer, own);
}

void ClusterExecutor::Run(const model::ExpertBatch& b, model::ExpertStore& store) {
  if (failed_.load()) {
    throw Error(ErrorCode::kUnavailable, failure_ + " (the cluster must be restarted)");
  }
  if (b.experts.empty()) return;
  const int N = comm_.size();
  const size_t K = b.top_k;
  const uint32_t LT = static_cast<uint32_t>(config_.routed_expert_hidden_size);
  const double t0 = NowSeconds();
  ++seq_;

  // Who computes what: each expert's owner; per worker its experts in the
  // batch's (disk) order, the tokens they need as local rows.
  std::vector<std::vector<int32_t>> mine(static_cast<size_t>(N));
  for (int32_t e : b.experts) {
    const int o = placement_.owner(b.layer, e);
    K3_CHECK(o >= 0 && o < N);
    mine[static_cast<size_t>(o)].push_back(e);
  }
  std::vector<int32_t> row_of(b.num_tokens);
  std::vector<uint32_t> rows;
  std::vector<uint32_t> npairs(static_cast<size_t>(N), 0);
  std::vector<Comm::Request> sends, recvs(static_cast<size_t>(N));
  uint64_t sent_bytes = 0;
  for (int r = 1; r < N; ++r) {
    const auto& ex = mine[static_cast<size_t>(r)];
    if (ex.empty()) continue;
    std::fill(row_of.begin(), row_of.end(), -1);
    rows.clear();
    uint32_t np = 0;
    for (int32_t e : ex) {
      for (uint32_t q : (*b.users)[static_cast<size_t>(e)]) {
        const size_t t = q / K;
        if (row_of[t] < 0) {
          row_of[t] = static_cast<int32_t>(rows.size());
          rows.push_back(static_cast<uint32_t>(t));
        }
        ++np;
      }
    }
    wire::Writer w;
    wire::WorkHeader h;
    h.seq = seq_;
    h.layer = static_cast<uint32_t>(b.layer);
    h.rows = static_cast<uint32_t>(rows.size());
    h.top_k = static_cast<uint32_t>(K);
    h.num_experts = static_cast<uint32_t>(ex.size());
    h.num_pairs = np;
    h.flags = (b.int8_acts ? uint32_t{wire::kInt8Acts} : 0u) |
              (options_.reduced ? uint32_t{wire::kBf16Reply} : 0u);
    wire::PutWorkHeader(w, h);
    for (int32_t e : ex) {
      w.Put<uint32_t>(static_cast<uint32_t>(e));
      w.Put<uint32_t>(static_cast<uint32_t>((*b.users)[static_cast<size_t>(e)].size()));
    }
    for (int32_t e : ex) {
      for (uint32_t q : (*b.users)[static_cast<size_t>(e)]) {
        w.Put<uint32_t>(static_cast<uint32_t>(row_of[q / K]) * static_cast<uint32_t>(K) +
                        static_cast<uint32_t>(q % K));
      }
    }
    for (uint32_t t : rows) w.PutBytes(b.latent + static_cast<size_t>(t) * LT, LT * sizeof(float));
    send_buf_[r] = std::move(w.bytes());
    npairs[static_cast<size_t>(r)] = np;
    recv_buf_[r].resize(wire::ReplyCapacity(np, LT));
    // The receive first, so the answer never waits for a posted buffer.
    recvs[static_cast<size_t>(r)] =
        comm_.Irecv(r, wire::kReply, recv_buf_[r].data(), recv_buf_[r].size());
    sends.push_back(comm_.Isend(r, wire::kWork, send_buf_[r].data(), send_buf_[r].size()));
    sent_bytes += send_buf_[r].size();
  }

  // Rank 0's own experts (symmetric) while the workers compute.
  double local_s = 0;
  if (!mine[0].empty()) {
    const double tl = NowSeconds();
    model::ExpertBatch local = b;
    local.experts = mine[0];
    cpu_.Run(local, store);
    local_s = NowSeconds() - tl;
  }

  // Every answer within the deadline (counted from the sends).
  const bool waited = !sends.empty();
  std::vector<size_t> got(static_cast<size_t>(N), 0);
  const Deadline deadline(options_.deadline_s, t0);
  bool stopped = false;
  PollUntil(deadline, [&] {
    if (StopRequested()) {
      stopped = true;
      return true;
    }
    bool all = true;
    for (int r = 1; r < N; ++r) {
      try {
        all = comm_.Test(recvs[static_cast<size_t>(r)], &got[static_cast<size_t>(r)]) && all;
      } catch (const Error& e) {
        Lose(r, "cluster: rank " + std::to_string(r) + " failed during layer " +
                    std::to_string(b.layer) + ": " + e.detail());
      }
    }
    for (auto& s : sends) all = comm_.Test(s) && all;
    return all;
  });
  std::string late;
  int late_rank = -1;
  for (int r = 1; r < N; ++r) {
    if (recvs[static_cast<size_t>(r)].active()) {
      late += (late.empty() ? "" : ", ") + std::to_string(r);
      if (late_rank < 0) late_rank = r;
    }
  }
  if (!late.empty()) {
    char why[320];
    if (stopped) {
      std::snprintf(why, sizeof why,
                    "cluster: stopped by SIGTERM (mpirun stops the job when a rank dies) while "
                    "rank %s had not answered layer %lld",
                    late.c_str(), static_cast<long long>(b.layer));
    } else {
      std::snprintf(why, sizeof why, "cluster: rank %s did not answer layer %lld within %.3g s",
                    late.c_str(), static_cast<long long>(b.layer), options_.deadline_s);
    }
    Lose(late_rank, why);
  }
  if (stopped) Lose(-1, "cluster: stopped by SIGTERM");

  // Decode every answer, then scatter; a worker's own error is rethrown
  // naming it (its code kept), after all answers are in (the exchange stays
  // in step).
  std::vector<float> row(LT);
  uint64_t recv_bytes = 0;
  double slowest = 0;
  std::optional<Error> worker_error;
  std::lock_guard<std::mutex> lock(mu_);
  for (int r = 1; r < N; ++r) {
    const uint32_t np = npairs[static_cast<size_t>(r)];
    if (np == 0) continue;
    wire::ReplyView v;
    try {
      v = wire::DecodeReply(recv_buf_[r].data(), got[static_cast<size_t>(r)], LT);
      if (v.h.seq != seq_)
        throw Error(ErrorCode::kCorrupt, "answer to exchange " + std::to_string(v.h.seq));
      if (v.h.status == 0 && v.h.num_pairs != np) {
        throw Error(ErrorCode::kCorrupt,
                    std::to_string(v.h.num_pairs) + " pairs for " + std::to_string(np));
      }
    } catch (const Error& e) {
      Lose(r, "cluster: rank " + std::to_string(r) + " answered layer " + std::to_string(b.layer) +
                  " with a bad message: " + e.detail());
    }
    recv_bytes += got[static_cast<size_t>(r)];
    slowest = std::max(slowest, v.h.compute_s);
    for (WorkerStats& w : stats_.workers) {
      if (w.rank != r) continue;
      ++w.exchanges;
      w.pairs += np;
      w.bytes_sent += send_buf_[r].size();
      w.bytes_received += got[static_cast<size_t>(r)];
      w.bytes_read = v.h.bytes_read;
      w.hits = v.h.hits;
      w.misses = v.h.misses;
      w.compute_s += v.h.compute_s;
    }
    if (v.h.status != 0) {
      if (!worker_error) {
        worker_error.emplace(static_cast<ErrorCode>(v.h.status),
                             "cluster: rank " + std::to_string(r) + ": " + v.detail, std::string{},
                             Error::kNoOffset, "rank " + std::to_string(r));
      }
      continue;
    }
    const bool bf16 = (v.h.flags & wire::kBf16Reply) != 0;
    const std::byte* p = v.payload;
    for (int32_t e : mine[static_cast<size_t>(r)]) {
      for (uint32_t q : (*b.users)[static_cast<size_t>(e)]) {
        if (bf16) {
          for (uint32_t i = 0; i < LT; ++i) {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            row[i] = wire::FromBf16(h);
          }
          p += 2 * LT;
        } else {
          std::memcpy(row.data(), p, LT * sizeof(float));
          p += LT * sizeof(float);
        }
        b.Emit(q, row.data());
      }
    }
  }
  if (!mine[0].empty()) {
    for (WorkerStats& w : stats_.workers) {
      if (w.rank != 0) continue;
      const model::ExpertStoreStats es = store.stats();
      ++w.exchanges;
      for (int32_t e : mine[0]) w.pairs += (*b.users)[static_cast<size_t>(e)].size();
      w.bytes_read = es.bytes_read;
      w.hits = es.hits;
      w.misses = es.misses;
      w.compute_s += local_s;
    }
  }
  ++stats_.layer_passes;
  if (waited) ++stats_.round_trips;
  stats_.exchange_s += NowSeconds() - t0;
  stats_.local_s += local_s;
  stats_.bytes_sent += sent_bytes;
  stats_.bytes_received += recv_bytes;
  PhaseStats& ph = b.num_tokens == 1 ? stats_.decode : stats_.prefill;
  ++ph.passes;
  if (waited) ++ph.round_trips;
  ph.tokens += b.num_tokens;
  ph.exchange_s += NowSeconds() - t0;
  ph.compute_s += std::max(slowest, local_s);
  ph.bytes += sent_bytes + recv_bytes;
  if (worker_error) throw *worker_error;
}

ClusterStats ClusterExecutor::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClusterStats s = stats_;
  s.failed_rank = failed_rank_.load();
  return s;
}

}  // namespace k3::cluster
