#include "k3/vulkan/dense.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <span>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "shaders/dense_f32.h"
#include "shaders/dense_q4.h"
#include "shaders/dense_q8.h"
#include "shaders/situ_glu.h"

namespace k3::vulkan {
namespace {

constexpr uint64_t kIoBytes = uint64_t{64} << 20;  // each of the two I/O buffers, at most
constexpr uint64_t kStagingBytes = uint64_t{16} << 20;
constexpr uint32_t kMaxGroupsX = 65535;  // Vulkan's guaranteed maxComputeWorkGroupCount
constexpr uint32_t kTokens = 4;          // the shaders' kTokens (specialization constant)

struct Push {
  uint32_t w_word, s_word, rows, cols, x_off, y_off, y_stride, n;
  float beta1, beta2;
};
static_assert(sizeof(Push) == 40, "matches the shaders' push-constant blocks");

uint64_t Align16(uint64_t v) { return (v + 15) / 16 * 16; }

// Bytes of one row's data and of its f32 scales, as the container stores them.
uint64_t RowDataBytes(const quant::WeightView& v) {
  switch (v.format) {
    case quant::WeightFormat::kF32:
      return v.cols * 4;
    case quant::WeightFormat::kInt8:
      return v.cols;
    default:
      return v.cols / 2;
  }
}
uint64_t RowScaleCount(const quant::WeightView& v) {
  switch (v.format) {
    case quant::WeightFormat::kInt8:
      return 1;
    case quant::WeightFormat::kInt4G64:
      return v.cols / 64;
    default:
      return 0;
  }
}

// The formats the shaders read: f32, int8 with whole-word rows, int4-g64.
bool Supported(const quant::WeightView& v) {
  if (v.rows == 0 || v.cols == 0 || v.rows >= (1u << 31) || v.cols >= (1u << 24)) return false;
  switch (v.format) {
    case quant::WeightFormat::kF32:
      return true;
    case quant::WeightFormat::kInt8:
      return v.cols % 4 == 0;
    case quant::WeightFormat::kInt4G64:
      return v.cols % 64 == 0;
    default:
      return false;
  }
}

uint64_t MatrixBytes(const model::Matrix& m) {
  return m.rows() * (RowDataBytes(m.view()) + RowScaleCount(m.view()) * 4);
}

}  // namespace

std::vector<TrunkMatrix> ListTrunk(const model::ModelWeights& weights) {
  std::vector<TrunkMatrix> shared, rest;
  int unit = 0;
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const model::LayerWeights& L = weights.layers[l];
    const int64_t layer = static_cast<int64_t>(l);
    auto add = [&](std::vector<TrunkMatrix>& to, const model::Matrix& m, const char* cls, int u) {
      if (!m.empty()) to.push_back({&m, cls, layer, u});
    };
    if (L.is_kda) {
      for (const model::Matrix* m : {&L.kda.q, &L.kda.k, &L.kda.v, &L.kda.g, &L.kda.o}) {
        add(rest, *m, "kda", 0);
      }
    } else {
      for (const model::Matrix* m : {&L.mla.q_a, &L.mla.q_b, &L.mla.kv_a, &L.mla.g, &L.mla.o}) {
        add(rest, *m, "mla", 0);
      }
    }
    if (L.is_moe) {
      add(rest, L.moe.latent_down, "latent", 0);
      add(rest, L.moe.latent_up, "latent", 0);
      if (!L.moe.shared.gate.empty()) {
        ++unit;
        for (const model::Matrix* m : {&L.moe.shared.gate, &L.moe.shared.up, &L.moe.shared.down}) {
          add(shared, *m, "shared", unit);
        }
      }
    } else if (!L.dense.gate.empty()) {
      ++unit;
      for (const model::Matrix* m : {&L.dense.gate, &L.dense.up, &L.dense.down}) {
        add(rest, *m, "dense_mlp", unit);
      }
    }
  }
  if (weights.has_head) rest.push_back({&weights.lm_head, "head", -1, 0});
  shared.insert(shared.end(), rest.begin(), rest.end());
  return shared;
}

