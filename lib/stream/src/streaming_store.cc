#include "k3/stream/streaming_store.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "io_engine.h"
#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"

namespace k3::stream {

using detail::Engine;
using detail::FileEntry;
using detail::kDirectAlign;
using detail::Load;
using detail::ReadReq;

namespace {

constexpr char kNoUringKey = 0;
constexpr char kUringOffKey = 0;
constexpr char kNoDirectKey = 0;
constexpr char kFloorKey = 0;

struct FreeDeleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
using BufferPtr = std::unique_ptr<std::byte, FreeDeleter>;

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

constexpr uint64_t kHugePage = uint64_t{2} << 20;

}  // namespace

CachePlan PlanCache(const ModelConfig& config, const StreamOptions& options,
                    uint64_t resident_bytes, uint64_t available_bytes) {
  CachePlan p;
  p.slot_bytes = model::ExpertTable::SlotBytesFor(config);
  p.moe_layers = std::max<int64_t>(1, config.num_moe_layers());
  p.resident_bytes = resident_bytes;
  p.available_bytes = available_bytes;
  p.from_env = options.budget_bytes >= 0;
  const double per_slot_all_layers =
      static_cast<double>(p.slot_bytes) * static_cast<double>(p.moe_layers);
  double budget;
  if (p.from_env) {
    budget = options.budget_bytes;
  } else {
    // What the machine can give: most of MemAvailable (the kernel's own
    // estimate keeps some slack) minus what inference still needs besides
    // the cache. Resident weights are already out of MemAvailable.
    budget = 0.88 * static_cast<double>(available_bytes) - options.reserve_bytes;
  }
  double slots = std::floor(std::max(0.0, budget) / per_slot_all_layers);
  if (p.from_env && available_bytes > 0) {
    // RAM guard (spec §8.2): an explicit budget is only ever lowered to what
    // the machine can hold, so a typo cannot push the box into swap/OOM.
    const double fits = std::floor(
        std::max(0.0, 0.88 * static_cast<double>(available_bytes) - options.reserve_bytes) /
        per_slot_all_layers);
    if (fits < slots) {
      slots = fits;
      p.lowered = true;
    }
  }
  p.slots_per_layer = std::clamp<int64_t>(
      slots > 1e12 ? config.num_experts : static_cast<int64_t>(slots), 1, config.num_experts);
  p.cache_bytes = static_cast<uint64_t>(p.slots_per_layer) * static_cast<uint64_t>(p.moe_layers) *
                  p.slot_bytes;
  return p;
}

// ---------------------------------------------------------------------------
struct StreamingExpertStore::Impl {
  struct CacheSlot {
    int64_t expert = -1;
    uint64_t used = 0;      // LRU stamp
    bool reserved = false;  // a hit of the current pass, not yet released
    int refs = 0;
    BufferPtr buf;
    size_t data_off = 0;  // the slot starts here (O_DIRECT alignment pad)
  };
  struct PassEntry {
    int32_t expert = -1;
    int cache_idx = -1;  // hit: index into the layer's cache
    std::unique_ptr<Load> load;  // miss
    BufferPtr buf;               // miss: until promoted or recycled
    size_t data_off = 0;
    bool submitted = false;
    bool acquired = false;
    bool released = false;
    bool ahead = false;  // a read-ahead load adopted by the pass (not in the window)
  };
  // Read-ahead of one layer (Prefetch): loads on their own pread threads, so
  // they progress while the consumer computes the trunk and polls nothing.
  struct Ahead {
    int64_t layer = -1;
    std::vector<int32_t> experts;
    std::vector<std::unique_ptr<Load>> loads;
    std::vector<BufferPtr> bufs;
    std::vector<size_t> data_off;
  };

  detail::FileTable files;
  std::unordered_map<int, uint32_t> file_of_fd;
  detail::IoCounters counters;
  std::vector<std::vector<CacheSlot>> cache;  // per layer
  std::vector<BufferPtr> free_bufs;
  size_t buf_bytes = 0;
  uint64_t read_chunk_bytes = 0;
  uint64_t clock = 0;

