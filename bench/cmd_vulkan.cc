// `k3-bench vulkan`: the Vulkan expert tier's shaders and uploads on the
// device Vulkan picks (lavapipe on a machine without a GPU: correctness and
// plumbing only, its numbers are CPU numbers), and optionally, on a model,
// the trunk's dense shaders per weight format and decode s/token CPU-only vs
// the tier vs the tier + the trunk (K3_VK_DENSE), same run. Baselines
// measured in the same run: the device's own copy bandwidth (vkCmdCopyBuffer
// between device-local buffers), host memory read GB/s (and --device-gbps,
// the nominal bandwidth, when given), host memcpy GB/s for the uploads.
#if K3_HAVE_VULKAN

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"
#include "k3/engine/engine.h"
#include "k3/model/model.h"
#include "k3/quant/quant.h"
#include "k3/vulkan/dense.h"
#include "k3/vulkan/device.h"
#include "k3/vulkan/tier.h"

namespace k3::bench {
namespace {

struct VkArgs {
  uint32_t moe_inter = 3072;  // K3's expert intermediate (spec §2)
  uint32_t latent = 3584;     // K3's latent width
  int experts = 4;
  std::vector<int> batches = {1, 8};
  int reps = 5;
  double device_gbps = 0;
  std::string model_dir;
  int decode_tokens = 8;
  std::vector<int> dense_bits = {4, 8};  // K3_BITS for the dense shader lines (32 = f32)
  double copy_mb = 256;                  // the device copy probe's buffer
};

JsonWriter Line(const char* what, const std::string& device) {
  JsonWriter j;
  j.BeginObject();
  j.Field("bench", "vulkan").Field("what", what).Field("git", SourceRevision());
  j.Field("cpu", CpuModel()).Field("device", device);
  return j;
}

void Print(JsonWriter& j) {
  j.EndObject();
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

// Host read GB/s over `bytes` (sum of 64-bit words), median of reps.
double HostReadGbps(size_t bytes, int reps) {
  std::vector<uint64_t> buf(bytes / 8, 1);
  static volatile uint64_t sink = 0;
  std::vector<double> r;
  for (int i = 0; i < reps; ++i) {
    const double t0 = NowSeconds();
    uint64_t s = 0;
    for (uint64_t v : buf) s += v;
    sink = sink + s;
    r.push_back(static_cast<double>(bytes) / (NowSeconds() - t0) / 1e9);
  }
  return Median(r);
}

// The device's memory bandwidth as a copy sees it: vkCmdCopyBuffer between
// two device-local buffers, (read + written bytes) / time, median of reps.
double DeviceCopyGbps(vulkan::Device& dev, uint64_t bytes, int reps) {
  bytes = std::min<uint64_t>(bytes, dev.info().max_allocation ? dev.info().max_allocation : bytes);
  vulkan::Buffer src = dev.CreateBufferOrThrow(bytes, vulkan::Buffer::Kind::kDeviceLocal);
  vulkan::Buffer dst = dev.CreateBufferOrThrow(bytes, vulkan::Buffer::Kind::kDeviceLocal);
  vulkan::CommandContext ctx(dev, false);
  std::vector<double> r;
  for (int i = 0; i <= reps; ++i) {
    VkCommandBuffer cmd = ctx.Begin();
    VkBufferCopy region{0, 0, bytes};
    vkCmdCopyBuffer(cmd, src.handle(), dst.handle(), 1, &region);
    const double t0 = NowSeconds();
    ctx.SubmitOrThrow();
    ctx.WaitOrThrow();
    if (i > 0) r.push_back(2.0 * static_cast<double>(bytes) / (NowSeconds() - t0) / 1e9);
  }
  return Median(r);
}

double g_device_copy_gbps = 0;  // measured once per run, the shader lines' baseline

void RunShaders(const VkArgs& a) {
  auto dev = vulkan::Device::OpenOrThrow({});
  const vulkan::DeviceInfo& info = dev->info();
  g_device_copy_gbps = DeviceCopyGbps(*dev, static_cast<uint64_t>(a.copy_mb * 1048576.0), a.reps);
  {
    JsonWriter j = Line("device_copy", info.name);
    j.Field("type", info.type).Field("bytes", static_cast<uint64_t>(a.copy_mb * 1048576.0));
    j.Field("reps", a.reps).Field("copy_gbps", g_device_copy_gbps);
    Print(j);
  }
  const uint32_t max_batch =
      static_cast<uint32_t>(*std::max_element(a.batches.begin(), a.batches.end()));
  vulkan::ExpertKernels k(*dev, {a.moe_inter, a.latent, 4.0f, 25.0f},
                          max_batch * static_cast<uint32_t>(a.experts));
  const uint64_t slot = k.layout().slot_bytes;
  const uint64_t slab_bytes = slot * static_cast<uint64_t>(a.experts);
  vulkan::Buffer slab = dev->CreateBufferOrThrow(slab_bytes, vulkan::Buffer::Kind::kDeviceLocal);
  const uint32_t w = k.AddWeights(slab);
  std::mt19937 rng(7);
  std::vector<std::byte> bytes(slab_bytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(rng());
  // E8M0 scales near 2^0 so the outputs stay finite.
  for (int e = 0; e < a.experts; ++e) {
    for (int p : {1, 3, 5}) {
      std::byte* s = bytes.data() + static_cast<uint64_t>(e) * slot + k.layout().offset[p];
      for (uint64_t i = 0; i < k.layout().bytes[p]; ++i)
        s[i] = static_cast<std::byte>(120 + rng() % 8);
    }
  }
  // Uploads vs host memcpy of the same bytes.
  {
    vulkan::Uploader up(*dev, 64u << 20);
    std::vector<double> gbps, memcpy_gbps;
    std::vector<std::byte> copy(bytes.size());
    for (int i = 0; i < a.reps; ++i) {
      double t0 = NowSeconds();
      up.UploadOrThrow(slab, 0, bytes);
      gbps.push_back(static_cast<double>(slab_bytes) / (NowSeconds() - t0) / 1e9);
      t0 = NowSeconds();
      std::memcpy(copy.data(), bytes.data(), bytes.size());
      memcpy_gbps.push_back(static_cast<double>(slab_bytes) / (NowSeconds() - t0) / 1e9);
    }
    JsonWriter j = Line("upload", info.name);
    j.Field("type", info.type).Field("bytes", slab_bytes).Field("reps", a.reps);
    j.Field("upload_gbps", Median(gbps)).Field("host_memcpy_gbps", Median(memcpy_gbps));
    j.Field("ratio_vs_memcpy", Median(gbps) / Median(memcpy_gbps));
    Print(j);
  }
  const double host_gbps = HostReadGbps(slab_bytes, a.reps);
  const uint64_t weight_bytes =
      3ull * a.moe_inter * a.latent / 2 + 3ull * a.moe_inter * a.latent / 32;
  for (int batch : a.batches) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const uint32_t n = static_cast<uint32_t>(batch);
    std::vector<vulkan::ExpertKernels::Job> jobs;
    for (int e = 0; e < a.experts; ++e) {
      jobs.push_back({w, static_cast<uint64_t>(e) * slot, static_cast<uint32_t>(e) * n, n});
    }
    float* acts = k.acts();
    for (size_t i = 0; i < static_cast<size_t>(a.experts) * n * a.latent; ++i) acts[i] = nd(rng);
    std::vector<double> secs;
    for (int i = 0; i <= a.reps; ++i) {
      const double t0 = NowSeconds();
      k.SubmitOrThrow(jobs);
      k.WaitOrThrow();
      if (i > 0) secs.push_back(NowSeconds() - t0);  // the first run warms the pipelines
    }
    // Parity of the first expert against the CPU kernels (f32 activations).
    const vulkan::SlotLayout& L = k.layout();
    auto view = [&](int p, size_t rows, size_t cols) {
      quant::WeightView v;
      v.format = quant::WeightFormat::kMxfp4;
      v.rows = rows;
      v.cols = cols;
      v.data = bytes.data() + L.offset[p];
      v.e8m0 = reinterpret_cast<const uint8_t*>(bytes.data() + L.offset[p + 1]);
      return v;
    };
    std::vector<float> g(n * a.moe_inter), u(n * a.moe_inter), y(n * a.latent);
    quant::MatMul(view(0, a.moe_inter, a.latent), acts, n, g.data());
    quant::MatMul(view(4, a.moe_inter, a.latent), acts, n, u.data());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = 4.0f * std::tanh(g[i] / 4.0f) * (1.0f / (1.0f + std::exp(-g[i]))) * 25.0f *
             std::tanh(u[i] / 25.0f);
    }
    quant::MatMul(view(2, a.latent, a.moe_inter), g.data(), n, y.data());
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double d = static_cast<double>(k.out()[i]) - y[i];
      num += d * d;
      den += static_cast<double>(y[i]) * y[i];
    }
    const double med = Median(secs);
    const double gbps = static_cast<double>(weight_bytes) * a.experts / med / 1e9;
    JsonWriter j = Line("shader", info.name);
    j.Field("type", info.type).Field("moe_inter", static_cast<int64_t>(a.moe_inter));
    j.Field("latent", static_cast<int64_t>(a.latent))
        .Field("experts", static_cast<int64_t>(a.experts));
    j.Field("batch", static_cast<int64_t>(batch)).Field("reps", a.reps);
    j.Field("median_ms", med * 1e3)
        .Field("min_ms", *std::min_element(secs.begin(), secs.end()) * 1e3);
    j.Field("max_ms", *std::max_element(secs.begin(), secs.end()) * 1e3);
    j.Field("weight_gbps", gbps).Field("host_read_gbps", host_gbps);
    j.Field("ratio_vs_host_read", gbps / host_gbps);
    j.Field("ratio_vs_device_copy", gbps / g_device_copy_gbps);
    if (a.device_gbps > 0) j.Field("ratio_vs_device_bandwidth", gbps / a.device_gbps);
    j.Field("rel_l2_vs_cpu", den > 0 ? std::sqrt(num / den) : 0.0);
    Print(j);
  }
}

double DecodeSecondsPerToken(model::Model& m, int tokens, int reps) {
  model::RunOptions ro;
  ro.idot = false;
  std::vector<double> spt;
  std::vector<float> last(static_cast<size_t>(m.config().vocab_size));
  for (int r = 0; r < reps; ++r) {
    model::Session s(m, ro, tokens + 1);
    model::ForwardOutputs out;
    out.logits_last = last.data();
    int32_t id = static_cast<int32_t>(m.config().bos_token_id >= 0 ? m.config().bos_token_id : 0);
    s.Forward(std::span<const int32_t>(&id, 1), out);
    const double t0 = NowSeconds();
    for (int t = 0; t < tokens; ++t) {
      id = model::Sampler::Argmax(last);
      s.Forward(std::span<const int32_t>(&id, 1), out);
    }
    spt.push_back((NowSeconds() - t0) / tokens);
  }
  return Median(spt);
}

const char* FormatName(quant::WeightFormat f) {
  switch (f) {
    case quant::WeightFormat::kF32:
      return "f32";
    case quant::WeightFormat::kInt8:
      return "int8";
    case quant::WeightFormat::kInt4G64:
      return "int4-g64";
    default:
      return "mxfp4";
  }
}

// The trunk's dense shaders: for each K3_BITS in --dense-bits, the model's
// largest placed matrix of each format, y = W x at each batch through the
// executor (the host copies of x and y and the submit included, as the
// forward pass sees them), weight GB/s against the device copy probe.
void RunDense(const VkArgs& a) {
  for (int bits : a.dense_bits) {
    model::LoadOptions lo = engine::EngineOptions::FromEnv(a.model_dir).load;
    lo.bits = bits;
    lo.mla_bits = bits;
    lo.head_bits = bits;
    lo.bits_explicit = true;
    lo.progress = false;
    auto m = model::Model::LoadOrThrow(a.model_dir, lo);
    vulkan::TierOptions o = vulkan::TierOptions::FromEnv();
    o.enabled = true;
    o.dense = vulkan::DenseMode::kAll;
    vulkan::DenseTier d(*m, o);
    std::vector<const model::Matrix*> largest(8, nullptr);
    for (const vulkan::TrunkMatrix& t : vulkan::ListTrunk(m->weights())) {
      const auto f = static_cast<size_t>(t.matrix->format());
      if (!d.holds(*t.matrix) || f >= largest.size()) continue;
      if (!largest[f] || t.matrix->resident_bytes() > largest[f]->resident_bytes()) {
        largest[f] = t.matrix;
      }
    }
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const model::Matrix* w : largest) {
      if (w == nullptr) continue;
      for (int batch : a.batches) {
        const size_t n = static_cast<size_t>(batch);
        std::vector<float> x(n * w->cols()), y(n * w->rows()), ref(n * w->rows());
        for (float& v : x) v = nd(rng);
        std::vector<double> secs;
        for (int i = 0; i <= a.reps; ++i) {
          const double t0 = NowSeconds();
          if (!d.MatMul(*w, x.data(), n, y.data())) return;  // announced by the executor
          if (i > 0) secs.push_back(NowSeconds() - t0);
        }
        quant::MatMul(w->view(), x.data(), n, ref.data());
        double num = 0, den = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          const double e = static_cast<double>(y[i]) - ref[i];
          num += e * e;
          den += static_cast<double>(ref[i]) * ref[i];
        }
        const double med = Median(secs);
        const double gbps = static_cast<double>(w->resident_bytes()) / med / 1e9;
        JsonWriter j = Line("dense", d.stats().device);
        j.Field("format", FormatName(w->format()));
        j.Field("rows", static_cast<uint64_t>(w->rows()))
            .Field("cols", static_cast<uint64_t>(w->cols()));
        j.Field("bytes", w->resident_bytes()).Field("batch", static_cast<int64_t>(batch));
        j.Field("reps", a.reps).Field("median_ms", med * 1e3).Field("weight_gbps", gbps);
        j.Field("device_copy_gbps", g_device_copy_gbps);
        j.Field("ratio_vs_device_copy", gbps / g_device_copy_gbps);
        if (a.device_gbps > 0) j.Field("ratio_vs_device_bandwidth", gbps / a.device_gbps);
        j.Field("rel_l2_vs_cpu", den > 0 ? std::sqrt(num / den) : 0.0);
        Print(j);
      }
    }
  }
}

