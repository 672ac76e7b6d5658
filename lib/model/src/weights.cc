#include "k3/model/weights.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/core/numeric.h"
#include "k3/core/sys.h"
#include "k3/model/tensor_table.h"

namespace k3::model {
namespace {

const std::vector<DType> kFloatDTypes = {DType::kBF16, DType::kF16, DType::kF32};
constexpr size_t kRowBlock = 1024;  // rows converted per read while quantizing

std::string LayerPrefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

}  // namespace

Matrix Matrix::F32(size_t rows, size_t cols, std::vector<float> values) {
  K3_CHECK(values.size() == rows * cols);
  Matrix m;
  m.f32_ = std::move(values);
  m.view_.format = quant::WeightFormat::kF32;
  m.view_.rows = rows;
  m.view_.cols = cols;
  m.view_.data = m.f32_.data();
  return m;
}

uint64_t Matrix::resident_bytes() const {
  switch (view_.format) {
    case quant::WeightFormat::kF32:
      return 4ull * view_.rows * view_.cols;
    case quant::WeightFormat::kInt8:
      return view_.rows * view_.cols + 4ull * view_.rows;
    case quant::WeightFormat::kInt4G64:
      return view_.rows * view_.cols / 2 + 4ull * view_.rows * (view_.cols / 64);
    case quant::WeightFormat::kMxfp4:
      return view_.rows * view_.cols / 2 + view_.rows * view_.cols / 32;
  }
  return 0;
}

EmbeddingTable::EmbeddingTable(TensorRef ref, int64_t vocab, int64_t hidden)
    : ref_(ref), vocab_(vocab), hidden_(hidden) {}

void EmbeddingTable::RowOrThrow(int64_t id, float* out) const {
  if (id < 0 || id >= vocab_) {
    throw Error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                 " outside the vocabulary [0, " +
                                                 std::to_string(vocab_) + ")");
  }
  const size_t esize = DTypeSize(ref_.info->dtype);
  const size_t row_bytes = esize * static_cast<size_t>(hidden_);
  std::vector<std::byte> raw(row_bytes);
  PreadFull(ref_.file->fd(), raw, ref_.offset + static_cast<uint64_t>(id) * row_bytes,
            ref_.file->path());
  ConvertToF32(ref_.info->dtype, raw, {out, static_cast<size_t>(hidden_)});
}

// Builds Matrix objects from tensors; shared state for the loader threads.
class WeightLoader {
 public:
  WeightLoader(const Snapshot& snap, const LoadOptions& opt, ModelWeights* w)
      : snap_(snap), opt_(opt), w_(w) {}

  // Class bits: 32+ = f32, 5..31 = int8, <= 4 = int4-g64 (when cols % 64 == 0).
  // `always_f32` marks tensors the spec keeps in f32 whatever the bits.
  struct Job {
    std::string name;
    size_t rows = 0;
    size_t cols = 0;
    int bits = 32;
    bool always_f32 = false;
    Matrix* out = nullptr;
  };

  // A matrix of the tensor table: its shape from the table; a kFloat entry
  // (router, f_a, f_b, b_proj) stays f32 whatever the bits (spec §6.7).
  void Add(const TensorTableEntry& t, int bits, Matrix* out) {
    K3_CHECK(t.kind != TensorKind::kExpert && t.shape.size() == 2);
    const bool always_f32 = t.kind == TensorKind::kFloat;
    jobs_.push_back(Job{t.name, static_cast<size_t>(t.shape[0]), static_cast<size_t>(t.shape[1]),
                        always_f32 ? 32 : bits, always_f32, out});
  }

  void MapShardsIfNeeded() {
    if (!opt_.mmap) return;
    for (const auto& f : snap_.shards()) w_->maps.push_back(MappedFile::OpenOrThrow(f.path()));
  }