  // The current pass.
  bool in_pass = false;
  int64_t layer = -1;
  std::vector<PassEntry> pass;
  std::vector<int> pass_idx;     // per expert id: index into pass, -1
  std::vector<size_t> miss_idx;  // pass indices of misses, in pass order
  size_t next_submit = 0;        // into miss_idx
  int outstanding = 0;           // submitted miss buffers not yet released
  double pass_t0 = 0;
  double pass_wait = 0;
  double first_submit = 0;
  std::exception_ptr deferred;   // an error raised inside noexcept Release()
  int64_t last_layer = INT64_MAX;

  // Buffers the prefault thread has already touched (K3_PREFAULT), taken
  // before allocating a fresh one.
  std::mutex ready_mu;
  std::vector<BufferPtr> ready;
  std::atomic<bool> stop_prefault{false};
  std::atomic<bool> prefault_done{true};  // false while the thread works
  std::thread prefault;

  Ahead ahead;

  // Declared last: destroyed first, so no read is in flight when the buffers go.
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Engine> ahead_engine;  // created at the first Prefetch

  // The engine a pass entry's read went to.
  Engine& EngineOf(const PassEntry& pe) { return pe.ahead ? *ahead_engine : *engine; }

  // A buffer of at least one huge page starts on a 2 MiB boundary and is
  // offered to transparent huge pages (its whole huge pages get them, the tail
  // 4 KiB pages); its size is not rounded up, so the cache holds what the plan
  // counted. A smaller one is 4 KiB-aligned.
  BufferPtr AllocBuffer() const {
    const bool huge = buf_bytes >= kHugePage;
    void* p = nullptr;
    if (::posix_memalign(&p, huge ? static_cast<size_t>(kHugePage) : static_cast<size_t>(kDirectAlign),
                         buf_bytes) != 0) {
      throw Error(ErrorCode::kNoSpace,
                  "cannot allocate a " + std::to_string(buf_bytes) + "-byte expert buffer");
    }
    if (huge) AdviseHugePages(p, buf_bytes);
    return BufferPtr(static_cast<std::byte*>(p));
  }

  BufferPtr TakeBuffer() {
    if (!free_bufs.empty()) {
      BufferPtr b = std::move(free_bufs.back());
      free_bufs.pop_back();
      return b;
    }
    {
      std::lock_guard<std::mutex> lock(ready_mu);
      if (!ready.empty()) {
        BufferPtr b = std::move(ready.back());
        ready.pop_back();
        return b;
      }
    }
    return AllocBuffer();
  }

  // A fresh buffer's first touch happens inside the O_DIRECT submit: the
  // kernel pins its pages on the compute thread, which then zeroes them, a
  // large share of a cold prefill (docs/streaming.md). This thread touches the
  // buffers the cache plan will hold
  // (every slot plus the read window) ahead of use, at a low priority, and
  // stops early when the store goes.
  void StartPrefault(uint64_t count) {
    if (count == 0) return;
    try {
      prefault_done.store(false);
      prefault = std::thread([this, count] {
        PrefaultBuffers(count);
        prefault_done.store(true);
      });
    } catch (const std::system_error&) {
      prefault_done.store(true);
      // No thread to spare: the buffers are touched on first use, as before.
    }
  }

  void PrefaultBuffers(uint64_t count) {
#ifdef SYS_gettid
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
#endif
    const size_t page = 4096;
    for (uint64_t i = 0; i < count && !stop_prefault.load(std::memory_order_relaxed); ++i) {
      BufferPtr b;
      try {
        b = AllocBuffer();
      } catch (const Error&) {
        return;  // out of memory now: TakeBuffer reports it when a read needs one
      }
      volatile std::byte* v = b.get();
      for (size_t off = 0; off < buf_bytes; off += page) v[off] = std::byte{0};
      std::lock_guard<std::mutex> lock(ready_mu);
      ready.push_back(std::move(b));
    }
  }

