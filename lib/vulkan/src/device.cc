#include "k3/vulkan/device.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "shaders/mx_down.h"
#include "shaders/mx_gate_up.h"

namespace k3::vulkan {
namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";
constexpr uint64_t kWaitNs = 120ull * 1000 * 1000 * 1000;  // a hung device is a lost one

const char* ResultName(VkResult r) {
  switch (r) {
    case VK_SUCCESS:
      return "VK_SUCCESS";
    case VK_TIMEOUT:
      return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY:
      return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
      return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED:
      return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST:
      return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_LAYER_NOT_PRESENT:
      return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT:
      return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER:
      return "VK_ERROR_INCOMPATIBLE_DRIVER";
    default:
      return "VkResult";
  }
}

[[noreturn]] void Fail(ErrorCode code, const char* what, VkResult r) {
  throw Error(code, std::string("vulkan: ") + what + " failed: " + ResultName(r) + " (" +
                        std::to_string(static_cast<int>(r)) + ")");
}

void Check(VkResult r, const char* what) {
  if (r == VK_SUCCESS) return;
  Fail(r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY ? ErrorCode::kNoSpace
                                                                              : ErrorCode::kIo,
       what, r);
}

const char* TypeName(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "cpu";
    default:
      return "other";
  }
}

// discrete > integrated > virtual > CPU (lavapipe) > other.
int TypeRank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return 1;
    default:
      return 0;
  }
}

bool LayerAvailable(const char* name) {
  uint32_t n = 0;
  if (vkEnumerateInstanceLayerProperties(&n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkLayerProperties> layers(n);
  if (vkEnumerateInstanceLayerProperties(&n, layers.data()) != VK_SUCCESS) return false;
  for (const auto& l : layers) {
    if (std::strcmp(l.layerName, name) == 0) return true;
  }
  return false;
}

int ComputeQueueFamily(VkPhysicalDevice pd) {
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, fams.data());
  for (uint32_t i = 0; i < n; ++i) {
    if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

bool LoaderPresent() { return volkInitialize() == VK_SUCCESS; }

// --- Buffer ------------------------------------------------------------------
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = std::exchange(o.device_, VK_NULL_HANDLE);
    buffer_ = std::exchange(o.buffer_, VK_NULL_HANDLE);
    memory_ = std::exchange(o.memory_, VK_NULL_HANDLE);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = std::exchange(o.mapped_, nullptr);
  }
  return *this;
}

void Buffer::Reset() noexcept {
  if (device_ == VK_NULL_HANDLE) return;
  if (mapped_) vkUnmapMemory(device_, memory_);
  if (buffer_) vkDestroyBuffer(device_, buffer_, nullptr);
  if (memory_) vkFreeMemory(device_, memory_, nullptr);
  device_ = VK_NULL_HANDLE;
  buffer_ = VK_NULL_HANDLE;
  memory_ = VK_NULL_HANDLE;
  mapped_ = nullptr;
  bytes_ = 0;
}

// --- Device --------------------------------------------------------------------
VKAPI_ATTR VkBool32 VKAPI_CALL Device::OnMessage(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                 VkDebugUtilsMessageTypeFlagsEXT,
                                                 const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                 void* self) {
  if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    static_cast<Device*>(self)->validation_errors_.fetch_add(1);
    K3_LOG_ERROR("vulkan validation: %s", data && data->pMessage ? data->pMessage : "?");
  } else if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    K3_LOG_WARN("vulkan validation: %s", data && data->pMessage ? data->pMessage : "?");
  }
  return VK_FALSE;
}

bool Device::InjectNow(Fault f) {
  if (options_.fault != f) return false;
  std::atomic<int>& calls = f == Fault::kAlloc    ? alloc_calls_
                            : f == Fault::kSubmit ? submit_calls_
                                                  : wait_calls_;
  return calls.fetch_add(1) == options_.fault_after;
}

