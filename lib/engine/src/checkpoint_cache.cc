// The checkpoint cache (checkpoint_cache.h): LRU over RAM slots, parking on
// disk, deepest exact-prefix match.
#include "k3/engine/checkpoint_cache.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"

namespace k3::engine {

using model::SessionCheckpoint;

struct CheckpointCache::Entry {
  std::vector<int32_t> ids;                          // the checkpoint's prefix
  std::shared_ptr<const SessionCheckpoint> ram;      // null: on disk only
  std::string path;                                  // empty: not parked
  uint64_t file_bytes = 0;
  uint64_t last_use = 0;
};

namespace {

constexpr const char* kSuffix = ".k3ckpt";

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool IsPrefix(const std::vector<int32_t>& prefix, std::span<const int32_t> ids, int64_t max_len) {
  return static_cast<int64_t>(prefix.size()) <= max_len && prefix.size() <= ids.size() &&
         std::equal(prefix.begin(), prefix.end(), ids.begin());
}

}  // namespace

CheckpointCache::CheckpointCache(const CheckpointCacheOptions& options,
                                 model::StateFingerprint fingerprint, model::StateLayout layout)
    : options_(options), fingerprint_(std::move(fingerprint)), layout_(layout) {
  slots_ = options_.ram_slots >= 0 ? options_.ram_slots
                                   : DefaultSlots(layout_, MemAvailableBytes());
  disk_cap_bytes_ = options_.disk_gb > 0 ? static_cast<uint64_t>(options_.disk_gb * 1e9) : 0;
  if (slots_ > 0 && !options_.disk_dir.empty()) ScanDisk();
  Publish();
}

CheckpointCache::~CheckpointCache() { ReportParkStreak("closing"); }

int64_t CheckpointCache::DefaultSlots(const model::StateLayout& layout, uint64_t mem_available,
                                      int64_t typical_tokens) {
  if (mem_available == 0) return 2;
  const double per = static_cast<double>(layout.kda_bytes()) +
                     static_cast<double>(layout.mla_bytes_per_token()) *
                         static_cast<double>(std::max<int64_t>(typical_tokens, 0));
  if (per <= 0) return 0;
  const double n = std::floor(0.25 * static_cast<double>(mem_available) / per);
  return static_cast<int64_t>(std::clamp(n, 0.0, 64.0));
}

std::string CheckpointCache::Describe() const {
  if (slots_ == 0) return "checkpoints off (0 slots)";
  std::string s = "checkpoints: " + std::to_string(slots_) + " RAM slots of " +
                  FormatBytes(layout_.kda_bytes()) + " KDA state + " +
                  FormatBytes(layout_.mla_bytes_per_token()) + "/token MLA (shared)";
  if (!options_.disk_dir.empty()) {
    s += "; parked in " + options_.disk_dir + " up to " + FormatBytes(disk_cap_bytes_) + " (" +
         std::to_string(stats_.disk_checkpoints) + " found)";
  }
  return s;
}

std::string CheckpointCache::FilePathFor(const std::vector<int32_t>& ids) const {
  // Model and options in the name too, so that processes of other options
  // sharing the directory never overwrite each other's files.
  const XXH128_hash_t h = XXH3_128bits(ids.data(), ids.size() * sizeof(int32_t));
  const uint64_t opt = XXH3_64bits(fingerprint_.options.data(), fingerprint_.options.size());
  char buf[128];
  std::snprintf(buf, sizeof buf, "%.16s-%08" PRIx64 "-%016" PRIx64 "%016" PRIx64 "-%zu",
                fingerprint_.model.c_str(), opt >> 32, static_cast<uint64_t>(h.high64),
                static_cast<uint64_t>(h.low64), ids.size());
  return JoinPath(options_.disk_dir, std::string(buf) + kSuffix);
}

namespace {

// "<name>.k3ckpt.tmp.<pid>": AtomicFileWriter's temp name for one of our files.
// Returns the pid, or 0 when `name` is not such a temp name.
pid_t TempFilePid(const std::string& name) {
  const std::string mark = std::string(kSuffix) + ".tmp.";
  const size_t at = name.rfind(mark);
  if (at == std::string::npos) return 0;
  const std::string digits = name.substr(at + mark.size());
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return 0;
  }
  return static_cast<pid_t>(std::stol(digits));
}

// Whether a process with this pid runs on this host (EPERM: it runs, as
// another user). Pids are per host (per pid namespace): a directory shared
// across hosts is not a supported setup (docs/checkpoints.md).
bool ProcessAlive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

void CheckpointCache::ScanDisk() {
  const std::string dir = options_.disk_dir;
  std::vector<std::string> names;
  try {
    MakeDirs(dir);
    names = ListDirectoryOrThrow(dir);
  } catch (const Error& e) {
    K3_LOG_WARN("ckpt: %s: parking off", e.what());
    options_.disk_dir.clear();
    return;
  }
  struct Found {
    std::string path;
    double mtime;
    uint64_t bytes;
  };
  std::vector<Found> found;
  // What the scan did, for one summary line (each removal is named at debug level).
  int64_t temps_removed = 0, damaged_removed = 0, foreign = 0, not_regular = 0, busy_temps = 0;
  uint64_t removed_bytes = 0;
  auto remove = [&](const std::string& path, uint64_t bytes, const char* why) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      // Still there: its bytes are on our disk, so the cap counts them.
      K3_LOG_WARN("ckpt: cannot remove %s (%s): %s; counted against the disk cap", path.c_str(),
                  why, std::strerror(errno));
      stray_bytes_ += bytes;
      return false;
    }
    K3_LOG_DEBUG("ckpt: removed %s (%s)", path.c_str(), why);
    removed_bytes += bytes;
    ++stats_.removed_at_start;
    return true;
  };
  for (const std::string& name : names) {
    const std::string path = JoinPath(dir, name);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;  // gone meanwhile
    const uint64_t bytes = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
    if (const pid_t pid = TempFilePid(name); pid > 0) {
      // A writer killed while parking (kill -9, power loss) leaves its temp
      // file; one whose process still runs (another server sharing the
      // directory) is mid-write and left alone. Ours: we have written nothing yet.
      if (pid != ::getpid() && ProcessAlive(pid)) {
        ++busy_temps;
        continue;
      }
      if (S_ISDIR(st.st_mode)) {
        ++not_regular;
        continue;
      }
      if (remove(path, bytes, "leftover temp file of a writer that is gone")) ++temps_removed;
      continue;
    }
    if (!EndsWith(name, kSuffix)) continue;
    if (!S_ISREG(st.st_mode)) {
      // Never opened: a FIFO would block, a link could point anywhere.
      ++not_regular;
      K3_LOG_DEBUG("ckpt: ignoring %s: not a regular file", path.c_str());
      continue;
    }
    found.push_back(
        {path, static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * st.st_mtim.tv_nsec, bytes});
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (const Found& f : found) {
    CheckpointFileResult r = ReadCheckpointFile(f.path, fingerprint_, layout_, true, options_.direct);
    if (r.status == CheckpointFileStatus::kNotFound) continue;  // removed meanwhile
    if (r.status != CheckpointFileStatus::kOk) {
      if (r.foreign) {
        // Another model's, options' or build's file sharing the directory: not ours to delete.
        ++foreign;
        K3_LOG_DEBUG("ckpt: leaving %s alone: %s (%s)", f.path.c_str(),
                     CheckpointFileStatusName(r.status), r.detail.c_str());
        continue;
      }
      // A damaged header (a torn copy, a truncated file, garbage under our
      // suffix): never restorable, so it goes now rather than filling the disk.
      K3_LOG_WARN("ckpt: removing %s: %s (%s)", f.path.c_str(), CheckpointFileStatusName(r.status),
                  r.detail.c_str());
      if (remove(f.path, f.bytes, CheckpointFileStatusName(r.status))) ++damaged_removed;
      continue;
    }
    Entry e;
    e.ids = std::move(r.ids);
    e.path = f.path;
    e.file_bytes = r.file_bytes;
    e.last_use = ++tick_;
    entries_.push_back(std::move(e));
    ++stats_.disk_checkpoints;
    stats_.disk_bytes += r.file_bytes;
  }
  if (temps_removed + damaged_removed + foreign + not_regular + busy_temps > 0) {
    K3_LOG_WARN(
        "ckpt: %s: removed %lld leftover temp file(s) and %lld damaged file(s) (%s); left alone "
        "%lld "
        "file(s) of other models/options/versions, %lld entr(ies) that are not regular files, %lld "
        "temp file(s) of running processes",
        dir.c_str(), static_cast<long long>(temps_removed), static_cast<long long>(damaged_removed),
        FormatBytes(removed_bytes).c_str(), static_cast<long long>(foreign),
        static_cast<long long>(not_regular), static_cast<long long>(busy_temps));
  }
  stats_.disk_bytes += stray_bytes_;
  EnforceDisk();
}