  void StopPrefault() noexcept {
    stop_prefault.store(true, std::memory_order_relaxed);
    if (prefault.joinable()) prefault.join();
  }
};

StreamingExpertStore::StreamingExpertStore(const Snapshot& snapshot,
                                           const ModelConfig& config, StreamOptions options)
    : table_(snapshot, config), options_(options), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  options_.window = std::max(1, options_.window);
  plan_ = PlanCache(config, options_, PeakRssBytes(), MemAvailableBytes());
  if (plan_.from_env && options_.budget_bytes <
                            static_cast<double>(plan_.slot_bytes) * static_cast<double>(plan_.moe_layers)) {
    LogOnce(&kFloorKey, LogLevel::kWarn,
            "expert cache: K3_EXPERT_GB below one slot per MoE layer; using the floor of 1 slot");
  }
  if (plan_.lowered) {
    Log(LogLevel::kWarn,
        "expert cache: K3_EXPERT_GB exceeds what MemAvailable allows; lowered to %lld slot(s)/layer",
        static_cast<long long>(plan_.slots_per_layer));
  }
  if (options_.log_projection) {
    const double working = static_cast<double>(options_.window) *
                           static_cast<double>(plan_.slot_bytes);
    Log(LogLevel::kInfo,
        "expert cache: %lld slot(s)/layer x %lld MoE layers x %s = %s (%s); resident %s, "
        "MemAvailable %s, reserve %s, read window %s; projected peak %s; reads: pipe %s, "
        "%d in flight, %s",
        static_cast<long long>(plan_.slots_per_layer), static_cast<long long>(plan_.moe_layers),
        FormatBytes(plan_.slot_bytes).c_str(), FormatBytes(plan_.cache_bytes).c_str(),
        plan_.from_env ? "K3_EXPERT_GB" : "sized from MemAvailable",
        FormatBytes(plan_.resident_bytes).c_str(), FormatBytes(plan_.available_bytes).c_str(),
        FormatBytes(static_cast<uint64_t>(options_.reserve_bytes)).c_str(),
        FormatBytes(static_cast<uint64_t>(working)).c_str(),
        FormatBytes(plan_.resident_bytes + plan_.cache_bytes + static_cast<uint64_t>(working)).c_str(),
        options_.pipe ? "on" : "off", options_.queue_depth,
        options_.read_chunk_bytes == 0
            ? "whole experts"
            : (FormatBytes(options_.read_chunk_bytes) + " pieces").c_str());
  }

  // Files: the snapshot's buffered fds plus an O_DIRECT twin each.
  const auto& shards = snapshot.shards();
  for (size_t i = 0; i < shards.size(); ++i) {
    auto f = std::make_unique<FileEntry>();
    f->path = shards[i].path();
    f->buffered_fd = shards[i].fd();
    f->size = FileSizeOrThrow(f->buffered_fd, f->path);
    if (options_.direct) {
      f->direct_fd = TryOpen(f->path, O_RDONLY | O_DIRECT);
      if (f->direct_fd.valid()) {
        f->direct_ok = true;
      } else {
        const int err = errno;
        LogOnce(&kNoDirectKey, LogLevel::kWarn,
                "expert streaming: O_DIRECT refused on %s (%s; tmpfs/NFS/FUSE?); using buffered "
                "reads with posix_fadvise for such files",
                f->path.c_str(), std::strerror(err));
      }
    }
    m.file_of_fd[f->buffered_fd] = static_cast<uint32_t>(i);
    m.files.files.push_back(std::move(f));
  }
  m.buf_bytes = static_cast<size_t>(RoundUp(table_.slot_bytes() + 2 * kDirectAlign, kDirectAlign));
  m.read_chunk_bytes = options_.read_chunk_bytes;
  m.cache.resize(static_cast<size_t>(config.num_hidden_layers));
  m.pass_idx.assign(static_cast<size_t>(config.num_experts), -1);

  if (options_.uring) {
    int err = 0;
    m.engine = detail::MakeUringEngine(m.files, options_, m.counters, &err);
    if (!m.engine) {
      LogOnce(&kNoUringKey, LogLevel::kWarn,
              "expert streaming: io_uring unavailable (%s); reading experts with %d pread threads",
              std::strerror(err), std::clamp(options_.io_threads, 1, 16));
    }
  } else {
    LogOnce(&kUringOffKey, LogLevel::kInfo,
            "expert streaming: io_uring off (K3_URING=0); reading experts with %d pread threads",
            std::clamp(options_.io_threads, 1, 16));
  }
  if (!m.engine) m.engine = detail::MakePoolEngine(m.files, options_, m.counters);
  if (options_.prefault) {
    m.StartPrefault(static_cast<uint64_t>(plan_.slots_per_layer) * static_cast<uint64_t>(plan_.moe_layers) +
                    static_cast<uint64_t>(options_.window));
  }
}

