// A rank's capacity for the placement, measured at start (--cluster-ram-gb
// auto, --cluster-disk-gbps auto; docs/cluster.md "Placement").
//
// RAM: the expert cache this rank's store would be sized to (K3_EXPERT_GB, or
// MemAvailable minus the resident process and the reserve: stream::PlanCache).
// Disk: a timed read of expert bytes from this rank's own files, O_DIRECT so
// that the page cache does not count, several reads in flight as the store's
// pread pool has them, spread over the layers; holes (a prepared share's
// bytes of other ranks) are skipped.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <thread>

#include "k3/cluster/cluster.h"
#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"

namespace k3::cluster {
namespace {

constexpr uint64_t kAlign = 4096;
constexpr uint64_t kPiece = 4ull << 20;  // one read

struct Range {
  const std::string* path;
  uint64_t offset, length;
};

// Two significant digits, rounded down: a measurement that wobbles by a few
// per cent still gives the same placement on most restarts.
uint64_t TwoDigits(double v) {
  if (!(v >= 1)) return 0;
  const double scale = std::pow(10.0, std::floor(std::log10(v)) - 1);
  return static_cast<uint64_t>(std::floor(v / scale) * scale);
}

// The expert ranges to sample: every part of every present expert, the
// experts visited with a stride coprime to their count so the sample spreads
// over layers and files.
std::vector<Range> SampleRanges(const model::ExpertTable& t) {
  std::vector<Range> out;
  std::vector<std::pair<int64_t, int64_t>> present;
  for (int64_t l = t.first_moe_layer(); l < t.num_layers(); ++l) {
    for (int64_t e = 0; e < t.num_experts(); ++e) {
      if (t.present(l, e)) present.emplace_back(l, e);
    }
  }
  const size_t n = present.size();
  size_t stride = n > 7 ? n / 7 + 1 : 1;
  while (n > 1 && std::gcd(stride, n) != 1) ++stride;
  for (size_t i = 0, k = 0; i < n; ++i, k = (k + stride) % n) {
    const auto [l, e] = present[k];
    for (int p = 0; p < model::kExpertParts; ++p) {
      const auto part = static_cast<model::ExpertPart>(p);
      out.push_back({&t.path(l, e), t.offset(l, e, part), t.part_bytes(part)});
    }
  }
  return out;
}

}  // namespace

DiskRate MeasureDiskRate(const model::ExpertTable& table, double max_seconds, uint64_t max_bytes,
                         int threads) {
  const std::vector<Range> ranges = SampleRanges(table);
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> buffered{false};
  std::atomic<int> errors{0};
  const double t0 = NowSeconds();
  auto worker = [&] {
    std::map<const std::string*, int> fds;
    void* raw = nullptr;
    if (posix_memalign(&raw, kAlign, kPiece) != 0) return;
    std::unique_ptr<void, void (*)(void*)> buf(raw, std::free);
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= ranges.size() || bytes.load() >= max_bytes || NowSeconds() - t0 >= max_seconds) break;
      const Range& r = ranges[i];
      int& fd = fds[r.path];
      if (fd == 0) {
        fd = ::open(r.path->c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (fd < 0) {
          fd = ::open(r.path->c_str(), O_RDONLY | O_CLOEXEC);  // no O_DIRECT here (tmpfs)
          buffered.store(true);
        }
        if (fd < 0) {
          ++errors;
          continue;
        }
      }
      if (fd < 0) continue;
      // A hole is another rank's bytes in a prepared share: not this disk's.
      const off_t data = ::lseek(fd, static_cast<off_t>(r.offset), SEEK_DATA);
      if (data < 0 || static_cast<uint64_t>(data) != r.offset) continue;
      uint64_t pos = r.offset / kAlign * kAlign;
      const uint64_t end = (r.offset + r.length + kAlign - 1) / kAlign * kAlign;
      if (buffered.load()) (void)::posix_fadvise(fd, off_t(pos), off_t(end - pos), POSIX_FADV_DONTNEED);
      while (pos < end) {
        const ssize_t got = ::pread(fd, buf.get(), std::min(kPiece, end - pos), static_cast<off_t>(pos));
        if (got <= 0) {
          if (got < 0 && errno == EINTR) continue;
          if (got < 0) ++errors;
          break;
        }
        bytes.fetch_add(static_cast<uint64_t>(got));
        pos += static_cast<uint64_t>(got);
      }
    }
    for (auto& [path, fd] : fds) {
      if (fd > 0) ::close(fd);
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  DiskRate out;
  out.seconds = NowSeconds() - t0;
  out.bytes = bytes.load();
  out.direct = !buffered.load();
  out.errors = errors.load();
  out.bytes_per_s = out.seconds > 0 ? static_cast<double>(out.bytes) / out.seconds : 0;
  return out;
}

Capacity MeasureCapacity(const model::ExpertTable& table, uint64_t cache_bytes, Capacity given,
                         const ClusterOptions& options, int rank) {
  Capacity c = given;
  std::string how;
  if (options.measure_ram) {
    c.ram_bytes = TwoDigits(static_cast<double>(cache_bytes));
    how += " RAM " + FormatBytes(c.ram_bytes) + " (its expert cache)";
  }
  if (options.measure_disk) {
    const DiskRate d = MeasureDiskRate(table, options.measure_seconds, options.measure_bytes, 4);
    c.disk_bytes_per_s = TwoDigits(d.bytes_per_s);
    char line[256];
    std::snprintf(line, sizeof line, " disk %.3g GB/s (%s of experts in %.2f s, %s%s)",
                  static_cast<double>(c.disk_bytes_per_s) / 1e9, FormatBytes(d.bytes).c_str(), d.seconds,
                  d.direct ? "O_DIRECT" : "buffered: the page cache may inflate it",
                  d.errors ? ", some reads failed" : "");
    how += line;
  }
  if (!how.empty()) K3_LOG_INFO("cluster: rank %d measured its capacity:%s", rank, how.c_str());
  return c;
}

}  // namespace k3::cluster
