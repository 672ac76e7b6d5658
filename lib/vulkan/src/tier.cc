#include "k3/vulkan/tier.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"

namespace k3::vulkan {
namespace {

constexpr char kMagic[8] = {'K', '3', 'V', 'K', 'H', 'I', 'S', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;
constexpr uint32_t kMaxPairs = 1024;  // rows per submission; more go to the CPU

template <typename T>
void Put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
T Get(const std::string& s, size_t off) {
  T v;
  std::memcpy(&v, s.data() + off, sizeof v);
  return v;
}

Fault ParseFault(const std::string& v) {
  if (v.empty() || v == "none") return Fault::kNone;
  if (v == "alloc") return Fault::kAlloc;
  if (v == "submit") return Fault::kSubmit;
  if (v == "lost") return Fault::kDeviceLost;
  throw Error(ErrorCode::kInvalidArgument,
              "K3_VK_FAULT=" + v + ": expected none, alloc, submit or lost");
}

DenseMode ParseDenseMode(const std::string& v) {
  if (v == "0" || v == "none") return DenseMode::kNone;
  if (v == "shared") return DenseMode::kShared;
  if (v == "all") return DenseMode::kAll;
  return DenseMode::kAuto;  // GetEnvChoice admitted nothing else
}

}  // namespace

const char* DenseModeName(DenseMode mode) {
  switch (mode) {
    case DenseMode::kNone:
      return "none";
    case DenseMode::kShared:
      return "shared";
    case DenseMode::kAll:
      return "all";
    case DenseMode::kAuto:
      break;
  }
  return "auto";
}

// --- options -------------------------------------------------------------------
TierOptions TierOptions::FromEnv() {
  TierOptions o;
  o.enabled = GetEnvBool("K3_VK", false);
  o.budget_gb = GetEnvDouble("K3_VK_GB", 0.0, 0.0, 1e6);
  o.device_index = static_cast<int>(GetEnvInt("K3_VK_DEVICE", -1, -1, 1023));
  o.validate = GetEnvBool("K3_VK_VALIDATE", false);
  o.promotions_per_step = static_cast<int>(GetEnvInt("K3_VK_PROMOTE", 4, 0, 1 << 20));
  o.fault = ParseFault(GetEnvChoice("K3_VK_FAULT", "none", {"none", "alloc", "submit", "lost"}));
  o.fault_after = static_cast<int>(GetEnvInt("K3_VK_FAULT_AFTER", 0, 0, 1 << 30));
  o.dense =
      ParseDenseMode(GetEnvChoice("K3_VK_DENSE", "auto", {"0", "none", "shared", "all", "auto"}));
  if (auto x = GetEnv("XDG_CACHE_HOME"); x && !x->empty()) {
    o.cache_dir = JoinPath(*x, "k3");
  } else if (auto h = GetEnv("HOME"); h && !h->empty()) {
    o.cache_dir = JoinPath(JoinPath(*h, ".cache"), "k3");
  }
  return o;
}

// --- history -------------------------------------------------------------------------
uint64_t ModelFingerprint(const Snapshot& snapshot) {
  std::string id = snapshot.config_json();
  for (const auto& f : snapshot.shards()) {
    id.push_back('\0');
    id += BaseName(f.path());
    Put<uint64_t>(id, FileSizeOrThrow(f.fd(), f.path()));
  }
  return XXH64(id.data(), id.size(), 0);
}

std::string HistoryPath(const std::string& cache_dir, uint64_t fingerprint) {
  char name[48];
  std::snprintf(name, sizeof name, "vk-history-%016llx.bin",
                static_cast<unsigned long long>(fingerprint));
  return JoinPath(cache_dir, name);
}

std::optional<History> History::Load(const std::string& path, uint64_t fingerprint, uint32_t layers,
                                     uint32_t experts) {
  if (!PathExists(path)) return std::nullopt;
  const uint64_t want = kHeaderBytes + 8ull * layers * experts + 8;
  std::string s;
  auto ignore = [&](const char* why) -> std::optional<History> {
    K3_LOG_WARN("vulkan: history file %s ignored: %s", path.c_str(), why);
    return std::nullopt;
  };
  try {
    s = ReadFileOrThrow(path, want + 1);
  } catch (const Error& e) {
    return ignore(e.what());
  }
  if (s.size() < kHeaderBytes + 8) return ignore("truncated header");
  if (std::memcmp(s.data(), kMagic, 8) != 0) return ignore("bad magic");
  if (Get<uint32_t>(s, 8) != kVersion) return ignore("unknown version");
  if (XXH64(s.data(), s.size() - 8, 0) != Get<uint64_t>(s, s.size() - 8)) {
    return ignore("checksum mismatch");
  }
  if (Get<uint64_t>(s, 24) != fingerprint) return ignore("written for another model");
  if (Get<uint32_t>(s, 12) != layers || Get<uint32_t>(s, 16) != experts) {
    return ignore("shape differs from the model");
  }
  if (s.size() != want) return ignore("size differs from its header");
  History h;
  h.fingerprint = fingerprint;
  h.layers = layers;
  h.experts = experts;
  h.counts.resize(static_cast<size_t>(layers) * experts);
  std::memcpy(h.counts.data(), s.data() + kHeaderBytes, h.counts.size() * 8);
  return h;
}

void History::SaveOrThrow(const std::string& path) const {
  std::string s(kMagic, 8);
  Put<uint32_t>(s, kVersion);
  Put<uint32_t>(s, layers);
  Put<uint32_t>(s, experts);
  Put<uint32_t>(s, 0);
  Put<uint64_t>(s, fingerprint);
  for (uint64_t c : counts) Put<uint64_t>(s, c);
  Put<uint64_t>(s, XXH64(s.data(), s.size(), 0));
  MakeDirs(DirName(path));
  WriteFileAtomic(path, s);
}

// --- the tier ----------------------------------------------------------------------------
VulkanTier::VulkanTier(model::Model& model, const TierOptions& options)
    : model_(model),
      options_(options),
      cpu_(model.config()),
      table_(model.snapshot(), model.config()) {
  const ModelConfig& c = model.config();
  num_layers_ = static_cast<size_t>(c.num_hidden_layers);
  num_experts_ = static_cast<size_t>(c.num_experts);
  lt_ = static_cast<size_t>(c.routed_expert_hidden_size);
  mi_ = static_cast<size_t>(c.moe_intermediate_size);
  fingerprint_ = ModelFingerprint(model.snapshot());

  device_ = Device::OpenOrThrow(options.device_options());
  const DeviceInfo& info = device_->info();
  ExpertKernels::Shape shape{static_cast<uint32_t>(mi_), static_cast<uint32_t>(lt_), c.situ_beta,
                             c.situ_linear_beta};
  const uint64_t wide = std::max(lt_, mi_) * 4;
  const uint32_t max_pairs = static_cast<uint32_t>(
      std::min<uint64_t>(kMaxPairs, std::max<uint64_t>(1, info.max_storage_range / wide)));
  kernels_ = std::make_unique<ExpertKernels>(*device_, shape, max_pairs);

  // Budget -> slots -> slabs no larger than one binding or one allocation.
  const uint64_t slot_bytes = kernels_->layout().slot_bytes;
  uint64_t budget = options.budget_bytes;
  if (budget == 0 && options.budget_gb > 0) budget = static_cast<uint64_t>(options.budget_gb * 1e9);
  if (budget == 0) {
    // A quarter of device-local memory; a CPU device's "device memory" is the
    // host's own RAM, which the CPU path needs too: at most 2 GB there.
    budget = info.device_local_bytes / 4;
    if (info.type == "cpu") budget = std::min<uint64_t>(budget, 2000000000ull);
  }
  const model::ExpertTable& table = table_;
  uint64_t present = 0;
  for (size_t l = 0; l < num_layers_; ++l) {
    if (!c.is_moe(static_cast<int64_t>(l))) continue;
    for (size_t e = 0; e < num_experts_; ++e) {
      present += table.present(static_cast<int64_t>(l), static_cast<int64_t>(e));
    }
  }
  uint64_t nslots = std::min<uint64_t>(budget / slot_bytes, present);
  if (nslots == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "vulkan: budget of " + std::to_string(budget) + " bytes holds no expert (one is " +
                    std::to_string(slot_bytes) + " bytes on the device)");
  }
  const uint64_t slab_max = std::min<uint64_t>(
      {info.max_storage_range, info.max_allocation ? info.max_allocation : UINT64_MAX,
       uint64_t{1} << 30});
  const uint64_t per_slab = std::max<uint64_t>(1, slab_max / slot_bytes);
  const uint64_t max_slots = per_slab * ExpertKernels::kMaxWeightBuffers;
  if (nslots > max_slots) {
    K3_LOG_WARN("vulkan: budget capped at %llu experts (%u weight buffers of %llu)",
                static_cast<unsigned long long>(max_slots), ExpertKernels::kMaxWeightBuffers,
                static_cast<unsigned long long>(per_slab));
    nslots = max_slots;
  }
  for (uint64_t done = 0; done < nslots;) {
    const uint64_t n = std::min(per_slab, nslots - done);
    slabs_.push_back(device_->CreateBufferOrThrow(n * slot_bytes, Buffer::Kind::kDeviceLocal));
    const uint32_t w = kernels_->AddWeights(slabs_.back());
    for (uint64_t i = 0; i < n; ++i) {
      Slot s;
      s.weights = w;
      s.offset = i * slot_bytes;
      slots_.push_back(s);
    }
    done += n;
  }

