// The checkpoint cache on the oracle's k3-tiny model: alternating
// conversations through a 2-slot cache, parking to disk and reloading in a new
// cache (a restarted process), every kind of damaged file refused, memory
// within the slots. Every turn's logits are compared bit for bit with a fresh
// session that prefills the whole prompt (whose own agreement with the oracle
// is ckpt_session_test's and model_golden_test's business).
#include "k3/engine/checkpoint_cache.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "k3/core/file.h"
#include "k3/model/model.h"
#include "k3/model/session_state.h"
#include "k3_test_support.h"

using namespace k3;
using namespace k3::model;
using namespace k3::engine;

namespace {

const std::string kTiny = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";

std::unique_ptr<Model> LoadTiny() {
  LoadOptions lo;
  lo.bits = 4;
  lo.mla_bits = 8;
  lo.head_bits = 8;
  lo.bits_explicit = true;
  lo.progress = false;
  return Model::LoadOrThrow(kTiny, lo);
}

RunOptions Opts() {
  RunOptions ro;
  ro.idot = true;
  ro.chunk = 7;
  return ro;
}

// Deterministic ids of one conversation's turn (2048 = BOS is shared by all).
std::vector<int32_t> TurnIds(int conv, int turn, size_t n) {
  std::vector<int32_t> v;
  for (size_t i = 0; i < n; ++i) {
    v.push_back(static_cast<int32_t>((conv * 733 + turn * 97 + i * 31) % 2000));
  }
  return v;
}

// Drives one Session the way the engine does: keep it when the prompt extends
// what it fed, else restore the deepest checkpoint, else reset; prefill the
// rest; "generate" a few ids; checkpoint at the turn end.
struct Driver {
  Model& model;
  CheckpointCache& cache;
  Session session;
  Driver(Model& m, CheckpointCache& c) : model(m), cache(c), session(m, Opts(), 0) {}

  struct Turn {
    int64_t restored = 0;  // positions restored from a checkpoint
    int64_t fed = 0;       // positions prefilled
    std::vector<int32_t> history;  // after the turn
  };

  Turn Run(const std::vector<int32_t>& prompt) {
    const size_t V = static_cast<size_t>(model.config().vocab_size);
    Turn t;
    const auto& h = session.history();
    int64_t keep = 0;
    if (h.size() < prompt.size() && std::equal(h.begin(), h.end(), prompt.begin())) {
      keep = session.position();
    }
    t.restored = cache.RestoreDeepest(session, prompt, static_cast<int64_t>(prompt.size()) - 1, keep);
    if (t.restored == 0 && keep == 0) session.Reset();
    const int64_t from = session.position();
    t.fed = static_cast<int64_t>(prompt.size()) - from;
    std::vector<float> logits(V);
    ForwardOutputs out;
    out.logits_last = logits.data();
    session.Forward(std::span<const int32_t>(prompt).subspan(static_cast<size_t>(from)), out);
    // The reference: a fresh session fed the whole prompt.
    Session fresh(model, Opts(), 0);
    std::vector<float> ref(V);
    ForwardOutputs ro;
    ro.logits_last = ref.data();
    fresh.Forward(prompt, ro);
    CHECK(std::memcmp(logits.data(), ref.data(), V * 4) == 0);
    // Three greedy ids, then the turn-end checkpoint.
    for (int i = 0; i < 3; ++i) {
      const int32_t id = Sampler::Argmax(logits);
      session.Forward(std::span<const int32_t>(&id, 1), out);
    }
    cache.Save(session);
    t.history = session.history();
    return t;
  }
};

struct Conversations {
  std::map<int, std::vector<int32_t>> history;
  std::map<int, int> turns;
  // The next prompt of conversation `c`: its history plus a new user turn.
  std::vector<int32_t> Next(int c) {
    std::vector<int32_t> p = history[c];
    if (p.empty()) p.push_back(2048);
    const std::vector<int32_t> add = TurnIds(c, turns[c]++, 9);
    p.insert(p.end(), add.begin(), add.end());
    return p;
  }
  // Runs conversation c's next turn on `d`, keeps its history, checks the
  // cache stayed within its slots.
  Driver::Turn Turn(Driver& d, int c) {
    Driver::Turn t = d.Run(Next(c));
    history[c] = t.history;
    CHECK(d.cache.stats().ram_checkpoints <= d.cache.slots());
    return t;
  }
};

std::string TempDir(const char* name) { return test::MakeTempDir(name); }

}  // namespace