// --- construction ----------------------------------------------------------------
DenseTier::DenseTier(model::Model& model, const TierOptions& options) : options_(options) {
  device_ = Device::OpenOrThrow(options.device_options());
  const DeviceInfo& info = device_->info();
  stats_.device = info.name;
  stats_.validation = info.validation;
  DenseMode mode = options.dense;
  if (mode == DenseMode::kAuto) {
    if (info.type != "discrete") {
      nothing_reason_ = "K3_VK_DENSE=auto places nothing on " + info.name + " (" + info.type +
                        "): its memory is the host's, which the CPU reads as fast; "
                        "K3_VK_DENSE=shared or all to place the trunk anyway";
    }
    mode = DenseMode::kAll;
  }
  stats_.mode = options.dense == DenseMode::kAuto
                    ? std::string("auto (") + (nothing_reason_.empty() ? "all" : "none") + ")"
                    : DenseModeName(options.dense);

  // Choose: the shared experts first (units of three), then the largest
  // per-token bytes first, whole MLP units together, within the budget.
  uint64_t budget = options.dense_budget_bytes;
  if (budget == 0) {
    budget = info.device_local_bytes / 2;
    if (info.type == "cpu") budget = std::min<uint64_t>(budget, 2000000000ull);
  }
  const std::vector<TrunkMatrix> trunk = ListTrunk(model.weights());
  struct Unit {
    std::vector<const TrunkMatrix*> members;
    uint64_t bytes = 0;
    bool shared = false;
  };
  std::vector<Unit> units;
  std::map<int, size_t> unit_of;
  for (const TrunkMatrix& t : trunk) {
    const bool ok = Supported(t.matrix->view());
    if (t.unit > 0 && unit_of.count(t.unit)) {
      Unit& u = units[unit_of[t.unit]];
      u.members.push_back(&t);
      u.bytes += MatrixBytes(*t.matrix);
      if (!ok) u.bytes = UINT64_MAX;  // a unit is placed whole or not at all
      continue;
    }
    if (t.unit > 0) unit_of[t.unit] = units.size();
    units.push_back(
        {{&t}, ok ? MatrixBytes(*t.matrix) : UINT64_MAX, std::strcmp(t.cls, "shared") == 0});
  }
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    if (a.shared != b.shared) return a.shared;
    return !a.shared && a.bytes > b.bytes;
  });
  std::vector<const TrunkMatrix*> chosen;
  uint64_t used = 0;
  if (nothing_reason_.empty()) {
    for (const Unit& u : units) {
      if (mode == DenseMode::kShared && !u.shared) continue;
      if (u.bytes == UINT64_MAX || used + u.bytes > budget) continue;
      used += u.bytes;
      chosen.insert(chosen.end(), u.members.begin(), u.members.end());
    }
  }

  // Pack the chosen matrices into slabs of at most one binding / allocation /
  // 1 GiB; a matrix larger than what is left spills into the next slab by rows.
  const uint64_t slab_max =
      std::min<uint64_t>(
          {info.max_storage_range, info.max_allocation ? info.max_allocation : UINT64_MAX,
           options.dense_slab_bytes ? options.dense_slab_bytes : uint64_t{1} << 30}) /
      16 * 16;
  std::vector<uint64_t> slab_bytes;
  for (const TrunkMatrix* t : chosen) {
    const quant::WeightView& v = t->matrix->view();
    const uint64_t per_row = RowDataBytes(v) + RowScaleCount(v) * 4;
    Placed p;
    p.format = v.format;
    p.rows = static_cast<uint32_t>(v.rows);
    p.cols = static_cast<uint32_t>(v.cols);
    for (uint64_t r0 = 0; r0 < v.rows;) {
      const uint64_t left = v.rows - r0;
      uint64_t avail = slab_bytes.empty() ? 0 : slab_max - slab_bytes.back();
      // A fresh slab when this one holds not a row, or when the rest would
      // fit whole in a fresh one (fewer pieces).
      if (avail < per_row + 32 || (left * per_row + 32 > avail && left * per_row + 32 <= slab_max &&
                                   !slab_bytes.empty() && slab_bytes.back() > 0)) {
        slab_bytes.push_back(0);
        avail = slab_max;
      }
      if (avail < per_row + 32) {
        throw Error(ErrorCode::kUnsupported, "vulkan dense: a row of " + std::to_string(per_row) +
                                                 " bytes exceeds the binding limit");
      }
      const uint64_t n = std::min<uint64_t>(left, (avail - 32) / per_row);
      Piece pc;
      pc.slab = static_cast<uint32_t>(slab_bytes.size() - 1);
      pc.data_offset = slab_bytes.back();
      pc.scales_offset = pc.data_offset + Align16(n * RowDataBytes(v));
      pc.r0 = static_cast<uint32_t>(r0);
      pc.rows = static_cast<uint32_t>(n);
      slab_bytes.back() = pc.scales_offset + Align16(n * RowScaleCount(v) * 4);
      p.pieces.push_back(pc);
      r0 += n;
    }
    placed_.emplace(t->matrix, std::move(p));
  }

  // Counts for the stats and the start-up line.
  std::map<std::string, uint64_t> classes;
  for (const TrunkMatrix& t : trunk) {
    if (placed_.count(t.matrix)) {
      ++stats_.matrices_on_device;
      stats_.bytes_on_device += t.matrix->resident_bytes();
      ++classes[t.cls];
    } else {
      ++stats_.matrices_on_cpu;
      stats_.bytes_on_cpu += t.matrix->resident_bytes();
    }
  }
  for (const auto& [k, v] : classes) stats_.classes.emplace_back(k, v);
  if (placed_.empty()) {
    if (nothing_reason_.empty()) {
      nothing_reason_ = "K3_VK_DENSE=" + stats_.mode + ": no trunk matrix fits the budget of " +
                        FormatBytes(budget) + " (or none is in a supported format)";
    }
    return;
  }

  // Buffers, pipelines, uploads. The raw handles BuildPipelines makes are
  // released here if a later step throws (no destructor runs then).
  try {
    Start(slab_bytes, slab_max);
  } catch (...) {
    DestroyHandles();
    throw;
  }
  active_ = true;
  LogStart(budget);
}