void RunDecode(const VkArgs& a) {
  // K3_BITS etc. as k3-run reads them (the engine's one reader).
  model::LoadOptions lo = engine::EngineOptions::FromEnv(a.model_dir).load;
  lo.progress = false;
  auto m = model::Model::LoadOrThrow(a.model_dir, lo);
  const double cpu = DecodeSecondsPerToken(*m, a.decode_tokens, a.reps);
  vulkan::TierOptions o = vulkan::TierOptions::FromEnv();
  o.enabled = true;
  o.cache_dir.clear();  // a benchmark leaves no history behind
  vulkan::VulkanTier* tier = vulkan::InstallTier(*m, o);
  if (tier == nullptr) return;
  DecodeSecondsPerToken(*m, a.decode_tokens, 1);  // warm: promotions
  tier->WaitUploads();
  const double gpu = DecodeSecondsPerToken(*m, a.decode_tokens, a.reps);
  const vulkan::TierStats s = tier->stats();
  // Then the trunk too: K3_VK_DENSE as set, `all` when it is unset or auto
  // (so a CPU device is measured too).
  if (o.dense == vulkan::DenseMode::kAuto || o.dense == vulkan::DenseMode::kNone) {
    o.dense = vulkan::DenseMode::kAll;
  }
  vulkan::DenseTier* dense = vulkan::InstallDense(*m, o);
  const double both = dense ? DecodeSecondsPerToken(*m, a.decode_tokens, a.reps) : 0;
  JsonWriter j = Line("decode", s.device);
  j.Field("model", a.model_dir).Field("tokens", static_cast<int64_t>(a.decode_tokens));
  j.Field("reps", a.reps).Field("cpu_s_per_token", cpu).Field("tier_s_per_token", gpu);
  j.Field("ratio_tier_vs_cpu", gpu / cpu).Field("experts_resident", s.experts_resident);
  j.Field("pairs_on_device", s.pairs_on_device).Field("pairs_on_cpu", s.pairs_on_cpu);
  if (dense) {
    const vulkan::DenseStats ds = dense->stats();
    j.Field("dense_mode", vulkan::DenseModeName(o.dense));
    j.Field("tier_dense_s_per_token", both).Field("ratio_tier_dense_vs_cpu", both / cpu);
    j.Field("dense_matrices_on_device", ds.matrices_on_device);
    j.Field("dense_bytes_on_device", ds.bytes_on_device).Field("dense_active", ds.active);
  }
  Print(j);
}