void CheckpointCache::Touch(Entry& e) { e.last_use = ++tick_; }

void CheckpointCache::Save(model::Session& session) {
  if (slots_ == 0 || session.position() == 0) return;
  // The same ids give the same state: an entry with these ids is kept and
  // marked used, and the session's state is only copied when it is missing.
  Entry* same = Find(session.history());
  Put(same != nullptr && same->ram ? nullptr : session.SaveCheckpoint(), &session.history());
}

void CheckpointCache::Put(std::shared_ptr<const model::SessionCheckpoint> checkpoint) {
  if (slots_ == 0 || checkpoint == nullptr || checkpoint->position == 0) return;
  const std::vector<int32_t>& ids = checkpoint->ids;
  Put(std::move(checkpoint), &ids);
}

CheckpointCache::Entry* CheckpointCache::Find(const std::vector<int32_t>& ids) {
  for (Entry& e : entries_) {
    if (e.ids.size() == ids.size() && e.ids == ids) return &e;
  }
  return nullptr;
}

void CheckpointCache::Put(std::shared_ptr<const model::SessionCheckpoint> ck,
                          const std::vector<int32_t>* ids) {
  const PublishAtExit publish{this};
  if (Entry* e = Find(*ids)) {
    if (!e->ram && ck) {
      e->ram = std::move(ck);
      ++stats_.ram_checkpoints;
      ++stats_.saves;
    }
    Touch(*e);
    EnforceRam();
    return;
  }
  K3_CHECK(ck != nullptr);
  if (!(ck->fingerprint == fingerprint_) || !(ck->layout == layout_)) {
    throw Error(ErrorCode::kInvalidArgument,
                "checkpoint cache of another model or options (" + fingerprint_.options +
                    ") used with a session running " + ck->fingerprint.options);
  }
  Entry e;
  e.ids = *ids;
  e.ram = std::move(ck);
  e.last_use = ++tick_;
  entries_.push_back(std::move(e));
  ++stats_.saves;
  ++stats_.ram_checkpoints;
  EnforceRam();
}

