#include "source_stats.h"

#include <charconv>
#include <string_view>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/file.h"

namespace k3::repack {
namespace {

constexpr uint64_t kMaxStatsFileBytes = 16u << 20;

bool ParseU64(std::string_view s, uint64_t* v) {
  if (s.empty() || s.size() > 20) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

// "<seconds>.<9 digits>"
bool ParseTime(std::string_view s, struct timespec* t) {
  const size_t dot = s.find('.');
  uint64_t sec = 0, nsec = 0;
  if (dot == std::string_view::npos || s.size() - dot - 1 != 9 || !ParseU64(s.substr(0, dot), &sec) ||
      !ParseU64(s.substr(dot + 1), &nsec) || sec > static_cast<uint64_t>(INT64_MAX)) {
    return false;
  }
  t->tv_sec = static_cast<time_t>(sec);
  t->tv_nsec = static_cast<long>(nsec);
  return true;
}

}  // namespace

SourceStatManifest ReadSourceStats(const std::string& path) {
  SourceStatManifest m;
  if (!PathExists(path)) return m;
  const std::string text = ReadFileOrThrow(path, kMaxStatsFileBytes);
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string_view line(text.data() + pos, eol - pos);
    const int64_t line_at = static_cast<int64_t>(pos);
    ++line_no;
    pos = eol + 1;
    if (line.empty()) continue;
    // "<size> <mtime> <ctime> <inode>  <shard name>"
    const size_t sep = line.find("  ");
    std::vector<std::string_view> f;
    for (size_t at = 0; sep != std::string_view::npos && at < sep;) {
      size_t sp = line.find(' ', at);
      if (sp == std::string_view::npos || sp > sep) sp = sep;
      f.push_back(line.substr(at, sp - at));
      at = sp + 1;
    }
    SourceStat s;
    uint64_t ino = 0;
    const std::string_view name = sep == std::string_view::npos ? "" : line.substr(sep + 2);
    if (f.size() != 4 || !ParseU64(f[0], &s.size) || !ParseTime(f[1], &s.mtime) ||
        !ParseTime(f[2], &s.ctime) || !ParseU64(f[3], &ino) || name.empty() ||
        name.find('/') != std::string_view::npos) {
      throw Error(ErrorCode::kCorrupt,
                  "line " + std::to_string(line_no) +
                      " is not '<size> <mtime> <ctime> <inode>  <shard name>'",
                  path, line_at);
    }
    s.ino = static_cast<ino_t>(ino);
    if (!m.emplace(std::string(name), s).second) {
      throw Error(ErrorCode::kCorrupt, "shard listed twice", path, line_at, std::string(name));
    }
  }
  return m;
}

std::string RenderSourceStats(const SourceStatManifest& m) {
  std::string out;
  for (const auto& [name, s] : m) {
    out += std::to_string(s.size) + " " + TimeText(s.mtime) + " " + TimeText(s.ctime) + " " +
           std::to_string(static_cast<uint64_t>(s.ino)) + "  " + name + "\n";
  }
  return out;
}

std::optional<std::string> DescribeSourceChange(const SourceStat& recorded, const SourceStat& now) {
  std::string what;
  auto add = [&](const std::string& w) { what += (what.empty() ? "" : ", ") + w; };
  if (recorded.size != now.size) {
    add("size " + std::to_string(recorded.size) + " -> " + std::to_string(now.size) + " bytes");
  }
  if (!SameTime(recorded.mtime, now.mtime)) {
    add("mtime " + TimeText(recorded.mtime) + " -> " + TimeText(now.mtime));
  }
  if (!SameTime(recorded.ctime, now.ctime)) {
    add("ctime " + TimeText(recorded.ctime) + " -> " + TimeText(now.ctime));
  }
  if (recorded.ino != now.ino) {
    add("inode " + std::to_string(static_cast<uint64_t>(recorded.ino)) + " -> " +
        std::to_string(static_cast<uint64_t>(now.ino)));
  }
  if (what.empty()) return std::nullopt;
  return what;
}

}  // namespace k3::repack
