// Ranks 1..N-1: open the snapshot and a streaming store, meet the
// coordinator, check the share, then answer work messages until BYE.
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
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

struct Fault {
  enum Kind { kNone, kKill, kStop, kExit, kDisk } kind = kNone;
  uint64_t at = 0;  // the N-th work message (1-based)
};

Fault ParseFault(const std::string& spec, int my_rank) {
  Fault f;
  if (spec.empty()) return f;
  const size_t colon = spec.find(':'), at = spec.find('@');
  if (colon == std::string::npos || at == std::string::npos || at < colon) {
    throw Error(ErrorCode::kInvalidArgument,
                "--cluster-fault '" + spec + "': expected RANK:KIND@N");
  }
  const int rank = std::atoi(spec.substr(0, colon).c_str());
  const std::string kind = spec.substr(colon + 1, at - colon - 1);
  const long long n = std::atoll(spec.c_str() + at + 1);
  if (n < 1) throw Error(ErrorCode::kInvalidArgument, "--cluster-fault '" + spec + "': N >= 1");
  if (rank != my_rank) return f;
  f.at = static_cast<uint64_t>(n);
  if (kind == "kill")
    f.kind = Fault::kKill;
  else if (kind == "stop")
    f.kind = Fault::kStop;
  else if (kind == "exit")
    f.kind = Fault::kExit;
  else if (kind == "disk")
    f.kind = Fault::kDisk;
  else
    throw Error(ErrorCode::kInvalidArgument,
                "--cluster-fault kind '" + kind + "': kill, stop, exit or disk");
  return f;
}

// The disk fault: every read result from the armed moment on is -EIO, through
// the streaming store's own error path (it names the shard and offset).
class EioHook final : public stream::IoFaultHook {
 public:
  std::atomic<bool> armed{false};
  int64_t OnResult(const std::string&, uint64_t, uint64_t, bool, int64_t res) override {
    return armed.load() ? -EIO : res;
  }
};

// Blocking receive of the next message from rank 0 (any tag), polling so an
// idle worker sleeps instead of spinning.
int NextMessage(Comm& comm, std::vector<std::byte>& buf, size_t* bytes) {
  int tag = 0;
  PollUntil(Deadline(1e18), [&] { return comm.Probe(0, &tag, bytes); });
  buf.resize(std::max<size_t>(*bytes, 1));
  Comm::Request r = comm.Irecv(0, tag, buf.data(), buf.size());
  PollUntil(Deadline(1e18), [&] { return comm.Test(r, bytes); });
  return tag;
}

void SendAndWait(Comm& comm, int tag, const std::vector<std::byte>& msg) {
  Comm::Request r = comm.Isend(0, tag, msg.data(), msg.size());
  PollUntil(Deadline(1e18), [&] { return comm.Test(r); });
}

}  // namespace