TEST_CASE("2 RAM slots, 3 alternating conversations: LRU, exact-prefix matches only") {
  auto model = LoadTiny();
  Session probe(*model, Opts(), 0);
  CheckpointCacheOptions co;
  co.ram_slots = 2;
  CheckpointCache cache(co, probe.Fingerprint(), StateLayout::For(model->config()));
  Driver d(*model, cache);
  Conversations cv;
  auto turn = [&](int c) { return cv.Turn(d, c); };
  // A1 B1 C1: nothing to restore (they share only BOS, and no checkpoint is
  // ever that short); C1 evicts A1's checkpoint.
  CHECK(turn(0).restored == 0);
  CHECK(turn(1).restored == 0);
  CHECK(turn(2).restored == 0);
  // A2: A1's checkpoint is gone and the session holds C: full prefill.
  Driver::Turn a2 = turn(0);
  CHECK(a2.restored == 0);
  CHECK(a2.fed == static_cast<int64_t>(cv.history[0].size()) - 3);
  // C2: C1's checkpoint is still there (B1's was evicted by A2's).
  const int64_t c1_end = static_cast<int64_t>(cv.history[2].size());
  Driver::Turn c2 = turn(2);
  CHECK(c2.restored == c1_end);
  CHECK(c2.fed == 9);
  // B2: B1's checkpoint was evicted: full prefill, never another conversation's state.
  CHECK(turn(1).restored == 0);
  const CheckpointCacheStats s = cache.stats();
  CHECK(s.hits == 1);
  CHECK(s.misses == 5);
  CHECK(s.saves == 6);
  CHECK(s.evictions == 4);
  CHECK(s.ram_checkpoints == 2);
  CHECK(s.parks == 0);
}

TEST_CASE("a sub-agent's many turns evict its own earlier checkpoints, not the main thread's") {
  auto model = LoadTiny();
  Session probe(*model, Opts(), 0);
  CheckpointCacheOptions co;
  co.ram_slots = 3;
  CheckpointCache cache(co, probe.Fingerprint(), StateLayout::For(model->config()));
  Driver d(*model, cache);
  Conversations cv;
  auto turn = [&](int c) { return cv.Turn(d, c); };
  // The main conversation's first turn, then a sub-agent's six turns (each
  // extends the last) and a one-shot side call, all through the one session.
  turn(0);
  const int64_t main_end = static_cast<int64_t>(cv.history[0].size());
  for (int i = 0; i < 6; ++i) {
    const Driver::Turn t = turn(1);
    // The sub-agent resumes its own last turn (the session or a checkpoint).
    if (i > 0) CHECK(t.fed == 9);
  }
  turn(2);
  // Plain LRU would have dropped the main thread's only checkpoint at the
  // sub-agent's third turn; here its own superseded turns went first.
  const Driver::Turn back = turn(0);
  CHECK(back.restored == main_end);
  CHECK(back.fed == 9);
  // The sub-agent's newest turn is still there too.
  const int64_t sub_end = static_cast<int64_t>(cv.history[1].size());
  const Driver::Turn sub = turn(1);
  CHECK(sub.restored == sub_end);
  CHECK(cache.stats().evictions == 7);
}

TEST_CASE("a shared system prompt is reused up to where the ids agree, and no further") {
  auto model = LoadTiny();
  Session probe(*model, Opts(), 0);
  CheckpointCacheOptions co;
  co.ram_slots = 4;
  CheckpointCache cache(co, probe.Fingerprint(), StateLayout::For(model->config()));
  std::vector<int32_t> system = TurnIds(9, 0, 20);
  Session s(*model, Opts(), 0);
  s.Forward(system, {});
  cache.Save(s);  // e.g. the engine's checkpoint every K prefill tokens
  std::vector<int32_t> a = system, b = system;
  a.insert(a.end(), {1, 2, 3, 4});
  b.insert(b.end(), {1, 2, 9, 9});
  s.Forward(std::span<const int32_t>(a).subspan(20), {});
  cache.Save(s);
  // b shares 22 ids with a: the deepest checkpoint that is a prefix is the
  // system prompt's (20), not a's (24).
  Session t(*model, Opts(), 0);
  CHECK(cache.RestoreDeepest(t, b, static_cast<int64_t>(b.size()) - 1) == 20);
  CHECK(t.history() == system);
  // max_len keeps at least one id to feed: a prompt equal to a checkpoint's
  // ids restores the shallower one.
  CHECK(cache.RestoreDeepest(t, a, static_cast<int64_t>(a.size()) - 1) == 20);
  CHECK(cache.RestoreDeepest(t, a, static_cast<int64_t>(a.size())) == 24);
  // min_position: nothing deeper than what the session already holds.
  CHECK(cache.RestoreDeepest(t, a, 24, 24) == 0);
  CHECK(t.position() == 24);
}

