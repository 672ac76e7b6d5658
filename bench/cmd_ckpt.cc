// k3-bench ckpt: recurrent-state checkpoints (docs/checkpoints.md).
//
//   restore  Session::SaveCheckpoint / RestoreCheckpoint on MODEL after
//            --tokens ids, against memcpy of the same bytes (same run).
//   memcpy   memcpy at the real K3 state size (474.8 MB KDA + MLA rows of
//            --tokens ids): the rate the real model's restore is bound by.
//   park     WriteCheckpointFileOrThrow (checksum, atomic, fsync) and
//            ReadCheckpointFile (cold, checksum checked) of a checkpoint with
//            the real K3 layout, against a plain write+fsync and a plain cold
//            read of the same bytes in the same directory, the read both into
//            a reused buffer and into fresh memory (what a load must fill: on
//            VMs faulting in new pages costs as much as the read itself).
//   ttft     follow-up turn after a --tokens conversation on MODEL: time to
//            the first token's logits with a checkpoint (restore + prefill
//            --tail ids) and without (prefill everything), and their ratio.
// Every figure is the median of --reps runs, with min and max.
#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"
#include "k3/engine/checkpoint_cache.h"
#include "k3/engine/engine.h"
#include "k3/model/model.h"
#include "k3/model/session_state.h"
#include "k3/quant/isa.h"

