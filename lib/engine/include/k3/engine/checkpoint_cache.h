// Recurrent-state checkpoint cache: Session checkpoints kept in RAM slots
// (a conversation's superseded checkpoints evicted first, then the least
// recently used), matched on the exact token-id prefix, the deepest match
// restored so that only the tail is prefilled; optionally parked on disk when
// evicted (one safetensors file each, docs/checkpoints.md).
//
// Usable without the rest of the engine: it needs a Session and nothing else.
// Ownership: the cache owns its checkpoints (MLA segments are shared with
// other checkpoints of the same conversation and with the sessions that made
// or restored them) and the files it parks. Not thread-safe: one caller at a
// time (the engine serialises requests); only stats() may be called from any
// thread at any time (it reads a copy published after every change).
// Failures: a damaged, truncated, foreign-model or foreign-options file is a
// value (CheckpointFileStatus), logged as a warning naming the file and the
// kind, counted, removed from the cache and never restored; disk errors while
// parking are warnings too (the checkpoint is simply dropped). Only API misuse
// (a session of another fingerprint than the cache's) throws k3::Error.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "k3/model/model.h"
#include "k3/model/session_state.h"

namespace k3::engine {

// ---------------------------------------------------------------------------
// Checkpoint files (docs/checkpoints.md, format version 1).

enum class CheckpointFileStatus {
  kOk,
  kNotFound,          // no such file
  kTruncated,         // shorter than its header promises
  kCorrupt,           // not a well-formed k3 checkpoint (header, names, shapes)
  kChecksumMismatch,  // well-formed, but the data differs from its recorded XXH3-128
  kForeignModel,      // made by another model (or another layer count)
  kForeignOptions,    // made with other idot / chunk / topp / ISA
  kIo,                // a read failed
};
// "ok", "not-found", "truncated", "corrupt", "checksum-mismatch",
// "foreign-model", "foreign-options", "io-error".
const char* CheckpointFileStatusName(CheckpointFileStatus status);

struct CheckpointFileResult {
  CheckpointFileStatus status = CheckpointFileStatus::kOk;
  std::string detail;  // why, for the warning
  // A well-formed checkpoint of another model, other options or another format
  // version (another process's or build's file sharing the directory), as
  // opposed to a damaged one: the start-up scan leaves these alone.
  bool foreign = false;
  std::vector<int32_t> ids;  // the checkpoint's ids (also from a header-only read)
  uint64_t file_bytes = 0;
  // The checkpoint (one MLA segment); null unless status == kOk and the data was read.
  std::shared_ptr<const model::SessionCheckpoint> checkpoint;
};

// Writes `checkpoint` to `path` atomically (tmp, fsync, rename, fsync dir).
// Throws k3::Error (kIo, kNoSpace) naming the path; nothing is left behind.
// `direct`: the data bypasses the page cache (O_DIRECT) where the filesystem
// allows it (K3_DIRECT); the bytes written are the same either way.
void WriteCheckpointFileOrThrow(const std::string& path, const model::SessionCheckpoint& checkpoint,
                                bool direct = true);

// Reads and checks a checkpoint file against what this process would make.
// Only a regular file is opened, without following a link at `path` and
// without blocking (OpenRegularFileOrThrow): a FIFO, directory or link is
// kCorrupt at once, naming what it is.
// header_only: checks the header, the fingerprint and the tensor table and
// reads the ids, but neither the state nor the checksum (the start-up scan).
// `direct`: the blocks read are dropped from the page cache behind the read.
CheckpointFileResult ReadCheckpointFile(const std::string& path,
                                        const model::StateFingerprint& fingerprint,
                                        const model::StateLayout& layout, bool header_only = false,
                                        bool direct = true);

// ---------------------------------------------------------------------------
// The cache.

struct CheckpointCacheOptions {
  // RAM slots, one checkpoint each. -1: sized from free memory
  // (DefaultSlots); 0: checkpoints off.
  int64_t ram_slots = -1;
  // Where evicted checkpoints are parked; empty: they are dropped.
  std::string disk_dir;
  // Cap on the parked files' total size, decimal GB (oldest removed first).
  double disk_gb = 50.0;
  // Parked files are written with O_DIRECT where the filesystem allows it and
  // dropped from the page cache as they are read back (EngineOptions::FromEnv
  // sets it from K3_DIRECT).
  bool direct = true;
};

struct CheckpointCacheStats {
  int64_t hits = 0;             // lookups that restored a checkpoint
  int64_t misses = 0;           // lookups that found none
  int64_t restored_tokens = 0;  // positions restored instead of prefilled
  int64_t saves = 0;            // checkpoints taken
  int64_t evictions = 0;        // RAM slots given up (parked or dropped)
  int64_t parks = 0;            // files written
  int64_t disk_loads = 0;       // files read back and restored
  int64_t refused = 0;          // files refused (damaged, foreign), see the log
  int64_t park_failures = 0;    // parks that failed (disk errors; one warning per streak)
  int64_t removed_at_start = 0;  // leftover temp files and damaged files removed by the scan
  int64_t ram_checkpoints = 0;
  int64_t disk_checkpoints = 0;
  uint64_t ram_bytes = 0;   // KDA copies + distinct MLA segments held in RAM
  uint64_t disk_bytes = 0;  // parked files
};

class CheckpointCache {
 public:
  // `fingerprint` and `layout` are those of the sessions it will serve
  // (Session::Fingerprint(), StateLayout::For(config)). With a disk_dir, the
  // directory is created if needed and scanned (docs/checkpoints.md, "What is
  // trusted"): this model's files with these options are indexed (oldest
  // first) and count against disk_gb; leftover temp files of dead writers
  // ("*.k3ckpt.tmp.<pid>") and "*.k3ckpt" files whose header is damaged are
  // removed; well-formed files of other models, options or format versions and
  // anything that is not a regular file are left alone and never opened; one
  // warning line counts each kind.
  CheckpointCache(const CheckpointCacheOptions& options, model::StateFingerprint fingerprint,
                  model::StateLayout layout);
  ~CheckpointCache();
  CheckpointCache(const CheckpointCache&) = delete;
  CheckpointCache& operator=(const CheckpointCache&) = delete;

