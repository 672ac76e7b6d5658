// k3-bench repack: conversion throughput against the same disk's baselines, in the
// same run. Per run (page cache dropped before each step when --drop-caches):
//   k3-repack SRC OUT          vs  the disk's limit: the source's bytes read while
//                                  the output's size is written, O_DIRECT, over a
//                                  grid of parallel streams x queue depth x block
//                                  size (the best cell's median is the limit)
//                              and, right before every k3-repack run, one pass of
//                                  the best cell so far (the pair: both see the
//                                  same disk weather; ratio per pair, median/range)
//                              and cp -r SRC COPY (+ sync, so both are durable)
//   k3-verify OUT --full       vs  cat SRC/* OUT/* > /dev/null
// Each child runs as its own process: wall time and its peak RSS (wait4) are
// measured. Prints one JSON line per step and a summary with medians and ratios.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
  std::vector<int> grid_streams = {1, 2, 4};
  std::vector<int> grid_qd = {1, 2, 4};
  // Block sizes (MiB) of the disk-limit passes: with the in-flight counts they
  // tell whether the disk rewards I/Os in flight or bytes in flight.
  std::vector<int> grid_block_mib = {16};
  // Cells "SxQxB" added to the streams x qd x block product, e.g. equal bytes
  // in flight with more, smaller I/Os: 4x4x16,4x8x8,4x16x4.
  std::vector<std::string> grid_cells;
  bool disk_limit = true;
  bool cp_verify = true;
  // k3-repack configurations "SxR", "SxRxW" or "SxRxWxB" (--streams S --reads
  // R --writes W --block-mib B; 0 or absent = its default), or "default" (no
  // pipeline flags at all: what a user gets).
  std::vector<std::string> repack_configs = {"default"};
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
// fork + exec, not posix_spawn: glibc's posix_spawn runs the child in this
// process's memory until exec (CLONE_VM), and Linux carries the larger of that
// memory's peak and the new image's into the child's ru_maxrss, so after the
// disk-limit grid (up to 512 MiB of blocks) every child "peaked" at ours. A
// forked copy only carries what this process holds now (the disk-limit blocks
// are unmapped after each pass), a few MB.
Measured RunChild(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  double t0 = NowSeconds();
  const pid_t pid = ::fork();
  if (pid < 0) ThrowErrno(errno, "fork", argv[0]);
  if (pid == 0) {  // the child: async-signal-safe calls only
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) ::dup2(null_fd, 1);
    ::execve(args[0], args.data(), environ);
    ::_exit(127);
  }
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

// --- The disk's limit for this conversion ---------------------------------

constexpr size_t kIoAlign = 4096;

// mmap'd, so freeing it really returns the pages: a child forked later
// carries this process's resident size into its ru_maxrss (RunChild).
struct AlignedBlock {
  explicit AlignedBlock(size_t n) : bytes(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) ThrowErrno(errno, "mmap", "disk-limit block");
    std::memset(p, 0x5a, n);  // written once: fresh pages are slow to fault in here
    data = static_cast<std::byte*>(p);
  }
  ~AlignedBlock() { ::munmap(data, bytes); }
  size_t bytes;
  AlignedBlock(const AlignedBlock&) = delete;
  AlignedBlock& operator=(const AlignedBlock&) = delete;
  std::byte* data;
};