  void RunAll() {
    // Largest first so the threads finish together.
    std::vector<size_t> order(jobs_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return jobs_[a].rows * jobs_[a].cols > jobs_[b].rows * jobs_[b].cols;
    });
    for (const Job& j : jobs_) total_elems_ += j.rows * j.cols;
    int threads = opt_.threads > 0 ? opt_.threads : std::min(NumOnlineCpus(), 8);
    threads = std::max(1, std::min<int>(threads, static_cast<int>(jobs_.size())));
    std::atomic<size_t> next{0};
    std::exception_ptr error;
    std::mutex error_mu;
    // The quantizers split rows over OpenMP threads themselves; give each loader
    // thread its share of the CPUs so N loaders do not start N full teams.
    const int omp_per_worker = std::max(1, NumOnlineCpus() / threads);
    auto worker = [&] {
      omp_set_num_threads(omp_per_worker);
      for (;;) {
        size_t i = next.fetch_add(1);
        if (i >= order.size()) return;
        {
          std::lock_guard<std::mutex> lock(error_mu);
          if (error) return;
        }
        try {
          RunJob(jobs_[order[i]]);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (!error) error = std::current_exception();
          return;
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
    const int saved_omp = omp_get_max_threads();  // the calling thread's setting outlives the load
    worker();
    omp_set_num_threads(saved_omp);
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
  }

 private:
  void Progress(size_t elems) {
    size_t done = done_elems_.fetch_add(elems) + elems;
    if (!opt_.progress) return;
    double now = NowSeconds();
    std::lock_guard<std::mutex> lock(progress_mu_);
    if (now - last_progress_ < 2.0 && done < total_elems_) return;
    if (done >= total_elems_ && reported_done_) return;
    last_progress_ = now;
    reported_done_ = done >= total_elems_;
    K3_LOG_INFO(
        "loading weights: %.0f%% of %zu matrices (%.2f G elements)",
        100.0 * static_cast<double>(done) / static_cast<double>(std::max<size_t>(1, total_elems_)),
        jobs_.size(), static_cast<double>(total_elems_) * 1e-9);
  }

  void RunJob(const Job& job) {
    TensorRef r = snap_.FindOrThrow(job.name);
    if (r.info->dtype == DType::kU8 && !job.always_f32) {
      LoadPrepared(job, r);
    } else {
      LoadFloat(job);
    }
    Progress(job.rows * job.cols);
  }

  // A k3-repack matrix: U8 payload + `<name>.qs` F32 scales; the format is
  // recognised by byte counts alone (§6.7), never by the configured bits.
  void LoadPrepared(const Job& job, const TensorRef& r) {
    const std::string qs_name = job.name + ".qs";
    auto qs = snap_.Find(qs_name);
    if (!qs) {
      throw Error(ErrorCode::kCorrupt, "U8 matrix without its '.qs' scale sidecar", r.file->path(),
                  static_cast<int64_t>(r.offset), r.info->name);
    }
    const uint64_t nbytes = r.info->nbytes();
    const uint64_t qn = qs->info->numel();
    const size_t rows = job.rows, cols = job.cols;
    quant::WeightFormat fmt;
    if (nbytes == uint64_t{rows} * cols && qn == rows) {
      fmt = quant::WeightFormat::kInt8;
    } else if (cols % 64 == 0 && nbytes == uint64_t{rows} * cols / 2 && qn == rows * (cols / 64)) {
      fmt = quant::WeightFormat::kInt4G64;
    } else {
      throw Error(ErrorCode::kCorrupt,
                  "untrusted container: " + std::to_string(nbytes) + " bytes and " +
                      std::to_string(qn) + " scales match neither int8 nor int4-g64 for [" +
                      std::to_string(rows) + ", " + std::to_string(cols) + "]",
                  r.file->path(), static_cast<int64_t>(r.offset), r.info->name);
    }
    const bool downcast =
        fmt == quant::WeightFormat::kInt8 && opt_.bits_explicit && job.bits <= 4 && cols % 64 == 0;
    Matrix& m = *job.out;
    m.view_.rows = rows;
    m.view_.cols = cols;
    ++container_matrices_;
    if (opt_.mmap) {
      if (downcast) {
        throw Error(ErrorCode::kUnsupported,
                    "K3_MMAP=1 cannot downcast int8 to int4 (unset K3_BITS or K3_MMAP)",
                    r.file->path(), static_cast<int64_t>(r.offset), r.info->name);
      }
      if (qs->info->dtype != DType::kF32) {
        throw Error(ErrorCode::kUnsupported, "K3_MMAP=1 needs F32 '.qs' scales", qs->file->path(),
                    static_cast<int64_t>(qs->offset), qs->info->name);
      }
      if (qs->offset % 4 != 0) {
        throw Error(ErrorCode::kUnsupported, "K3_MMAP=1: '.qs' scales are not 4-byte aligned",
                    qs->file->path(), static_cast<int64_t>(qs->offset), qs->info->name);
      }
      const std::byte* base = w_->maps.at(r.shard_idx).data();
      const std::byte* qbase = w_->maps.at(qs->shard_idx).data();
      m.view_.format = fmt;
      m.view_.data = base + r.offset;
      m.view_.scales = reinterpret_cast<const float*>(qbase + qs->offset);
      m.mapped_ = true;
      return;
    }
    std::vector<uint8_t> payload(nbytes);
    r.file->ReadOrThrow(*r.info, std::as_writable_bytes(std::span(payload)));
    std::vector<float> scales = qs->file->ReadF32OrThrow(*qs->info);
    if (downcast) {
      m.bytes_.resize(rows * cols / 2);
      m.scales_.resize(rows * (cols / 64));
      quant::DowncastInt8ToInt4G64(reinterpret_cast<const int8_t*>(payload.data()), scales.data(),
                                   rows, cols, m.bytes_.data(), m.scales_.data());
      fmt = quant::WeightFormat::kInt4G64;
    } else {
      m.bytes_ = std::move(payload);
      m.scales_ = std::move(scales);
    }
    m.view_.format = fmt;
    m.view_.data = m.bytes_.data();
    m.view_.scales = m.scales_.data();
  }

  // BF16/F16/F32 source: converted in row blocks and quantized per the class bits.
  void LoadFloat(const Job& job) {
    TensorRef r = snap_.FindCheckedOrThrow(
        job.name, kFloatDTypes, {static_cast<int64_t>(job.rows), static_cast<int64_t>(job.cols)});
    if (opt_.mmap && !job.always_f32) {
      throw Error(ErrorCode::kUnsupported,
                  std::string("K3_MMAP=1 maps only a fully prepared container; this matrix is ") +
                      std::string(DTypeName(r.info->dtype)) +
                      " and would need conversion (repack it, or unset K3_MMAP)",
                  r.file->path(), static_cast<int64_t>(r.offset), r.info->name);
    }
    const size_t rows = job.rows, cols = job.cols;
    Matrix& m = *job.out;
    m.view_.rows = rows;
    m.view_.cols = cols;
    quant::WeightFormat fmt = job.bits >= 32                    ? quant::WeightFormat::kF32
                              : quant::UsesInt4(job.bits, cols) ? quant::WeightFormat::kInt4G64
                                                                : quant::WeightFormat::kInt8;
    m.view_.format = fmt;
    if (fmt == quant::WeightFormat::kF32) {
      m.f32_.resize(rows * cols);
    } else if (fmt == quant::WeightFormat::kInt8) {
      m.bytes_.resize(rows * cols);
      m.scales_.resize(rows);
      ++quantized_matrices_;
    } else {
      m.bytes_.resize(rows * cols / 2);
      m.scales_.resize(rows * (cols / 64));
      ++quantized_matrices_;
    }
    const size_t esize = DTypeSize(r.info->dtype);
    std::vector<std::byte> raw;
    std::vector<float> block;
    for (size_t r0 = 0; r0 < rows; r0 += kRowBlock) {
      const size_t n = std::min(kRowBlock, rows - r0);
      float* dst;
      if (fmt == quant::WeightFormat::kF32) {
        dst = m.f32_.data() + r0 * cols;
      } else {
        block.resize(n * cols);
        dst = block.data();
      }
      raw.resize(n * cols * esize);
      PreadFull(r.file->fd(), raw, r.offset + uint64_t{r0} * cols * esize, r.file->path());
      ConvertToF32(r.info->dtype, raw, {dst, n * cols});
      if (fmt == quant::WeightFormat::kInt8) {
        quant::QuantizeInt8Rows(dst, n, cols,
                                reinterpret_cast<int8_t*>(m.bytes_.data()) + r0 * cols,
                                m.scales_.data() + r0);
      } else if (fmt == quant::WeightFormat::kInt4G64) {
        quant::QuantizeInt4G64Rows(dst, n, cols, m.bytes_.data() + r0 * cols / 2,
                                   m.scales_.data() + r0 * (cols / 64));
      }
    }
    if (fmt == quant::WeightFormat::kF32) {
      m.view_.data = m.f32_.data();
    } else {
      m.view_.data = m.bytes_.data();
      m.view_.scales = m.scales_.data();
    }
  }

 public:
  std::atomic<int64_t> quantized_matrices_{0};
  std::atomic<int64_t> container_matrices_{0};

 private:
  const Snapshot& snap_;
  const LoadOptions& opt_;
  ModelWeights* w_;
  std::vector<Job> jobs_;
  size_t total_elems_ = 0;
  std::atomic<size_t> done_elems_{0};
  std::mutex progress_mu_;
  double last_progress_ = 0;
  bool reported_done_ = false;
};

namespace {

// The tensor table by name: the loader names the tensor each field holds and
// takes its shape and kind from here only. Asking for a name the table lacks,
// or leaving a non-expert entry unread, is a broken invariant (the loader and
// the table disagree), not bad input.
class Table {
 public:
  explicit Table(const ModelConfig& c) : entries_(K3TensorTable(c)) {
    for (const TensorTableEntry& t : entries_) by_name_.emplace(t.name, &t);
  }
  const TensorTableEntry& operator[](const std::string& name) {
    auto it = by_name_.find(name);
    K3_CHECK(it != by_name_.end());
    used_.insert(name);
    return *it->second;
  }
  // Non-expert entries never asked for (layers past `layers`, the head when absent, skipped).
  size_t UnreadEntries(int64_t layers, bool head) const {
    size_t n = 0;
    for (const TensorTableEntry& t : entries_) {
      const bool wanted = t.layer >= 0 ? t.layer < layers : (head || t.name == "model.embed_tokens.weight");
      if (t.kind != TensorKind::kExpert && wanted && !used_.count(t.name)) ++n;
    }
    return n;
  }
  size_t read() const { return used_.size(); }

 private:
  std::vector<TensorTableEntry> entries_;
  std::unordered_map<std::string, const TensorTableEntry*> by_name_;
  std::unordered_set<std::string> used_;
};

// A small f32 tensor: any shape with the table's element count (or, with
// min_numel, at least that many).
std::vector<float> ReadVector(const Snapshot& snap, const TensorTableEntry& t) {
  if (t.min_numel == 0) {
    TensorRef r = snap.FindCheckedOrThrow(t.name, kFloatDTypes, {static_cast<int64_t>(t.numel())});
    return r.file->ReadF32OrThrow(*r.info);
  }
  TensorRef r = snap.FindOrThrow(t.name);
  if (!IsFloatReadable(r.info->dtype) || r.info->numel() < static_cast<uint64_t>(t.min_numel)) {
    throw Error(ErrorCode::kCorrupt,
                "must be a float tensor with at least " + std::to_string(t.min_numel) + " elements",
                r.file->path(), static_cast<int64_t>(r.offset), r.info->name);
  }
  return r.file->ReadF32OrThrow(*r.info);
}

std::vector<float> ScoreWeight(const Snapshot& snap, const TensorTableEntry& norm, const TensorTableEntry& proj) {
  std::vector<float> a = ReadVector(snap, norm);
  std::vector<float> b = ReadVector(snap, proj);
  K3_CHECK(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] *= b[i];
  return a;
}

}  // namespace

ModelWeights LoadWeightsOrThrow(const Snapshot& snap, const ModelConfig& c,
                                const LoadOptions& opt) {
  const double t0 = NowSeconds();
  ModelWeights w;
  WeightLoader loader(snap, opt, &w);
  loader.MapShardsIfNeeded();
  Table T(c);
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& L = w.layers[static_cast<size_t>(i)];
    const std::string pre = LayerPrefix(i);
    auto t = [&](const char* leaf) -> const TensorTableEntry& { return T[pre + leaf]; };
    L.is_kda = c.is_kda[static_cast<size_t>(i)];
    L.is_moe = c.is_moe(i);
    L.input_norm = ReadVector(snap, t("input_layernorm.weight"));
    L.post_norm = ReadVector(snap, t("post_attention_layernorm.weight"));
    L.attn_sw = ScoreWeight(snap, t("self_attention_res_norm.weight"), t("self_attention_res_proj.weight"));
    L.mlp_sw = ScoreWeight(snap, t("mlp_res_norm.weight"), t("mlp_res_proj.weight"));
    if (L.is_kda) {
      KdaWeights& k = L.kda;
      loader.Add(t("self_attn.q_proj.weight"), opt.bits, &k.q);
      loader.Add(t("self_attn.k_proj.weight"), opt.bits, &k.k);
      loader.Add(t("self_attn.v_proj.weight"), opt.bits, &k.v);
      loader.Add(t("self_attn.g_proj.weight"), opt.bits, &k.g);
      loader.Add(t("self_attn.o_proj.weight"), opt.bits, &k.o);
      loader.Add(t("self_attn.f_a_proj.weight"), 32, &k.f_a);
      loader.Add(t("self_attn.f_b_proj.weight"), 32, &k.f_b);
      loader.Add(t("self_attn.b_proj.weight"), 32, &k.b);
      k.q_conv = ReadVector(snap, t("self_attn.q_conv1d.weight"));
      k.k_conv = ReadVector(snap, t("self_attn.k_conv1d.weight"));
      k.v_conv = ReadVector(snap, t("self_attn.v_conv1d.weight"));
      k.dt_bias = ReadVector(snap, t("self_attn.dt_bias"));
      k.o_norm = ReadVector(snap, t("self_attn.o_norm.weight"));
      // A_log holds at least one value per head; the release zero-pads it to head_dim.
      std::vector<float> a_log = ReadVector(snap, t("self_attn.A_log"));
      k.a.resize(static_cast<size_t>(c.kda_num_heads));
      for (size_t h = 0; h < k.a.size(); ++h) k.a[h] = std::exp(a_log[h]);
    } else {
      MlaWeights& m = L.mla;
      loader.Add(t("self_attn.q_a_proj.weight"), opt.mla_bits, &m.q_a);
      loader.Add(t("self_attn.q_b_proj.weight"), opt.mla_bits, &m.q_b);
      loader.Add(t("self_attn.kv_a_proj_with_mqa.weight"), opt.mla_bits, &m.kv_a);
      loader.Add(t("self_attn.kv_b_proj.weight"), opt.mla_bits, &m.kv_b);
      loader.Add(t("self_attn.o_proj.weight"), opt.mla_bits, &m.o);
      loader.Add(t("self_attn.g_proj.weight"), opt.mla_bits, &m.g);
      m.q_a_norm = ReadVector(snap, t("self_attn.q_a_layernorm.weight"));
      m.kv_a_norm = ReadVector(snap, t("self_attn.kv_a_layernorm.weight"));
    }
    if (!L.is_moe) {
      loader.Add(t("mlp.gate_proj.weight"), opt.bits, &L.dense.gate);
      loader.Add(t("mlp.up_proj.weight"), opt.bits, &L.dense.up);
      loader.Add(t("mlp.down_proj.weight"), opt.bits, &L.dense.down);
    } else {
      MoeWeights& m = L.moe;
      loader.Add(t("block_sparse_moe.gate.weight"), 32, &m.router);
      m.score_bias = ReadVector(snap, t("block_sparse_moe.gate.e_score_correction_bias"));
      loader.Add(t("block_sparse_moe.routed_expert_down_proj.weight"), opt.bits, &m.latent_down);
      loader.Add(t("block_sparse_moe.routed_expert_up_proj.weight"), opt.bits, &m.latent_up);
      m.latent_norm = ReadVector(snap, t("block_sparse_moe.routed_expert_norm.weight"));
      if (c.shared_intermediate() > 0) {
        loader.Add(t("block_sparse_moe.shared_experts.gate_proj.weight"), opt.bits, &m.shared.gate);
        loader.Add(t("block_sparse_moe.shared_experts.up_proj.weight"), opt.bits, &m.shared.up);
        loader.Add(t("block_sparse_moe.shared_experts.down_proj.weight"), opt.bits, &m.shared.down);
      }
    }
  }

  const TensorTableEntry& emb_spec = T["model.embed_tokens.weight"];
  TensorRef emb = snap.FindCheckedOrThrow(emb_spec.name, kFloatDTypes, emb_spec.shape);
  w.embed = EmbeddingTable(emb, emb_spec.shape[0], emb_spec.shape[1]);
  w.has_head = snap.Find("model.norm.weight").has_value();
  if (w.has_head) {
    w.final_norm = ReadVector(snap, T["model.norm.weight"]);
    w.out_sw = ScoreWeight(snap, T["model.output_attn_res_norm.weight"], T["model.output_attn_res_proj.weight"]);
    loader.Add(T["lm_head.weight"], opt.head_bits, &w.lm_head);
  }
  K3_CHECK(T.UnreadEntries(c.num_hidden_layers, w.has_head) == 0);
  w.tensors_read = static_cast<int64_t>(T.read());
  loader.RunAll();

  auto add = [&](const Matrix& m) { w.resident_bytes += m.resident_bytes(); };
  for (const LayerWeights& L : w.layers) {
    for (const Matrix* m :
         {&L.kda.q,           &L.kda.k,         &L.kda.v,           &L.kda.g,
          &L.kda.o,           &L.kda.f_a,       &L.kda.f_b,         &L.kda.b,
          &L.mla.q_a,         &L.mla.q_b,       &L.mla.kv_a,        &L.mla.kv_b,
          &L.mla.o,           &L.mla.g,         &L.dense.gate,      &L.dense.up,
          &L.dense.down,      &L.moe.router,    &L.moe.latent_down, &L.moe.latent_up,
          &L.moe.shared.gate, &L.moe.shared.up, &L.moe.shared.down}) {
      add(*m);
    }
  }
  add(w.lm_head);
  w.quantized_matrices = loader.quantized_matrices_;
  w.container_matrices = loader.container_matrices_;
  if (opt.progress) {
    K3_LOG_INFO(
        "weights: %s resident, %lld quantized at load, %lld taken from the container%s, "
        "%.2f s",
        FormatBytes(w.resident_bytes).c_str(), static_cast<long long>(w.quantized_matrices),
        static_cast<long long>(w.container_matrices), opt.mmap ? " (mapped)" : "",
        NowSeconds() - t0);
  }
  return w;
}

}  // namespace k3::model