void SetupVulkan(CLI::App& root) {
  auto a = std::make_shared<VkArgs>();
  CLI::App* cmd = root.add_subcommand(
      "vulkan",
      "Vulkan: device copy GB/s, MXFP4 and dense shader GB/s, upload GB/s, decode CPU vs tier vs "
      "tier + trunk");
  cmd->add_option("--moe-inter", a->moe_inter, "expert intermediate width (default 3072)");
  cmd->add_option("--latent", a->latent, "latent width (default 3584)");
  cmd->add_option("--experts", a->experts, "experts per timed submission (default 4)");
  cmd->add_option("--batches", a->batches, "tokens per expert (default 1 8)");
  cmd->add_option("--reps", a->reps, "repetitions (median reported; default 5)");
  cmd->add_option("--device-gbps", a->device_gbps, "the device's nominal memory GB/s, for a ratio");
  cmd->add_option("--model", a->model_dir, "also time decode with the tier vs CPU on this model");
  cmd->add_option("--decode-tokens", a->decode_tokens, "timed decode steps (default 8)");
  cmd->add_option("--dense-bits", a->dense_bits,
                  "with --model: K3_BITS of the dense shader lines (4, 8, 32; default 4 8)");
  cmd->add_option("--copy-mb", a->copy_mb, "device copy probe buffer in MiB (default 256)");
  cmd->callback([a] {
    RunShaders(*a);
    if (!a->model_dir.empty()) {
      RunDense(*a);
      RunDecode(*a);
    }
  });
}

K3_REGISTER_BENCH(SetupVulkan);

}  // namespace
}  // namespace k3::bench

#endif  // K3_HAVE_VULKAN