StreamingExpertStore::~StreamingExpertStore() {
  if (!impl_) return;
  impl_->StopPrefault();
  if (impl_->ahead_engine) impl_->ahead_engine->Drain();
  if (impl_->engine) impl_->engine->Drain();
}

const char* StreamingExpertStore::backend() const { return impl_->engine->name(); }

bool StreamingExpertStore::prefault_done() const { return impl_->prefault_done.load(); }

bool StreamingExpertStore::direct() const {
  for (const auto& f : impl_->files.files) {
    if (f->direct_ok.load()) return true;
  }
  return false;
}

model::ExpertStoreStats StreamingExpertStore::CounterStats() const {
  model::ExpertStoreStats s;
  s.bytes_read = stats_.total.bytes_read;
  s.hits = stats_.total.hits;
  s.misses = stats_.total.misses;
  s.blocked_seconds = stats_.total.io_wait_s;
  return s;
}

namespace {

// Builds the read requests of one miss into `buf`; returns the data offset.
size_t PlanReads(const model::ExpertTable& table, detail::FileTable& files,
                 const std::unordered_map<int, uint32_t>& file_of_fd, int64_t layer,
                 int64_t expert, std::byte* buf, uint64_t chunk_bytes, Load* load) {
  const uint64_t slot = table.slot_bytes();
  size_t data_off = 0;
  // Pieces stay 4 KiB multiples so O_DIRECT offsets and addresses stay aligned.
  const uint64_t piece_max =
      chunk_bytes > 0 ? std::max(kDirectAlign, chunk_bytes / kDirectAlign * kDirectAlign)
                      : UINT64_MAX;
  auto add = [&](uint32_t file, bool direct, uint64_t offset, uint64_t len, std::byte* dst) {
    load->bytes += len;
    for (uint64_t done = 0; done < len;) {
      const uint64_t n = std::min(piece_max, len - done);
      ReadReq r;
      r.load = load;
      r.file = file;
      r.direct = direct;
      r.offset = offset + done;
      r.len = n;
      r.dst = dst + done;
      load->reqs.push_back(r);
      done += n;
    }
  };
  load->reqs.reserve(model::kExpertParts + 1 +
                     (chunk_bytes > 0 ? slot / piece_max + model::kExpertParts : 0));
  if (table.contiguous(layer, expert)) {
    const uint32_t fi = table.disk_key(layer, expert).file_idx;
    const FileEntry& f = *files.files[fi];
    const uint64_t off = table.offset(layer, expert, model::ExpertPart::kW1p);
    if (f.direct_ok.load(std::memory_order_relaxed)) {
      // The aligned superset: from the block holding the first byte, whole
      // blocks, but never past the last whole block of the file; the tail
      // of a file (not a block multiple) comes through the page cache.
      const uint64_t a0 = off & ~(kDirectAlign - 1);
      const uint64_t pad = off - a0;
      const uint64_t want = pad + slot;
      uint64_t dlen = RoundUp(want, kDirectAlign);
      if (a0 + dlen > f.size) dlen = f.size > a0 ? (f.size - a0) & ~(kDirectAlign - 1) : 0;
      if (dlen > 0) add(fi, true, a0, dlen, buf);
      if (dlen < want) add(fi, false, a0 + dlen, want - dlen, buf + dlen);
      data_off = static_cast<size_t>(pad);
    } else {
      add(fi, false, off, slot, buf);
    }
  } else {
    for (int p = 0; p < model::kExpertParts; ++p) {
      const auto part = static_cast<model::ExpertPart>(p);
      const uint32_t fi = file_of_fd.at(table.fd(layer, expert, part));
      add(fi, false, table.offset(layer, expert, part), table.part_bytes(part),
          buf + table.part_offset_in_slot(part));
    }
  }
  load->pending.store(static_cast<int>(load->reqs.size()));
  return data_off;
}

using Impl = StreamingExpertStore::Impl;

// Submits the misses miss_idx[next_submit, until).
void SubmitUntil(Impl& m, const model::ExpertTable& table, size_t until) {
  until = std::min(until, m.miss_idx.size());
  for (; m.next_submit < until; ++m.next_submit) {
    Impl::PassEntry& pe = m.pass[m.miss_idx[m.next_submit]];
    pe.buf = m.TakeBuffer();
    pe.load = std::make_unique<Load>();
    pe.data_off =
        PlanReads(table, m.files, m.file_of_fd, m.layer, pe.expert, pe.buf.get(),
                  m.read_chunk_bytes, pe.load.get());
    if (m.first_submit == 0) m.first_submit = NowSeconds();
    pe.submitted = true;
    ++m.outstanding;
    m.engine->Submit(pe.load.get());
  }
}

// K3_PIPE=1: keep `window` miss buffers outstanding.
void FillWindow(Impl& m, const model::ExpertTable& table, int window) {
  const size_t room = window > m.outstanding ? static_cast<size_t>(window - m.outstanding) : 0;
  SubmitUntil(m, table, m.next_submit + room);
}

// K3_PIPE=0: read the next block of misses (at least through `through`)
// completely before computing; returns the seconds waited.
double ReadBlock(Impl& m, const model::ExpertTable& table, int window, size_t through) {
  const size_t first = m.next_submit;
  SubmitUntil(m, table, std::max(through + 1, first + static_cast<size_t>(window)));
  const double t0 = NowSeconds();
  for (size_t i = first; i < m.next_submit; ++i) {
    Load* load = m.pass[m.miss_idx[i]].load.get();
    if (load->pending.load(std::memory_order_acquire) > 0) m.engine->Wait(load);
  }
  return NowSeconds() - t0;
}

// A released miss joins the layer's LRU: an empty slot, else the least
// recently used slot no one holds or still needs this pass; else its buffer
// is recycled (not cached).
void Promote(Impl& m, int64_t layer, int64_t cap, Impl::PassEntry& pe) {
  auto& slots = m.cache[static_cast<size_t>(layer)];
  Impl::CacheSlot* dst = nullptr;
  if (static_cast<int64_t>(slots.size()) < cap) {
    dst = &slots.emplace_back();
  } else {
    for (auto& s : slots) {
      if (!s.reserved && s.refs == 0 && (dst == nullptr || s.used < dst->used)) dst = &s;
    }
  }
  if (dst == nullptr) {
    m.free_bufs.push_back(std::move(pe.buf));
    return;
  }
  if (dst->buf) m.free_bufs.push_back(std::move(dst->buf));
  dst->expert = pe.expert;
  dst->used = ++m.clock;
  dst->reserved = false;
  dst->refs = 0;
  dst->buf = std::move(pe.buf);
  dst->data_off = pe.data_off;
}

}  // namespace