  const size_t keys = num_layers_ * num_experts_;
  slot_of_.assign(keys, -1);
  history_heat_.assign(keys, 0);
  run_heat_.assign(keys, 0);
  queued_.assign(keys, 0);
  if (!options.cache_dir.empty()) {
    if (auto h = History::Load(HistoryPath(options.cache_dir, fingerprint_), fingerprint_,
                               static_cast<uint32_t>(num_layers_),
                               static_cast<uint32_t>(num_experts_))) {
      // Halved so this run's usage soon outweighs an old run's.
      for (size_t k = 0; k < keys; ++k) history_heat_[k] = h->counts[k] / 2 + (h->counts[k] & 1);
    }
  }
  // Warm start: the hottest experts of earlier runs, as many as fit.
  std::vector<size_t> hot;
  for (size_t k = 0; k < keys; ++k) {
    if (history_heat_[k] > 0 && table.present(static_cast<int64_t>(k / num_experts_),
                                              static_cast<int64_t>(k % num_experts_))) {
      hot.push_back(k);
    }
  }
  std::stable_sort(hot.begin(), hot.end(),
                   [&](size_t a, size_t b) { return history_heat_[a] > history_heat_[b]; });
  if (hot.size() > slots_.size()) hot.resize(slots_.size());
  for (size_t k : hot) {
    queue_.push_back(k);
    queued_[k] = 1;
  }
  stats_.device = info.name;
  stats_.slots = slots_.size();
  stats_.validation = info.validation;
  active_ = true;
  uploader_ = std::thread([this] { UploadLoop(); });
  K3_LOG_INFO("vulkan: %s (%s), %zu expert slots (%s), subgroup %u, binding limit %s",
              info.name.c_str(), info.type.c_str(), slots_.size(),
              FormatBytes(slots_.size() * slot_bytes).c_str(), info.subgroup_size,
              FormatBytes(info.max_storage_range).c_str());
}

VulkanTier::~VulkanTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  idle_cv_.notify_all();
  if (uploader_.joinable()) uploader_.join();
  SaveHistory();
}

