#include "cli.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string_view>
#include <system_error>

#include "k3/core/error.h"
#include "k3/core/sys.h"

namespace k3::repack_cli {
namespace {

bool ParseInt(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

std::vector<int64_t> ParseShardList(const std::string& list) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i <= list.size()) {
    size_t j = list.find(',', i);
    if (j == std::string::npos) j = list.size();
    std::string_view part(list.data() + i, j - i);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    if (!part.empty()) {
      size_t dash = part.find('-');
      int64_t a, b;
      bool ok = dash == std::string_view::npos
                    ? ParseInt(part, &a) && (b = a, true)
                    : ParseInt(part.substr(0, dash), &a) && ParseInt(part.substr(dash + 1), &b);
      if (!ok || a < 1 || b < a || b - a > 1000000) {
        throw Error(ErrorCode::kInvalidArgument,
                    "--shards: '" + std::string(part) + "' is not N or N-M (1-based)");
      }
      for (int64_t v = a; v <= b; ++v) out.push_back(v);
    }
    i = j + 1;
  }
  if (out.empty()) throw Error(ErrorCode::kInvalidArgument, "--shards: empty list");
  return out;
}

void ParseWorker(const std::string& spec, int* index, int* count) {
  size_t slash = spec.find('/');
  int64_t i, n;
  if (slash == std::string::npos || !ParseInt(std::string_view(spec).substr(0, slash), &i) ||
      !ParseInt(std::string_view(spec).substr(slash + 1), &n) || n < 1 || n > 100000 || i < 0 ||
      i >= n) {
    throw Error(ErrorCode::kInvalidArgument,
                "--worker '" + spec + "': expected I/N with 0 <= I < N (e.g. 0/4)");
  }
  *index = static_cast<int>(i);
  *count = static_cast<int>(n);
}

std::string ProgressLine(const repack::RepackEvent& e) {
  const double rate = e.convert_seconds > 0 ? static_cast<double>(e.bytes_done) / e.convert_seconds : 0;
  std::string eta = "--";
  if (e.convert_seconds >= 1.0 && e.bytes_done > 0 && rate > 0) {
    const double left = static_cast<double>(e.bytes_todo - std::min(e.bytes_todo, e.bytes_done));
    eta = std::to_string(static_cast<long long>(left / rate + 0.5)) + " s";
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "\r\033[K  %s  %s / %s  %.2f GB/s  ETA %s", e.shard.c_str(),
                FormatBytes(e.bytes_done).c_str(), FormatBytes(e.bytes_todo).c_str(), rate / 1e9, eta.c_str());
  return buf;
}

}  // namespace k3::repack_cli
