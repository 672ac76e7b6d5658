// k3-verify: proves a k3 container intact (docs/repack.md). Every problem found
// is collected as a value naming file, tensor and byte offset; nothing stops at
// the first one. Without a source it checks structure, index, the tensors the
// config needs and checksums.xxh128; with --full --source it also compares every
// expert byte with the source and re-derives every quantized tensor from it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "k3/core/error.h"

namespace k3::repack {

struct VerifyOptions {
  std::string dst;
  std::string source;  // HF snapshot; needed for full
  bool full = false;
  int threads = 0;  // files verified in parallel; 0 = online CPUs
  uint64_t block_bytes = 16u << 20;
  // Reads bypass the page cache (O_DIRECT) where the filesystem allows it; the
  // tool sets it from K3_DIRECT at start-up.
  bool direct = true;
  // Called after each file is hashed (from worker threads, one call at a time).
  std::function<void(size_t files_done, size_t files_total, uint64_t bytes_hashed)> progress;
};

struct Problem {
  ErrorCode code = ErrorCode::kCorrupt;
  std::string file;
  std::string tensor;
  int64_t offset = -1;  // absolute byte offset in `file`, -1 when not about a byte
  std::string detail;
  std::string ToString() const;
};

struct VerifyReport {
  // Root causes first (a missing or unreadable shard), then the rest sorted by
  // file and offset; what a root cause explains is counted, not listed.
  std::vector<Problem> problems;
  size_t consequences_folded = 0;
  size_t shards = 0;
  size_t tensors = 0;
  size_t files_hashed = 0;
  uint64_t bytes_hashed = 0;
  uint64_t expert_bytes_compared = 0;
  uint64_t source_bytes_read = 0;
  size_t quantized_tensors_rederived = 0;
  size_t passthrough_tensors_compared = 0;
  double seconds = 0;
  // When not ok: the k3-repack command that repairs what was found (the source
  // path is the one given to --source, else the placeholder SRC).
  std::string repair_command;
  bool ok() const { return problems.empty(); }
  // Exit code: 0 when ok, else that of the first problem's code.
  int ExitCode() const;
};

// Throws k3::Error only when verification cannot start (DST is not a directory,
// --full without a readable source); everything else is a Problem.
VerifyReport VerifyContainer(const VerifyOptions& options);

}  // namespace k3::repack