void VulkanTier::SaveHistory() const {
  if (options_.cache_dir.empty()) return;
  History h;
  h.fingerprint = fingerprint_;
  h.layers = static_cast<uint32_t>(num_layers_);
  h.experts = static_cast<uint32_t>(num_experts_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.counts.resize(history_heat_.size());
    for (size_t k = 0; k < h.counts.size(); ++k) h.counts[k] = Heat(k);
  }
  const std::string path = HistoryPath(options_.cache_dir, fingerprint_);
  try {
    h.SaveOrThrow(path);
  } catch (const Error& e) {
    K3_LOG_WARN("vulkan: history not saved: %s", e.what());
  }
}

void VulkanTier::Disable(const char* why) {
  if (!active_.exchange(false)) return;
  K3_LOG_WARN("%s; continuing on the CPU (same answers)", why);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  idle_cv_.notify_all();
}

void VulkanTier::Prefetch(int64_t layer, std::span<const int32_t> likely,
                          model::ExpertStore& store) {
  std::vector<int32_t> host;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int32_t e : likely) {
      if (!OnDevice(Key(layer, e))) host.push_back(e);
    }
  }
  if (!host.empty()) store.Prefetch(layer, host);
}

void VulkanTier::Run(const model::ExpertBatch& batch, model::ExpertStore& store) {
  const auto& users = *batch.users;
  std::vector<int32_t> on_dev, on_cpu;
  std::vector<ExpertKernels::Job> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t rows = 0;
    for (int32_t e : batch.experts) {
      const size_t k = Key(batch.layer, e);
      const uint32_t n = static_cast<uint32_t>(users[static_cast<size_t>(e)].size());
      run_heat_[k] += n;
      if (OnDevice(k) && rows + n <= kernels_->max_pairs()) {
        Slot& slot = slots_[static_cast<size_t>(slot_of_[k])];
        ++slot.pins;
        jobs.push_back({slot.weights, slot.offset, rows, n});
        on_dev.push_back(e);
        rows += n;
      } else {
        on_cpu.push_back(e);
      }
    }
  }
  std::string failure;
  const double t0 = NowSeconds();
  if (!on_dev.empty()) {
    float* acts = kernels_->acts();
    for (size_t i = 0; i < on_dev.size(); ++i) {
      const auto& us = users[static_cast<size_t>(on_dev[i])];
      for (size_t r = 0; r < us.size(); ++r) {
        std::memcpy(acts + (jobs[i].row + r) * lt_, batch.latent + (us[r] / batch.top_k) * lt_,
                    lt_ * sizeof(float));
      }
    }
    try {
      kernels_->SubmitOrThrow(jobs);
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  // Meanwhile the CPU computes (and reads) only the experts the device does not hold.
  model::ExpertBatch cb = batch;
  cb.experts = on_cpu;
  std::exception_ptr cpu_error;
  try {
    cpu_.Run(cb, store);
  } catch (...) {
    cpu_error = std::current_exception();
  }
  if (!on_dev.empty() && failure.empty()) {
    try {
      kernels_->WaitOrThrow();
      const float* out = kernels_->out();
      for (size_t i = 0; i < on_dev.size(); ++i) {
        const auto& us = users[static_cast<size_t>(on_dev[i])];
        for (size_t r = 0; r < us.size(); ++r) batch.Emit(us[r], out + (jobs[i].row + r) * lt_);
      }
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  const double dt = NowSeconds() - t0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int32_t e : on_dev) --slots_[static_cast<size_t>(slot_of_[Key(batch.layer, e)])].pins;
    if (!on_dev.empty()) stats_.device_ms += dt * 1e3;
  }
  idle_cv_.notify_all();
  if (cpu_error) std::rethrow_exception(cpu_error);
  uint64_t dev_pairs = 0, cpu_pairs = 0;
  for (int32_t e : on_dev) dev_pairs += users[static_cast<size_t>(e)].size();
  for (int32_t e : on_cpu) cpu_pairs += users[static_cast<size_t>(e)].size();
  if (!failure.empty()) {
    Disable(failure.c_str());
    model::ExpertBatch db = batch;
    db.experts = on_dev;
    cpu_.Run(db, store);
    cpu_pairs += dev_pairs;
    dev_pairs = 0;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.pairs_on_device += dev_pairs;
    stats_.pairs_on_cpu += cpu_pairs;
  }
  if (active_) QueuePromotions(batch.layer, on_cpu);
}

void VulkanTier::QueuePromotions(int64_t layer, const std::vector<int32_t>& cpu_experts) {
  const model::ExpertTable& table = table_;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<size_t> cand;
  for (int32_t e : cpu_experts) {
    const size_t k = Key(layer, e);
    if (!queued_[k] && slot_of_[k] < 0 && table.present(layer, e)) cand.push_back(k);
  }
  std::stable_sort(cand.begin(), cand.end(), [&](size_t a, size_t b) { return Heat(a) > Heat(b); });
  // The coldest displaceable resident (free slots count as heat 0).
  uint64_t coldest = UINT64_MAX;
  for (const Slot& s : slots_) {
    if (s.layer < 0) {
      coldest = 0;
      break;
    }
    if (s.ready && s.pins == 0) coldest = std::min(coldest, Heat(Key(s.layer, s.expert)));
  }
  int queued = 0;
  for (size_t k : cand) {
    if (queued >= options_.promotions_per_step) break;
    // Hotter than the coldest resident (or a free slot): worth an upload.
    if (coldest == 0 || Heat(k) > coldest) {
      queue_.push_back(k);
      queued_[k] = 1;
      ++queued;
    }
  }
  if (queued) cv_.notify_one();
}

void VulkanTier::UploadLoop() {
  const model::ExpertTable& table = table_;
  const SlotLayout& L = kernels_->layout();
  std::vector<std::byte> raw(table.slot_bytes()), dev(L.slot_bytes);
  std::unique_ptr<Uploader> up;
  for (;;) {
    size_t key = 0;
    size_t victim = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) break;
      // Hottest request first (the queue is short: bounded per step).
      auto it = std::max_element(queue_.begin(), queue_.end(),
                                 [&](size_t a, size_t b) { return Heat(a) < Heat(b); });
      key = *it;
      queue_.erase(it);
      queued_[key] = 0;
      if (slot_of_[key] >= 0) {  // promoted meanwhile
        if (queue_.empty()) idle_cv_.notify_all();
        continue;
      }
      bool found = false;
      uint64_t coldest = UINT64_MAX;
      for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot& s = slots_[i];
        if (s.layer < 0) {
          victim = i;
          found = true;
          break;
        }
        if (!s.ready || s.pins > 0) continue;
        const uint64_t h = Heat(Key(s.layer, s.expert));
        if (h < Heat(key) && h < coldest) {
          coldest = h;
          victim = i;
          found = true;
        }
      }
      if (!found) {
        if (queue_.empty()) idle_cv_.notify_all();
        continue;
      }
      Slot& s = slots_[victim];
      if (s.layer >= 0) slot_of_[Key(s.layer, s.expert)] = -1;
      s.layer = static_cast<int64_t>(key / num_experts_);
      s.expert = static_cast<int64_t>(key % num_experts_);
      s.ready = false;
      slot_of_[key] = static_cast<int32_t>(victim);
      busy_ = true;
    }
    const int64_t layer = static_cast<int64_t>(key / num_experts_);
    const int64_t expert = static_cast<int64_t>(key % num_experts_);
    bool ok = false;
    try {
      if (!up) up = std::make_unique<Uploader>(*device_, L.slot_bytes);
      table.ReadSlotOrThrow(layer, expert, raw);
      std::fill(dev.begin(), dev.end(), std::byte{0});
      for (int p = 0; p < model::kExpertParts; ++p) {
        const auto part = static_cast<model::ExpertPart>(p);
        std::memcpy(dev.data() + L.offset[p], raw.data() + table.part_offset_in_slot(part),
                    table.part_bytes(part));
      }
      const Slot& s = slots_[victim];  // weights/offset never change
      up->UploadOrThrow(slabs_[s.weights], s.offset, dev);
      ok = true;
    } catch (const Error& e) {
      std::string why = std::string("vulkan: upload of layer ") + std::to_string(layer) +
                        " expert " + std::to_string(expert) + " failed: " + e.what();
      Disable(why.c_str());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      Slot& s = slots_[victim];
      if (ok) {
        s.ready = true;
        ++stats_.uploads;
        stats_.upload_bytes += L.slot_bytes;
      } else {
        slot_of_[key] = -1;
        s.layer = s.expert = -1;
      }
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  busy_ = false;
  idle_cv_.notify_all();
}

