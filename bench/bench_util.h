// Facts every k3-bench area stamps on its JSON lines (source revision, CPU) and
// the median they report, so the areas agree on both.
#pragma once

#include <string>
#include <vector>

namespace k3::bench {

// Short git revision of the measured source tree ("unknown" outside a checkout).
std::string SourceRevision();
// The CPU's "model name" from /proc/cpuinfo ("unknown" if absent).
std::string CpuModel();
// The median (mean of the two middle values for an even count; 0 for none).
double Median(std::vector<double> v);
// This thread's CPU time: unlike the wall clock it excludes the time the thread
// was preempted, which on a shared machine is most of the slow tail.
double ThreadCpuSeconds();

}  // namespace k3::bench