namespace k3::bench {
namespace {

struct CkptArgs {
  std::string model_dir = std::string(K3_SOURCE_DIR) + "/tests/data/oracle/k3-tiny";
  int64_t tokens = 2000;
  int64_t tail = 32;
  int reps = 5;
  std::string dir = "/tmp";
  bool no_disk = false;
  bool no_ttft = false;
};

JsonWriter Begin(const char* what, const CkptArgs& a) {
  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "ckpt");
  j.Field("what", what);
  j.Field("git_sha", SourceRevision());
  j.Field("cpu", CpuModel());
  j.Field("isa", quant::IsaName(quant::ActiveIsa()));
  j.Field("threads", int64_t{omp_get_max_threads()});  // OMP_NUM_THREADS
  j.Field("reps", int64_t{a.reps});
  return j;
}

void End(JsonWriter& j) {
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

// memcpy of `bytes` from one buffer to another, touched first.
double TimeMemcpy(std::vector<char>& dst, const std::vector<char>& src) {
  const double t0 = NowSeconds();
  std::memcpy(dst.data(), src.data(), src.size());
  return NowSeconds() - t0;
}

std::vector<int32_t> Ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // Ordinary (non-special) ids: the lower part of the vocabulary.
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(std::max<int64_t>(vocab / 2, 1)));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// The real K3 state layout (spec §1): 69 KDA layers of 96 x 128 heads, conv 4;
// 24 MLA layers of 512 latent + 64 rope.
model::StateLayout RealLayout() {
  model::StateLayout l;
  l.kda_layers = 69;
  l.mla_layers = 24;
  l.kda_heads = 96;
  l.kda_head_dim = 128;
  l.kda_proj = 96 * 128;
  l.conv_kernel = 4;
  l.kv_lora = 512;
  l.qk_rope = 64;
  return l;
}

void RunRestore(const CkptArgs& a, model::Model& m, const model::RunOptions& ro) {
  model::Session s(m, ro, a.tokens);
  const std::vector<int32_t> ids = Ids(a.tokens, m.config().vocab_size, 1);
  s.Forward(ids, {});
  // The first save copies every MLA row; later ones at the same position
  // share them and copy only the KDA state (what a turn-end checkpoint costs
  // beyond the new rows).
  double t0 = NowSeconds();
  std::shared_ptr<const model::SessionCheckpoint> ck = s.SaveCheckpoint();
  const double first_save_s = NowSeconds() - t0;
  model::Session t(m, ro, 0);
  t.RestoreCheckpoint(*ck);  // grows its MLA cache once, outside the timing
  std::vector<double> save_t, restore_t, copy_t;
  for (int r = 0; r < a.reps; ++r) {
    t0 = NowSeconds();
    ck = s.SaveCheckpoint();
    save_t.push_back(NowSeconds() - t0);
    t0 = NowSeconds();
    t.RestoreCheckpoint(*ck);
    restore_t.push_back(NowSeconds() - t0);
  }
  const uint64_t bytes = ck->kda_bytes() + ck->mla_bytes();
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  for (int r = 0; r < a.reps; ++r) copy_t.push_back(TimeMemcpy(dst, src));
  const Summary sv = Summarise(save_t), rs = Summarise(restore_t), cp = Summarise(copy_t);
  JsonWriter j = Begin("restore", a);
  j.Field("model", a.model_dir);
  j.Field("tokens", a.tokens);
  j.Field("kda_bytes", ck->kda_bytes());
  j.Field("mla_bytes", ck->mla_bytes());
  j.Field("first_save_s", first_save_s);
  PutSummary(j, "save_kda_s", sv);
  PutSummary(j, "restore_s", rs);
  PutSummary(j, "memcpy_s", cp);
  j.Field("restore_gb_per_s", static_cast<double>(bytes) / rs.median / 1e9);
  j.Field("memcpy_gb_per_s", static_cast<double>(bytes) / cp.median / 1e9);
  j.Field("restore_vs_memcpy", cp.median / rs.median);
  End(j);
}

void RunRealMemcpy(const CkptArgs& a) {
  const model::StateLayout l = RealLayout();
  const uint64_t bytes =
      l.kda_bytes() + l.mla_bytes_per_token() * static_cast<uint64_t>(a.tokens);
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  std::vector<double> t;
  for (int r = 0; r < a.reps; ++r) t.push_back(TimeMemcpy(dst, src));
  const Summary cp = Summarise(t);
  JsonWriter j = Begin("memcpy", a);
  j.Field("layout", "real K3");
  j.Field("tokens", a.tokens);
  j.Field("kda_bytes", l.kda_bytes());
  j.Field("mla_bytes", l.mla_bytes_per_token() * static_cast<uint64_t>(a.tokens));
  PutSummary(j, "memcpy_s", cp);
  j.Field("memcpy_gb_per_s", static_cast<double>(bytes) / cp.median / 1e9);
  End(j);
}

void RunPark(const CkptArgs& a) {
  const model::StateLayout l = RealLayout();
  auto ck = std::make_shared<model::SessionCheckpoint>();
  ck->fingerprint = {"00000000000000000000000000000000", "bench"};
  ck->layout = l;
  ck->position = a.tokens;
  ck->ids = Ids(a.tokens, 160000, 2);
  ck->kda.assign(l.kda_layer_floats() * static_cast<uint64_t>(l.kda_layers), 0.25f);
  auto seg = std::make_shared<model::MlaSegment>();
  seg->end = a.tokens;
  seg->ids = ck->ids;
  seg->rows.assign(l.mla_row_floats() * static_cast<uint64_t>(l.mla_layers * a.tokens), 0.5f);
  ck->mla.push_back(seg);
  const std::string path = JoinPath(a.dir, "k3-bench-ckpt.k3ckpt");
  const std::string plain = JoinPath(a.dir, "k3-bench-ckpt.plain");
  std::vector<double> park_t, load_t, write_t, read_t, fresh_t;
  // The baseline writes and reads the checkpoint file's own bytes.
  engine::WriteCheckpointFileOrThrow(path, *ck);
  std::string buf = ReadFileOrThrow(path, 1ull << 40);
  auto plain_write = [&] {
    const double t0 = NowSeconds();
    UniqueFd fd = OpenOrThrow(plain, O_WRONLY | O_CREAT | O_TRUNC);
    WriteFull(fd.get(), std::as_bytes(std::span(buf.data(), buf.size())), plain);
    FsyncOrThrow(fd.get(), plain);
    write_t.push_back(NowSeconds() - t0);
  };
  auto park = [&] {
    const double t0 = NowSeconds();
    engine::WriteCheckpointFileOrThrow(path, *ck);
    park_t.push_back(NowSeconds() - t0);
  };
  for (int r = 0; r < a.reps; ++r) {
    // Alternate which goes first, so writeback of the other file hits both alike.
    if (r % 2 == 0) {
      plain_write();
      park();
    } else {
      park();
      plain_write();
    }
    // Cold reads: both files dropped from the page cache first.
    DropFromPageCache(plain);
    DropFromPageCache(path);
    double t0 = NowSeconds();
    {
      UniqueFd fd = OpenOrThrow(plain, O_RDONLY);
      PreadFull(fd.get(), std::as_writable_bytes(std::span(buf.data(), buf.size())), 0, plain);
    }
    read_t.push_back(NowSeconds() - t0);
    DropFromPageCache(plain);
    t0 = NowSeconds();
    {
      // Into memory that has never been touched (no value-initialisation).
      std::unique_ptr<std::byte[]> fresh(new std::byte[buf.size()]);
      UniqueFd fd = OpenOrThrow(plain, O_RDONLY);
      PreadFull(fd.get(), std::span(fresh.get(), buf.size()), 0, plain);
      fresh_t.push_back(NowSeconds() - t0);
    }
    t0 = NowSeconds();
    engine::CheckpointFileResult res = engine::ReadCheckpointFile(path, ck->fingerprint, l);
    load_t.push_back(NowSeconds() - t0);
    if (res.status != engine::CheckpointFileStatus::kOk) {
      throw Error(ErrorCode::kInternal, std::string("bench checkpoint refused: ") +
                                            engine::CheckpointFileStatusName(res.status) + " " +
                                            res.detail);
    }
  }
  const uint64_t file_bytes = FileSizeOrThrow(path);
  ::unlink(path.c_str());
  ::unlink(plain.c_str());
  const Summary pk = Summarise(park_t), ld = Summarise(load_t), wr = Summarise(write_t),
             rd = Summarise(read_t), fr = Summarise(fresh_t);
  JsonWriter j = Begin("park", a);
  j.Field("layout", "real K3");
  j.Field("dir", a.dir);
  j.Field("tokens", a.tokens);
  j.Field("file_bytes", file_bytes);
  PutSummary(j, "park_s", pk);
  PutSummary(j, "plain_write_fsync_s", wr);
  PutSummary(j, "load_s", ld);
  PutSummary(j, "plain_cold_read_s", rd);
  PutSummary(j, "plain_cold_read_fresh_s", fr);
  j.Field("park_gb_per_s", static_cast<double>(file_bytes) / pk.median / 1e9);
  j.Field("disk_write_gb_per_s", static_cast<double>(file_bytes) / wr.median / 1e9);
  j.Field("load_gb_per_s", static_cast<double>(file_bytes) / ld.median / 1e9);
  j.Field("disk_read_gb_per_s", static_cast<double>(file_bytes) / rd.median / 1e9);
  j.Field("park_vs_disk", wr.median / pk.median);
  j.Field("load_vs_disk", rd.median / ld.median);
  j.Field("load_vs_disk_fresh", fr.median / ld.median);
  End(j);
}

void RunTtft(const CkptArgs& a, model::Model& m, const model::RunOptions& ro) {
  const size_t V = static_cast<size_t>(m.config().vocab_size);
  const std::vector<int32_t> conv = Ids(a.tokens, m.config().vocab_size, 3);
  std::vector<int32_t> follow = conv;
  const std::vector<int32_t> tail = Ids(a.tail, m.config().vocab_size, 4);
  follow.insert(follow.end(), tail.begin(), tail.end());
  std::vector<float> la(V), lb(V);
  // The conversation so far, checkpointed at its end (also warms the expert cache).
  model::Session s(m, ro, static_cast<int64_t>(follow.size()));
  double t0 = NowSeconds();
  s.Forward(conv, {});
  const double conv_s = NowSeconds() - t0;
  auto ck = s.SaveCheckpoint();
  std::vector<double> with_t, without_t;
  bool same = true;
  for (int r = 0; r < a.reps; ++r) {
    model::ForwardOutputs oa, ob;
    oa.logits_last = la.data();
    ob.logits_last = lb.data();
    t0 = NowSeconds();
    s.Reset();
    s.Forward(follow, oa);
    without_t.push_back(NowSeconds() - t0);
    t0 = NowSeconds();
    s.RestoreCheckpoint(*ck);
    s.Forward(tail, ob);
    with_t.push_back(NowSeconds() - t0);
    same = same && std::memcmp(la.data(), lb.data(), V * 4) == 0;
  }
  const Summary w = Summarise(with_t), wo = Summarise(without_t);
  JsonWriter j = Begin("ttft", a);
  j.Field("model", a.model_dir);
  j.Field("conversation_tokens", a.tokens);
  j.Field("tail_tokens", a.tail);
  j.Field("chunk", int64_t{ro.chunk});
  j.Field("idot", ro.idot);
  j.Field("first_prefill_s", conv_s);
  j.Field("checkpoint_bytes", ck->kda_bytes() + ck->mla_bytes());
  PutSummary(j, "ttft_without_s", wo);
  PutSummary(j, "ttft_with_s", w);
  j.Field("ratio", wo.median / w.median);
  j.Field("bit_identical", same);
  End(j);
}

void RunCkptBench(const CkptArgs& a) {
  // K3_BITS, K3_IDOT, K3_CHUNK, ... read in the one place that reads them.
  engine::EngineOptions eo = engine::EngineOptions::FromEnv(a.model_dir);
  eo.load.progress = false;
  auto m = model::Model::LoadOrThrow(a.model_dir, eo.load, eo.snapshot);
  RunRestore(a, *m, eo.run);
  RunRealMemcpy(a);
  if (!a.no_disk) RunPark(a);
  if (!a.no_ttft) RunTtft(a, *m, eo.run);
}

void SetupCkptBench(CLI::App& root) {
  auto args = std::make_shared<CkptArgs>();
  CLI::App* cmd = root.add_subcommand(
      "ckpt", "Checkpoints: restore vs memcpy, park/load vs the disk, follow-up TTFT ratio");
  cmd->add_option("MODEL", args->model_dir, "model directory (default: the oracle's k3-tiny)");
  cmd->add_option("--tokens", args->tokens, "conversation length before the checkpoint (2000)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--tail", args->tail, "follow-up turn length (32)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_option("--reps", args->reps, "timed runs per figure; median, min, max (5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--dir", args->dir, "directory for the park/load files (/tmp)");
  cmd->add_flag("--no-disk", args->no_disk, "skip park/load");
  cmd->add_flag("--no-ttft", args->no_ttft, "skip the follow-up TTFT");
  cmd->callback([args] { RunCkptBench(*args); });
}

K3_REGISTER_BENCH(SetupCkptBench);

}  // namespace
}  // namespace k3::bench