// The source's shard files (what k3-repack reads), largest first so that the
// streams finish together.
std::vector<std::pair<std::string, uint64_t>> SourceShards(const std::string& src) {
  std::vector<std::pair<std::string, uint64_t>> files;
  for (const std::string& name : ListDirectory(src)) {
    if (!name.ends_with(".safetensors")) continue;
    const std::string path = JoinPath(src, name);
    files.emplace_back(path, FileSizeOrThrow(path));
  }
  std::sort(files.begin(), files.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  return files;
}

// `streams` threads each take the next source file and read it with `qd`
// reads of `block` bytes in flight (qd threads taking its blocks in turn), O_DIRECT;
// meanwhile `streams` writers write out_bytes / streams each to their own file
// (allocated first) the same way, then fsync (k3-repack's output is durable too). Returns seconds
// until the last read and the last fsync are done.
double DiskLimitPass(const std::vector<std::pair<std::string, uint64_t>>& files,
                     uint64_t out_bytes, const std::string& work, int streams, int qd,
                     size_t block) {
  std::atomic<size_t> next_file{0};
  std::mutex err_mu;
  std::string err;
  auto fail = [&](const std::string& e) {
    std::lock_guard<std::mutex> lock(err_mu);
    if (err.empty()) err = e;
  };
  // [0, bytes) in `block`-byte blocks, qd of them in flight (qd threads taking the
  // blocks in turn); io(buf, off, len) moves one block and returns "" or an error.
  auto blocks_in_flight = [&](uint64_t bytes, auto&& io) {
    const uint64_t blocks = (bytes + block - 1) / block;
    std::atomic<uint64_t> next_block{0};
    std::vector<std::thread> q;
    for (int i = 0; i < qd; ++i) {
      q.emplace_back([&] {
        AlignedBlock buf(block);
        for (uint64_t b = next_block++; b < blocks; b = next_block++) {
          const uint64_t off = b * block;
          const std::string e = io(buf.data, off, std::min<uint64_t>(block, bytes - off));
          if (!e.empty()) return fail(e);
        }
      });
    }
    for (auto& t : q) t.join();
  };
  auto read_stream = [&] {
    for (size_t f = next_file++; f < files.size(); f = next_file++) {
      UniqueFd fd = TryOpen(files[f].first, O_RDONLY | O_DIRECT);
      if (!fd.valid()) return fail("O_DIRECT open refused: " + files[f].first);
      blocks_in_flight(files[f].second, [&](std::byte* buf, uint64_t off, uint64_t len) {
        const uint64_t want = (len + kIoAlign - 1) / kIoAlign * kIoAlign;  // the tail too
        for (uint64_t got = 0; got < len;) {
          const ssize_t n = ::pread(fd.get(), buf + got, want - got, off + got);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) return "read " + files[f].first + ": " + std::strerror(errno);
          got += static_cast<uint64_t>(n);
        }
        return std::string();
      });
    }
  };
  auto write_stream = [&](int w) {
    const std::string path = JoinPath(work, "disk-limit." + std::to_string(w) + ".tmp");
    UniqueFd fd = TryOpen(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (!fd.valid()) return fail("O_DIRECT open refused: " + path);
    const uint64_t bytes = (out_bytes / streams + kIoAlign - 1) / kIoAlign * kIoAlign;
    // Allocated first, as k3-repack does: ext4 serializes O_DIRECT writes that
    // extend a file, so the writes in flight would otherwise go one at a time.
    try {
      PreallocateOrThrow(fd.get(), bytes, path);
    } catch (const Error& e) {
      return fail(e.what());
    }
    blocks_in_flight(bytes, [&](std::byte* buf, uint64_t off, uint64_t len) {
      for (uint64_t put = 0; put < len;) {
        const ssize_t n = ::pwrite(fd.get(), buf + put, len - put, off + put);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return "write " + path + ": " + std::strerror(errno);
        put += static_cast<uint64_t>(n);
      }
      return std::string();
    });
    if (::fsync(fd.get()) != 0) fail("fsync " + path + ": " + std::strerror(errno));
  };
  const double t0 = NowSeconds();
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) threads.emplace_back(read_stream);
  for (int i = 0; i < streams; ++i) threads.emplace_back(write_stream, i);
  for (auto& t : threads) t.join();
  const double secs = NowSeconds() - t0;
  for (int i = 0; i < streams; ++i)
    ::unlink(JoinPath(work, "disk-limit." + std::to_string(i) + ".tmp").c_str());
  if (!err.empty()) throw Error(ErrorCode::kIo, "disk-limit baseline: " + err);
  return secs;
}

struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread SpreadOf(const std::vector<double>& v) {
  if (v.empty()) return {};
  return {Median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}

void RunRepackBench(const RepackBenchArgs& a) {
  const std::string bin = SelfDir();
  const std::string out = JoinPath(a.work, "repack-out");
  const std::string copy = JoinPath(a.work, "cp-out");
  if (!IsDirectory(a.work))
    throw Error(ErrorCode::kNotFound, "--work must be an existing directory", a.work);
  const uint64_t src_bytes = TreeBytes(a.src);
  const auto shards = SourceShards(a.src);
  uint64_t shard_bytes = 0;
  for (const auto& f : shards) shard_bytes += f.second;
  std::vector<double> cp_s, cp_sync_s, verify_s, cat_s;
  struct RepackConfig {
    std::vector<std::string> flags;  // k3-repack's pipeline flags
    std::string key;
  };
  std::vector<RepackConfig> configs;
  for (const std::string& c : a.repack_configs) {
    if (c == "default") {
      configs.push_back({{}, "repack_default"});
      continue;
    }
    std::vector<std::string> parts;
    for (size_t i = 0;;) {
      const size_t x = c.find('x', i);
      parts.push_back(c.substr(i, x == std::string::npos ? std::string::npos : x - i));
      if (x == std::string::npos) break;
      i = x + 1;
    }
    const bool ok = parts.size() >= 2 && parts.size() <= 4 &&
                    std::all_of(parts.begin(), parts.end(), [](const std::string& p) {
                      return !p.empty() && p.find_first_not_of("0123456789") == std::string::npos;
                    });
    if (!ok) {
      throw Error(ErrorCode::kInvalidArgument,
                  "--repack-configs: '" + c + "' is not SxR, SxRxW, SxRxWxB or default");
    }
    while (parts.size() < 4) parts.push_back("0");
    RepackConfig rc{{"--streams", parts[0], "--reads", parts[1], "--writes", parts[2]},
                    "repack_s" + parts[0] + "_r" + parts[1]};
    if (parts[2] != "0") rc.key += "_w" + parts[2];
    if (parts[3] != "0") {
      rc.flags.insert(rc.flags.end(), {"--block-mib", parts[3]});
      rc.key += "_b" + parts[3];
    }
    configs.push_back(rc);
  }
  for (int b : a.grid_block_mib) {
    if (b < 1 || b > 256) {
      throw Error(ErrorCode::kInvalidArgument,
                  "--grid-block-mib " + std::to_string(b) + ": must be 1 .. 256");
    }
  }
  std::vector<std::vector<double>> repack_s(configs.size());
  // Per config: the adjacent baseline pass's seconds / k3-repack's, one per run.
  std::vector<std::vector<double>> pair_ratio(configs.size());
  struct Cell {
    int streams, qd, block_mib;
    std::vector<double> secs;
    // 16 MiB cells keep the keys they had before the block size was a knob.
    std::string Key() const {
      std::string k = "disk_s" + std::to_string(streams) + "_qd" + std::to_string(qd);
      if (block_mib != 16) k += "_b" + std::to_string(block_mib);
      return k;
    }
    double Pass(const std::vector<std::pair<std::string, uint64_t>>& files, uint64_t out_bytes,
                const std::string& work) const {
      return DiskLimitPass(files, out_bytes, work, streams, qd, size_t(block_mib) << 20);
    }
  };
  std::vector<Cell> grid;
  if (a.disk_limit) {
    for (int b : a.grid_block_mib) {
      for (int st : a.grid_streams) {
        for (int q : a.grid_qd) grid.push_back({st, q, b, {}});
      }
    }
    for (const std::string& c : a.grid_cells) {
      int st = 0, q = 0, b = 0;
      char tail = 0;
      if (std::sscanf(c.c_str(), "%dx%dx%d%c", &st, &q, &b, &tail) != 3 || st < 1 || st > 64 || q < 1 ||
          q > 64 || b < 1 || b > 256) {
        throw Error(ErrorCode::kInvalidArgument,
                    "--grid-cells: '" + c + "' is not SxQxB (streams 1..64, qd 1..64, block 1..256 MiB)");
      }
      const bool dup = std::any_of(grid.begin(), grid.end(), [&](const Cell& x) {
        return x.streams == st && x.qd == q && x.block_mib == b;
      });
      if (!dup) grid.push_back({st, q, b, {}});
    }
  }
  uint64_t repack_rss = 0, verify_rss = 0, out_bytes = 0;
  for (int run = 0; run < a.runs; ++run) {
    JsonWriter w;
    w.BeginObject().Field("bench", "repack").Field("run", int64_t{run});
    w.Field("load_avg_before", LoadAverage());
    // The first run starts with one k3-repack (its output size sizes the
    // baseline's writes; not timed). Then the grid, then each configuration
    // right after a pass of the grid's best cell so far (by median): the pair
    // sees the same disk weather. Each step from a dropped cache.
    auto repack = [&](const RepackConfig& c) {
      RunChild({"/bin/rm", "-rf", out});
      DropCaches(a.drop_caches);
      std::vector<std::string> argv = {bin + "/k3-repack", a.src, out, "--bits",
                                       std::to_string(a.bits), "--json"};
      argv.insert(argv.end(), c.flags.begin(), c.flags.end());
      return RunChild(argv);
    };
    if (out_bytes == 0 && !grid.empty()) {
      repack(configs.front());
      out_bytes = TreeBytes(out);
    }
    for (Cell& c : grid) {
      DropCaches(a.drop_caches);
      c.secs.push_back(c.Pass(shards, out_bytes, a.work));
      w.Field(c.Key() + "_s", c.secs.back());
    }
    const Cell* pair_cell = nullptr;
    for (const Cell& c : grid) {
      if (!pair_cell || Median(c.secs) < Median(pair_cell->secs)) pair_cell = &c;
    }
    Measured r;
    for (size_t i = 0; i < configs.size(); ++i) {
      if (pair_cell) {
        DropCaches(a.drop_caches);
        const double b = pair_cell->Pass(shards, out_bytes, a.work);
        w.Field(configs[i].key + "_pair_disk_s", b);
        r = repack(configs[i]);
        pair_ratio[i].push_back(b / r.seconds);
      } else {
        r = repack(configs[i]);
      }
      repack_s[i].push_back(r.seconds);
      repack_rss = std::max(repack_rss, r.peak_rss);
      w.Field(configs[i].key + "_s", r.seconds);
      w.Field(configs[i].key + "_peak_rss", r.peak_rss);
      w.Field(configs[i].key + "_cpu_s", r.cpu_s);
    }
    out_bytes = TreeBytes(out);
    if (pair_cell) {
      w.Field("pair_disk_streams", int64_t{pair_cell->streams})
          .Field("pair_disk_qd", int64_t{pair_cell->qd})
          .Field("pair_disk_block_mib", int64_t{pair_cell->block_mib});
    }
    if (a.cp_verify) {
      DropCaches(a.drop_caches);
      Measured c = RunChild({"/bin/cp", "-r", a.src, copy});
      Measured s = RunChild({"/bin/sync"});
      RunChild({"/bin/rm", "-rf", copy});
      DropCaches(a.drop_caches);
      Measured v = RunChild({bin + "/k3-verify", out, "--full", "--source", a.src, "--json"});
      DropCaches(a.drop_caches);
      Measured k =
          RunChild({"/bin/sh", "-c", "cat '" + a.src + "'/* '" + out + "'/* > /dev/null"});
      cp_s.push_back(c.seconds);
      cp_sync_s.push_back(c.seconds + s.seconds);
      verify_s.push_back(v.seconds);
      cat_s.push_back(k.seconds);
      verify_rss = std::max(verify_rss, v.peak_rss);
      w.Field("cp_s", c.seconds).Field("cp_sync_s", c.seconds + s.seconds);
      w.Field("verify_full_s", v.seconds).Field("cat_both_s", k.seconds);
      w.Field("cp_cpu_s", c.cpu_s).Field("verify_cpu_s", v.cpu_s).Field("cat_cpu_s", k.cpu_s);
      w.Field("verify_peak_rss", v.peak_rss);
    }
    w.Field("load_avg_after", LoadAverage());
    Print(w);
  }
  if (!a.keep) RunChild({"/bin/rm", "-rf", out, copy});
  const double gb = 1e9;
  JsonWriter w;
  w.BeginObject().Field("bench", "repack").Field("summary", true);
  w.Field("runs", int64_t{a.runs})
      .Field("drop_caches", a.drop_caches)
      .Field("bits", int64_t{a.bits});
  w.Field("threads", int64_t{NumOnlineCpus()});
  w.Field("src_bytes", src_bytes).Field("src_shard_bytes", shard_bytes);
  w.Field("src_shards", uint64_t(shards.size())).Field("out_bytes", out_bytes);
  // The limit: the grid cell with the fastest median (its spread alongside).
  const Cell* best = nullptr;
  for (const Cell& c : grid) {
    const Spread sp = SpreadOf(c.secs);
    const std::string k = c.Key();
    w.Field(k + "_gbps", shard_bytes / sp.median / gb);
    w.Field(k + "_s", sp.median).Field(k + "_min_s", sp.min).Field(k + "_max_s", sp.max);
    if (!best || sp.median < Median(best->secs)) best = &c;
  }
  Spread limit;
  if (best) {
    limit = SpreadOf(best->secs);
    w.Field("disk_limit_streams", int64_t{best->streams}).Field("disk_limit_qd", int64_t{best->qd});
    w.Field("disk_limit_block_mib", int64_t{best->block_mib});
    w.Field("disk_limit_s", limit.median)
        .Field("disk_limit_min_s", limit.min)
        .Field("disk_limit_max_s", limit.max);
    w.Field("disk_limit_gbps", shard_bytes / limit.median / gb);
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    const Spread rs = SpreadOf(repack_s[i]);
    const std::string& k = configs[i].key;
    w.Field(k + "_s", rs.median).Field(k + "_min_s", rs.min).Field(k + "_max_s", rs.max);
    w.Field(k + "_gbps", shard_bytes / rs.median / gb);
    if (best) w.Field(k + "_vs_disk_limit", limit.median / rs.median);
    if (!pair_ratio[i].empty()) {
      const Spread pr = SpreadOf(pair_ratio[i]);
      w.Field(k + "_vs_pair_median", pr.median)
          .Field(k + "_vs_pair_min", pr.min)
          .Field(k + "_vs_pair_max", pr.max);
    }
  }
  if (a.cp_verify) {
    const double rs = Median(repack_s.front());
    const double cs = Median(cp_s), css = Median(cp_sync_s);
    const double vs = Median(verify_s), ks = Median(cat_s);
    w.Field("cp_gbps", src_bytes / cs / gb);
    w.Field("cp_sync_gbps", src_bytes / css / gb);
    w.Field("repack_vs_cp", cs / rs);
    w.Field("repack_vs_cp_sync", css / rs);
    w.Field("verify_full_gbps", (src_bytes + out_bytes) / vs / gb);
    w.Field("cat_both_gbps", (src_bytes + out_bytes) / ks / gb);
    w.Field("verify_vs_cat", ks / vs);
  }
  w.Field("repack_peak_rss", repack_rss).Field("verify_peak_rss", verify_rss);
  w.Field("git", SourceRevision()).Field("cpu", CpuModel());
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
  cmd->add_option("--grid-streams", args->grid_streams, "disk-limit baseline: parallel streams")
      ->delimiter(',');
  cmd->add_option("--grid-qd", args->grid_qd, "disk-limit baseline: reads in flight per stream")
      ->delimiter(',');
  cmd->add_option("--grid-block-mib", args->grid_block_mib,
                  "disk-limit baseline: block sizes in MiB (each with every streams x qd cell)")
      ->delimiter(',');
  cmd->add_option("--grid-cells", args->grid_cells,
                  "disk-limit baseline: more cells SxQxB (streams x reads in flight x block MiB), "
                  "e.g. 4x8x8,4x16x4")
      ->delimiter(',');
  cmd->add_flag("!--no-disk-limit", args->disk_limit, "skip the disk-limit grid");
  cmd->add_flag("!--no-cp-verify", args->cp_verify, "skip cp, k3-verify and cat");
  cmd->add_option("--repack-configs", args->repack_configs,
                  "k3-repack configurations to time, SxR, SxRxW or SxRxWxB = --streams S --reads R "
                  "--writes W --block-mib B (0 = its default), or default (no pipeline flags), "
                  "e.g. 1x1x1,2x2x2x16,default")
      ->delimiter(',');
  cmd->callback([args] { RunRepackBench(*args); });
}

}  // namespace

K3_REGISTER_BENCH(SetupRepackBench);

}  // namespace k3::bench
