// k3-bench repack: conversion throughput against the same disk's baselines, in the
// same run. Per run (page cache dropped before each step when --drop-caches):
//   k3-repack SRC OUT          vs  cp -r SRC COPY (+ sync, so both are durable)
//   k3-verify OUT --full       vs  cat SRC/* OUT/* > /dev/null
// Each child runs as its own process: wall time and its peak RSS (wait4) are
// measured. Prints one JSON line per step and a summary with medians and ratios.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"

extern char** environ;

namespace k3::bench {
namespace {

struct RepackBenchArgs {
  std::string src;
  std::string work;
  int runs = 3;
  bool drop_caches = false;
  int bits = 8;
  bool keep = false;
};

struct Measured {
  double seconds = 0;
  double cpu_s = 0;  // user + system time of the child
  uint64_t peak_rss = 0;
};

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  return DirName(buf);
}

// Runs argv (stdout to /dev/null), returns wall time and the child's peak RSS.
Measured RunChild(const std::vector<std::string>& argv) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  double t0 = NowSeconds();
  int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) ThrowErrno(rc, "posix_spawn", argv[0]);
  int status = 0;
  struct rusage ru {};
  while (::wait4(pid, &status, 0, &ru) < 0) {
    if (errno != EINTR) ThrowErrno(errno, "wait4", argv[0]);
  }
  Measured m;
  m.seconds = NowSeconds() - t0;
  m.peak_rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  m.cpu_s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
            ru.ru_stime.tv_usec * 1e-6;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw Error(ErrorCode::kIo,
                "benchmark step failed (status " + std::to_string(status) + "): " + cmd);
  }
  return m;
}

void DropCaches(bool enabled) {
  if (!enabled) return;
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  if (!f) throw Error(ErrorCode::kIo, "cannot write /proc/sys/vm/drop_caches (needs root)");
}

uint64_t TreeBytes(const std::string& dir) {
  uint64_t n = 0;
  std::unique_ptr<FILE, int (*)(FILE*)> p(
      popen(("find '" + dir + "' -type f -printf '%s\\n'").c_str(), "r"), pclose);
  char line[64];
  while (p && fgets(line, sizeof line, p.get())) n += std::strtoull(line, nullptr, 10);
  return n;
}

// 1-minute load average: these VMs are shared, so every step records how busy
// the machine was while it ran.
double LoadAverage() {
  std::ifstream f("/proc/loadavg");
  double l = 0;
  f >> l;
  return l;
}

void Print(JsonWriter& w) {
  w.EndObject();
  std::printf("%s\n", w.str().c_str());
  std::fflush(stdout);
}

void RunRepackBench(const RepackBenchArgs& a) {
  const std::string bin = SelfDir();
  const std::string out = JoinPath(a.work, "repack-out");
  const std::string copy = JoinPath(a.work, "cp-out");
  if (!IsDirectory(a.work))
    throw Error(ErrorCode::kNotFound, "--work must be an existing directory", a.work);
  const uint64_t src_bytes = TreeBytes(a.src);
  std::vector<double> repack_s, cp_s, cp_sync_s, verify_s, cat_s;
  uint64_t repack_rss = 0, verify_rss = 0, out_bytes = 0;
  for (int run = 0; run < a.runs; ++run) {
    RunChild({"/bin/rm", "-rf", out, copy});
    DropCaches(a.drop_caches);
    const double load_before = LoadAverage();
    Measured r =
        RunChild({bin + "/k3-repack", a.src, out, "--bits", std::to_string(a.bits), "--json"});
    out_bytes = TreeBytes(out);
    DropCaches(a.drop_caches);
    Measured c = RunChild({"/bin/cp", "-r", a.src, copy});
    Measured s = RunChild({"/bin/sync"});
    DropCaches(a.drop_caches);
    Measured v = RunChild({bin + "/k3-verify", out, "--full", "--source", a.src, "--json"});
    DropCaches(a.drop_caches);
    Measured k = RunChild({"/bin/sh", "-c", "cat '" + a.src + "'/* '" + out + "'/* > /dev/null"});
    repack_s.push_back(r.seconds);
    cp_s.push_back(c.seconds);
    cp_sync_s.push_back(c.seconds + s.seconds);
    verify_s.push_back(v.seconds);
    cat_s.push_back(k.seconds);
    repack_rss = std::max(repack_rss, r.peak_rss);
    verify_rss = std::max(verify_rss, v.peak_rss);
    JsonWriter w;
    w.BeginObject().Field("bench", "repack").Field("run", int64_t{run});
    w.Field("repack_s", r.seconds)
        .Field("cp_s", c.seconds)
        .Field("cp_sync_s", c.seconds + s.seconds);
    w.Field("verify_full_s", v.seconds).Field("cat_both_s", k.seconds);
    w.Field("repack_cpu_s", r.cpu_s).Field("cp_cpu_s", c.cpu_s);
    w.Field("verify_cpu_s", v.cpu_s).Field("cat_cpu_s", k.cpu_s);
    w.Field("repack_peak_rss", r.peak_rss).Field("verify_peak_rss", v.peak_rss);
    w.Field("load_avg_before", load_before).Field("load_avg_after", LoadAverage());
    Print(w);
  }
  if (!a.keep) RunChild({"/bin/rm", "-rf", out, copy});
  const double gb = 1e9;
  const double rs = Median(repack_s), cs = Median(cp_s), css = Median(cp_sync_s);
  const double vs = Median(verify_s), ks = Median(cat_s);
  JsonWriter w;
  w.BeginObject().Field("bench", "repack").Field("summary", true);
  w.Field("runs", int64_t{a.runs})
      .Field("drop_caches", a.drop_caches)
      .Field("bits", int64_t{a.bits});
  w.Field("threads", int64_t{NumOnlineCpus()});
  w.Field("src_bytes", src_bytes).Field("out_bytes", out_bytes);
  w.Field("repack_gbps", src_bytes / rs / gb);
  w.Field("cp_gbps", src_bytes / cs / gb);
  w.Field("cp_sync_gbps", src_bytes / css / gb);
  w.Field("repack_vs_cp", cs / rs);
  w.Field("repack_vs_cp_sync", css / rs);
  w.Field("verify_full_gbps", (src_bytes + out_bytes) / vs / gb);
  w.Field("cat_both_gbps", (src_bytes + out_bytes) / ks / gb);
  w.Field("verify_vs_cat", ks / vs);
  w.Field("repack_peak_rss", repack_rss).Field("verify_peak_rss", verify_rss);
  Print(w);
}

void SetupRepackBench(CLI::App& root) {
  auto args = std::make_shared<RepackBenchArgs>();
  CLI::App* cmd = root.add_subcommand(
      "repack", "k3-repack vs cp and k3-verify --full vs cat, same source, same disk, same run");
  cmd->add_option("--src", args->src, "HF snapshot (e.g. k3-fixture --preset real-layer)")
      ->required();
  cmd->add_option("--work", args->work, "scratch directory on the disk under test")->required();
  cmd->add_option("--runs", args->runs, "runs (median reported)")->default_val(3);
  cmd->add_option("--bits", args->bits, "k3-repack --bits")->default_val(8);
  cmd->add_flag("--drop-caches", args->drop_caches, "drop the page cache before every step (root)");
  cmd->add_flag("--keep", args->keep, "keep the last outputs");
  cmd->callback([args] { RunRepackBench(*args); });
}

}  // namespace

K3_REGISTER_BENCH(SetupRepackBench);

}  // namespace k3::bench