TEST_CASE("parked checkpoints: 3 conversations through 2 slots all hit; a new cache reloads them") {
  auto model = LoadTiny();
  Session probe(*model, Opts(), 0);
  const StateLayout lay = StateLayout::For(model->config());
  const std::string dir = TempDir("k3_ckpt_park");
  CheckpointCacheOptions co;
  co.ram_slots = 2;
  co.disk_dir = dir + "/parked";  // created by the cache
  Conversations cv;
  {
    CheckpointCache cache(co, probe.Fingerprint(), lay);
    Driver d(*model, cache);
    for (int round = 0; round < 3; ++round) {
      for (int c = 0; c < 3; ++c) {
        const int64_t prev = static_cast<int64_t>(cv.history[c].size());
        Driver::Turn t = d.Run(cv.Next(c));
        cv.history[c] = t.history;
        CHECK(t.restored == prev);  // round 0: nothing (0); later: the last turn's end
        CHECK(cache.stats().ram_checkpoints <= 2);
      }
    }
    const CheckpointCacheStats s = cache.stats();
    CHECK(s.hits == 6);
    CHECK(s.disk_loads >= 4);
    CHECK(s.parks >= 4);
    CHECK(s.refused == 0);
    CHECK(s.disk_checkpoints >= 1);
  }
  // A restarted process: the files are found and restored from, bit-identically.
  CheckpointCache again(co, probe.Fingerprint(), lay);
  CHECK(again.stats().disk_checkpoints >= 1);
  CHECK(again.Describe().find("parked in") != std::string::npos);
  Driver d2(*model, again);
  int hits = 0;
  for (int c = 0; c < 3; ++c) {
    const int64_t prev = static_cast<int64_t>(cv.history[c].size());
    Driver::Turn t = d2.Run(cv.Next(c));
    cv.history[c] = t.history;
    if (t.restored == prev) ++hits;
  }
  // Each conversation resumes from its deepest parked checkpoint (the two
  // held in RAM at exit were not parked, so those resume a turn earlier).
  CHECK(hits >= 1);
  CHECK(again.stats().hits == 3);
  CHECK(again.stats().disk_loads == 3);
  // The disk cap bounds what stays parked.
  CheckpointCacheOptions tiny_cap = co;
  tiny_cap.disk_gb = 1e-12;
  CheckpointCache capped(tiny_cap, probe.Fingerprint(), lay);
  CHECK(capped.stats().disk_checkpoints == 0);
  CHECK(capped.stats().disk_bytes == 0);
  std::filesystem::remove_all(dir);
}