void DenseTier::Start(const std::vector<uint64_t>& slab_bytes, uint64_t slab_max) {
  const DeviceInfo& info = device_->info();
  for (uint64_t b : slab_bytes) {
    slabs_.push_back(device_->CreateBufferOrThrow(b, Buffer::Kind::kDeviceLocal));
  }
  const uint64_t io_bytes = std::min<uint64_t>(kIoBytes, info.max_storage_range) / 16 * 16;
  for (Io* io : {&sync_, &async_}) {
    io->buffer = device_->CreateBufferOrThrow(io_bytes, Buffer::Kind::kHostVisible);
    io->floats = io_bytes / 4;
    io->ctx = std::make_unique<CommandContext>(*device_, true);
  }
  BuildPipelines(static_cast<uint32_t>(slabs_.size()));
  {
    Uploader up(*device_, std::min<uint64_t>(kStagingBytes, slab_max));
    for (const auto& [m, p] : placed_) {
      const quant::WeightView& v = m->view();
      for (const Piece& pc : p.pieces) {
        const auto* data = static_cast<const std::byte*>(v.data) + pc.r0 * RowDataBytes(v);
        up.UploadOrThrow(slabs_[pc.slab], pc.data_offset,
                         std::span<const std::byte>(data, pc.rows * RowDataBytes(v)));
        if (RowScaleCount(v) > 0) {
          const auto* s = reinterpret_cast<const std::byte*>(v.scales + pc.r0 * RowScaleCount(v));
          up.UploadOrThrow(slabs_[pc.slab], pc.scales_offset,
                           std::span<const std::byte>(s, pc.rows * RowScaleCount(v) * 4));
        }
      }
    }
  }
}

void DenseTier::LogStart(uint64_t budget) {
  const DeviceInfo& info = device_->info();
  std::string by_class;
  for (const auto& [k, v] : stats_.classes) {
    by_class += (by_class.empty() ? "" : ", ") + k + " " + std::to_string(v);
  }
  const uint64_t all = stats_.bytes_on_device + stats_.bytes_on_cpu;
  K3_LOG_INFO(
      "vulkan dense: %s (%s), K3_VK_DENSE=%s: %llu trunk matrices on the device (%s, %.1f%% of the "
      "trunk's per-token bytes: %s), %llu on the CPU (%s); budget %s",
      info.name.c_str(), info.type.c_str(), stats_.mode.c_str(),
      static_cast<unsigned long long>(stats_.matrices_on_device),
      FormatBytes(stats_.bytes_on_device).c_str(),
      all ? 100.0 * static_cast<double>(stats_.bytes_on_device) / static_cast<double>(all) : 0.0,
      by_class.c_str(), static_cast<unsigned long long>(stats_.matrices_on_cpu),
      FormatBytes(stats_.bytes_on_cpu).c_str(), FormatBytes(budget).c_str());
}