void StreamingExpertStore::AbandonPass() noexcept {
  Impl& m = *impl_;
  if (!m.in_pass) return;
  // Reads still in flight target pass buffers: drain before reusing them.
  m.engine->Drain();
  if (m.ahead_engine) {
    // Adopted read-ahead loads too; a read-ahead not adopted yet is dropped
    // with them (its queued requests are gone, so it must not be waited on).
    m.ahead_engine->Drain();
    for (auto& b : m.ahead.bufs) {
      if (b) m.free_bufs.push_back(std::move(b));
    }
    m.ahead = Impl::Ahead{};
  }
  for (auto& e : m.pass) {
    if (e.buf) m.free_bufs.push_back(std::move(e.buf));
    m.pass_idx[static_cast<size_t>(e.expert)] = -1;
  }
  for (auto& s : m.cache[static_cast<size_t>(m.layer)]) {
    s.reserved = false;
    s.refs = 0;
  }
  m.pass.clear();
  m.miss_idx.clear();
  m.in_pass = false;
}

void StreamingExpertStore::Bump(uint64_t StepStats::*field, uint64_t v) {
  stats_.steps.back().*field += v;
  stats_.total.*field += v;
}

void StreamingExpertStore::BumpSeconds(double StepStats::*field, double v) {
  stats_.steps.back().*field += v;
  stats_.total.*field += v;
}