namespace {

// Every way a checkpoint file can be damaged, and what the reader must say.
enum class Damage {
  kEmpty,
  kTruncatedHeader,
  kTruncatedData,
  kLastByteMissing,
  kHeaderLength,
  kHeaderByte,
  kDataByte,
  kIdsByte,
  kTrailingByte,
  kOtherVersion,
  kForeignModel,
  kForeignOptions,
  kOtherLayout,
};

struct DamageCase {
  Damage damage;
  const char* name;
  CheckpointFileStatus expect;
};

const DamageCase kDamages[] = {
    {Damage::kEmpty, "empty", CheckpointFileStatus::kTruncated},
    {Damage::kTruncatedHeader, "truncated-header", CheckpointFileStatus::kTruncated},
    {Damage::kTruncatedData, "truncated-data", CheckpointFileStatus::kTruncated},
    {Damage::kLastByteMissing, "last-byte-missing", CheckpointFileStatus::kTruncated},
    {Damage::kHeaderLength, "header-length", CheckpointFileStatus::kCorrupt},
    {Damage::kHeaderByte, "header-byte", CheckpointFileStatus::kCorrupt},
    {Damage::kDataByte, "data-byte", CheckpointFileStatus::kChecksumMismatch},
    {Damage::kIdsByte, "ids-byte", CheckpointFileStatus::kChecksumMismatch},
    {Damage::kTrailingByte, "trailing-byte", CheckpointFileStatus::kCorrupt},
    {Damage::kOtherVersion, "other-version", CheckpointFileStatus::kCorrupt},
    {Damage::kForeignModel, "foreign-model", CheckpointFileStatus::kForeignModel},
    {Damage::kForeignOptions, "foreign-options", CheckpointFileStatus::kForeignOptions},
    {Damage::kOtherLayout, "other-layout", CheckpointFileStatus::kCorrupt},
};

void Damage(const std::string& path, const DamageCase& dc, const SessionCheckpoint& ck) {
  std::string bytes = ReadFileOrThrow(path, 1ull << 30);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  const size_t data0 = 8 + n;
  switch (dc.damage) {
    case Damage::kEmpty: bytes.clear(); break;
    case Damage::kTruncatedHeader: bytes.resize(8 + n / 2); break;
    case Damage::kTruncatedData: bytes.resize(data0 + (bytes.size() - data0) / 2); break;
    case Damage::kLastByteMissing: bytes.pop_back(); break;
    case Damage::kHeaderLength: bytes[6] = 0x01; break;  // header "longer" than the file
    case Damage::kHeaderByte: {
      const size_t at = bytes.find("\"shape\"");
      REQUIRE(at != std::string::npos);
      bytes[at + 1] = 'x';  // "xhape": not a tensor description
      break;
    }
    case Damage::kDataByte: bytes[bytes.size() - 5] ^= 0x10; break;
    case Damage::kIdsByte: bytes[data0 + 4] ^= 0x01; break;
    case Damage::kTrailingByte: bytes.push_back('\0'); break;
    case Damage::kOtherVersion:
    case Damage::kForeignModel:
    case Damage::kForeignOptions:
    case Damage::kOtherLayout: {
      // Written whole by the writer, with one thing changed.
      SessionCheckpoint other = ck;
      if (dc.damage == Damage::kForeignModel) other.fingerprint.model[0] ^= 0x01;
      if (dc.damage == Damage::kForeignOptions) other.fingerprint.options += " x";
      if (dc.damage == Damage::kOtherLayout) {
        other.layout.conv_kernel += 1;
        other.kda.resize(other.layout.kda_layer_floats() * other.layout.kda_layers);
      }
      WriteCheckpointFileOrThrow(path, other);
      bytes = ReadFileOrThrow(path, 1ull << 30);
      if (dc.damage == Damage::kOtherVersion) {
        const size_t at = bytes.find("\"version\":\"1\"");
        REQUIRE(at != std::string::npos);
        bytes[at + 11] = '9';
      }
      break;
    }
  }
  WriteFileAtomic(path, bytes);
}

// The fraction of `path`'s pages in the page cache (mincore over a mapping).
double CachedFraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  const size_t len = size_t(st.st_size);
  void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(p != MAP_FAILED);
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((len + page - 1) / page);
  REQUIRE(::mincore(p, len, in.data()) == 0);
  ::munmap(p, len);
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return double(n) / double(in.size());
}

bool DirectIoWorks(const std::string& dir) {
  // tmpfs may accept the O_DIRECT flag but has nothing to bypass.
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0 || fs.f_type == TMPFS_MAGIC) return false;
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

}  // namespace

