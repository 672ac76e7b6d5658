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
// This thread's CPU time: unlike the wall clock it excludes the time the thread
// was preempted, which on a shared machine is most of the slow tail.
double ThreadCpuSeconds();

// A measurement's runs: median and range (all 0 for no runs).
struct Summary {
  double median = 0, min = 0, max = 0;
};
Summary Summarise(std::vector<double> v);
// Writes `key`: {"median": .., "min": .., "max": ..}, the one form every area
// reports a measurement's runs in.
void PutSummary(JsonWriter& j, const std::string& key, const Summary& s);
void PutSummary(JsonWriter& j, const std::string& key, const std::vector<double>& runs);

// The IDOT GEMM tile's arithmetic ceiling on this core (bench/cmd_mix.cc): the
// share of the vpdpbusd peak left when each 8 vpdpbusd of a (row, activation)
// pair are followed by the block's float work, cvt + mul + fma for the nibble
// formats (MXFP4, int4-g64) and cvt + fma for int8, the better of the two
// schedules the mix bench times. Register-only loops on the calling thread,
// about `seconds` per repetition, the median of `reps`. measured is false on
// CPUs without AVX-512 VNNI (the tile's ISA; no ceiling is claimed there).
struct MixCeiling {
  bool measured = false;
  double nibble = 1, int8 = 1, mxfp4 = 1;  // shares of the active ISA's IDOT roof
  const char* isa = "";                    // whose tile mix: "avx512", "avx2"
};
MixCeiling MeasureMixCeiling(double seconds, int reps);

}  // namespace k3::bench
