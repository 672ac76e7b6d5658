// k3-repack: HF snapshot -> k3 container (docs/repack.md). Parses flags, prints
// progress (TTY) or JSON events (--json), maps k3::Error to exit codes.
#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "k3/core/cli_registry.h"
#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "k3/core/log.h"
#include "k3/core/tool.h"
#include "k3/core/sys.h"
#include "k3/quant/isa.h"
#include "k3/quant/isa_info.h"
#include "k3/toolenv/toolenv.h"
#include "k3/repack/repack.h"
#include "cli.h"

namespace {

using k3::repack::RepackEvent;

const char* KindName(RepackEvent::Kind k) {
  switch (k) {
    case RepackEvent::Kind::kStart:
      return "start";
    case RepackEvent::Kind::kShardSkipped:
      return "shard_skipped";
    case RepackEvent::Kind::kShardStart:
      return "shard_start";
    case RepackEvent::Kind::kProgress:
      return "progress";
    case RepackEvent::Kind::kShardDone:
      return "shard_done";
    case RepackEvent::Kind::kShardFailed:
      return "shard_failed";
    case RepackEvent::Kind::kSummary:
      return "summary";
  }
  return "?";
}

double Rate(const RepackEvent& e) {
  return e.elapsed_seconds > 0 ? static_cast<double>(e.bytes_done) / e.elapsed_seconds / 1e9 : 0;
}

void PrintJson(const RepackEvent& e) {
  k3::JsonWriter w;
  w.BeginObject();
  w.Field("event", KindName(e.kind));
  if (!e.shard.empty()) w.Field("shard", e.shard);
  if (!e.detail.empty()) w.Field("detail", e.detail);
  switch (e.kind) {
    case RepackEvent::Kind::kStart:
      w.Field("shards_selected", e.shards_selected);
      w.Field("shards_todo", e.shards_todo);
      w.Field("bytes_todo", e.bytes_todo);
      w.Field("out_bytes_planned", e.out_bytes_planned);
      w.Field("free_bytes", e.free_bytes);
      w.Field("streams", e.pipeline.streams);
      w.Field("reads_in_flight", e.pipeline.reads);
      w.Field("writes_in_flight", e.pipeline.writes);
      w.Field("block_bytes", e.pipeline.block_bytes);
      w.Field("mem_budget_bytes", e.pipeline.budget_bytes);
      w.Field("buffer_bytes", e.pipeline.buffer_bytes);
      w.Field("pipeline", e.pipeline.Describe());
      break;
    case RepackEvent::Kind::kShardSkipped:
      w.Field("out_bytes", e.shard_out_bytes);
      break;
    case RepackEvent::Kind::kShardStart:
      w.Field("src_bytes", e.shard_src_bytes);
      break;
    case RepackEvent::Kind::kProgress:
      w.Field("bytes_done", e.bytes_done);
      w.Field("bytes_todo", e.bytes_todo);
      w.Field("gb_per_s", Rate(e));
      break;
    case RepackEvent::Kind::kShardDone:
      w.Field("src_bytes", e.shard_src_bytes);
      w.Field("out_bytes", e.shard_out_bytes);
      w.Field("seconds", e.shard_seconds);
      w.Field("xxh128", e.shard_xxh128);
      w.Field("source_xxh128", e.source_xxh128);
      w.Field("expert_bytes_verified", e.expert_bytes_verified);
      w.Field("streams_lent", e.streams_lent);
      w.Field("shards_done", e.shards_done);
      w.Field("shards_todo", e.shards_todo);
      break;
    case RepackEvent::Kind::kShardFailed:  // the error is the detail
      w.Field("src_bytes", e.shard_src_bytes);
      w.Field("shards_failed", e.shards_failed);
      break;
    case RepackEvent::Kind::kSummary:
      w.Field("shards_selected", e.shards_selected);
      w.Field("shards_done", e.shards_done);
      w.Field("shards_skipped", e.shards_skipped);
      w.Field("shards_failed", e.shards_failed);
      w.Field("bytes_done", e.bytes_done);
      w.Field("seconds", e.elapsed_seconds);
      w.Field("gb_per_s", Rate(e));
      w.Field("index_shards", e.index_shards);
      w.Field("index_tensors", e.index_tensors);
      w.Field("index_total_size", e.index_total_size);
      w.Field("peak_rss_bytes", e.peak_rss_bytes);
      break;
  }
  w.EndObject();
  std::printf("%s\n", w.str().c_str());
  std::fflush(stdout);
}

void PrintHuman(const RepackEvent& e, bool tty) {
  switch (e.kind) {
    case RepackEvent::Kind::kStart:
      std::fprintf(
          stderr,
          "k3-repack: %zu shard(s) selected, %zu to convert (%s to read, %s to write, %s free)\n",
          e.shards_selected, e.shards_todo, k3::FormatBytes(e.bytes_todo).c_str(),
          k3::FormatBytes(e.out_bytes_planned).c_str(), k3::FormatBytes(e.free_bytes).c_str());
      if (e.shards_todo > 0) std::fprintf(stderr, "k3-repack: pipeline: %s\n", e.pipeline.Describe().c_str());
      break;
    case RepackEvent::Kind::kShardSkipped:
      std::fprintf(stderr, "  %s: already complete, kept\n", e.shard.c_str());
      break;
    case RepackEvent::Kind::kShardStart:
      break;
    case RepackEvent::Kind::kProgress:
      if (tty) std::fputs(k3::repack_cli::ProgressLine(e).c_str(), stderr);
      break;
    case RepackEvent::Kind::kShardDone:
      std::fprintf(stderr, "%s  %s: done (%zu/%zu) %s in %.1f s%s\n", tty ? "\r\033[K" : "",
                   e.shard.c_str(), e.shards_done, e.shards_todo,
                   k3::FormatBytes(e.shard_out_bytes).c_str(), e.shard_seconds,
                   e.expert_bytes_verified ? ", experts verified against the source" : "");
      break;
    case RepackEvent::Kind::kShardFailed:
      std::fprintf(stderr, "%s  %s: NOT published: %s\n", tty ? "\r\033[K" : "", e.shard.c_str(),
                   e.detail.c_str());
      break;
    case RepackEvent::Kind::kSummary:
      if (e.shards_failed > 0)
        std::fprintf(stderr, "k3-repack: %zu shard(s) failed\n", e.shards_failed);
      std::fprintf(stderr,
                   "k3-repack: %zu converted, %zu kept; index: %zu shards, %zu tensors, total_size "
                   "%llu; %.2f GB/s; peak RSS %s\n",
                   e.shards_done, e.shards_skipped, e.index_shards, e.index_tensors,
                   static_cast<unsigned long long>(e.index_total_size), Rate(e),
                   k3::FormatBytes(e.peak_rss_bytes).c_str());
      break;
  }
}

}  // namespace

