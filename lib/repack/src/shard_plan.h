// What one output shard is: its kept source tensors in output order, the
// planned header, and the contiguous segments the pipeline works through.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "k3/container/safetensors.h"
#include "k3/repack/classify.h"
#include "k3/repack/container.h"
#include "transform.h"

namespace k3::repack {

enum class Op : uint8_t { kCopy, kQuant };

// One kept source tensor, in output order.
struct Item {
  const TensorInfo* src = nullptr;
  TensorRole role = TensorRole::kPassthrough;
  Op op = Op::kCopy;
  QuantShape qshape;
  uint64_t rows = 0, cols = 0;
  size_t out_index = 0;  // first output entry (quantized: entry and entry+1)
};

// What the source file was when its header was read (pre-flight): a shard is
// published only if its source is still that at the end of the shard.
struct SourceStat {
  uint64_t size = 0;
  struct timespec mtime {};
  struct timespec ctime {};
  dev_t dev = 0;
  ino_t ino = 0;
};

SourceStat SourceStatOf(const struct stat& st);
// "1764630000.123456789": seconds and 9 digits of nanoseconds, as messages and
// k3-repack.source-stats write a time.
std::string TimeText(const struct timespec& t);
bool SameTime(const struct timespec& a, const struct timespec& b);

struct ShardPlan {
  int64_t number = 0;
  const SafetensorsFile* src = nullptr;
  SourceStat src_stat;
  std::string out_name;
  std::vector<Item> items;
  std::vector<PlannedTensor> out;
  std::string header;       // JSON header bytes (padded)
  uint64_t src_bytes = 0;   // bytes of kept source tensors
  uint64_t file_bytes = 0;  // 8 + header + data
  uint64_t expert_bytes = 0;
};

// A contiguous piece of work in output order.
struct Segment {
  enum Kind : uint8_t { kCopy, kQuant, kScales } kind = kCopy;
  size_t item = 0;
  uint64_t src_off = 0, src_len = 0;  // absolute in the source file
  uint64_t dst_len = 0;
  uint64_t row0 = 0, rows = 0;
};

// Output shard `number` of `total` made from `src`: non-expert tensors in source
// order, then experts by (id, matrix, packed before scale). Throws kUnsupported
// for a tensor that must be quantized but is not a 2-D float matrix.
ShardPlan PlanShard(const SafetensorsFile& src, int64_t number, int64_t total,
                    const std::vector<bool>& is_kda, const QuantBits& bits);

// The plan's work in output order, cut at `block_bytes` of source (whole rows
// for quantized tensors, whose scales follow as one kScales segment).
std::vector<Segment> Segments(const ShardPlan& p, uint64_t block_bytes);

}  // namespace k3::repack