std::unique_ptr<Device> Device::OpenOrThrow(const DeviceOptions& options) {
  if (volkInitialize() != VK_SUCCESS) {
    throw Error(ErrorCode::kUnsupported, "vulkan: no loader (libvulkan.so.1 not found)");
  }
  std::unique_ptr<Device> d(new Device());
  d->options_ = options;
  const bool validate = options.validate && LayerAvailable(kValidationLayer);
  if (options.validate && !validate) {
    K3_LOG_WARN("vulkan: %s requested but not installed (vulkan-validationlayers)",
                kValidationLayer);
  }
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "k3";
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  const char* layers[] = {kValidationLayer};
  const char* exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
  VkDebugUtilsMessengerCreateInfoEXT mci{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  mci.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT |
                        VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT;
  mci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  mci.pfnUserCallback = &Device::OnMessage;
  mci.pUserData = d.get();
  // Synchronization validation too: it catches a missing barrier between the
  // uploads' copies and the shaders that read them.
  const VkValidationFeatureEnableEXT features[] = {
      VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  VkValidationFeaturesEXT vf{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
  vf.enabledValidationFeatureCount = 1;
  vf.pEnabledValidationFeatures = features;
  vf.pNext = &mci;  // the messenger also reports instance creation itself
  if (validate) {
    ici.enabledLayerCount = 1;
    ici.ppEnabledLayerNames = layers;
    ici.enabledExtensionCount = 1;
    ici.ppEnabledExtensionNames = exts;
    ici.pNext = &vf;
  }
  Check(vkCreateInstance(&ici, nullptr, &d->instance_), "vkCreateInstance");
  // Instance-level loading dispatches device calls through the loader's
  // trampolines, so several Devices in one process never share a table.
  volkLoadInstance(d->instance_);
  if (validate) {
    Check(vkCreateDebugUtilsMessengerEXT(d->instance_, &mci, nullptr, &d->messenger_),
          "vkCreateDebugUtilsMessengerEXT");
    d->info_.validation = true;
  }

  uint32_t n = 0;
  Check(vkEnumeratePhysicalDevices(d->instance_, &n, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> pds(n);
  Check(vkEnumeratePhysicalDevices(d->instance_, &n, pds.data()), "vkEnumeratePhysicalDevices");
  if (n == 0) throw Error(ErrorCode::kUnsupported, "vulkan: no physical device");
  int pick = -1;
  if (options.device_index >= 0) {
    if (options.device_index >= static_cast<int>(n)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "vulkan: K3_VK_DEVICE=" + std::to_string(options.device_index) + " but only " +
                      std::to_string(n) + " device(s)");
    }
    pick = options.device_index;
    if (ComputeQueueFamily(pds[static_cast<size_t>(pick)]) < 0) {
      throw Error(ErrorCode::kUnsupported,
                  "vulkan: device " + std::to_string(pick) + " has no compute queue");
    }
  } else {
    int best_rank = -1;
    for (uint32_t i = 0; i < n; ++i) {
      VkPhysicalDeviceProperties p;
      vkGetPhysicalDeviceProperties(pds[i], &p);
      if (p.apiVersion < VK_API_VERSION_1_1 || ComputeQueueFamily(pds[i]) < 0) continue;
      const int r = TypeRank(p.deviceType);
      if (r > best_rank) {
        best_rank = r;
        pick = static_cast<int>(i);
      }
    }
    if (pick < 0) throw Error(ErrorCode::kUnsupported, "vulkan: no Vulkan 1.1 compute device");
  }
  d->physical_ = pds[static_cast<size_t>(pick)];
  d->queue_family_ = static_cast<uint32_t>(ComputeQueueFamily(d->physical_));

  VkPhysicalDeviceSubgroupProperties sub{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties m3{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  sub.pNext = &m3;
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &sub;
  vkGetPhysicalDeviceProperties2(d->physical_, &p2);
  const VkPhysicalDeviceLimits& lim = p2.properties.limits;
  d->info_.name = p2.properties.deviceName;
  d->info_.type = TypeName(p2.properties.deviceType);
  d->info_.subgroup_size = sub.subgroupSize;
  d->info_.max_storage_range = lim.maxStorageBufferRange;
  d->info_.max_allocation = m3.maxMemoryAllocationSize;
  if (lim.maxComputeWorkGroupSize[0] < 64 || lim.maxComputeWorkGroupInvocations < 64 ||
      lim.maxPushConstantsSize < 40) {
    throw Error(ErrorCode::kUnsupported,
                "vulkan: " + d->info_.name + ": compute limits below 64 invocations / 40 bytes");
  }
  vkGetPhysicalDeviceMemoryProperties(d->physical_, &d->memory_);
  for (uint32_t i = 0; i < d->memory_.memoryHeapCount; ++i) {
    if (d->memory_.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      d->info_.device_local_bytes =
          std::max<uint64_t>(d->info_.device_local_bytes, d->memory_.memoryHeaps[i].size);
    }
  }

  const float prio = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = d->queue_family_;
  qci.queueCount = 1;
  qci.pQueuePriorities = &prio;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  Check(vkCreateDevice(d->physical_, &dci, nullptr, &d->device_), "vkCreateDevice");
  vkGetDeviceQueue(d->device_, d->queue_family_, 0, &d->queue_);
  return d;
}

Device::~Device() {
  if (device_) {
    vkDeviceWaitIdle(device_);
    vkDestroyDevice(device_, nullptr);
  }
  if (messenger_) vkDestroyDebugUtilsMessengerEXT(instance_, messenger_, nullptr);
  if (instance_) vkDestroyInstance(instance_, nullptr);
}

Buffer Device::CreateBufferOrThrow(uint64_t bytes, Buffer::Kind kind) {
  if (InjectNow(Fault::kAlloc))
    Fail(ErrorCode::kNoSpace, "vkAllocateMemory (injected)", VK_ERROR_OUT_OF_DEVICE_MEMORY);
  Buffer b;
  b.device_ = device_;
  b.bytes_ = bytes;
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = bytes;
  bci.usage = kind == Buffer::Kind::kStaging ? VK_BUFFER_USAGE_TRANSFER_SRC_BIT
              : kind == Buffer::Kind::kDeviceLocal
                  ? VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                        VK_BUFFER_USAGE_TRANSFER_SRC_BIT  // the bench's copy probe
                  : VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  Check(vkCreateBuffer(device_, &bci, nullptr, &b.buffer_), "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, b.buffer_, &req);
  const VkMemoryPropertyFlags want =
      kind == Buffer::Kind::kDeviceLocal
          ? VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
          : VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int type = -1;
  for (int pass = 0; pass < 2 && type < 0; ++pass) {
    // Device-local falls back to any type the buffer accepts (pass 1).
    const VkMemoryPropertyFlags need = pass == 0                            ? want
                                       : kind == Buffer::Kind::kDeviceLocal ? 0
                                                                            : want;
    for (uint32_t i = 0; i < memory_.memoryTypeCount; ++i) {
      if ((req.memoryTypeBits & (1u << i)) &&
          (memory_.memoryTypes[i].propertyFlags & need) == need) {
        type = static_cast<int>(i);
        break;
      }
    }
  }
  if (type < 0) {
    throw Error(ErrorCode::kUnsupported,
                "vulkan: no memory type for a buffer of " + std::to_string(bytes) + " bytes");
  }
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = static_cast<uint32_t>(type);
  Check(vkAllocateMemory(device_, &mai, nullptr, &b.memory_), "vkAllocateMemory");
  Check(vkBindBufferMemory(device_, b.buffer_, b.memory_, 0), "vkBindBufferMemory");
  if (kind != Buffer::Kind::kDeviceLocal) {
    void* p = nullptr;
    Check(vkMapMemory(device_, b.memory_, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
    b.mapped_ = static_cast<std::byte*>(p);
  }
  return b;
}

void Device::SubmitOrThrow(VkCommandBuffer cmd, VkFence fence, bool compute) {
  if (compute && InjectNow(Fault::kSubmit)) {
    Fail(ErrorCode::kIo, "vkQueueSubmit (injected)", VK_ERROR_INITIALIZATION_FAILED);
  }
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  std::lock_guard<std::mutex> lock(queue_mu_);
  Check(vkQueueSubmit(queue_, 1, &si, fence), "vkQueueSubmit");
}

void Device::WaitOrThrow(VkFence fence, bool compute) {
  VkResult r = vkWaitForFences(device_, 1, &fence, VK_TRUE, kWaitNs);
  if (r == VK_SUCCESS && compute && InjectNow(Fault::kDeviceLost)) r = VK_ERROR_DEVICE_LOST;
  if (r != VK_SUCCESS) Fail(ErrorCode::kIo, "vkWaitForFences", r);
  Check(vkResetFences(device_, 1, &fence), "vkResetFences");
}

// --- CommandContext --------------------------------------------------------------
CommandContext::CommandContext(Device& device, bool compute) : device_(device), compute_(compute) {
  VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pci.queueFamilyIndex = device.queue_family();
  Check(vkCreateCommandPool(device.handle(), &pci, nullptr, &pool_), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cai.commandPool = pool_;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  if (vkAllocateCommandBuffers(device.handle(), &cai, &cmd_) != VK_SUCCESS ||
      vkCreateFence(device.handle(), &fci, nullptr, &fence_) != VK_SUCCESS) {
    if (fence_) vkDestroyFence(device.handle(), fence_, nullptr);
    vkDestroyCommandPool(device.handle(), pool_, nullptr);
    throw Error(ErrorCode::kIo, "vulkan: command buffer / fence creation failed");
  }
}

CommandContext::~CommandContext() {
  // A pending submission must finish before its pool goes; errors here have
  // already been reported by whoever stopped waiting.
  if (pending_) vkWaitForFences(device_.handle(), 1, &fence_, VK_TRUE, kWaitNs);
  vkDestroyFence(device_.handle(), fence_, nullptr);
  vkDestroyCommandPool(device_.handle(), pool_, nullptr);
}

VkCommandBuffer CommandContext::Begin() {
  K3_CHECK(!pending_);
  Check(vkResetCommandBuffer(cmd_, 0), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  Check(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
  return cmd_;
}

void CommandContext::SubmitOrThrow() {
  Check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
  device_.SubmitOrThrow(cmd_, fence_, compute_);
  pending_ = true;
}

void CommandContext::WaitOrThrow() {
  if (!pending_) return;
  pending_ = false;  // a failed wait leaves the fence to the destructor's wait
  try {
    device_.WaitOrThrow(fence_, compute_);
  } catch (...) {
    pending_ = true;
    throw;
  }
}

// --- Uploader ------------------------------------------------------------------------
Uploader::Uploader(Device& device, uint64_t staging_bytes)
    : staging_(device.CreateBufferOrThrow(staging_bytes, Buffer::Kind::kStaging)),
      ctx_(device, false) {}

void Uploader::UploadOrThrow(const Buffer& dst, uint64_t dst_offset,
                             std::span<const std::byte> bytes) {
  K3_CHECK(dst_offset + bytes.size() <= dst.bytes());
  for (uint64_t done = 0; done < bytes.size();) {
    const uint64_t n = std::min<uint64_t>(staging_.bytes(), bytes.size() - done);
    std::memcpy(staging_.mapped(), bytes.data() + done, n);
    VkCommandBuffer cmd = ctx_.Begin();
    VkBufferCopy region{0, dst_offset + done, n};
    vkCmdCopyBuffer(cmd, staging_.handle(), dst.handle(), 1, &region);
    ctx_.SubmitOrThrow();
    ctx_.WaitOrThrow();
    done += n;
  }
}

// --- SlotLayout / ExpertKernels ---------------------------------------------------------
SlotLayout SlotLayout::For(uint32_t moe_inter, uint32_t latent) {
  SlotLayout s;
  const uint64_t n = static_cast<uint64_t>(moe_inter) * latent;
  const uint64_t sizes[6] = {n / 2, n / 32, n / 2, n / 32, n / 2, n / 32};
  uint64_t off = 0;
  for (int i = 0; i < 6; ++i) {
    s.offset[i] = off;
    s.bytes[i] = sizes[i];
    off += (sizes[i] + 15) / 16 * 16;
  }
  s.slot_bytes = off;
  return s;
}

namespace {
struct Push {
  uint32_t a_words, a_scales, b_words, b_scales, rows, cols, x_row, n;
  float beta1, beta2;
};
static_assert(sizeof(Push) == 40, "matches the shaders' push-constant block");
}  // namespace

ExpertKernels::ExpertKernels(Device& device, Shape shape, uint32_t max_pairs)
    : device_(device),
      shape_(shape),
      max_pairs_(max_pairs),
      layout_(SlotLayout::For(shape.moe_inter, shape.latent)),
      ctx_(device, true) {
  if (shape.moe_inter % 32 || shape.latent % 32 || max_pairs == 0) {
    throw Error(ErrorCode::kUnsupported, "vulkan: expert shape " + std::to_string(shape.moe_inter) +
                                             "x" + std::to_string(shape.latent) +
                                             " is not a multiple of 32");
  }
  const uint64_t wide = std::max(shape.moe_inter, shape.latent);
  if (static_cast<uint64_t>(max_pairs) * wide * 4 > device.info().max_storage_range) {
    throw Error(ErrorCode::kUnsupported, "vulkan: activation buffer exceeds the binding limit");
  }
  const VkDevice dev = device.handle();
  auto cleanup = [&] {
    if (gate_up_) vkDestroyPipeline(dev, gate_up_, nullptr);
    if (down_) vkDestroyPipeline(dev, down_, nullptr);
    if (pipeline_layout_) vkDestroyPipelineLayout(dev, pipeline_layout_, nullptr);
    if (set_layout_) vkDestroyDescriptorSetLayout(dev, set_layout_, nullptr);
    if (pool_) vkDestroyDescriptorPool(dev, pool_, nullptr);
  };
  try {
    acts_ = device.CreateBufferOrThrow(uint64_t{max_pairs} * shape.latent * 4,
                                       Buffer::Kind::kHostVisible);
    hid_ = device.CreateBufferOrThrow(uint64_t{max_pairs} * shape.moe_inter * 4,
                                      Buffer::Kind::kHostVisible);
    out_ = device.CreateBufferOrThrow(uint64_t{max_pairs} * shape.latent * 4,
                                      Buffer::Kind::kHostVisible);
    MakeStorageLayoutsOrThrow(dev, 3, sizeof(Push), &set_layout_, &pipeline_layout_);
    gate_up_ = MakePipeline(kMxGateUpSpv);
    down_ = MakePipeline(kMxDownSpv);
    VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                            2 * 3 * ExpertKernels::kMaxWeightBuffers};
    VkDescriptorPoolCreateInfo dp{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    dp.maxSets = 2 * ExpertKernels::kMaxWeightBuffers;
    dp.poolSizeCount = 1;
    dp.pPoolSizes = &ps;
    Check(vkCreateDescriptorPool(dev, &dp, nullptr, &pool_), "vkCreateDescriptorPool");
  } catch (...) {
    cleanup();
    throw;
  }
}

ExpertKernels::~ExpertKernels() {
  const VkDevice dev = device_.handle();
  try {
    ctx_.WaitOrThrow();
  } catch (const Error&) {
    // Already reported by the step that failed; only the handles matter now.
  }
  vkDestroyPipeline(dev, gate_up_, nullptr);
  vkDestroyPipeline(dev, down_, nullptr);
  vkDestroyPipelineLayout(dev, pipeline_layout_, nullptr);
  vkDestroyDescriptorSetLayout(dev, set_layout_, nullptr);
  vkDestroyDescriptorPool(dev, pool_, nullptr);
}

void CheckVkOrThrow(VkResult r, const char* what) { Check(r, what); }

void MakeStorageLayoutsOrThrow(VkDevice dev, uint32_t bindings, uint32_t push_bytes,
                               VkDescriptorSetLayout* set_layout, VkPipelineLayout* layout) {
  std::vector<VkDescriptorSetLayoutBinding> b(bindings);
  for (uint32_t i = 0; i < bindings; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo dl{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  dl.bindingCount = bindings;
  dl.pBindings = b.data();
  Check(vkCreateDescriptorSetLayout(dev, &dl, nullptr, set_layout), "vkCreateDescriptorSetLayout");
  VkPushConstantRange pr{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  VkPipelineLayoutCreateInfo pl{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pl.setLayoutCount = 1;
  pl.pSetLayouts = set_layout;
  pl.pushConstantRangeCount = 1;
  pl.pPushConstantRanges = &pr;
  Check(vkCreatePipelineLayout(dev, &pl, nullptr, layout), "vkCreatePipelineLayout");
}

VkPipeline MakeComputePipeline(VkDevice dev, VkPipelineLayout layout,
                               std::span<const uint32_t> spirv, uint32_t tokens) {
  VkShaderModuleCreateInfo smi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  smi.codeSize = spirv.size_bytes();
  smi.pCode = spirv.data();
  VkShaderModule mod = VK_NULL_HANDLE;
  Check(vkCreateShaderModule(dev, &smi, nullptr, &mod), "vkCreateShaderModule");
  VkSpecializationMapEntry me{0, 0, sizeof(uint32_t)};
  VkSpecializationInfo spec{1, &me, sizeof(tokens), &tokens};
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = mod;
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = &spec;
  ci.layout = layout;
  VkPipeline p = VK_NULL_HANDLE;
  const VkResult r = vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &ci, nullptr, &p);
  vkDestroyShaderModule(dev, mod, nullptr);
  Check(r, "vkCreateComputePipelines");
  return p;
}

VkPipeline ExpertKernels::MakePipeline(std::span<const uint32_t> spirv) {
  return MakeComputePipeline(device_.handle(), pipeline_layout_, spirv, kTokensPerGroup);
}

uint32_t ExpertKernels::AddWeights(const Buffer& slab) {
  if (sets_.size() >= ExpertKernels::kMaxWeightBuffers) {
    throw Error(ErrorCode::kUnsupported, "vulkan: more than " +
                                             std::to_string(ExpertKernels::kMaxWeightBuffers) +
                                             " weight buffers");
  }
  if (slab.bytes() > device_.info().max_storage_range) {
    throw Error(ErrorCode::kUnsupported, "vulkan: weight buffer exceeds the binding limit");
  }
  VkDescriptorSetLayout layouts[2] = {set_layout_, set_layout_};
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = pool_;
  ai.descriptorSetCount = 2;
  ai.pSetLayouts = layouts;
  VkDescriptorSet s[2];
  Check(vkAllocateDescriptorSets(device_.handle(), &ai, s), "vkAllocateDescriptorSets");
  // up: (weights, acts -> hid); down: (weights, hid -> out).
  const VkBuffer io[2][2] = {{acts_.handle(), hid_.handle()}, {hid_.handle(), out_.handle()}};
  for (int k = 0; k < 2; ++k) {
    VkDescriptorBufferInfo bi[3] = {{slab.handle(), 0, VK_WHOLE_SIZE},
                                    {io[k][0], 0, VK_WHOLE_SIZE},
                                    {io[k][1], 0, VK_WHOLE_SIZE}};
    VkWriteDescriptorSet w[3] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      w[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
      w[i].dstSet = s[k];
      w[i].dstBinding = i;
      w[i].descriptorCount = 1;
      w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      w[i].pBufferInfo = &bi[i];
    }
    vkUpdateDescriptorSets(device_.handle(), 3, w, 0, nullptr);
  }
  sets_.emplace_back(s[0], s[1]);
  return static_cast<uint32_t>(sets_.size() - 1);
}

void ExpertKernels::SubmitOrThrow(std::span<const Job> jobs) {
  VkCommandBuffer cmd = ctx_.Begin();
  const SlotLayout& L = layout_;
  auto words = [](uint64_t byte) { return static_cast<uint32_t>(byte / 4); };
  // Host writes to the mapped activations, and the uploads' copies submitted
  // earlier on this queue (the first scope of a barrier covers every command
  // before it in submission order), are visible to the shaders.
  VkMemoryBarrier host{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  host.srcAccessMask = VK_ACCESS_HOST_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  host.dstAccessMask = VK_ACCESS_SHADER_READ_BIT;
  vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &host, 0, nullptr, 0, nullptr);
  for (int pass = 0; pass < 2; ++pass) {
    vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pass == 0 ? gate_up_ : down_);
    for (const Job& j : jobs) {
      K3_CHECK(j.weights < sets_.size() && j.row + j.n <= max_pairs_);
      VkDescriptorSet set = pass == 0 ? sets_[j.weights].first : sets_[j.weights].second;
      vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout_, 0, 1, &set, 0,
                              nullptr);
      Push p{};
      const uint64_t s = j.slot_offset;
      if (pass == 0) {
        p = {words(s + L.offset[0]),
             static_cast<uint32_t>(s + L.offset[1]),
             words(s + L.offset[4]),
             static_cast<uint32_t>(s + L.offset[5]),
             shape_.moe_inter,
             shape_.latent,
             j.row,
             j.n,
             shape_.situ_beta,
             shape_.situ_linear_beta};
      } else {
        p = {words(s + L.offset[2]),
             static_cast<uint32_t>(s + L.offset[3]),
             0,
             0,
             shape_.latent,
             shape_.moe_inter,
             j.row,
             j.n,
             0.0f,
             0.0f};
      }
      vkCmdPushConstants(cmd, pipeline_layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push), &p);
      vkCmdDispatch(cmd, p.rows, (j.n + kTokensPerGroup - 1) / kTokensPerGroup, 1);
    }
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    mb.dstAccessMask = pass == 0 ? VK_ACCESS_SHADER_READ_BIT : VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(
        cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
        pass == 0 ? VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT : VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
        nullptr, 0, nullptr);
  }
  ctx_.SubmitOrThrow();
}

}  // namespace k3::vulkan