// Address space stays bounded, not only RSS (tests/repack converts under
// RLIMIT_AS = 1 GiB): the pipeline runs ~18 threads per stream (readers and
// the writer's I/O threads, docs/repack.md), and glibc would give each one
// 8 MiB of stack and reserve up to 8 x CPUs malloc arenas of 64 MiB. None of
// them needs that: the big buffers are a few long-lived blocks, the threads'
// frames are small (quantization kernels included).
void BoundAddressSpace() {
  ::mallopt(M_ARENA_MAX, 4);
  pthread_attr_t attr;
  if (::pthread_attr_init(&attr) != 0) return;
  ::pthread_attr_setstacksize(&attr, 2u << 20);
  ::pthread_setattr_default_np(&attr);
  ::pthread_attr_destroy(&attr);
}

int Main(int argc, char** argv) {
  BoundAddressSpace();
  CLI::App app{"k3-repack: convert a Kimi K3 HF snapshot into a k3 container (docs/repack.md)"};
  k3::cli::InitApp(app, "k3-repack", k3::quant::KernelsVersionDetail);
  k3::repack::RepackOptions opt;
  int mla_bits = -1, head_bits = -1;
  std::string shards, worker;
  bool json = false, quiet = false;
  int64_t block_mib = 0, mem_mb = 0;
  app.add_option("SRC", opt.src, "HF snapshot directory")->required();
  app.add_option("DST", opt.dst, "container directory (created if missing)")->required();
  app.add_option("--bits", opt.bits.bits, "bits for KDA/MoE-latent/shared/dense matrices (4 or 8)")
      ->default_val(8);
  CLI::Option* mla_opt =
      app.add_option("--mla-bits", mla_bits, "bits for MLA projections, 4 or 8 (default max(bits, 8))");
  CLI::Option* head_opt = app.add_option("--head-bits", head_bits, "bits for lm_head, 4 or 8 (default max(bits, 8))");
  app.add_option("--shards", shards, "source shard numbers to convert, e.g. 1,2,5-9");
  app.add_option("--worker", worker,
                 "I/N: convert every N-th selected shard starting at I (0-based)");
  app.add_flag("--verify-full", opt.verify_full,
               "compare every expert byte with the source (implies --recheck)");
  app.add_flag(
      "--recheck", opt.recheck,
      "re-hash the shards a rerun keeps against checksums.xxh128, re-read their sources against "
      "k3-repack.sources, and convert the ones that differ again");
  app.add_option("--threads", opt.threads, "quantization threads (default: all CPUs)");
  // The pipeline's shape: 0 = chosen at start-up within --mem-mb (printed as
  // the "pipeline:" line; docs/repack.md). Output bytes do not depend on it.
  app.add_option("--streams", opt.streams,
                 "source shards converted at once (0 = " +
                     std::to_string(k3::repack::kDefaultStreams) + ", fewer if --mem-mb is small)")
      ->default_val(0);
  app.add_option("--reads", opt.reads_in_flight,
                 "source reads in flight per stream (0 = as many as --mem-mb holds, up to " +
                     std::to_string(k3::repack::kDefaultReadsInFlight) + ")")
      ->default_val(0);
  app.add_option("--writes", opt.writes_in_flight,
                 "output writes in flight per stream (0 = as many as --mem-mb holds, up to " +
                     std::to_string(k3::repack::kDefaultWritesInFlight) + ")")
      ->default_val(0);
  CLI::Option* mem_opt = app.add_option(
      "--mem-mb", mem_mb,
      "MiB for the pipeline's buffers (default: the smaller of " +
          std::to_string(k3::repack::kDefaultMemBudgetBytes >> 20) +
          " and MemAvailable/4); automatic block size, streams, reads and writes are sized to fit, "
          "given ones must fit");
  app.add_flag("--json", json, "one JSON event per line on stdout");
  app.add_flag("-q,--quiet", quiet, "no progress or summary on stderr (errors and warnings still)");
  app.add_flag("--force", opt.force, "discard what DST holds and start over");
  CLI::Option* block_opt = app.add_option(
      "--block-mib", block_mib,
      "pipeline block size in MiB, 1 .. 256 (default: 8, less if --mem-mb cannot hold 4 reads and writes of it)");
  // Tests only, not in --help: a source that changes while it is read
  // (tests/repack; docs/repack.md).
  app.add_option("--test-read-delay-ms", opt.test_read_delay_ms,
                 "tests only: wait this long before each source read")
      ->check(CLI::Range(0, 10000))
      ->group("");
  bool no_space_check = false;
  app.add_flag("--no-space-check", no_space_check,
               "skip the free-space pre-flight (for filesystems whose statvfs is wrong)");
  // K3_LOG, the kernel variables and the crash hook, before parsing: --version
  // reports the configured kernels, and a bad value is refused before anything
  // is written.
  if (const int rc = k3::toolenv::ApplyFromEnvOrReport("k3-repack")) return rc;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return k3::cli::UsageExit(app, e);
  }

  const bool tty = ::isatty(2);
  try {
    if (quiet && k3::CurrentLogLevel() < k3::LogLevel::kWarn) k3::SetLogLevel(k3::LogLevel::kWarn);
    k3::quant::ActiveIsa();  // choose (and log) the kernels now, after --quiet
    // Given values are checked as given (--mla-bits 0 is an error, not the default).
    opt.bits.mla_bits = mla_opt->count() ? mla_bits : std::max(opt.bits.bits, 8);
    opt.bits.head_bits = head_opt->count() ? head_bits : std::max(opt.bits.bits, 8);
    if (!shards.empty()) opt.shards = k3::repack_cli::ParseShardList(shards);
    if (!worker.empty()) k3::repack_cli::ParseWorker(worker, &opt.worker_index, &opt.worker_count);
    // Given values are checked as given: 0 is not "automatic" here.
    if (block_opt->count()) {
      if (block_mib < 1 || block_mib > static_cast<int64_t>(k3::repack::kMaxBlockBytes >> 20)) {
        throw k3::Error(k3::ErrorCode::kInvalidArgument,
                        "--block-mib " + std::to_string(block_mib) + ": must be 1 .. " +
                            std::to_string(k3::repack::kMaxBlockBytes >> 20));
      }
      opt.block_bytes = static_cast<uint64_t>(block_mib) << 20;
    }
    if (mem_opt->count()) {
      constexpr int64_t kMaxMemMb = int64_t{1} << 30;
      const int64_t min_mb = static_cast<int64_t>(k3::repack::kMinMemBudgetBytes >> 20);
      if (mem_mb < min_mb || mem_mb > kMaxMemMb) {
        throw k3::Error(k3::ErrorCode::kInvalidArgument,
                        "--mem-mb " + std::to_string(mem_mb) + ": must be " + std::to_string(min_mb) +
                            " .. " + std::to_string(kMaxMemMb) + " (MiB of pipeline buffers)");
      }
      opt.mem_budget_bytes = static_cast<uint64_t>(mem_mb) << 20;
    }
    opt.space_check = !no_space_check;
    opt.direct = k3::GetEnvBool("K3_DIRECT", true);  // docs/environment.md
    k3::repack::RunRepack(opt, [&](const RepackEvent& e) {
      if (json)
        PrintJson(e);
      else if (!quiet)
        PrintHuman(e, tty);
    });
    return 0;
  } catch (const k3::Error& e) {
    if (json) {
      k3::JsonWriter w;
      w.BeginObject();
      w.Field("event", "error");
      w.Field("code", k3::ErrorCodeName(e.code()));
      w.Field("exit", k3::ExitCodeFor(e.code()));
      w.Field("path", e.path());
      if (e.offset() >= 0) w.Field("offset", e.offset());
      w.Field("object", e.object());
      w.Field("message", std::string(e.what()));
      w.EndObject();
      std::printf("%s\n", w.str().c_str());
    }
    std::fprintf(stderr, "%sk3-repack: error: %s\n", tty ? "\r\033[K" : "", e.what());
    return k3::ExitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3-repack: internal error: %s\n", e.what());
    return k3::ExitCodeFor(k3::ErrorCode::kInternal);
  }
}

int main(int argc, char** argv) { return k3::FinishStdout("k3-repack", Main(argc, argv)); }
