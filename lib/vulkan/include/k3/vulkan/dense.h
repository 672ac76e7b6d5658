// The trunk on a Vulkan device: a model::DenseExecutor that holds some of the
// model's dense matrices (the fused shared experts first, then the largest
// per-token bytes, as K3_VK_DENSE and the budget allow) in their container
// formats (f32, int8 per-row, int4-g64; never re-encoded) and computes y = W x
// for them with one shader per format, f32 accumulation. docs/vulkan.md §6.
//
// Ownership: the DenseTier owns its own Device (beside the expert tier's) and
// keeps pointers to the model's Matrix objects, so it must be destroyed before
// the model's weights (Model owns it and does). The host copies stay: they are
// what the CPU computes with after a failure.
// Thread-safety: calls are serialised by an internal lock (one Session thread
// in practice). Failures never escape the executor calls: any Vulkan failure
// (allocation, submit, device lost) is announced once, the placement turns
// itself off and every later call answers false, so the CPU computes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "k3/core/json_writer.h"
#include "k3/model/dense_executor.h"
#include "k3/model/model.h"
#include "k3/quant/quant.h"
#include "k3/vulkan/device.h"
#include "k3/vulkan/tier.h"

namespace k3::vulkan {

// One trunk matrix the model computes with Linear, by class.
struct TrunkMatrix {
  const model::Matrix* matrix = nullptr;
  const char* cls = "";  // "shared", "dense_mlp", "latent", "mla", "kda", "head"
  int64_t layer = -1;    // -1: the head
  int unit = 0;          // matrices of one MLP share a unit (placed together)
};
// Every matrix of `weights` that Linear computes (MLA's kv_b, KDA's f32 gate
// projections and the router stay with the CPU code that reads them row-wise
// or for routing), shared experts first. Units number MLPs from 1; 0 = alone.
std::vector<TrunkMatrix> ListTrunk(const model::ModelWeights& weights);

struct DenseStats {
  std::string device;  // "" when never opened
  std::string mode;    // K3_VK_DENSE as resolved
  bool active = false;
  uint64_t matrices_on_device = 0, matrices_on_cpu = 0;
  uint64_t bytes_on_device = 0, bytes_on_cpu = 0;         // per-token weight bytes
  std::vector<std::pair<std::string, uint64_t>> classes;  // class -> matrices on the device
  uint64_t calls_on_device = 0;                           // matmuls and MLPs computed there
  uint64_t mlps_on_device = 0;  // MLP submissions (shared experts: beside the routed experts)
  double device_ms = 0;         // submit to fence, summed (host clock)
  double cpu_ms = 0;            // trunk matrices computed on the CPU meanwhile
  uint64_t validation_errors = 0;
  bool validation = false;
};

class DenseTier final : public model::DenseExecutor {
 public:
  // Opens the device, chooses and uploads the matrices. Throws k3::Error when
  // it cannot start (no loader, no device, an allocation or upload failed).
  // With DenseMode::kAuto on a device that is not discrete nothing is placed
  // (nothing_placed_reason() says why).
  DenseTier(model::Model& model, const TierOptions& options);
  ~DenseTier() override;

  bool MatMul(const model::Matrix& w, const float* x, size_t batch, float* y) override;
  bool BeginMlp(const model::MlpWeights& w, const float* x, size_t batch, float situ_beta,
                float situ_linear_beta) override;
  bool FinishMlp(float* out) override;
  void AddCpuSeconds(double seconds) override;

  bool active() const { return active_.load(); }
  bool holds(const model::Matrix& w) const { return placed_.count(&w) != 0; }
  const std::string& nothing_placed_reason() const { return nothing_reason_; }
  DenseStats stats() const;

 private:
  struct Piece {  // rows [r0, r0 + rows) of one matrix in one slab
    uint32_t slab = 0;
    uint64_t data_offset = 0;    // bytes, 16-aligned
    uint64_t scales_offset = 0;  // bytes, 16-aligned (unused for f32)
    uint32_t r0 = 0, rows = 0;
  };
  struct Placed {
    quant::WeightFormat format = quant::WeightFormat::kF32;
    uint32_t rows = 0, cols = 0;
    std::vector<Piece> pieces;
  };
  // One host-visible I/O buffer with its command buffer: `sync_` for single
  // matmuls, `async_` for an MLP in flight beside them.
  struct Io {
    Buffer buffer;
    std::unique_ptr<CommandContext> ctx;
    std::vector<VkDescriptorSet> sets;  // per slab: (slab, this buffer)
    uint64_t floats = 0;
    float* data() const { return reinterpret_cast<float*>(buffer.mapped()); }
  };

  void Disable(const std::string& why);
  // Slabs, I/O buffers, pipelines and the uploads of the chosen matrices.
  void Start(const std::vector<uint64_t>& slab_bytes, uint64_t slab_max);
  void LogStart(uint64_t budget);
  void BuildPipelines(uint32_t slabs);
  void DestroyHandles();
  void Record(VkCommandBuffer cmd, const Io& io, const Placed& m, uint32_t x_off, uint32_t y_off,
              uint32_t n) const;
  void RecordSitu(VkCommandBuffer cmd, const Io& io, uint32_t g_off, uint32_t u_off, uint32_t count,
                  float b1, float b2) const;
  static void Barrier(VkCommandBuffer cmd, bool to_host);
  void DrainPending();  // under mu_

  TierOptions options_;
  std::unique_ptr<Device> device_;
  std::vector<Buffer> slabs_;
  Io sync_, async_;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout_ = VK_NULL_HANDLE;
  VkDescriptorPool pool_ = VK_NULL_HANDLE;
  VkPipeline f32_ = VK_NULL_HANDLE, q8_ = VK_NULL_HANDLE, q4_ = VK_NULL_HANDLE,
             situ_ = VK_NULL_HANDLE;
  std::unordered_map<const model::Matrix*, Placed> placed_;
  std::string nothing_reason_;
  std::atomic<bool> active_{false};

  mutable std::mutex mu_;  // guards the I/O buffers, the pending MLP and stats_
  struct Pending {
    bool on = false;
    uint32_t n = 0, rows = 0, y_off = 0;
    double t0 = 0;
  } pending_;
  DenseStats stats_;
};

// Installs the dense placement on `model` when options.enabled (K3_VK=1) and
// K3_VK_DENSE chooses any matrix; logs one start-up line saying what went
// where, or why nothing did, and announces (once) a failure to start.
// Returns the executor or null.
DenseTier* InstallDense(model::Model& model, const TierOptions& options);
// The dense placement installed on `model`, or null.
DenseTier* InstalledDense(model::Model& model);

// `stats.vulkan_dense` of `k3-run generate --json` (null when off); `tokens`
// (prompt + decode steps) gives the per-token times.
void WriteDenseStatsJson(const DenseTier* dense, uint64_t tokens, JsonWriter& j);
// One summary line on stderr (nothing when dense is null).
void LogDenseSummary(const DenseTier* dense, uint64_t tokens);

// Prometheus text for /metrics (k3-run serve): k3_vk_* of the expert tier and
// of the trunk's placement; either may be null (its metrics are left out).
std::string RenderVulkanMetrics(const VulkanTier* tier, const DenseTier* dense);

}  // namespace k3::vulkan
