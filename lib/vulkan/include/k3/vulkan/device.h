// One Vulkan compute device for the expert tier: loader (volk), instance,
// device choice, the queue, limits, RAII buffers, and the MXFP4 expert
// kernels (shaders/*.comp, embedded SPIR-V). docs/vulkan.md.
//
// Ownership: Device owns the instance, the logical device and everything
// created from it must be destroyed first (Buffer and ExpertKernels hold a
// Device& and must not outlive it). Thread-safety: Device::Submit and
// CreateBufferOrThrow may be called from several threads (the queue is
// guarded); a Buffer, an Uploader or an ExpertKernels belongs to one thread.
// Failures throw k3::Error: kUnsupported (no loader, no device, no compute
// queue, a limit too small), kIo (a Vulkan call failed, device lost), kNoSpace
// (an allocation failed). Injected faults (tests) take exactly those paths.
#pragma once

#include <volk.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace k3::vulkan {

// Faults a test can inject (K3_VK_FAULT). Each makes the same call fail the
// way the driver would: allocation -> VK_ERROR_OUT_OF_DEVICE_MEMORY, submit ->
// VK_ERROR_INITIALIZATION_FAILED from vkQueueSubmit, lost ->
// VK_ERROR_DEVICE_LOST from the fence wait.
enum class Fault : uint8_t { kNone = 0, kAlloc, kSubmit, kDeviceLost };

struct DeviceOptions {
  int device_index = -1;  // K3_VK_DEVICE: index into vkEnumeratePhysicalDevices; -1 = best
  bool validate = false;  // enable VK_LAYER_KHRONOS_validation when installed
  Fault fault = Fault::kNone;
  int fault_after = 0;  // the fault fires on call number fault_after (0 = the first)
};

struct DeviceInfo {
  std::string name;
  std::string type;  // "discrete", "integrated", "virtual", "cpu", "other"
  uint32_t subgroup_size = 0;
  uint64_t max_storage_range = 0;   // bytes one storage-buffer binding may span
  uint64_t max_allocation = 0;      // bytes one VkDeviceMemory may hold
  uint64_t device_local_bytes = 0;  // the largest device-local heap
  bool validation = false;          // the validation layer is active
};

// True when a Vulkan loader can be opened (volkInitialize succeeds).
bool LoaderPresent();

// Throws k3::Error naming `what` unless r is VK_SUCCESS (kNoSpace for an
// out-of-memory result, kIo otherwise).
void CheckVkOrThrow(VkResult r, const char* what);

// The layouts every k3 compute shader uses: `bindings` storage buffers at
// bindings 0.., compute stage, and `push_bytes` of push constants.
void MakeStorageLayoutsOrThrow(VkDevice dev, uint32_t bindings, uint32_t push_bytes,
                               VkDescriptorSetLayout* set_layout, VkPipelineLayout* layout);

// A compute pipeline of `spirv` (entry "main") on `layout`, its
// specialization constant 0 set to `tokens`. Throws k3::Error naming the call.
VkPipeline MakeComputePipeline(VkDevice dev, VkPipelineLayout layout,
                               std::span<const uint32_t> spirv, uint32_t tokens);

class Device;

// A VkBuffer with its own VkDeviceMemory. Host-visible kinds stay mapped.
class Buffer {
 public:
  enum class Kind : uint8_t {
    kDeviceLocal,  // storage + transfer destination; device-local memory when any
    kHostVisible,  // storage, host-visible + coherent, mapped
    kStaging,      // transfer source, host-visible + coherent, mapped
  };
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  VkBuffer handle() const { return buffer_; }
  uint64_t bytes() const { return bytes_; }
  std::byte* mapped() const { return mapped_; }  // null unless host-visible

 private:
  friend class Device;
  void Reset() noexcept;
  VkDevice device_ = VK_NULL_HANDLE;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  uint64_t bytes_ = 0;
  std::byte* mapped_ = nullptr;
};

class Device {
 public:
  static std::unique_ptr<Device> OpenOrThrow(const DeviceOptions& options);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  VkDevice handle() const { return device_; }
  uint32_t queue_family() const { return queue_family_; }

  Buffer CreateBufferOrThrow(uint64_t bytes, Buffer::Kind kind);
  // vkQueueSubmit of one command buffer signalling `fence`, under the queue lock.
  // Injected submit / device-lost faults count `compute` calls only (the
  // expert kernels' steps, not the uploads), so a test can aim at step N.
  void SubmitOrThrow(VkCommandBuffer cmd, VkFence fence, bool compute);
  // Waits for `fence` (then resets it); a lost device or a timeout throws kIo.
  void WaitOrThrow(VkFence fence, bool compute);
  // Errors the validation layer reported so far (0 when it is not active).
  uint64_t validation_errors() const { return validation_errors_.load(); }