void CheckpointCache::Park(Entry& e) {
  const std::string path = FilePathFor(e.ids);
  try {
    WriteCheckpointFileOrThrow(path, *e.ram, options_.direct);
    e.path = path;
    e.file_bytes = FileSizeOrThrow(path);
    ++stats_.parks;
    ++stats_.disk_checkpoints;
    stats_.disk_bytes += e.file_bytes;
    ReportParkStreak("parking works again");
  } catch (const Error& err) {
    // A full or read-only disk fails every eviction: one warning per streak,
    // not one per request.
    ++stats_.park_failures;
    if (park_failure_streak_++ == 0) {
      K3_LOG_WARN(
          "ckpt: could not park a checkpoint of %zu tokens: %s (further failures are counted, "
          "and reported once parking works again or at exit)",
          e.ids.size(), err.what());
    }
    last_park_error_ = err.what();
  }
}

void CheckpointCache::ReportParkStreak(const char* when) {
  if (park_failure_streak_ > 1) {
    K3_LOG_WARN("ckpt: %s after %lld failed parks in a row (the last: %s)", when,
                static_cast<long long>(park_failure_streak_), last_park_error_.c_str());
  }
  park_failure_streak_ = 0;
}

bool CheckpointCache::Superseded(const Entry& e) const {
  const size_t n = e.ids.size();
  for (const Entry& x : entries_) {
    // The last id first: most entries of other conversations differ there.
    if (x.ids.size() > n && (n == 0 || x.ids[n - 1] == e.ids[n - 1]) &&
        std::equal(e.ids.begin(), e.ids.end(), x.ids.begin())) {
      return true;
    }
  }
  return false;
}

