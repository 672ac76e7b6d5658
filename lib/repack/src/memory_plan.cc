#include "memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "k3/core/error.h"
#include "k3/repack/repack.h"

namespace k3::repack {
namespace {

// PipelineDepth with one stream.
constexpr size_t kPipelineDepth = 4;

std::string BlockText(uint64_t bytes) {
  return bytes % (1 << 20) == 0 ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

size_t PipelineDepth(int streams) {
  return std::max<size_t>(2, kPipelineDepth / static_cast<size_t>(std::max(1, streams)));
}

size_t BlocksPerStream(int streams, int reads, int writes) {
  const size_t depth = PipelineDepth(streams);
  const size_t read_pool = depth + static_cast<size_t>(std::max(1, reads)) - 1;
  // Quantized blocks are at most half their source block (int8 from BF16/F16;
  // a quarter from F32, less for int4), and are allocated at that size.
  const size_t out_pool = (depth + 1) / 2;
  const size_t stages = static_cast<size_t>(std::max(1, writes)) + 1;
  return read_pool + out_pool + stages;
}

uint64_t PipelineBufferBytes(int streams, int reads, int writes, uint64_t block_bytes) {
  return static_cast<uint64_t>(std::max(1, streams)) * BlocksPerStream(streams, reads, writes) *
         block_bytes;
}


PipelinePlan ResolvePipeline(const RepackOptions& o, size_t shards_todo, uint64_t mem_available,
                             uint64_t address_space) {
  PipelinePlan p;
  p.budget_given = o.mem_budget_bytes > 0;
  if (p.budget_given) {
    p.budget_bytes = o.mem_budget_bytes;
  } else {
    // A quarter of what the machine has free, at most the default: the budget
    // is for buffers, and the page cache and other processes need the rest.
    p.budget_bytes = kDefaultMemBudgetBytes;
    if (mem_available > 0) {
      p.budget_bytes = std::min(p.budget_bytes, std::max(kMinMemBudgetBytes, mem_available / 4));
    }
    // Under an address-space limit (ulimit -v), the buffers share it with a
    // stack per pipeline thread, the malloc arenas and the mapped binary.
    if (address_space > 0) {
      const uint64_t fit = std::max(kMinMemBudgetBytes, address_space / 8 * 3);
      if (fit < p.budget_bytes) {
        p.budget_bytes = fit;
        p.budget_by_address_space = true;
      }
    }
  }
  const int cap = static_cast<int>(std::clamp<size_t>(shards_todo, 1, kMaxStreams));
  p.streams_auto = o.streams <= 0;
  p.reads_auto = o.reads_in_flight <= 0;
  p.writes_auto = o.writes_in_flight <= 0;
  p.block_auto = o.block_bytes == 0;
  p.streams = std::min(p.streams_auto ? kDefaultStreams : o.streams, cap);
  auto bytes = [&] { return PipelineBufferBytes(p.streams, p.reads, p.writes, p.block_bytes); };
  // The disk measured in docs/PERFORMANCE.md rewards bytes in flight, in
  // blocks of 8 MiB or more: the first of these that fits the budget is taken,
  // the block size before the count (automatic reads and writes are equal).
  //   block 8 MiB, in flight 16 down to 4; then 4 MiB, 16 down to 4; ... 1 MiB;
  //   then 1 MiB with 3 down to 1 in flight; then fewer automatic streams.
  auto try_counts = [&](int hi, int lo) {
    for (int n = hi; n >= lo; --n) {
      p.reads = p.reads_auto ? n : o.reads_in_flight;
      p.writes = p.writes_auto ? n : o.writes_in_flight;
      if (bytes() <= p.budget_bytes) return true;
      if (!p.reads_auto && !p.writes_auto) return false;
    }
    return false;
  };
  bool fits = false;
  for (uint64_t b = kMaxAutoBlockBytes; !fits && b >= kMinAutoBlockBytes; b /= 2) {
    p.block_bytes = p.block_auto ? b : o.block_bytes;
    fits = try_counts(kDefaultReadsInFlight, kMinAutoInFlight);
    if (!p.block_auto) break;
  }
  while (!fits) {
    fits = try_counts(kMinAutoInFlight - 1, 1);
    if (fits || !p.streams_auto || p.streams == 1) break;
    --p.streams;
    fits = try_counts(kDefaultReadsInFlight, 1);
  }
  if (!fits && p.reads_auto) p.reads = 1;
  if (!fits && p.writes_auto) p.writes = 1;
  p.buffer_bytes = bytes();
  if (p.budget_given && p.buffer_bytes > p.budget_bytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "--mem-mb " + std::to_string(p.budget_bytes >> 20) + ": --streams " +
                    std::to_string(p.streams) + " --reads " + std::to_string(p.reads) + " --writes " +
                    std::to_string(p.writes) + " with " + BlockText(p.block_bytes) +
                    " blocks need " + std::to_string((p.buffer_bytes + (1 << 20) - 1) >> 20) +
                    " MiB of buffers; raise --mem-mb or lower the flags given (0 = automatic)");
  }
  return p;
}

std::string PipelinePlan::Describe() const {
  auto src = [](bool a) { return a ? "" : " (given)"; };
  char buf[512];
  const uint64_t mib = 1 << 20;
  const std::string automatic =
      budget_by_address_space
          ? std::string("automatic: 3/8 of the address-space limit, RLIMIT_AS")
          : "automatic: the smaller of " + std::to_string(kDefaultMemBudgetBytes / mib) + " MiB and MemAvailable / 4";
  const std::string block = BlockText(block_bytes);
  std::snprintf(buf, sizeof buf,
                "%d stream(s)%s x %d read(s)%s and %d write(s)%s in flight, %s blocks%s: buffers "
                "<= %llu MiB of a %llu MiB budget (%s)",
                streams, src(streams_auto), reads, src(reads_auto), writes, src(writes_auto),
                block.c_str(), src(block_auto),
                static_cast<unsigned long long>((buffer_bytes + mib - 1) / mib),
                static_cast<unsigned long long>(budget_bytes / mib),
                budget_given                  ? "--mem-mb"
                : buffer_bytes > budget_bytes ? "automatic; the flags given exceed it"
                                              : automatic.c_str());
  return buf;
}

}  // namespace k3::repack
