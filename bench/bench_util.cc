#include "bench_util.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

namespace k3::bench {

std::string SourceRevision() {
  std::string cmd =
      std::string("git -C '") + K3_SOURCE_DIR + "' rev-parse --short=12 HEAD 2>/dev/null";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[64];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  }
  return "unknown";
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Summary Summarise(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = Median(v);
  s.min = v.front();
  s.max = v.back();
  return s;
}

void PutSummary(JsonWriter& j, const std::string& key, const Summary& s) {
  j.Key(key).BeginObject().Field("median", s.median).Field("min", s.min).Field("max", s.max).EndObject();
}

void PutSummary(JsonWriter& j, const std::string& key, const std::vector<double>& runs) {
  PutSummary(j, key, Summarise(runs));
}

}  // namespace k3::bench
