// EngineOptions::FromEnv: the one place the runtime's K3_* variables are read.
// Each variable has one meaning, one default and one accepted range, listed in
// docs/environment.md (a test checks that table against the sources).
#include <cstdint>
#include <string>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/engine/engine.h"
#include "k3/toolenv/toolenv.h"

namespace k3::engine {
namespace {

int Bits(const char* name, int fallback) {
  const std::string v = GetEnvChoice(name, std::to_string(fallback), {"4", "8", "32"});
  return std::stoi(v);
}

}  // namespace

void ApplyLogLevelFromEnv() { SetLogLevel(toolenv::LogLevelFromEnv()); }

EngineOptions EngineOptions::FromEnv(std::string model_dir) {
  ApplyLogLevelFromEnv();
  EngineOptions o;
  o.model_dir = std::move(model_dir);

  model::LoadOptions& l = o.load;
  l.bits_explicit = GetEnv("K3_BITS").has_value();
  l.bits = Bits("K3_BITS", 4);
  l.mla_bits = Bits("K3_MLA_BITS", 8);
  l.head_bits = Bits("K3_HEAD_BITS", 8);
  l.mmap = GetEnvBool("K3_MMAP", false);
  l.threads = static_cast<int>(GetEnvInt("K3_LOAD_THREADS", 0, 0, 256));
  l.max_layers = GetEnvInt("K3_LAYERS", 0, 0, 1 << 20);
  // The streaming store replaces the load-time SimpleExpertStore at once, so
  // that one gets the minimum (one slot per layer); K3_EXPERT_GB sizes the
  // streaming cache only.
  l.expert_cache_bytes = 0;

  model::RunOptions& r = o.run;
  r.idot = GetEnvBool("K3_IDOT", true);
  r.chunk = static_cast<int>(GetEnvInt("K3_CHUNK", 0, 0, 1 << 24));
  if (GetEnv("K3_PREFILL_GB"))
    o.prefill_budget_bytes = GetEnvDouble("K3_PREFILL_GB", 0, 0.001, 1e6) * 1e9;
  r.topp = static_cast<float>(GetEnvDouble("K3_TOPP", 0.0, 0.0, 1.0));

  if (auto dirs = GetEnv("K3_DIRS")) o.snapshot.extra_dirs = SplitDirList(*dirs);

  stream::StreamOptions& s = o.stream;
  if (GetEnv("K3_EXPERT_GB")) s.budget_bytes = GetEnvDouble("K3_EXPERT_GB", 0, 0, 1e6) * 1e9;
  s.direct = GetEnvBool("K3_DIRECT", true);
  o.checkpoints.direct = s.direct;
  s.uring = GetEnvBool("K3_URING", true);
  s.pipe = GetEnvBool("K3_PIPE", true);
  s.io_threads = static_cast<int>(GetEnvInt("K3_IO_THREADS", 4, 1, 16));
  s.queue_depth = static_cast<int>(GetEnvInt("K3_QD", 8, 1, 64));
  s.window = static_cast<int>(GetEnvInt("K3_WINDOW", 32, 1, 4096));
  s.prefault = GetEnvBool("K3_PREFAULT", true);
  s.ahead = GetEnvBool("K3_READ_AHEAD", true);
  const double chunk_mb = GetEnvDouble("K3_READ_CHUNK_MB", 0.0, 0.0, 1024.0);
  s.read_chunk_bytes = static_cast<uint64_t>(chunk_mb * 1048576.0);
  if (s.read_chunk_bytes % 4096 != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "expected a multiple of 4 KiB (0.00390625 MB), got '" + *GetEnv("K3_READ_CHUNK_MB") +
                    "'",
                {}, Error::kNoOffset, "K3_READ_CHUNK_MB");
  }

  o.max_context = GetEnvInt("K3_MAXT", 0, 0, int64_t{1} << 32);
  return o;
}

}  // namespace k3::engine