CheckpointCache::Entry* CheckpointCache::PickVictim(const std::function<bool(const Entry&)>& held) {
  // A conversation's own earlier checkpoints go before any other
  // conversation's newest one: a sub-agent's turns (and a long prompt's
  // window checkpoints) evict their own predecessors, not the main thread's
  // turn end. Least recently used within each class.
  Entry* lru[2] = {nullptr, nullptr};  // [superseded, newest of its conversation]
  for (Entry& e : entries_) {
    if (!held(e)) continue;
    Entry*& slot = lru[Superseded(e) ? 0 : 1];
    if (slot == nullptr || e.last_use < slot->last_use) slot = &e;
  }
  return lru[0] != nullptr ? lru[0] : lru[1];
}

void CheckpointCache::EnforceRam() {
  while (stats_.ram_checkpoints > slots_) {
    Entry* lru = PickVictim([](const Entry& e) { return e.ram != nullptr; });
    K3_CHECK(lru != nullptr);
    ++stats_.evictions;
    if (lru->path.empty() && !options_.disk_dir.empty() &&
        lru->ram->kda_bytes() + lru->ram->mla_bytes() <= disk_cap_bytes_) {
      Park(*lru);
    }
    lru->ram.reset();
    --stats_.ram_checkpoints;
    if (lru->path.empty()) Forget(*lru, false);
  }
  EnforceDisk();
}

void CheckpointCache::EnforceDisk() {
  while (stats_.disk_bytes > disk_cap_bytes_) {
    Entry* lru = PickVictim([](const Entry& e) { return !e.path.empty(); });
    if (lru == nullptr) break;
    if (::unlink(lru->path.c_str()) != 0 && errno != ENOENT) {
      K3_LOG_WARN("ckpt: cannot remove %s: %s", lru->path.c_str(), std::strerror(errno));
    }
    --stats_.disk_checkpoints;
    stats_.disk_bytes -= lru->file_bytes;
    lru->path.clear();
    lru->file_bytes = 0;
    if (!lru->ram) Forget(*lru, false);
  }
}

void CheckpointCache::Forget(Entry& e, bool unlink_file) {
  if (e.ram) --stats_.ram_checkpoints;
  if (!e.path.empty()) {
    if (unlink_file && ::unlink(e.path.c_str()) != 0 && errno != ENOENT) {
      K3_LOG_WARN("ckpt: cannot remove %s: %s", e.path.c_str(), std::strerror(errno));
    }
    --stats_.disk_checkpoints;
    stats_.disk_bytes -= e.file_bytes;
  }
  entries_.remove_if([&](const Entry& x) { return &x == &e; });
}

CheckpointCache::Entry* CheckpointCache::FindDeepest(std::span<const int32_t> ids, int64_t max_len,
                                                     int64_t min_position) {
  Entry* best = nullptr;
  for (Entry& e : entries_) {
    const int64_t n = static_cast<int64_t>(e.ids.size());
    if (n <= min_position || !IsPrefix(e.ids, ids, max_len)) continue;
    if (best == nullptr || n > static_cast<int64_t>(best->ids.size()) ||
        (n == static_cast<int64_t>(best->ids.size()) && e.ram && !best->ram)) {
      best = &e;
    }
  }
  return best;
}

int64_t CheckpointCache::RestoreDeepest(model::Session& session, std::span<const int32_t> ids,
                                        int64_t max_len, int64_t min_position) {
  if (slots_ == 0) return 0;
  const PublishAtExit publish{this};
  max_len = std::min<int64_t>(max_len, static_cast<int64_t>(ids.size()));
  while (Entry* e = FindDeepest(ids, max_len, min_position)) {
    if (!e->ram) {
      CheckpointFileResult r = ReadCheckpointFile(e->path, fingerprint_, layout_, false, options_.direct);
      if (r.status != CheckpointFileStatus::kOk || r.ids != e->ids) {
        const char* kind = r.status == CheckpointFileStatus::kOk
                               ? "corrupt"
                               : CheckpointFileStatusName(r.status);
        K3_LOG_WARN("ckpt: refusing %s: %s (%s); prefilling instead", e->path.c_str(), kind,
                    r.status == CheckpointFileStatus::kOk ? "ids differ from the index"
                                                          : r.detail.c_str());
        ++stats_.refused;
        Forget(*e, true);
        continue;
      }
      e->ram = std::move(r.checkpoint);
      ++stats_.ram_checkpoints;
      ++stats_.disk_loads;
    }
    const std::shared_ptr<const SessionCheckpoint> ck = e->ram;
    Touch(*e);
    session.RestoreCheckpoint(*ck);
    ++stats_.hits;
    stats_.restored_tokens += ck->position;
    EnforceRam();  // a loaded file took a slot
    return ck->position;
  }
  ++stats_.misses;
  return 0;
}