void DenseTier::BuildPipelines(uint32_t slabs) {
  const VkDevice dev = device_->handle();
  MakeStorageLayoutsOrThrow(dev, 2, sizeof(Push), &set_layout_, &pipeline_layout_);
  auto make = [&](std::span<const uint32_t> spirv) {
    return MakeComputePipeline(dev, pipeline_layout_, spirv, kTokens);
  };
  f32_ = make(kDenseF32Spv);
  q8_ = make(kDenseQ8Spv);
  q4_ = make(kDenseQ4Spv);
  situ_ = make(kSituGluSpv);
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 2 * 2 * slabs};
  VkDescriptorPoolCreateInfo dp{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  dp.maxSets = 2 * slabs;
  dp.poolSizeCount = 1;
  dp.pPoolSizes = &ps;
  CheckVkOrThrow(vkCreateDescriptorPool(dev, &dp, nullptr, &pool_), "vkCreateDescriptorPool");
  for (Io* io : {&sync_, &async_}) {
    std::vector<VkDescriptorSetLayout> layouts(slabs, set_layout_);
    io->sets.resize(slabs);
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = pool_;
    ai.descriptorSetCount = slabs;
    ai.pSetLayouts = layouts.data();
    CheckVkOrThrow(vkAllocateDescriptorSets(dev, &ai, io->sets.data()), "vkAllocateDescriptorSets");
    for (uint32_t s = 0; s < slabs; ++s) {
      VkDescriptorBufferInfo bi[2] = {{slabs_[s].handle(), 0, VK_WHOLE_SIZE},
                                      {io->buffer.handle(), 0, VK_WHOLE_SIZE}};
      VkWriteDescriptorSet w[2] = {};
      for (uint32_t i = 0; i < 2; ++i) {
        w[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        w[i].dstSet = io->sets[s];
        w[i].dstBinding = i;
        w[i].descriptorCount = 1;
        w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w[i].pBufferInfo = &bi[i];
      }
      vkUpdateDescriptorSets(dev, 2, w, 0, nullptr);
    }
  }
}

DenseTier::~DenseTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    DrainPending();
  }
  // The command contexts wait for their own submissions in their destructors.
  sync_.ctx.reset();
  async_.ctx.reset();
  DestroyHandles();
}

void DenseTier::DestroyHandles() {
  const VkDevice dev = device_ ? device_->handle() : VK_NULL_HANDLE;
  if (dev == VK_NULL_HANDLE) return;
  for (VkPipeline p : {f32_, q8_, q4_, situ_}) {
    if (p) vkDestroyPipeline(dev, p, nullptr);
  }
  if (pipeline_layout_) vkDestroyPipelineLayout(dev, pipeline_layout_, nullptr);
  if (set_layout_) vkDestroyDescriptorSetLayout(dev, set_layout_, nullptr);
  if (pool_) vkDestroyDescriptorPool(dev, pool_, nullptr);
  f32_ = q8_ = q4_ = situ_ = VK_NULL_HANDLE;
  pipeline_layout_ = VK_NULL_HANDLE;
  set_layout_ = VK_NULL_HANDLE;
  pool_ = VK_NULL_HANDLE;
}

// --- recording ---------------------------------------------------------------------
void DenseTier::Barrier(VkCommandBuffer cmd, bool to_host) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  mb.dstAccessMask = to_host ? VK_ACCESS_HOST_READ_BIT : VK_ACCESS_SHADER_READ_BIT;
  vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                       to_host ? VK_PIPELINE_STAGE_HOST_BIT : VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                       0, 1, &mb, 0, nullptr, 0, nullptr);
}

