// Facts every k3-bench area stamps on its JSON lines (source revision, CPU) and
// the median and range they report, so the areas agree on all of them.
#pragma once

#include <string>

#include "k3/core/json_writer.h"
#include <vector>

namespace k3::bench {

// Short git revision of the measured source tree ("unknown" outside a checkout).
std::string SourceRevision();
// The CPU's "model name" from /proc/cpuinfo ("unknown" if absent).
std::string CpuModel();
// The median (mean of the two middle values for an even count; 0 for none).
double Median(std::vector<double> v);

// A measurement's runs: median and range (all 0 for no runs).
struct Summary {
  double median = 0, min = 0, max = 0;
};
Summary Summarise(std::vector<double> v);
// Writes `key`: {"median": .., "min": .., "max": ..}, the one form every area
// reports a measurement's runs in.
void PutSummary(JsonWriter& j, const std::string& key, const Summary& s);
void PutSummary(JsonWriter& j, const std::string& key, const std::vector<double>& runs);

}  // namespace k3::bench
