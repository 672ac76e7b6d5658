#include "cli_util.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#if K3_HAVE_VULKAN
#include "k3/vulkan/dense.h"
#include "k3/vulkan/tier.h"
#endif

namespace k3::run {

std::vector<int32_t> ParseIdList(const std::string& csv) {
  std::vector<int32_t> ids;
  size_t i = 0, item = 0;
  bool have_item = false;  // a number since the last comma
  auto empty_item = [&] {
    throw Error(ErrorCode::kInvalidArgument,
                "--ids: item " + std::to_string(item + 1) + " is empty (ids are separated by one comma)");
  };
  while (i < csv.size()) {
    const char ch = csv[i];
    if (ch == ' ' || ch == '\t') {
      ++i;
    } else if (ch == ',') {
      if (!have_item) empty_item();
      have_item = false;
      ++item;
      ++i;
    } else {
      size_t j = csv.find_first_of(", \t", i);
      if (j == std::string::npos) j = csv.size();
      const std::string part = csv.substr(i, j - i);
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(part.c_str(), &end, 10);
      if (end == part.c_str() || *end != '\0' || errno == ERANGE || v < 0 || v > INT32_MAX ||
          part[0] == '+' || part[0] == '-') {
        throw Error(ErrorCode::kInvalidArgument, "--ids: '" + part + "' (item " +
                                                     std::to_string(item + 1) +
                                                     ") is not a token id");
      }
      if (have_item) ++item;  // "1 2": space-separated items
      ids.push_back(static_cast<int32_t>(v));
      have_item = true;
      i = j;
    }
  }
  if (!ids.empty() && !have_item) empty_item();  // trailing comma
  return ids;
}

void AddRuntimeFlags(CLI::App* cmd, RuntimeFlags& flags, const std::string& temp_default,
                     const std::string& top_p_default) {
  auto finite_nonneg = CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0' || !std::isfinite(v) || v < 0) {
          return "temperature must be a finite number >= 0 (0: greedy), got '" + s + "'";
        }
        return {};
      },
      "FLOAT>=0");
  auto top_p = CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0' || !(v > 0 && v <= 1)) {
          return "top-p must be in (0, 1], got '" + s + "'";
        }
        return {};
      },
      "(0,1]");
  cmd->add_option("--temp", flags.temperature, "temperature >= 0; 0 is greedy (default " + temp_default + ")")
      ->check(finite_nonneg);
  cmd->add_option("--top-p", flags.top_p, "nucleus mass in (0, 1] (default " + top_p_default + ")")
      ->check(top_p);
  cmd->add_option("--seed", flags.seed, "sampling seed, 0 to 2^64-1 (default 1)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", flags.threads, "compute threads, 1 to 1024 (default: every CPU)")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--quiet,-q", flags.quiet, "no load progress or stats lines on stderr (warnings and errors stay)");
  cmd->add_flag_callback(
      "--progress", [&flags] { flags.progress_line = 1; },
      "the prefill progress line on stderr (default: when stderr is a terminal)");
  cmd->add_flag_callback(
      "--no-progress", [&flags] { flags.progress_line = 0; }, "no prefill progress line");
  AddCheckpointFlags(cmd, flags);
  AddPrefillFlags(cmd, flags);
}

void AddPrefillFlags(CLI::App* cmd, RuntimeFlags& flags) {
  cmd->add_option("--prefill-mem-gb", flags.prefill_mem_gb,
                  "memory a prefill window may hold, GB (default K3_PREFILL_GB, else sized from "
                  "MemAvailable; docs/engine.md)")
      ->check(CLI::Range(0.001, 1e6));
}