CheckpointCacheStats CheckpointCache::stats() const {
  std::lock_guard<std::mutex> lock(published_mu_);
  return published_;
}

void CheckpointCache::Publish() {
  const CheckpointCacheStats s = ComputeStats();
  std::lock_guard<std::mutex> lock(published_mu_);
  published_ = s;
}

int64_t CheckpointCache::ParkAll() {
  if (slots_ == 0 || options_.disk_dir.empty()) return 0;
  std::vector<Entry*> todo;
  for (Entry& e : entries_) {
    if (e.ram && e.path.empty()) todo.push_back(&e);
  }
  // Most recently used first: when the disk cap runs out, the older ones go.
  std::sort(todo.begin(), todo.end(),
            [](const Entry* a, const Entry* b) { return a->last_use > b->last_use; });
  int64_t written = 0;
  for (Entry* e : todo) {
    if (e->ram->kda_bytes() + e->ram->mla_bytes() > disk_cap_bytes_) continue;
    const int64_t parks = stats_.parks;
    Park(*e);
    if (stats_.parks == parks) continue;  // a disk error, warned
    ++written;
    EnforceDisk();
    if (e->path.empty()) {  // the cap removed the file just written: no room for older ones
      --written;
      break;
    }
  }
  Publish();
  return written;
}

CheckpointCacheStats CheckpointCache::ComputeStats() const {
  CheckpointCacheStats s = stats_;
  s.ram_bytes = 0;
  std::unordered_set<const model::MlaSegment*> seen;
  for (const Entry& e : entries_) {
    if (!e.ram) continue;
    s.ram_bytes += e.ram->kda_bytes() + e.ids.size() * sizeof(int32_t);
    for (const auto& seg : e.ram->mla) {
      if (seen.insert(seg.get()).second) s.ram_bytes += seg->bytes();
    }
  }
  return s;
}

PrefillResult PrefillWithCheckpoints(model::Session& session, CheckpointCache* cache,
                                     std::span<const int32_t> prompt, int64_t every_k,
                                     const std::function<bool()>& cancel,
                                     const model::ForwardOutputs& last_out) {
  K3_CHECK(last_out.logits_all == nullptr && last_out.trace == nullptr &&
           last_out.final_hidden == nullptr);
  if (prompt.empty()) throw Error(ErrorCode::kInvalidArgument, "empty prompt");
  PrefillResult r;
  const int64_t len = static_cast<int64_t>(prompt.size());
  const std::vector<int32_t>& h = session.history();
  if (static_cast<int64_t>(h.size()) < len && std::equal(h.begin(), h.end(), prompt.begin())) {
    r.reused = session.position();
  }
  if (cache != nullptr) r.restored = cache->RestoreDeepest(session, prompt, len - 1, r.reused);
  if (r.restored > 0) {
    r.reused = 0;
  } else if (r.reused == 0) {
    session.Reset();
  }
  while (session.position() < len) {
    if (cancel && cancel()) {
      r.cancelled = true;
      return r;
    }
    const int64_t pos = session.position();
    int64_t end = len;
    if (every_k > 0) end = std::min(len, (pos / every_k + 1) * every_k);
    const bool last = end == len;
    session.Forward(prompt.subspan(static_cast<size_t>(pos), static_cast<size_t>(end - pos)),
                    last ? last_out : model::ForwardOutputs{});
    r.fed += end - pos;
    if (!last && cache != nullptr) cache->Save(session);
  }
  return r;
}

}  // namespace k3::engine