void VulkanTier::WaitUploads() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return stop_ || (queue_.empty() && !busy_); });
}

bool VulkanTier::resident(int64_t layer, int64_t expert) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t s = slot_of_[Key(layer, expert)];
  return s >= 0 && slots_[static_cast<size_t>(s)].ready;
}

TierStats VulkanTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats s = stats_;
  s.active = active_;
  s.experts_resident = 0;
  for (const Slot& sl : slots_) s.experts_resident += sl.ready;
  s.validation_errors = device_->validation_errors();
  return s;
}

// --- installation and reporting -------------------------------------------------------------
VulkanTier* InstallTier(model::Model& model, const TierOptions& options) {
  if (!options.enabled) return nullptr;
  try {
    auto tier = std::make_unique<VulkanTier>(model, options);
    VulkanTier* p = tier.get();
    model.SetExpertExecutor(std::move(tier));
    return p;
  } catch (const Error& e) {
    static const char kKey = 0;
    LogOnce(&kKey, LogLevel::kWarn, "vulkan: tier not started: %s; continuing on the CPU",
            e.what());
    return nullptr;
  }
}

VulkanTier* InstalledTier(model::Model& model) {
  return dynamic_cast<VulkanTier*>(model.executor());
}

void WriteTierStatsJson(const VulkanTier* tier, JsonWriter& j) {
  j.Key("vulkan");
  if (tier == nullptr) {
    j.Null();
    return;
  }
  const TierStats s = tier->stats();
  j.BeginObject();
  j.Field("device", s.device);
  j.Field("active", s.active);
  j.Field("experts_resident", s.experts_resident);
  j.Field("slots", s.slots);
  j.Field("pairs_on_device", s.pairs_on_device);
  j.Field("pairs_on_cpu", s.pairs_on_cpu);
  j.Field("uploads", s.uploads);
  j.Field("upload_bytes", s.upload_bytes);
  j.Field("device_ms", s.device_ms);
  if (s.validation) j.Field("validation_errors", s.validation_errors);
  j.EndObject();
}

void LogTierSummary(const VulkanTier* tier) {
  if (tier == nullptr) return;
  const TierStats s = tier->stats();
  const uint64_t all = s.pairs_on_device + s.pairs_on_cpu;
  std::fprintf(
      stderr,
      "k3-run: vulkan %s%s | %llu/%llu experts resident | pairs on device %llu (%.1f%%) "
      "| uploads %llu (%s) | device %.1f ms\n",
      s.device.c_str(), s.active ? "" : " (fell back to the CPU)",
      static_cast<unsigned long long>(s.experts_resident), static_cast<unsigned long long>(s.slots),
      static_cast<unsigned long long>(s.pairs_on_device),
      all ? 100.0 * static_cast<double>(s.pairs_on_device) / static_cast<double>(all) : 0.0,
      static_cast<unsigned long long>(s.uploads), FormatBytes(s.upload_bytes).c_str(), s.device_ms);
}

}  // namespace k3::vulkan