 private:
  Device() = default;
  static VKAPI_ATTR VkBool32 VKAPI_CALL OnMessage(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                  VkDebugUtilsMessageTypeFlagsEXT types,
                                                  const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                  void* self);
  bool InjectNow(Fault f);

  DeviceOptions options_;
  DeviceInfo info_;
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  VkPhysicalDeviceMemoryProperties memory_{};
  std::mutex queue_mu_;
  std::atomic<uint64_t> validation_errors_{0};
  std::atomic<int> alloc_calls_{0}, submit_calls_{0}, wait_calls_{0};
};

// A command pool, one command buffer and one fence: what one thread needs to
// submit work and wait for it.
class CommandContext {
 public:
  CommandContext(Device& device, bool compute);
  ~CommandContext();
  CommandContext(const CommandContext&) = delete;
  CommandContext& operator=(const CommandContext&) = delete;
  VkCommandBuffer Begin();  // resets and begins the command buffer
  void SubmitOrThrow();     // ends it and submits
  void WaitOrThrow();
  bool pending() const { return pending_; }

 private:
  Device& device_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  bool compute_ = false;
  bool pending_ = false;
};

// Copies host bytes into device-local buffers through one staging buffer.
class Uploader {
 public:
  Uploader(Device& device, uint64_t staging_bytes);
  // Blocks until the copy is done. `bytes` may exceed the staging size.
  void UploadOrThrow(const Buffer& dst, uint64_t dst_offset, std::span<const std::byte> bytes);

 private:
  Buffer staging_;
  CommandContext ctx_;
};

// Where the six parts of one routed expert sit inside a device slot: the
// bytes as stored (canonical order w1p, w1s, w2p, w2s, w3p, w3s), each part at
// a 16-byte aligned offset so the shaders read nibbles as whole words.
struct SlotLayout {
  uint64_t offset[6] = {};
  uint64_t bytes[6] = {};
  uint64_t slot_bytes = 0;  // a multiple of 16
  static SlotLayout For(uint32_t moe_inter, uint32_t latent);
};

// The two compute pipelines (gate_up: w1, w3, SiTU-GLU; down: w2) and their
// I/O buffers for up to `max_pairs` rows per submission.
class ExpertKernels {
 public:
  struct Shape {
    uint32_t moe_inter = 0;  // MI (multiple of 32)
    uint32_t latent = 0;     // LT (multiple of 32)
    float situ_beta = 0;
    float situ_linear_beta = 0;
  };
  // One expert over rows [row, row + n) of the activation buffer.
  struct Job {
    uint32_t weights = 0;      // index returned by AddWeights
    uint64_t slot_offset = 0;  // byte offset of the expert's slot in that buffer
    uint32_t row = 0;
    uint32_t n = 0;
  };

  // Weight buffers one ExpertKernels can bind (its descriptor pool's size).
  static constexpr uint32_t kMaxWeightBuffers = 64;

  ExpertKernels(Device& device, Shape shape, uint32_t max_pairs);
  ~ExpertKernels();
  ExpertKernels(const ExpertKernels&) = delete;
  ExpertKernels& operator=(const ExpertKernels&) = delete;

  // Registers a weight buffer (a slab of slots); returns its index for Job.
  uint32_t AddWeights(const Buffer& slab);
  uint32_t max_pairs() const { return max_pairs_; }
  const SlotLayout& layout() const { return layout_; }
  float* acts() { return reinterpret_cast<float*>(acts_.mapped()); }  // [max_pairs][LT]
  const float* out() const { return reinterpret_cast<const float*>(out_.mapped()); }

  // Records gate_up for every job, one barrier, down for every job; submits.
  void SubmitOrThrow(std::span<const Job> jobs);
  void WaitOrThrow() { ctx_.WaitOrThrow(); }

 private:
  VkPipeline MakePipeline(std::span<const uint32_t> spirv);

  Device& device_;
  Shape shape_;
  uint32_t max_pairs_;
  SlotLayout layout_;
  Buffer acts_, hid_, out_;
  CommandContext ctx_;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout_ = VK_NULL_HANDLE;
  VkPipeline gate_up_ = VK_NULL_HANDLE, down_ = VK_NULL_HANDLE;
  VkDescriptorPool pool_ = VK_NULL_HANDLE;
  std::vector<std::pair<VkDescriptorSet, VkDescriptorSet>> sets_;  // per weights: (up, down)
};

inline constexpr uint32_t kTokensPerGroup = 4;  // the shaders' kTokens

}  // namespace k3::vulkan