void AddCheckpointFlags(CLI::App* cmd, RuntimeFlags& flags) {
  cmd->add_option("--ckpt-slots", flags.ckpt_slots,
                  "recurrent-state checkpoints kept in RAM; 0 turns them off (default: sized from "
                  "free memory, printed at start)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  cmd->add_option("--ckpt-dir", flags.ckpt_dir,
                  "park evicted checkpoints in this directory, and all of them at a clean exit "
                  "(the next start resumes from them)");
  cmd->add_option("--ckpt-disk-gb", flags.ckpt_disk_gb, "cap on parked checkpoints, GB (default 50)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--ckpt-every", flags.ckpt_every,
                  "a checkpoint every N prefilled tokens, 0: none (default 1024)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
}

engine::EngineOptions EngineOptionsFor(const std::string& model_dir, const RuntimeFlags& flags) {
  engine::EngineOptions o = engine::EngineOptions::FromEnv(model_dir);
  o.threads = flags.threads;
  o.checkpoints.ram_slots = flags.ckpt_slots;
  o.checkpoints.disk_dir = flags.ckpt_dir;
  o.checkpoints.disk_gb = flags.ckpt_disk_gb;
  o.checkpoint_every = flags.ckpt_every;
  if (flags.prefill_mem_gb > 0) o.prefill_budget_bytes = flags.prefill_mem_gb * 1e9;
#if K3_HAVE_VULKAN
  // The Vulkan expert tier and the trunk's placement (K3_VK_DENSE) for every
  // command when K3_VK=1 (docs/vulkan.md).
  const vulkan::TierOptions vk = vulkan::TierOptions::FromEnv();
  o.on_model_loaded = [vk](model::Model& m) {
    vulkan::InstallTier(m, vk);
    vulkan::InstallDense(m, vk);
  };
#endif
  if (flags.quiet) {
    o.progress = false;
    if (CurrentLogLevel() < LogLevel::kWarn) SetLogLevel(LogLevel::kWarn);
  }
  return o;
}

PrefillProgressLine::PrefillProgressLine(const RuntimeFlags& flags) {
  tty_ = isatty(STDERR_FILENO) != 0;
  enabled_ = flags.progress_line == 1 || (flags.progress_line < 0 && tty_ && !flags.quiet);
}

std::string PrefillProgressLine::Format(const engine::PrefillProgress& p) {
  const int64_t layers = std::max<int64_t>(p.layers, 1);
  // The layer the current window is in: its token-layers past the whole windows.
  int64_t layer = layers;
  if (p.window_tokens > 0 && p.done < p.total) {
    layer = std::min(layers, (p.units_done - p.done * layers) / p.window_tokens + 1);
  }
  const double tok_s = p.elapsed_s > 0 ? static_cast<double>(p.units_done) /
                                             static_cast<double>(layers) / p.elapsed_s
                                       : 0;
  char eta[32] = "?";
  if (p.eta_s >= 0) {
    const long long s = std::llround(p.eta_s);
    if (s >= 3600) {
      std::snprintf(eta, sizeof eta, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    } else {
      std::snprintf(eta, sizeof eta, "%lld:%02lld", s / 60, s % 60);
    }
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "prefill %lld/%lld tokens · layer %lld/%lld · %.1f GB read · %.0f tok/s · ETA %s",
                static_cast<long long>(p.done), static_cast<long long>(p.total),
                static_cast<long long>(layer), static_cast<long long>(layers),
                static_cast<double>(p.expert_bytes_read) / 1e9, tok_s, eta);
  return buf;
}

bool PrefillProgressLine::Update(const engine::PrefillProgress& p) {
  if (!enabled_) return true;
  const double now = NowSeconds();
  if (shown_ && now - last_draw_ < 0.2) return true;
  last_draw_ = now;
  const std::string line = Format(p);
  // On a terminal the line is redrawn in place; elsewhere (--progress into a
  // file or pipe) each update is its own line.
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
  shown_ = true;
  return true;
}

void PrefillProgressLine::Clear() {
  if (!shown_) return;
  if (tty_) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  shown_ = false;
}

namespace {
// The process's MPI world: made by RunClusterRole, finalized at exit.
std::unique_ptr<cluster::Comm>& TheComm() {
  static std::unique_ptr<cluster::Comm> comm;
  return comm;
}
}  // namespace

void AddClusterFlags(CLI::App* cmd, ClusterFlags& flags) {
  cmd->add_flag(
      "--cluster", flags.on,
      "expert-parallel run over MPI: start with mpirun/srun, rank 0 coordinates, the other "
      "ranks compute the experts they own (docs/cluster.md)");
  cmd->add_flag("--cluster-symmetric", flags.options.symmetric, "rank 0 owns experts too");
  cmd->add_option(
         "--cluster-deadline", flags.options.deadline_s,
         "seconds one expert exchange may take before the worker counts as lost (default 60)")
      ->check(CLI::Range(0.01, 86400.0));
  cmd->add_flag("--cluster-reduced", flags.options.reduced,
                "workers answer in bf16 (half the bytes; not bit-exact, docs/cluster.md)");
  // A capacity flag: a number in its range, or "auto".
  auto capacity = [](double hi) {
    return CLI::Validator(
        [hi](std::string& v) -> std::string {
          if (v == "auto") return {};
          char* end = nullptr;
          const double x = std::strtod(v.c_str(), &end);
          if (v.empty() || *end != '\0' || !(x >= 0 && x <= hi))
            return "must be auto or a number in 0.." + std::to_string(static_cast<int64_t>(hi));
          return {};
        },
        "auto|NUMBER");
  };
  cmd->add_option("--cluster-ram-gb", flags.ram_gb,
                  "this rank's expert RAM for the placement, GB, or auto: the expert cache it "
                  "would size (default 0; 0 on every rank: equal shares)")
      ->check(capacity(1e6));
  cmd->add_option("--cluster-disk-gbps", flags.disk_gbps,
                  "this rank's disk read rate for the placement, GB/s, or auto: a 2 s O_DIRECT "
                  "read of its expert files at start (default 0)")
      ->check(capacity(1e4));
  cmd->add_option(
      "--cluster-fault", flags.options.fault,
      "test hook: RANK:KIND@N, KIND kill|stop|exit|disk at that worker's N-th exchange");
}

bool RunClusterRole(const ClusterFlags& flags, engine::EngineOptions& eo, bool stop_handler) {
  if (!flags.on) return false;
  auto& comm = TheComm();
  comm = cluster::Comm::InitOrThrow(nullptr, nullptr);
  cluster::ClusterOptions co = flags.options;
  co.measure_ram = flags.ram_gb == "auto";
  co.measure_disk = flags.disk_gbps == "auto";
  if (!co.measure_ram) co.capacity.ram_bytes = static_cast<uint64_t>(std::llround(std::strtod(flags.ram_gb.c_str(), nullptr) * 1e9));
  if (!co.measure_disk)
    co.capacity.disk_bytes_per_s = static_cast<uint64_t>(std::llround(std::strtod(flags.disk_gbps.c_str(), nullptr) * 1e9));
  if (comm->rank() != 0) {
    cluster::WorkerSetup ws;
    ws.model_dir = eo.model_dir;
    ws.snapshot = eo.snapshot;
    ws.stream = eo.stream;
    ws.progress = eo.progress;
    try {
      cluster::RunWorkerOrThrow(*comm, ws, co);
    } catch (...) {
      if (!comm->settled()) comm->Abandon();
      throw;
    }
    return true;
  }
  if (stop_handler) cluster::InstallStopHandler();
  auto prev = eo.on_model_loaded;
  cluster::Comm* c = comm.get();
  eo.on_model_loaded = [prev, c, co](model::Model& m) {
    if (prev) prev(m);
    try {
      cluster::InstallCoordinator(m, *c, co);
    } catch (...) {
      if (!c->settled()) c->Abandon();
      throw;
    }
  };
  return false;
}

cluster::ClusterExecutor* ClusterOf(engine::Engine& engine) {
  return cluster::InstalledCoordinator(engine.model());
}

void OnClusterLoss(engine::Engine& engine, const Error& e) {
  if (e.code() != ErrorCode::kUnavailable || !ClusterOf(engine)) return;
  const int64_t parked = engine.ParkCheckpoints();
  std::fprintf(stderr, "k3-run: %s; parked %lld checkpoints; exit %d (restart the job)\n",
               e.detail().c_str(), static_cast<long long>(parked), ExitCodeFor(e.code()));
  std::fflush(stderr);
}

void AbandonCluster() {
  if (TheComm()) TheComm()->Abandon();
}

}  // namespace k3::run
