// What the trunk's placement and the expert tier report: stats.vulkan_dense
// of `k3-run generate --json`, the summary line, and /metrics' k3_vk_* lines.
#include <cstdio>
#include <string>

#include "k3/core/sys.h"
#include "k3/vulkan/dense.h"
#include "k3/vulkan/tier.h"

namespace k3::vulkan {

void WriteDenseStatsJson(const DenseTier* dense, uint64_t tokens, JsonWriter& j) {
  j.Key("vulkan_dense");
  if (dense == nullptr) {
    j.Null();
    return;
  }
  const DenseStats s = dense->stats();
  j.BeginObject();
  j.Field("device", s.device);
  j.Field("mode", s.mode);
  j.Field("active", s.active);
  j.Field("matrices_on_device", s.matrices_on_device);
  j.Field("matrices_on_cpu", s.matrices_on_cpu);
  j.Field("bytes_on_device", s.bytes_on_device);
  j.Field("bytes_on_cpu", s.bytes_on_cpu);
  j.Key("classes_on_device");
  j.BeginObject();
  for (const auto& [k, v] : s.classes) j.Field(k.c_str(), v);
  j.EndObject();
  j.Field("calls_on_device", s.calls_on_device);
  j.Field("mlps_on_device", s.mlps_on_device);
  j.Field("device_ms", s.device_ms);
  j.Field("cpu_ms", s.cpu_ms);
  const double t = tokens ? static_cast<double>(tokens) : 1.0;
  j.Field("device_ms_per_token", s.device_ms / t);
  j.Field("cpu_ms_per_token", s.cpu_ms / t);
  if (s.validation) j.Field("validation_errors", s.validation_errors);
  j.EndObject();
}

void LogDenseSummary(const DenseTier* dense, uint64_t tokens) {
  if (dense == nullptr) return;
  const DenseStats s = dense->stats();
  const double t = tokens ? static_cast<double>(tokens) : 1.0;
  std::fprintf(stderr,
               "k3-run: vulkan dense %s%s | %llu trunk matrices on device (%s), %llu on CPU (%s) "
               "| device %.2f ms/token, CPU %.2f ms/token\n",
               s.device.c_str(), s.active ? "" : " (fell back to the CPU)",
               static_cast<unsigned long long>(s.matrices_on_device),
               FormatBytes(s.bytes_on_device).c_str(),
               static_cast<unsigned long long>(s.matrices_on_cpu),
               FormatBytes(s.bytes_on_cpu).c_str(), s.device_ms / t, s.cpu_ms / t);
}

std::string RenderVulkanMetrics(const VulkanTier* tier, const DenseTier* dense) {
  std::string o;
  char line[512];
  auto metric = [&](const char* name, const char* type, const char* help, double v,
                    const char* labels = "") {
    std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s%s %.9g\n", name, help, name,
                  type, name, labels, v);
    o += line;
  };
  if (tier != nullptr) {
    const TierStats s = tier->stats();
    metric("k3_vk_active", "gauge", "the expert tier computes on the device (0 after a fallback)",
           s.active);
    metric("k3_vk_experts_resident", "gauge", "routed experts resident on the device",
           static_cast<double>(s.experts_resident));
    metric("k3_vk_pairs_total", "counter", "routed (token, expert) pairs by where they ran",
           static_cast<double>(s.pairs_on_device), "{where=\"device\"}");
    o += "k3_vk_pairs_total{where=\"cpu\"} " + std::to_string(s.pairs_on_cpu) + "\n";
    metric("k3_vk_device_seconds_total", "counter", "expert tier: submit to fence, summed",
           s.device_ms / 1e3);
  }
  if (dense != nullptr) {
    const DenseStats s = dense->stats();
    metric("k3_vk_dense_active", "gauge", "the trunk placement computes on the device", s.active);
    metric("k3_vk_dense_matrices", "gauge", "trunk matrices by where they are computed",
           static_cast<double>(s.matrices_on_device), "{where=\"device\"}");
    o += "k3_vk_dense_matrices{where=\"cpu\"} " + std::to_string(s.matrices_on_cpu) + "\n";
    metric("k3_vk_dense_bytes", "gauge", "trunk weight bytes by where they are computed",
           static_cast<double>(s.bytes_on_device), "{where=\"device\"}");
    o += "k3_vk_dense_bytes{where=\"cpu\"} " + std::to_string(s.bytes_on_cpu) + "\n";
    metric("k3_vk_dense_seconds_total", "counter", "trunk matmul time by where it ran",
           s.device_ms / 1e3, "{where=\"device\"}");
    std::snprintf(line, sizeof line, "k3_vk_dense_seconds_total{where=\"cpu\"} %.9g\n",
                  s.cpu_ms / 1e3);
    o += line;
  }
  return o;
}

}  // namespace k3::vulkan