TEST_CASE("every kind of damaged checkpoint file is refused, named, removed; the prompt re-prefills") {
  auto model = LoadTiny();
  Session s(*model, Opts(), 0);
  const StateLayout lay = StateLayout::For(model->config());
  const StateFingerprint fp = s.Fingerprint();
  const std::vector<int32_t> prompt = TurnIds(3, 0, 30);
  s.Forward(std::span<const int32_t>(prompt).first(25), {});
  auto ck = s.SaveCheckpoint();
  const std::string dir = TempDir("k3_ckpt_damage");

  // The undamaged file reads back to the same state.
  const std::string good = dir + "/good.k3ckpt";
  WriteCheckpointFileOrThrow(good, *ck);
  CheckpointFileResult ok = ReadCheckpointFile(good, fp, lay);
  REQUIRE(ok.status == CheckpointFileStatus::kOk);
  CHECK(ok.checkpoint->ids == ck->ids);
  CHECK(ok.checkpoint->kda == ck->kda);
  CHECK(ok.file_bytes == FileSizeOrThrow(good));
  for (int64_t m = 0; m < lay.mla_layers; ++m) {
    for (int64_t r = 0; r < 25; ++r) {
      CHECK(std::memcmp(ok.checkpoint->MlaRow(m, r), ck->MlaRow(m, r),
                        lay.mla_row_floats() * 4) == 0);
    }
  }
  CHECK(ReadCheckpointFile(dir + "/none.k3ckpt", fp, lay).status == CheckpointFileStatus::kNotFound);

  for (const DamageCase& dc : kDamages) {
    INFO("damage " << dc.name);
    const std::string path = dir + "/" + dc.name + ".k3ckpt";
    WriteCheckpointFileOrThrow(path, *ck);
    Damage(path, dc, *ck);
    CheckpointFileResult r = ReadCheckpointFile(path, fp, lay);
    CHECK(CheckpointFileStatusName(r.status) == std::string(CheckpointFileStatusName(dc.expect)));
    CHECK(r.checkpoint == nullptr);
    CHECK(!r.detail.empty());
  }

  // Through the cache: park a checkpoint, damage the parked file, look it up.
  for (const DamageCase& dc : kDamages) {
    INFO("damage via the cache " << dc.name);
    const std::string cdir = dir + "/cache_" + dc.name;
    CheckpointCacheOptions co;
    co.ram_slots = 1;
    co.disk_dir = cdir;
    CheckpointCache cache(co, fp, lay);
    Session a(*model, Opts(), 0);
    a.Forward(std::span<const int32_t>(prompt).first(25), {});
    cache.Save(a);
    a.Forward(std::span<const int32_t>(TurnIds(4, 0, 3)), {});
    cache.Save(a);  // evicts (parks) the first
    REQUIRE(cache.stats().parks == 1);
    std::string parked;
    for (const auto& f : std::filesystem::directory_iterator(cdir)) parked = f.path();
    REQUIRE(!parked.empty());
    Damage(parked, dc, *ck);
    Session b(*model, Opts(), 0);
    b.Forward(std::span<const int32_t>(prompt).first(2), {});
    CHECK(cache.RestoreDeepest(b, prompt, 29) == 0);
    CHECK(b.position() == 2);  // untouched
    CHECK(cache.stats().refused == 1);
    CHECK(cache.stats().disk_checkpoints == 0);
    CHECK(!PathExists(parked));
    // A restarted cache never indexes a damaged file either (this time left in place).
    WriteCheckpointFileOrThrow(parked, *ck);
    Damage(parked, dc, *ck);
    CheckpointCache rescan(co, fp, lay);
    Session c(*model, Opts(), 0);
    if (rescan.stats().disk_checkpoints == 1) {
      // Header-level checks pass for data damage: refused at load instead
      // (damaged ids no longer match the prompt at all).
      CHECK(rescan.RestoreDeepest(c, prompt, 29) == 0);
      CHECK(rescan.stats().refused == (dc.damage == Damage::kIdsByte ? 0 : 1));
    } else {
      CHECK(rescan.stats().disk_checkpoints == 0);
      CHECK(rescan.RestoreDeepest(c, prompt, 29) == 0);
      // A damaged header is removed by the scan; another model's, options'
      // or format version's file is left for its owner.
      const bool foreign = dc.damage == Damage::kForeignModel ||
                           dc.damage == Damage::kForeignOptions ||
                           dc.damage == Damage::kOtherVersion;
      CHECK(PathExists(parked) == foreign);
      CHECK(rescan.stats().removed_at_start == (foreign ? 0 : 1));
    }
    CHECK(c.position() == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("RAM stays within the configured slots; shared MLA rows are counted once") {
  auto model = LoadTiny();
  Session s(*model, Opts(), 0);
  const StateLayout lay = StateLayout::For(model->config());
  CheckpointCacheOptions co;
  co.ram_slots = 3;
  CheckpointCache cache(co, s.Fingerprint(), lay);
  std::vector<int32_t> ids = TurnIds(5, 0, 60);
  // One conversation checkpointed every 10 ids: the MLA rows are shared.
  for (size_t at = 10; at <= 60; at += 10) {
    s.Forward(std::span<const int32_t>(ids).subspan(at - 10, 10), {});
    cache.Save(s);
    const CheckpointCacheStats st = cache.stats();
    CHECK(st.ram_checkpoints <= 3);
    const uint64_t n = static_cast<uint64_t>(std::min<size_t>(at / 10, 3));
    // KDA copies + ids per checkpoint, and each MLA row at most once (the
    // oldest kept checkpoint's rows are shared by the newer ones).
    uint64_t ids_bytes = 0;
    for (uint64_t k = 0; k < n; ++k) ids_bytes += (at - 10 * k) * 4;
    CHECK(st.ram_bytes == n * lay.kda_bytes() + ids_bytes + at * lay.mla_bytes_per_token());
  }
  // Sized from memory: a quarter of what is free, per checkpoint of the typical length.
  CHECK(CheckpointCache::DefaultSlots(lay, 0) == 2);
  const uint64_t per = lay.kda_bytes() + 4096 * lay.mla_bytes_per_token();
  CHECK(CheckpointCache::DefaultSlots(lay, 4 * per * 5) == 5);
  CHECK(CheckpointCache::DefaultSlots(lay, 1ull << 50) == 64);
  CHECK(CheckpointCache::DefaultSlots(lay, per) == 0);
  // 0 slots: off.
  CheckpointCacheOptions off;
  off.ram_slots = 0;
  CheckpointCache none(off, s.Fingerprint(), lay);
  CHECK(!none.enabled());
  none.Save(s);
  CHECK(none.stats().saves == 0);
  Session t(*model, Opts(), 0);
  CHECK(none.RestoreDeepest(t, ids, 59) == 0);
}

TEST_CASE("a prefill cancelled midway resumes from its K-token checkpoint, bit-identically") {
  auto model = LoadTiny();
  const size_t V = static_cast<size_t>(model->config().vocab_size);
  Session s(*model, Opts(), 0);
  CheckpointCacheOptions co;
  co.ram_slots = 4;
  CheckpointCache cache(co, s.Fingerprint(), StateLayout::For(model->config()));
  std::vector<int32_t> prompt = TurnIds(6, 0, 45);
  // Cancel before the third piece: pieces end at 16 and 32 (K = 16).
  int polls = 0;
  std::vector<float> logits(V);
  ForwardOutputs out;
  out.logits_last = logits.data();
  PrefillResult a = PrefillWithCheckpoints(s, &cache, prompt, 16, [&] { return ++polls == 3; }, out);
  CHECK(a.cancelled);
  CHECK(a.fed == 32);
  CHECK(s.position() == 32);
  CHECK(cache.stats().saves == 2);
  // The same request again, in another session (the first was handed to
  // another conversation meanwhile): resumes at 32 and feeds 13.
  Session other(*model, Opts(), 0);
  other.Forward(std::span<const int32_t>(TurnIds(7, 0, 5)), {});
  PrefillResult b = PrefillWithCheckpoints(other, &cache, prompt, 16, {}, out);
  CHECK(!b.cancelled);
  CHECK(b.restored == 32);
  CHECK(b.fed == 13);
  Session fresh(*model, Opts(), 0);
  std::vector<float> ref(V);
  ForwardOutputs ro;
  ro.logits_last = ref.data();
  fresh.Forward(prompt, ro);
  CHECK(std::memcmp(logits.data(), ref.data(), V * 4) == 0);
  // The session that was cancelled keeps its prefix: prefix reuse, no restore.
  PrefillResult c = PrefillWithCheckpoints(s, &cache, prompt, 16, {}, out);
  CHECK(c.reused == 32);
  CHECK(c.restored == 0);
  CHECK(c.fed == 13);
  CHECK(std::memcmp(logits.data(), ref.data(), V * 4) == 0);
  // Without a cache it is a plain prefill.
  Session plain(*model, Opts(), 0);
  PrefillResult d = PrefillWithCheckpoints(plain, nullptr, prompt, 16, {}, out);
  CHECK(d.fed == 45);
  CHECK(std::memcmp(logits.data(), ref.data(), V * 4) == 0);
}

TEST_CASE("checkpoint files: direct and buffered I/O write the same bytes and read the same state") {
  // A layout of ~21 MB: several 8 MiB direct blocks, none ending where a tensor
  // does, and a data section that starts at an unaligned file offset.
  StateLayout lay;
  lay.kda_layers = 2;
  lay.mla_layers = 3;
  lay.kda_heads = 4;
  lay.kda_head_dim = 64;
  lay.kda_proj = 768;
  lay.conv_kernel = 4;
  lay.kv_lora = 512;
  lay.qk_rope = 64;
  const int64_t tokens = 3001;
  auto ck = std::make_shared<SessionCheckpoint>();
  ck->fingerprint = {"0123456789abcdef0123456789abcdef", "direct-io test"};
  ck->layout = lay;
  ck->position = tokens;
  for (int64_t i = 0; i < tokens; ++i) ck->ids.push_back(int32_t((i * 7919) % 160000));
  ck->kda.resize(lay.kda_layer_floats() * uint64_t(lay.kda_layers));
  for (size_t i = 0; i < ck->kda.size(); ++i) ck->kda[i] = float(i % 1013) * 0.25f - 17.0f;
  auto seg = std::make_shared<MlaSegment>();
  seg->end = tokens;
  seg->ids = ck->ids;
  seg->rows.resize(lay.mla_row_floats() * uint64_t(lay.mla_layers * tokens));
  for (size_t i = 0; i < seg->rows.size(); ++i) seg->rows[i] = float(i % 4099) / 64.0f;
  ck->mla.push_back(seg);

  const std::string dir = TempDir("k3_ckpt_direct");
  std::map<std::string, std::string> bytes;
  std::vector<std::string> dirs = {dir};
  // tmpfs refuses O_DIRECT: the writer and the reader fall back to buffered I/O.
  if (std::filesystem::is_directory("/dev/shm")) dirs.push_back(test::MakeTempDir("k3_ckpt_direct", "/dev/shm"));
  for (const std::string& d : dirs) {
    for (bool direct : {true, false}) {
      const std::string path = d + (direct ? "/direct.k3ckpt" : "/buffered.k3ckpt");
      WriteCheckpointFileOrThrow(path, *ck, direct);
      if (d == dir) {
        // Where the filesystem takes O_DIRECT, a direct write leaves (almost)
        // nothing in the page cache; a buffered one leaves it all there.
        const double cached = CachedFraction(path);
        if (DirectIoWorks(dir)) {
          CHECK_MESSAGE((direct ? cached < 0.05 : cached > 0.95), "page-cached fraction " << cached);
        } else {
          MESSAGE("O_DIRECT is refused under " << dir << ": only the fallback is tested here");
        }
      }
      bytes[path] = ReadFileOrThrow(path, 1u << 30);
      for (bool read_direct : {true, false}) {
        INFO(path << " read " << (read_direct ? "direct" : "buffered"));
        if (d == dir) DropFromPageCache(path);
        CheckpointFileResult r = ReadCheckpointFile(path, ck->fingerprint, lay, false, read_direct);
        REQUIRE(r.status == CheckpointFileStatus::kOk);
        // A direct load drops what it read from the page cache; a buffered one keeps it.
        if (d == dir && DirectIoWorks(dir)) {
          const double cached = CachedFraction(path);
          CHECK_MESSAGE((read_direct ? cached < 0.05 : cached > 0.95), "page-cached fraction after the load " << cached);
        }
        CHECK(r.checkpoint->ids == ck->ids);
        CHECK(r.checkpoint->kda == ck->kda);
        REQUIRE(r.checkpoint->mla.size() == 1);
        CHECK(r.checkpoint->mla[0]->rows == seg->rows);
      }
    }
  }
  const std::string ref = bytes.begin()->second;
  CHECK(ref.size() > (size_t{16} << 20));
  for (const auto& [path, b] : bytes) {
    INFO(path);
    CHECK(b == ref);
  }
  // A flipped byte deep in the MLA rows (in a later direct block) is caught.
  {
    const std::string path = dir + "/direct.k3ckpt";
    std::string b = bytes[path];
    b[b.size() - 5000] = char(b[b.size() - 5000] ^ 0x10);
    WriteFileAtomic(path, b);
    CHECK(ReadCheckpointFile(path, ck->fingerprint, lay).status == CheckpointFileStatus::kChecksumMismatch);
  }
}

namespace {

// A cache of one RAM slot whose first checkpoint (25 ids of `prompt`) has been
// parked: returns the parked file's path.
std::string ParkOne(Model& model, CheckpointCache& cache, const std::vector<int32_t>& prompt,
                    const std::string& dir) {
  Session a(model, Opts(), 0);
  a.Forward(std::span<const int32_t>(prompt).first(25), {});
  cache.Save(a);
  a.Forward(std::span<const int32_t>(TurnIds(4, 0, 3)), {});
  cache.Save(a);  // evicts (parks) the first
  std::string parked;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().string().ends_with(".k3ckpt")) parked = f.path();
  }
  return parked;
}

}  // namespace

TEST_CASE(
    "hostile checkpoint directories: a FIFO, directory or link in place of a parked file; "
    "leftovers") {
  auto model = LoadTiny();
  Session probe(*model, Opts(), 0);
  const StateLayout lay = StateLayout::For(model->config());
  const StateFingerprint fp = probe.Fingerprint();
  const std::vector<int32_t> prompt = TurnIds(3, 0, 30);
  const std::string dir = TempDir("k3_ckpt_hostile");
  const std::string outside = dir + "/outside";
  MakeDirs(outside);

  // Each replacement of the parked file is refused at once (opening a FIFO
  // would block the request forever), never followed, and prefilled instead.
  for (const char* kind : {"fifo", "directory", "link"}) {
    INFO(kind);
    const std::string cdir = dir + "/cache_" + kind;
    CheckpointCacheOptions co;
    co.ram_slots = 1;
    co.disk_dir = cdir;
    CheckpointCache cache(co, fp, lay);
    const std::string parked = ParkOne(*model, cache, prompt, cdir);
    REQUIRE(!parked.empty());
    const std::string real = outside + "/" + kind + ".k3ckpt";
    REQUIRE(::rename(parked.c_str(), real.c_str()) == 0);  // a valid file, elsewhere
    if (std::string(kind) == "fifo") REQUIRE(::mkfifo(parked.c_str(), 0644) == 0);
    if (std::string(kind) == "directory") REQUIRE(::mkdir(parked.c_str(), 0755) == 0);
    if (std::string(kind) == "link") REQUIRE(::symlink(real.c_str(), parked.c_str()) == 0);
    const CheckpointFileResult r = ReadCheckpointFile(parked, fp, lay);
    CHECK(r.status == CheckpointFileStatus::kCorrupt);
    CHECK(r.detail.find("not a regular file") != std::string::npos);
    Session b(*model, Opts(), 0);
    CHECK(cache.RestoreDeepest(b, prompt, 29) == 0);
    CHECK(b.position() == 0);
    CHECK(cache.stats().refused == 1);
    CHECK(cache.stats().disk_checkpoints == 0);
    CHECK(PathExists(real));  // the link's target is never removed
    // A restarted cache never opens such an entry (a FIFO would block the scan).
    if (std::string(kind) != "directory") {
      if (std::string(kind) == "fifo") REQUIRE(::mkfifo(parked.c_str(), 0644) == 0);
      if (std::string(kind) == "link") REQUIRE(::symlink(real.c_str(), parked.c_str()) == 0);
    }
    CheckpointCache rescan(co, fp, lay);
    CHECK(rescan.stats().disk_checkpoints == 0);
    CHECK(rescan.stats().removed_at_start == 0);
    struct stat st {};
    CHECK(::lstat(parked.c_str(), &st) == 0);  // left alone
  }

  // Leftovers of killed writers are removed at start (a dead pid's, and one
  // with our own pid: this process has written nothing yet); a live process's
  // temp file is its business; a file that cannot be removed counts against the cap.
  {
    const std::string cdir = dir + "/leftovers";
    CheckpointCacheOptions co;
    co.ram_slots = 1;
    co.disk_dir = cdir;
    std::string parked;
    {
      CheckpointCache cache(co, fp, lay);
      parked = ParkOne(*model, cache, prompt, cdir);
    }
    REQUIRE(!parked.empty());
    const uint64_t parked_bytes = FileSizeOrThrow(parked);
    const std::string partial = std::string(2000, 'x');
    pid_t dead = ::fork();  // a pid that is certainly free once reaped
    if (dead == 0) ::_exit(0);
    REQUIRE(dead > 0);
    int st = 0;
    REQUIRE(::waitpid(dead, &st, 0) == dead);
    const std::string stale = parked + ".tmp." + std::to_string(dead);
    const std::string mine = cdir + "/x.k3ckpt.tmp." + std::to_string(::getpid());
    const std::string live = cdir + "/y.k3ckpt.tmp.1";  // pid 1 runs
    for (const std::string& p : {stale, mine, live}) WriteFileAtomic(p, partial);
    WriteFileAtomic(cdir + "/garbage.k3ckpt", "not a checkpoint at all");
    CheckpointCache again(co, fp, lay);
    CHECK(again.stats().removed_at_start == 3);
    CHECK_FALSE(PathExists(stale));
    CHECK_FALSE(PathExists(mine));
    CHECK_FALSE(PathExists(cdir + "/garbage.k3ckpt"));
    CHECK(PathExists(live));
    CHECK(again.stats().disk_checkpoints == 1);
    CHECK(again.stats().disk_bytes == parked_bytes);
    Session b(*model, Opts(), 0);
    CHECK(again.RestoreDeepest(b, prompt, 29) == 25);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("parking that keeps failing: one warning per streak, every failure counted") {
  auto model = LoadTiny();
  Session probe(*model, Opts(), 0);
  const StateLayout lay = StateLayout::For(model->config());
  const std::string dir = TempDir("k3_ckpt_failing");
  CheckpointCacheOptions co;
  co.ram_slots = 1;
  co.disk_dir = dir + "/parked";
  CheckpointCache cache(co, probe.Fingerprint(), lay);
  // The directory disappears under the cache: every park fails (ENOENT).
  std::filesystem::remove_all(co.disk_dir);
  // The warnings go to stderr: captured in a file for the count.
  const std::string err_path = dir + "/stderr";
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE((saved >= 0 && err_fd >= 0 && ::dup2(err_fd, 2) == 2));
  ::close(err_fd);
  auto count = [&](const std::string& what) {
    std::fflush(stderr);
    const std::string text = ReadFileOrThrow(err_path, 1 << 20);
    int n = 0;
    for (size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++n;
    return n;
  };
  Session s(*model, Opts(), 0);
  for (int i = 0; i < 5; ++i) {
    s.Forward(std::span<const int32_t>(TurnIds(5, i, 4)), {});
    cache.Save(s);  // from the second on, each evicts (parks) the previous one
  }
  CHECK(cache.stats().park_failures == 4);
  CHECK(cache.stats().parks == 0);
  CHECK(count("could not park") == 1);
  // Parking works again: the streak is reported once, with its count.
  MakeDirs(co.disk_dir);
  s.Forward(std::span<const int32_t>(TurnIds(5, 9, 4)), {});
  cache.Save(s);
  CHECK(cache.stats().parks == 1);
  const int reported = count("parking works again after 4 failed parks");
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  CHECK(reported == 1);
  std::filesystem::remove_all(dir);
}