void RunWorkerOrThrow(Comm& comm, const WorkerSetup& setup, const ClusterOptions& options) {
  const int me = comm.rank();
  const Fault fault = ParseFault(options.fault, me);
  const Snapshot snapshot = Snapshot::OpenOrThrow(setup.model_dir, setup.snapshot);
  const ModelConfig config =
      ModelConfig::ParseOrThrow(snapshot.config_json(), setup.model_dir + "/config.json");
  EioHook eio;
  stream::StreamOptions so = setup.stream;
  so.log_projection = setup.progress;
  if (fault.kind == Fault::kDisk) so.fault_hook = &eio;

  wire::Hello hello;
  hello.rank = me;
  hello.build_id = BuildId();
  hello.model_fp = ModelFingerprint(snapshot);
  hello.capacity = options.capacity;
  if (options.measure_ram || options.measure_disk) {
    const model::ExpertTable table(snapshot, config);
    const uint64_t cache = stream::PlanCache(config, so, PeakRssBytes(), MemAvailableBytes()).cache_bytes;
    hello.capacity = MeasureCapacity(table, cache, options.capacity, options, me);
  }
  hello.host = comm.host();
  hello.kernels = quant::IsaName(quant::ActiveIsa());
  SendAndWait(comm, wire::kHello, wire::EncodeHello(hello));

  std::vector<std::byte> buf;
  size_t n = 0;
  int tag = NextMessage(comm, buf, &n);
  if (tag == wire::kBye) return;
  if (tag != wire::kPlan)
    throw Error(ErrorCode::kCorrupt, "cluster: expected the plan, got tag " + std::to_string(tag));
  const wire::Plan plan = wire::DecodePlan(buf.data(), n);
  if (plan.refuse) {
    K3_LOG_INFO("cluster: rank %d: the coordinator refused the start (see its error)", me);
    return;
  }
  // The placement from this rank's own view of the options and the
  // capacities every rank reported; the coordinator compares fingerprints.
  wire::Ready ready;
  std::optional<Placement> placement;
  std::unique_ptr<stream::StreamingExpertStore> store;
  std::optional<Error> start_error;
  try {
    const std::vector<int> owners = OwnerRanks(comm.size(), options.symmetric);
    if (owners != plan.owners) {
      // Another view of who owns experts (--cluster-symmetric on some ranks
      // only): fingerprint 0, which the coordinator reports naming this rank
      // (status 0: its message is the placement's), sent in the one READY
      // below; throwing here would land in the catch and send a second.
      ready.placement_fp = 0;
      start_error.emplace(ErrorCode::kExists, "cluster: rank " + std::to_string(me) +
                                                  ": the owner ranks differ from the coordinator's "
                                                  "(--cluster-symmetric on some ranks only)");
    } else {
      placement = Placement::Compute(config, owners, plan.capacity);
      ready.placement_fp = placement->fingerprint();
      store = std::make_unique<stream::StreamingExpertStore>(snapshot, config, so);
      ready.owned_bytes =
          static_cast<uint64_t>(placement->CountOwned(me)) * store->table().slot_bytes();
      const std::string missing = CheckShare(store->table(), *placement, me);
      if (!missing.empty()) {
        start_error.emplace(ErrorCode::kNotFound, "cluster: rank " + std::to_string(me) +
                                                      " lacks bytes it owns: " + missing);
        ready.status = static_cast<uint32_t>(ErrorCode::kNotFound);
        ready.detail = "lacks bytes it owns: " + missing;
      }
    }
  } catch (const Error& e) {
    start_error = e;
    ready.status = static_cast<uint32_t>(e.code());
    ready.detail = e.what();
  }
  SendAndWait(comm, wire::kReady, wire::EncodeReady(ready));
  if (start_error) {
    // Wait for the coordinator's BYE so that its error, which names this
    // rank, is printed before mpirun reacts to this rank's exit.
    NextMessage(comm, buf, &n);
    comm.Settle();
    throw *start_error;
  }
  if (setup.progress) {
    K3_LOG_INFO("cluster: rank %d ready: %lld experts (%s), kernels %s", me,
                static_cast<long long>(placement->CountOwned(me)),
                FormatBytes(ready.owned_bytes).c_str(), hello.kernels.c_str());
  }

  model::CpuExpertExecutor cpu(config);
  const uint32_t E = static_cast<uint32_t>(config.num_experts);
  const uint32_t LT = static_cast<uint32_t>(config.routed_expert_hidden_size);
  std::vector<std::vector<uint32_t>> users(E);
  std::vector<float> latent, out;
  std::vector<int32_t> experts;
  uint64_t count = 0;
  for (;;) {
    tag = NextMessage(comm, buf, &n);
    if (tag == wire::kBye) return;
    if (tag != wire::kWork)
      throw Error(ErrorCode::kCorrupt, "cluster: unexpected tag " + std::to_string(tag));
    ++count;
    if (fault.kind != Fault::kNone && count == fault.at) {
      K3_LOG_WARN("cluster: rank %d: injected fault at work message %llu", me,
                  static_cast<unsigned long long>(count));
      if (fault.kind == Fault::kKill) raise(SIGKILL);
      if (fault.kind == Fault::kStop) raise(SIGSTOP);
      if (fault.kind == Fault::kExit) std::_Exit(1);
      if (fault.kind == Fault::kDisk) eio.armed.store(true);
    }
    const double t0 = NowSeconds();
    wire::ReplyHeader rh;
    std::string detail;
    wire::WorkView v;
    bool parsed = false;
    try {
      v = wire::DecodeWork(buf.data(), n, E, LT);
      parsed = true;
      rh.seq = v.h.seq;
      if (v.h.layer >= static_cast<uint32_t>(config.num_hidden_layers) ||
          !config.is_moe(v.h.layer)) {
        throw Error(ErrorCode::kCorrupt,
                    "work for layer " + std::to_string(v.h.layer) + ", not a MoE layer");
      }
      for (uint32_t e : v.expert_ids) {
        if (placement->owner(v.h.layer, e) != me) {
          throw Error(ErrorCode::kExists, "layer " + std::to_string(v.h.layer) + " expert " +
                                              std::to_string(e) +
                                              " is not this rank's (placement differs)");
        }
      }
      const uint32_t K = v.h.top_k;
      latent.resize(static_cast<size_t>(v.h.rows) * LT);
      std::memcpy(latent.data(), v.rows, latent.size() * sizeof(float));
      out.resize(static_cast<size_t>(v.h.rows) * K * LT);
      experts.assign(v.expert_ids.begin(), v.expert_ids.end());
      size_t at = 0;
      for (size_t i = 0; i < v.expert_ids.size(); ++i) {
        auto& us = users[v.expert_ids[i]];
        us.assign(v.pairs.begin() + static_cast<ptrdiff_t>(at),
                  v.pairs.begin() + static_cast<ptrdiff_t>(at + v.counts[i]));
        at += v.counts[i];
      }
      std::stable_sort(experts.begin(), experts.end(), [&](int32_t a, int32_t b) {
        return store->DiskOrder(v.h.layer, a) < store->DiskOrder(v.h.layer, b);
      });
      model::ExpertBatch batch;
      batch.layer = v.h.layer;
      batch.num_tokens = v.h.rows;
      batch.top_k = K;
      batch.latent = latent.data();
      batch.experts = experts;
      batch.users = &users;
      batch.int8_acts = (v.h.flags & wire::kInt8Acts) != 0;
      batch.out = out.data();
      batch.latent_dim = LT;  // the CPU executor Emit()s each pair into out
      cpu.Run(batch, *store);
      rh.num_pairs = v.h.num_pairs;
      rh.flags = v.h.flags & wire::kBf16Reply;
    } catch (const Error& e) {
      rh.status =
          static_cast<uint32_t>(e.code() == ErrorCode::kOk ? ErrorCode::kInternal : e.code());
      // what() without its " [code]" tail: the coordinator's error adds it.
      detail = e.what();
      const std::string tail = " [" + std::string(ErrorCodeName(e.code())) + "]";
      if (detail.ends_with(tail)) detail.resize(detail.size() - tail.size());
      K3_LOG_ERROR("cluster: rank %d: %s", me, e.what());
    }
    const model::ExpertStoreStats es = store->stats();
    rh.bytes_read = es.bytes_read;
    rh.hits = es.hits;
    rh.misses = es.misses;
    rh.compute_s = NowSeconds() - t0;
    wire::Writer w;
    if (rh.status != 0) rh.num_pairs = 0;
    wire::PutReplyHeader(w, rh, detail);
    if (rh.status == 0) {
      // Each pair's LT outputs, in the message's order.
      const bool bf16 = (rh.flags & wire::kBf16Reply) != 0;
      for (uint32_t q : v.pairs) {
        const float* src = out.data() + static_cast<size_t>(q) * LT;
        if (bf16) {
          for (uint32_t i = 0; i < LT; ++i) w.Put<uint16_t>(wire::ToBf16(src[i]));
        } else {
          w.PutBytes(src, LT * sizeof(float));
        }
      }
    }
    if (parsed) {
      for (uint32_t e : v.expert_ids) users[e].clear();
    }
    SendAndWait(comm, wire::kReply, w.bytes());
  }
}

}  // namespace k3::cluster
