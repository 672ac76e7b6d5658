// k3-verify: proves a k3 container intact and reports every problem it finds
// (docs/repack.md). Exit 0 only when all is well.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <map>
#include <set>
#include <cstdio>
#include <string>

#include "k3/core/cli_registry.h"
#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/core/tool.h"
#include "k3/quant/isa.h"
#include "k3/quant/isa_info.h"
#include "k3/toolenv/toolenv.h"
#include "k3/repack/verify.h"

namespace {

// One line per file with problems: how many, of which kinds.
void PrintPerFile(const k3::repack::VerifyReport& r) {
  std::map<std::string, std::pair<size_t, std::set<std::string>>> by_file;
  for (const auto& p : r.problems) {
    auto& f = by_file[p.file.empty() ? "(container)" : p.file];
    ++f.first;
    f.second.insert(std::string(k3::ErrorCodeName(p.code)));
  }
  if (by_file.size() < 2) return;
  std::printf("per file:\n");
  for (const auto& [file, f] : by_file) {
    std::string kinds;
    for (const auto& k : f.second) kinds += (kinds.empty() ? "" : ", ") + k;
    std::printf("  %s: %zu problem(s) (%s)\n", file.c_str(), f.first, kinds.c_str());
  }
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{
      "k3-verify: check a k3 container (structure, index, tensors, checksums; --full: "
      "against the source)"};
  k3::cli::InitApp(app, "k3-verify", k3::quant::KernelsVersionDetail);
  k3::repack::VerifyOptions opt;
  bool json = false, quiet = false;
  app.add_option("DST", opt.dst, "container directory")->required();
  app.add_option("--source", opt.source, "the HF snapshot it was converted from");
  app.add_flag("--full", opt.full,
               "compare every expert byte with the source and re-derive every quantized tensor");
  app.add_option("--threads", opt.threads, "files checked in parallel (default: all CPUs)");
  app.add_flag("--json", json, "JSON: one line per problem, then a summary line");
  app.add_flag("-q,--quiet", quiet, "print only the problems (no summary); the exit code says the rest");
  // K3_LOG, the kernel variables and the crash hook, before parsing: --version
  // reports the configured kernels, and a bad value is refused before anything
  // is written.
  if (const int rc = k3::toolenv::ApplyFromEnvOrReport("k3-verify")) return rc;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return k3::cli::UsageExit(app, e);
  }

  const bool tty = ::isatty(2) != 0;
  if (json) {
    opt.progress = [](size_t done, size_t total, uint64_t bytes) {
      k3::JsonWriter w;
      w.BeginObject().Field("event", "progress").Field("files_done", done).Field("files_total", total);
      w.Field("bytes_hashed", bytes).EndObject();
      std::printf("%s\n", w.str().c_str());
      std::fflush(stdout);
    };
  } else if (tty && !quiet) {
    opt.progress = [](size_t done, size_t total, uint64_t bytes) {
      // \r + erase-line: the next line starts clean whatever was there.
      std::fprintf(stderr, "\r\033[K  verifying: %zu/%zu files, %s hashed", done, total,
                   k3::FormatBytes(bytes).c_str());
    };
  }
  try {
    if (quiet && k3::CurrentLogLevel() < k3::LogLevel::kWarn) k3::SetLogLevel(k3::LogLevel::kWarn);
    k3::quant::ActiveIsa();  // choose (and log) the kernels now, after --quiet
    opt.direct = k3::GetEnvBool("K3_DIRECT", true);  // docs/environment.md
    k3::repack::VerifyReport r = k3::repack::VerifyContainer(opt);
    if (opt.progress && !json) std::fprintf(stderr, "\r\033[K");
    for (const auto& p : r.problems) {
      if (json) {
        k3::JsonWriter w;
        w.BeginObject();
        w.Field("event", "problem");
        w.Field("code", k3::ErrorCodeName(p.code));
        w.Field("file", p.file);
        w.Field("tensor", p.tensor);
        w.Field("offset", p.offset);
        w.Field("detail", p.detail);
        w.EndObject();
        std::printf("%s\n", w.str().c_str());
      } else {
        std::printf("PROBLEM %s\n", p.ToString().c_str());
      }
    }
    const double gbps =
        r.seconds > 0 ? (r.bytes_hashed + r.source_bytes_read) / r.seconds / 1e9 : 0;
    if (json) {
      k3::JsonWriter w;
      w.BeginObject();
      w.Field("event", "summary");
      w.Field("ok", r.ok());
      w.Field("problems", r.problems.size());
      w.Field("consequences_folded", r.consequences_folded);
      w.Field("shards", r.shards);
      w.Field("tensors", r.tensors);
      w.Field("files_hashed", r.files_hashed);
      w.Field("bytes_hashed", r.bytes_hashed);
      w.Field("source_bytes_read", r.source_bytes_read);
      w.Field("expert_bytes_compared", r.expert_bytes_compared);
      w.Field("quantized_tensors_rederived", r.quantized_tensors_rederived);
      w.Field("passthrough_tensors_compared", r.passthrough_tensors_compared);
      w.Field("seconds", r.seconds);
      w.Field("gb_per_s", gbps);
      w.Field("peak_rss_bytes", k3::PeakRssBytes());
      w.Field("exit", r.ExitCode());
      if (!r.ok()) w.Field("repair", r.repair_command);
      w.EndObject();
      std::printf("%s\n", w.str().c_str());
    } else if (!quiet) {
      std::printf("%s: %zu shard(s), %zu tensors, %zu files hashed (%s)", r.ok() ? "OK" : "FAILED",
                  r.shards, r.tensors, r.files_hashed, k3::FormatBytes(r.bytes_hashed).c_str());
      if (opt.full) {
        std::printf(
            ", %s of experts compared, %zu quantized tensors re-derived, %zu others compared",
            k3::FormatBytes(r.expert_bytes_compared).c_str(), r.quantized_tensors_rederived,
            r.passthrough_tensors_compared);
      }
      std::printf(", %.2f s, %.2f GB/s; %zu problem(s)", r.seconds, gbps, r.problems.size());
      if (r.consequences_folded) std::printf(" (and %zu consequences of them not listed)", r.consequences_folded);
      std::printf("\n");
      PrintPerFile(r);
      if (!r.ok()) {
        std::printf("to repair: %s%s\n", r.repair_command.c_str(),
                    opt.source.empty() ? "   (SRC: the snapshot it was converted from)" : "");
      }
    }
    return r.ExitCode();
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "k3-verify: error: %s\n", e.what());
    return k3::ExitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3-verify: internal error: %s\n", e.what());
    return k3::ExitCodeFor(k3::ErrorCode::kInternal);
  }
}

int main(int argc, char** argv) { return k3::FinishStdout("k3-verify", Main(argc, argv)); }