// Waits for the read-ahead loads no pass adopted and recycles their buffers;
// their bytes were read all the same, so they count (ahead_unused).
void StreamingExpertStore::SettleAhead() {
  Impl& m = *impl_;
  if (m.ahead.layer < 0) return;
  uint64_t unused = 0, bytes = 0;
  for (size_t i = 0; i < m.ahead.bufs.size(); ++i) {
    if (!m.ahead.bufs[i]) continue;  // adopted
    Load* load = m.ahead.loads[i].get();
    if (load->pending.load(std::memory_order_acquire) > 0) m.ahead_engine->Wait(load);
    ++unused;
    bytes += load->bytes;
    m.free_bufs.push_back(std::move(m.ahead.bufs[i]));
  }
  m.ahead = Impl::Ahead{};
  stats_.total.ahead_unused += unused;
  stats_.total.bytes_read += bytes;
  if (!stats_.steps.empty()) {
    stats_.steps.back().ahead_unused += unused;
    stats_.steps.back().bytes_read += bytes;
  }
}

void StreamingExpertStore::Prefetch(int64_t layer, std::span<const int32_t> likely) {
  Impl& m = *impl_;
  if (!options_.ahead || m.in_pass) return;
  K3_CHECK(layer >= 0 && layer < static_cast<int64_t>(m.cache.size()));
  if (m.ahead.layer == layer) return;  // already reading ahead for it
  SettleAhead();
  // Only into the layer's free cache capacity: the reads become the pass's
  // hits and then cache slots, so the plan's memory holds them; evicting
  // cached experts to make room would trade a read now for one later.
  const auto& slots = m.cache[static_cast<size_t>(layer)];
  int64_t room = plan_.slots_per_layer - static_cast<int64_t>(slots.size());
  if (room <= 0) return;
  if (!m.ahead_engine) {
    StreamOptions o = options_;
    o.io_threads = std::clamp(options_.ahead_threads, 1, 16);
    m.ahead_engine = detail::MakePoolEngine(m.files, o, m.counters);
  }
  std::vector<char> skip(static_cast<size_t>(table_.num_experts()), 0);
  for (const auto& sl : slots) {
    if (sl.expert >= 0) skip[static_cast<size_t>(sl.expert)] = 1;
  }
  m.ahead.layer = layer;
  for (int32_t e : likely) {
    if (room == 0) break;
    if (e < 0 || e >= table_.num_experts() || skip[static_cast<size_t>(e)]) continue;
    skip[static_cast<size_t>(e)] = 1;
    if (!table_.present(layer, e)) continue;  // the pass names it, if it asks
    BufferPtr buf = m.TakeBuffer();
    auto load = std::make_unique<Load>();
    const size_t off = PlanReads(table_, m.files, m.file_of_fd, layer, e, buf.get(),
                                 m.read_chunk_bytes, load.get());
    m.ahead_engine->Submit(load.get());
    m.ahead.experts.push_back(e);
    m.ahead.loads.push_back(std::move(load));
    m.ahead.bufs.push_back(std::move(buf));
    m.ahead.data_off.push_back(off);
    --room;
  }
}

