// The Vulkan expert tier: an ExpertExecutor that computes the pairs whose
// expert is resident on a Vulkan device (MXFP4 bytes as stored) while the CPU
// computes the others, with a budget filled hottest-first from a usage
// history and refreshed by an upload thread. docs/vulkan.md.
//
// Thread-safety: Run() is called by one thread (the Session's); the tier owns
// one upload thread. Failures never escape Run(): any Vulkan failure (shader,
// allocation, submit, device lost) is announced once, the tier turns itself
// off and the affected pairs are computed on the CPU, giving the CPU's bits.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "k3/core/json_writer.h"
#include "k3/model/expert_executor.h"
#include "k3/model/model.h"
#include "k3/vulkan/device.h"

namespace k3::vulkan {

// Which trunk matrices K3_VK_DENSE puts on the device (dense.h): none;
// the fused shared experts; every trunk matrix the budget holds (shared
// experts first, then the largest per-token bytes); auto = all on a discrete
// GPU, none on an integrated GPU or a CPU device (lavapipe), whose memory is
// the host's own: there the CPU reads the same bytes as fast.
enum class DenseMode : uint8_t { kAuto = 0, kNone, kShared, kAll };
const char* DenseModeName(DenseMode mode);

// Every knob of the tier. FromEnv() is the one place that reads the
// environment (K3_VK, K3_VK_GB, K3_VK_DEVICE, K3_VK_VALIDATE, K3_VK_PROMOTE,
// K3_VK_DENSE, K3_VK_FAULT, K3_VK_FAULT_AFTER, XDG_CACHE_HOME / HOME);
// lib/engine's EngineOptions::FromEnv can call it.
struct TierOptions {
  bool enabled = false;         // K3_VK=1
  double budget_gb = 0;         // K3_VK_GB (1e9 bytes); <= 0: a quarter of device-local memory
  uint64_t budget_bytes = 0;    // exact budget (tests); wins over budget_gb when > 0
  int device_index = -1;        // K3_VK_DEVICE
  bool validate = false;        // K3_VK_VALIDATE=1: validation layer + error count
  int promotions_per_step = 4;  // K3_VK_PROMOTE: uploads queued per MoE step, at most
  std::string cache_dir;        // history directory; empty: no history file
  Fault fault = Fault::kNone;   // K3_VK_FAULT=alloc|submit|lost (tests)
  int fault_after = 0;          // K3_VK_FAULT_AFTER: which call fails (0 = first)
  DenseMode dense = DenseMode::kAuto;  // K3_VK_DENSE=0|none|shared|all|auto (needs K3_VK=1)
  // Device bytes for trunk matrices (tests); 0: half of device-local memory,
  // at most 2 GB on a CPU device.
  uint64_t dense_budget_bytes = 0;
  uint64_t dense_slab_bytes = 0;  // largest weight buffer (tests: split a matrix); 0: the device's

  static TierOptions FromEnv();
  // The device part (index, validation, the fault hooks).
  DeviceOptions device_options() const {
    return {.device_index = device_index,
            .validate = validate,
            .fault = fault,
            .fault_after = fault_after};
  }
};

struct TierStats {
  std::string device;   // "" when the tier never opened one
  bool active = false;  // false after a fallback
  uint64_t experts_resident = 0;
  uint64_t slots = 0;  // capacity in experts
  uint64_t pairs_on_device = 0;
  uint64_t pairs_on_cpu = 0;
  uint64_t uploads = 0;
  uint64_t upload_bytes = 0;
  double device_ms = 0;  // wall time from submit to fence, summed
  uint64_t validation_errors = 0;
  bool validation = false;
};

// Usage history of earlier runs (docs/vulkan.md §4): counts per (layer,
// expert), keyed by the model's fingerprint. A file that is corrupt, of
// another model or of another shape is ignored with a warning, never trusted.
struct History {
  uint64_t fingerprint = 0;
  uint32_t layers = 0;
  uint32_t experts = 0;
  std::vector<uint64_t> counts;  // [layers][experts]