namespace {
// Host writes to the mapped inputs (and the start-up uploads' copies) are
// visible to the shaders.
void HostToShader(VkCommandBuffer cmd) {
  VkMemoryBarrier host{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  host.srcAccessMask = VK_ACCESS_HOST_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  host.dstAccessMask = VK_ACCESS_SHADER_READ_BIT;
  vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &host, 0, nullptr, 0, nullptr);
}
}  // namespace

void DenseTier::Record(VkCommandBuffer cmd, const Io& io, const Placed& m, uint32_t x_off,
                       uint32_t y_off, uint32_t n) const {
  VkPipeline pipe = m.format == quant::WeightFormat::kF32    ? f32_
                    : m.format == quant::WeightFormat::kInt8 ? q8_
                                                             : q4_;
  vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
  quant::WeightView shape;
  shape.format = m.format;
  shape.cols = m.cols;
  const uint64_t row_words = RowDataBytes(shape) / 4;
  const uint64_t row_scales = RowScaleCount(shape);
  for (const Piece& pc : m.pieces) {
    vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout_, 0, 1,
                            &io.sets[pc.slab], 0, nullptr);
    for (uint32_t r = 0; r < pc.rows; r += kMaxGroupsX) {
      const uint32_t rows = std::min(kMaxGroupsX, pc.rows - r);
      Push p{static_cast<uint32_t>(pc.data_offset / 4 + r * row_words),
             static_cast<uint32_t>(pc.scales_offset / 4 + r * row_scales),
             rows,
             m.cols,
             x_off,
             y_off + pc.r0 + r,
             m.rows,
             n,
             0.0f,
             0.0f};
      vkCmdPushConstants(cmd, pipeline_layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push), &p);
      vkCmdDispatch(cmd, rows, (n + kTokens - 1) / kTokens, 1);
    }
  }
}

void DenseTier::RecordSitu(VkCommandBuffer cmd, const Io& io, uint32_t g_off, uint32_t u_off,
                           uint32_t count, float b1, float b2) const {
  vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, situ_);
  vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout_, 0, 1, &io.sets[0],
                          0, nullptr);
  Push p{g_off, u_off, count, 0, 0, 0, 0, 0, b1, b2};
  vkCmdPushConstants(cmd, pipeline_layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push), &p);
  vkCmdDispatch(cmd, std::min<uint32_t>(kMaxGroupsX, (count + 63) / 64), 1, 1);
}

// --- the executor --------------------------------------------------------------------
void DenseTier::Disable(const std::string& why) {
  if (!active_.exchange(false)) return;
  K3_LOG_WARN("vulkan dense: %s; the trunk continues on the CPU (same answers)", why.c_str());
}

void DenseTier::DrainPending() {
  if (!pending_.on) return;
  pending_.on = false;
  try {
    async_.ctx->WaitOrThrow();
  } catch (const Error& e) {
    Disable(e.what());
  }
}

bool DenseTier::MatMul(const model::Matrix& w, const float* x, size_t batch, float* y) {
  if (!active_) return false;
  const auto it = placed_.find(&w);
  if (it == placed_.end() || batch == 0) return false;
  const Placed& m = it->second;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t per_token = uint64_t{m.cols} + m.rows;
  const size_t cap = static_cast<size_t>(std::min<uint64_t>(sync_.floats / per_token, 1u << 20));
  if (cap == 0) return false;
  const double t0 = NowSeconds();
  try {
    for (size_t b0 = 0; b0 < batch; b0 += cap) {
      const uint32_t n = static_cast<uint32_t>(std::min(cap, batch - b0));
      const uint32_t y_off = n * m.cols;
      std::memcpy(sync_.data(), x + b0 * m.cols, size_t{n} * m.cols * sizeof(float));
      VkCommandBuffer cmd = sync_.ctx->Begin();
      HostToShader(cmd);
      Record(cmd, sync_, m, 0, y_off, n);
      Barrier(cmd, true);
      sync_.ctx->SubmitOrThrow();
      sync_.ctx->WaitOrThrow();
      std::memcpy(y + b0 * m.rows, sync_.data() + y_off, size_t{n} * m.rows * sizeof(float));
    }
  } catch (const Error& e) {
    Disable(e.what());
    return false;
  }
  stats_.device_ms += (NowSeconds() - t0) * 1e3;
  ++stats_.calls_on_device;
  return true;
}