void StreamingExpertStore::BeginPass(int64_t layer, std::span<const int32_t> experts) {
  Impl& m = *impl_;
  AbandonPass();  // only does something after an exception mid-pass
  m.deferred = nullptr;
  K3_CHECK(layer >= 0 && layer < static_cast<int64_t>(m.cache.size()));
  if (layer <= m.last_layer || stats_.steps.empty()) stats_.steps.emplace_back();
  // Read-ahead of this layer: index by expert, adopted below.
  std::vector<int> ahead_of;
  if (m.ahead.layer == layer) {
    ahead_of.assign(static_cast<size_t>(table_.num_experts()), -1);
    for (size_t i = 0; i < m.ahead.experts.size(); ++i) {
      ahead_of[static_cast<size_t>(m.ahead.experts[i])] = static_cast<int>(i);
    }
  }
  uint64_t adopted = 0;
  m.last_layer = layer;
  auto& slots = m.cache[static_cast<size_t>(layer)];
  m.in_pass = true;
  m.layer = layer;
  m.pass_t0 = NowSeconds();
  m.pass_wait = 0;
  m.first_submit = 0;
  m.pass.clear();
  m.miss_idx.clear();
  m.next_submit = 0;
  m.outstanding = 0;
  m.pass.reserve(experts.size());
  for (int32_t e : experts) {
    K3_CHECK(e >= 0 && e < table_.num_experts());
    if (m.pass_idx[static_cast<size_t>(e)] >= 0) continue;  // the union is unique; be safe
    Impl::PassEntry pe;
    pe.expert = e;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].expert == e) {
        pe.cache_idx = static_cast<int>(i);
        slots[i].reserved = true;  // not evictable until this pass releases it
        break;
      }
    }
    const int ai = ahead_of.empty() ? -1 : ahead_of[static_cast<size_t>(e)];
    if (pe.cache_idx < 0 && ai >= 0) {
      pe.load = std::move(m.ahead.loads[static_cast<size_t>(ai)]);
      pe.buf = std::move(m.ahead.bufs[static_cast<size_t>(ai)]);
      pe.data_off = m.ahead.data_off[static_cast<size_t>(ai)];
      pe.submitted = true;
      pe.ahead = true;
      ++adopted;
    } else if (pe.cache_idx < 0) {
      if (!table_.present(layer, e)) {
        AbandonPass();
        // Names the missing tensor and the shard the index promises.
        std::vector<std::byte> none(table_.slot_bytes());
        table_.ReadSlotOrThrow(layer, e, none);
      }
      m.miss_idx.push_back(m.pass.size());
    }
    m.pass_idx[static_cast<size_t>(e)] = static_cast<int>(m.pass.size());
    m.pass.push_back(std::move(pe));
  }
  Bump(&StepStats::unique_experts, m.pass.size());
  Bump(&StepStats::ahead_used, adopted);
  if (m.ahead.layer == layer) SettleAhead();

  // Buffered files: ask for the whole slot now. Without it a cold 17.5 MB
  // buffered read crawls through the default readahead window; with it the
  // kernel queues the span at once (docs/streaming.md).
  {
    for (size_t i : m.miss_idx) {
      const int32_t e = m.pass[i].expert;
      if (!table_.contiguous(layer, e)) continue;
      const FileEntry& f = *m.files.files[table_.disk_key(layer, e).file_idx];
      if (f.direct_ok.load(std::memory_order_relaxed)) continue;
      ::posix_fadvise(f.buffered_fd,
                      static_cast<off_t>(table_.offset(layer, e, model::ExpertPart::kW1p)),
                      static_cast<off_t>(table_.slot_bytes()), POSIX_FADV_WILLNEED);
    }
  }
  if (m.miss_idx.empty()) return;
  if (options_.pipe) {
    FillWindow(m, table_, options_.window);
  } else {
    const double waited = ReadBlock(m, table_, options_.window, 0);
    m.pass_wait += waited;
    BumpSeconds(&StepStats::io_wait_s, waited);
  }
}

model::ExpertView StreamingExpertStore::Acquire(int64_t layer, int64_t expert) {
  Impl& m = *impl_;
  if (m.deferred) std::rethrow_exception(m.deferred);
  K3_CHECK(m.in_pass && layer == m.layer);
  K3_CHECK(expert >= 0 && expert < table_.num_experts());
  int idx = m.pass_idx[static_cast<size_t>(expert)];
  if (idx < 0) {
    // Not announced at BeginLayer: read it on demand, after the others.
    std::array<int32_t, 1> one{static_cast<int32_t>(expert)};
    if (!table_.present(layer, expert)) {
      std::vector<std::byte> none(table_.slot_bytes());
      table_.ReadSlotOrThrow(layer, expert, none);
    }
    Impl::PassEntry pe;
    pe.expert = one[0];
    for (size_t i = 0; i < m.cache[static_cast<size_t>(layer)].size(); ++i) {
      if (m.cache[static_cast<size_t>(layer)][i].expert == expert) pe.cache_idx = static_cast<int>(i);
    }
    if (pe.cache_idx < 0) m.miss_idx.push_back(m.pass.size());
    idx = static_cast<int>(m.pass.size());
    m.pass_idx[static_cast<size_t>(expert)] = idx;
    m.pass.push_back(std::move(pe));
    Bump(&StepStats::unique_experts, 1);
  }
  Impl::PassEntry& pe = m.pass[static_cast<size_t>(idx)];
  if (pe.cache_idx >= 0) {
    Impl::CacheSlot& s = m.cache[static_cast<size_t>(layer)][static_cast<size_t>(pe.cache_idx)];
    ++s.refs;
    s.reserved = true;
    s.used = ++m.clock;
    Bump(&StepStats::hits, 1);
    return table_.ViewOfSlot(s.buf.get() + s.data_off);
  }
  if (!pe.submitted) {
    const size_t pos = static_cast<size_t>(
        std::find(m.miss_idx.begin(), m.miss_idx.end(), static_cast<size_t>(idx)) -
        m.miss_idx.begin());
    if (options_.pipe) {
      SubmitUntil(m, table_, std::max(pos + 1, m.next_submit));
    } else {
      const double waited = ReadBlock(m, table_, options_.window, pos);
      m.pass_wait += waited;
      BumpSeconds(&StepStats::io_wait_s, waited);
    }
  }
  if (pe.load->pending.load(std::memory_order_acquire) > 0) {
    const double t0 = NowSeconds();
    m.EngineOf(pe).Wait(pe.load.get());
    const double waited = NowSeconds() - t0;
    m.pass_wait += waited;
    BumpSeconds(&StepStats::io_wait_s, waited);
  }
  if (pe.load->error) {
    Error e = *pe.load->error;
    e = e.WithObject(table_.TensorName(layer, expert, model::ExpertPart::kW1p));
    throw e;
  }
  pe.acquired = true;
  Bump(&StepStats::misses, 1);
  Bump(&StepStats::bytes_read, pe.load->bytes);
  return table_.ViewOfSlot(pe.buf.get() + pe.data_off);
}