  static std::optional<History> Load(const std::string& path, uint64_t fingerprint, uint32_t layers,
                                     uint32_t experts);
  void SaveOrThrow(const std::string& path) const;
};
// Identity of a model for the history: config.json and the shards' names/sizes.
uint64_t ModelFingerprint(const Snapshot& snapshot);
std::string HistoryPath(const std::string& cache_dir, uint64_t fingerprint);

class VulkanTier final : public model::ExpertExecutor {
 public:
  // Opens the device and starts the upload thread. Throws k3::Error when the
  // tier cannot start (no loader, no device, shape unsupported, allocation).
  VulkanTier(model::Model& model, const TierOptions& options);
  ~VulkanTier() override;  // saves the history (a failure only warns)

  void Run(const model::ExpertBatch& batch, model::ExpertStore& store) override;
  // Read-ahead only for the experts the device does not hold (those are
  // computed there, never read from the store).
  void Prefetch(int64_t layer, std::span<const int32_t> likely, model::ExpertStore& store) override;
  // The CPU's experts first, then the device's (its batch buffer is its own).
  model::PairOrder pair_order() const override { return model::PairOrder::kAnyOrder; }

  // Blocks until every queued upload is done (tests, benchmarks).
  void WaitUploads();
  TierStats stats() const;
  void SaveHistory() const;
  bool active() const { return active_.load(); }
  // True when the expert's bytes are on the device now.
  bool resident(int64_t layer, int64_t expert) const;
  uint64_t slot_bytes() const { return kernels_->layout().slot_bytes; }

 private:
  struct Slot {
    int64_t layer = -1, expert = -1;  // -1: free
    bool ready = false;               // bytes on the device
    int pins = 0;                     // steps using it now
    uint32_t weights = 0;             // slab index
    uint64_t offset = 0;              // byte offset in the slab
  };
  size_t Key(int64_t layer, int64_t expert) const {
    return static_cast<size_t>(layer) * num_experts_ + static_cast<size_t>(expert);
  }
  uint64_t Heat(size_t key) const { return history_heat_[key] + run_heat_[key]; }
  // The device holds this expert, ready to compute (under mu_).
  bool OnDevice(size_t key) const {
    const int32_t s = slot_of_[key];
    return active_ && s >= 0 && slots_[static_cast<size_t>(s)].ready;
  }
  void Disable(const char* why);
  void QueuePromotions(int64_t layer, const std::vector<int32_t>& cpu_experts);
  void UploadLoop();

  model::Model& model_;
  TierOptions options_;
  model::CpuExpertExecutor cpu_;
  // Our own copy: the model's store (and its table) may be replaced later.
  model::ExpertTable table_;
  uint64_t fingerprint_ = 0;
  size_t num_layers_ = 0, num_experts_ = 0;
  size_t lt_ = 0, mi_ = 0;

  std::unique_ptr<Device> device_;
  std::vector<Buffer> slabs_;
  std::unique_ptr<ExpertKernels> kernels_;
  std::atomic<bool> active_{false};

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_, idle_cv_;
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_;  // [layer * E + expert] -> slot or -1
  std::vector<uint64_t> history_heat_, run_heat_;
  std::vector<size_t> queue_;  // keys to upload, hottest first
  std::vector<char> queued_;
  bool busy_ = false, stop_ = false;
  TierStats stats_;
  std::thread uploader_;
};

// Installs the tier on `model` when options.enabled; announces (once) why it
// could not start and leaves the CPU executor otherwise. Returns the tier or
// null. K3_VK=0 never opens the device.
VulkanTier* InstallTier(model::Model& model, const TierOptions& options);

// The tier installed on `model` (its executor), or null.
VulkanTier* InstalledTier(model::Model& model);

// The `stats.vulkan` object of `k3-run generate --json` (call between
// BeginObject of "stats" and its EndObject); writes null when tier is null.
void WriteTierStatsJson(const VulkanTier* tier, JsonWriter& j);
// One summary line on stderr (nothing when tier is null).
void LogTierSummary(const VulkanTier* tier);

}  // namespace k3::vulkan