bool DenseTier::BeginMlp(const model::MlpWeights& w, const float* x, size_t batch, float situ_beta,
                         float situ_linear_beta) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainPending();  // a pass abandoned by an exception left one
  if (!active_ || batch == 0) return false;
  const auto g = placed_.find(&w.gate), u = placed_.find(&w.up), d = placed_.find(&w.down);
  if (g == placed_.end() || u == placed_.end() || d == placed_.end()) return false;
  const Placed &G = g->second, &U = u->second, &D = d->second;
  if (U.rows != G.rows || U.cols != G.cols || D.cols != G.rows) return false;
  const uint64_t n = batch, in = G.cols, inter = G.rows, outc = D.rows;
  const uint64_t x_off = 0, g_off = n * in, u_off = g_off + n * inter, y_off = u_off + n * inter;
  if (y_off + n * outc > async_.floats) return false;  // the caller slices or computes it
  const double t0 = NowSeconds();
  try {
    std::memcpy(async_.data(), x, n * in * sizeof(float));
    VkCommandBuffer cmd = async_.ctx->Begin();
    HostToShader(cmd);
    const uint32_t nn = static_cast<uint32_t>(n);
    Record(cmd, async_, G, x_off, static_cast<uint32_t>(g_off), nn);
    Record(cmd, async_, U, x_off, static_cast<uint32_t>(u_off), nn);
    Barrier(cmd, false);
    RecordSitu(cmd, async_, static_cast<uint32_t>(g_off), static_cast<uint32_t>(u_off),
               static_cast<uint32_t>(n * inter), situ_beta, situ_linear_beta);
    Barrier(cmd, false);
    Record(cmd, async_, D, static_cast<uint32_t>(g_off), static_cast<uint32_t>(y_off), nn);
    Barrier(cmd, true);
    async_.ctx->SubmitOrThrow();
  } catch (const Error& e) {
    Disable(e.what());
    return false;
  }
  pending_ = {true, static_cast<uint32_t>(n), static_cast<uint32_t>(outc),
              static_cast<uint32_t>(y_off), t0};
  return true;
}

bool DenseTier::FinishMlp(float* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_.on) return false;
  pending_.on = false;
  try {
    async_.ctx->WaitOrThrow();
  } catch (const Error& e) {
    Disable(e.what());
    return false;
  }
  std::memcpy(out, async_.data() + pending_.y_off,
              size_t{pending_.n} * pending_.rows * sizeof(float));
  stats_.device_ms += (NowSeconds() - pending_.t0) * 1e3;
  ++stats_.calls_on_device;
  ++stats_.mlps_on_device;
  return true;
}

void DenseTier::AddCpuSeconds(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.cpu_ms += seconds * 1e3;
}

DenseStats DenseTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DenseStats s = stats_;
  s.active = active_;
  s.validation_errors = device_->validation_errors();
  return s;
}

// --- installation and reporting ---------------------------------------------------------
DenseTier* InstallDense(model::Model& model, const TierOptions& options) {
  static const char kNeedsVk = 0, kFailed = 0;
  if (!options.enabled) {
    if (options.dense == DenseMode::kShared || options.dense == DenseMode::kAll) {
      LogOnce(&kNeedsVk, LogLevel::kWarn,
              "vulkan dense: K3_VK_DENSE=%s ignored: the device is used only with K3_VK=1",
              DenseModeName(options.dense));
    }
    return nullptr;
  }
  if (options.dense == DenseMode::kNone) return nullptr;
  try {
    auto dense = std::make_unique<DenseTier>(model, options);
    if (!dense->nothing_placed_reason().empty()) {
      K3_LOG_INFO("vulkan dense: %s", dense->nothing_placed_reason().c_str());
      return nullptr;
    }
    DenseTier* p = dense.get();
    model.SetDenseExecutor(std::move(dense));
    return p;
  } catch (const Error& e) {
    LogOnce(&kFailed, LogLevel::kWarn,
            "vulkan dense: not started: %s; the trunk continues on the CPU", e.what());
    return nullptr;
  }
}

DenseTier* InstalledDense(model::Model& model) {
  return dynamic_cast<DenseTier*>(model.dense_executor());
}

}  // namespace k3::vulkan