  // Slots that fit in a quarter of `mem_available_bytes` for checkpoints of
  // `typical_tokens` tokens, clamped to [0, 64]; 2 when memory is unknown (0).
  static int64_t DefaultSlots(const model::StateLayout& layout, uint64_t mem_available_bytes,
                              int64_t typical_tokens = 4096);

  bool enabled() const { return slots_ > 0; }
  int64_t slots() const { return slots_; }
  // One line for the start-up log: slots, bytes per checkpoint, disk dir.
  std::string Describe() const;

  // Takes a checkpoint of `session` at its position (nothing when off, at
  // position 0, or when one with exactly these ids is cached: that one is
  // marked used instead). May evict (and park) the least recently used.
  void Save(model::Session& session);
  // Keeps a checkpoint made elsewhere (Session::Forward's captures inside its
  // prefill windows) under the same rules: nothing when off or at position 0; an
  // entry with the same ids is marked used instead (and gets this state if it
  // was on disk only).
  void Put(std::shared_ptr<const model::SessionCheckpoint> checkpoint);

  // The deepest cached checkpoint whose ids are a prefix of ids[0, max_len)
  // and which is deeper than min_position: restored into `session`, which then
  // holds exactly that prefix; returns its position. Returns 0 (the session
  // untouched) when there is none; refused files are skipped and removed.
  int64_t RestoreDeepest(model::Session& session, std::span<const int32_t> ids,
                         int64_t max_len, int64_t min_position = 0);

  // Thread-safe: the counters as of the end of the last Save, RestoreDeepest
  // or ParkAll (a copy under a mutex), so /metrics may read them while a
  // request runs.
  CheckpointCacheStats stats() const;

  // Writes every RAM checkpoint that is not on disk yet to disk_dir (a clean
  // shutdown: the next process with this model and these options finds them),
  // most recently used first, as far as disk_gb allows; they stay in RAM too.
  // Returns how many files were written; 0 without a disk_dir. Disk errors
  // are warnings, as when parking an evicted one.
  int64_t ParkAll();

 private:
  struct Entry;
  Entry* Find(const std::vector<int32_t>& ids);
  // Save and Put: `ck` may be null only when an entry with `ids` exists.
  void Put(std::shared_ptr<const model::SessionCheckpoint> ck, const std::vector<int32_t>* ids);
  Entry* FindDeepest(std::span<const int32_t> ids, int64_t max_len, int64_t min_position);
  void Touch(Entry& e);
  // True when another entry extends e's ids (a later point of its conversation).
  bool Superseded(const Entry& e) const;
  // The entry to give up among those `held` (in RAM, on disk): the least
  // recently used superseded one, else the least recently used; null if none.
  Entry* PickVictim(const std::function<bool(const Entry&)>& held);
  void EnforceRam();
  void EnforceDisk();
  void Park(Entry& e);
  // Warns once about a streak of failed parks that ended (or is still going at exit).
  void ReportParkStreak(const char* when);
  void Forget(Entry& e, bool unlink_file);
  std::string FilePathFor(const std::vector<int32_t>& ids) const;
  void ScanDisk();
  CheckpointCacheStats ComputeStats() const;
  void Publish();
  // Publishes on every way out of a public call (returns and throws).
  struct PublishAtExit {
    CheckpointCache* cache;
    ~PublishAtExit() { cache->Publish(); }
  };

  CheckpointCacheOptions options_;
  model::StateFingerprint fingerprint_;
  model::StateLayout layout_;
  int64_t slots_ = 0;
  uint64_t disk_cap_bytes_ = 0;
  uint64_t tick_ = 0;
  // Parking failures since the last success: the first of a streak is warned
  // with its error, the rest counted and reported when parking works again.
  int64_t park_failure_streak_ = 0;
  std::string last_park_error_;
  // Leftover files the start-up scan could not remove: on our disk, so
  // counted in disk_bytes against the cap.
  uint64_t stray_bytes_ = 0;
  std::list<Entry> entries_;
  CheckpointCacheStats stats_;
  mutable std::mutex published_mu_;
  CheckpointCacheStats published_;  // under published_mu_
};

// ---------------------------------------------------------------------------
// A prefill that resumes and can be resumed (what Engine::Generate calls).

struct PrefillResult {
  int64_t reused = 0;    // positions the session already held (prefix reuse)
  int64_t restored = 0;  // positions restored from a checkpoint
  int64_t fed = 0;       // positions prefilled by this call
  bool cancelled = false;
};

// Brings `session` to hold exactly `prompt` (at least one id): keeps it when
// the prompt extends what it fed, else restores the deepest checkpoint of
// `cache` (may be null), else resets; then feeds the rest in pieces that end
// at multiples of `every_k` positions (<= 0: one piece), checkpointing after
// each piece that ends before the prompt does, so that a cancelled or failed
// prefill resumes from there. `cancel` is polled before each piece; on true
// the call returns with cancelled set and the session at a piece boundary (a
// consistent prefix). `last_out` receives the last piece's outputs: only
// logits_last is allowed (the other outputs are per fed position).
PrefillResult PrefillWithCheckpoints(model::Session& session, CheckpointCache* cache,
                                     std::span<const int32_t> prompt, int64_t every_k,
                                     const std::function<bool()>& cancel,
                                     const model::ForwardOutputs& last_out);

}  // namespace k3::engine