void StreamingExpertStore::Release(int64_t layer, int64_t expert) noexcept {
  Impl& m = *impl_;
  if (!m.in_pass || layer != m.layer || expert < 0 || expert >= table_.num_experts()) return;
  const int idx = m.pass_idx[static_cast<size_t>(expert)];
  if (idx < 0) return;
  Impl::PassEntry& pe = m.pass[static_cast<size_t>(idx)];
  if (pe.cache_idx >= 0) {
    Impl::CacheSlot& s = m.cache[static_cast<size_t>(layer)][static_cast<size_t>(pe.cache_idx)];
    if (s.refs > 0 && --s.refs == 0) s.reserved = false;
    return;
  }
  if (!pe.acquired || pe.released) return;
  pe.released = true;
  Promote(m, layer, plan_.slots_per_layer, pe);
  if (!pe.ahead) --m.outstanding;
  try {
    if (options_.pipe) FillWindow(m, table_, options_.window);
    m.engine->Poll();
  } catch (...) {
    m.deferred = std::current_exception();
  }
}

void StreamingExpertStore::EndLayer(int64_t layer) {
  Impl& m = *impl_;
  K3_CHECK(m.in_pass && layer == m.layer);
  if (m.deferred) {
    AbandonPass();
    std::rethrow_exception(m.deferred);
  }
  // Misses announced but never used still have reads in flight: finish them
  // before their buffers are reused.
  double last_done = 0;
  for (auto& pe : m.pass) {
    if (pe.cache_idx >= 0) {
      Impl::CacheSlot& s = m.cache[static_cast<size_t>(layer)][static_cast<size_t>(pe.cache_idx)];
      s.reserved = false;
      s.refs = 0;
    } else if (pe.submitted) {
      if (pe.load->pending.load(std::memory_order_acquire) > 0) {
        m.EngineOf(pe).Wait(pe.load.get());
      }
      last_done = std::max(last_done, pe.load->done_time.load());
      if (pe.acquired && !pe.released) {
        pe.released = true;
        Promote(m, layer, plan_.slots_per_layer, pe);
      }
      if (pe.buf) m.free_bufs.push_back(std::move(pe.buf));
    }
    m.pass_idx[static_cast<size_t>(pe.expert)] = -1;
  }
  const double now = NowSeconds();
  if (m.first_submit > 0 && last_done >= m.first_submit) {
    BumpSeconds(&StepStats::io_busy_s, last_done - m.first_submit);
  }
  BumpSeconds(&StepStats::compute_s, std::max(0.0, (now - m.pass_t0) - m.pass_wait));
  stats_.read_ops = m.counters.read_ops.load();
  stats_.retries = m.counters.retries.load();
  stats_.short_reads = m.counters.short_reads.load();
  m.pass.clear();
  m.miss_idx.clear();
  m.in_pass = false;
}

}  // namespace k3::stream

