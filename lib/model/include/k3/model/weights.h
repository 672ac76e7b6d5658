// Resident (non-expert) weights of a K3 model, loaded from an HF snapshot
// (BF16/F16/F32, quantized at load) or a k3-repack container (U8 + `.qs`
// sidecar, used as stored), optionally mapped read-only (K3_MMAP=1).
//
// Both sources give bit-identical matrices for the same bits: the container is
// produced by the same lib/quant quantizers this loader calls.
// Loading throws k3::Error naming the tensor (and its shard) on any missing
// tensor, wrong dtype or shape; nothing is half-loaded on failure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "k3/container/snapshot.h"
#include "k3/core/file.h"
#include "k3/model/config.h"
#include "k3/quant/quant.h"

namespace k3::model {

// Load-time choices. k3::engine::EngineOptions::FromEnv fills them from K3_BITS,
// K3_MLA_BITS, K3_HEAD_BITS, K3_MMAP, K3_LOAD_THREADS and K3_LAYERS
// (docs/environment.md); tests build the struct directly.
struct LoadOptions {
  int bits = 4;       // KDA q/k/v/g/o, latent down/up, shared experts, dense MLP
  int mla_bits = 8;   // MLA q_a, q_b, kv_a, kv_b, o, g
  int head_bits = 8;  // lm_head
  // True when the user set K3_BITS explicitly: allows the int8 -> int4-g64
  // downcast of container matrices whose class resolves to <= 4 bits (§6.7).
  bool bits_explicit = false;
  bool mmap = false;     // map prepared container matrices instead of copying
  int threads = 0;       // loader threads; 0 = min(online CPUs, 8)
  bool progress = true;  // log progress lines while quantizing
  // Budget of the SimpleExpertStore that Model::LoadOrThrow installs (decimal
  // bytes): slots per MoE layer = floor(bytes / (slot bytes x MoE layers)),
  // clamped to [1, num_experts]. The engine replaces that store with the
  // streaming one (sized by K3_EXPERT_GB) and so asks for the minimum here.
  double expert_cache_bytes = 8e9;
  // K3_LAYERS: run only the first N layers (0 = all). Validation on partial
  // snapshots; the head is still used when model.norm.weight exists.
  int64_t max_layers = 0;

};

// One resident matrix [rows, cols]. Owns its bytes on the heap, or borrows them
// from a mapping kept alive by the owning ModelWeights. Move-only.
class Matrix {
 public:
  Matrix() = default;
  Matrix(Matrix&&) noexcept = default;
  Matrix& operator=(Matrix&&) noexcept = default;
  Matrix(const Matrix&) = delete;
  Matrix& operator=(const Matrix&) = delete;

  static Matrix F32(size_t rows, size_t cols, std::vector<float> values);

  const quant::WeightView& view() const { return view_; }
  size_t rows() const { return view_.rows; }
  size_t cols() const { return view_.cols; }
  quant::WeightFormat format() const { return view_.format; }
  bool mapped() const { return mapped_; }
  // Bytes this matrix occupies (data + scales), heap or mapped.
  uint64_t resident_bytes() const;
  bool empty() const { return view_.rows == 0; }

 private:
  friend class WeightLoader;
  quant::WeightView view_;
  std::vector<float> f32_;
  std::vector<uint8_t> bytes_;
  std::vector<float> scales_;
  bool mapped_ = false;
};

struct KdaWeights {
  Matrix q, k, v, g, o;                       // quantized (bits)
  std::vector<float> q_conv, k_conv, v_conv;  // [P][K], tap 0 = oldest
  Matrix f_a, f_b, b;                         // f32
  std::vector<float> dt_bias;                 // [P]
  std::vector<float> a;                       // [H] = expf(A_log[h])
  std::vector<float> o_norm;                  // [hd]
};

struct MlaWeights {
  Matrix q_a, q_b, kv_a, kv_b, o, g;  // quantized (mla bits)
  std::vector<float> q_a_norm;        // [q_lora]
  std::vector<float> kv_a_norm;       // [kv_lora]
};

struct MlpWeights {  // dense MLP or fused shared experts
  Matrix gate, up, down;
};

struct MoeWeights {
  Matrix router;                   // f32 [E, D]
  std::vector<float> score_bias;   // [E]
  Matrix latent_down, latent_up;   // quantized (bits)
  std::vector<float> latent_norm;  // [LT]
  MlpWeights shared;               // empty when num_shared_experts == 0
};

struct LayerWeights {
  bool is_kda = true;
  bool is_moe = false;
  std::vector<float> input_norm, post_norm;
  // AttnRes score weights, pre-multiplied at load: res_norm ⊙ res_proj (§5.2).
  std::vector<float> attn_sw, mlp_sw;
  KdaWeights kda;
  MlaWeights mla;
  MlpWeights dense;
  MoeWeights moe;
};

// Reads single embedding rows on demand (one pread per token, converted to
// f32): the table is vocab x hidden BF16 (2.3 GB for K3) and each step needs
// only a handful of rows, so keeping it resident buys nothing. Thread-safe.
class EmbeddingTable {
 public:
  EmbeddingTable() = default;
  EmbeddingTable(TensorRef ref, int64_t vocab, int64_t hidden);
  // Throws kInvalidArgument for ids outside [0, vocab).
  void RowOrThrow(int64_t id, float* out) const;

 private:
  TensorRef ref_;
  int64_t vocab_ = 0;
  int64_t hidden_ = 0;
};

struct ModelWeights {
  std::vector<LayerWeights> layers;
  EmbeddingTable embed;
  bool has_head = false;          // false: trace-only (no model.norm.weight)
  std::vector<float> final_norm;  // [D]
  std::vector<float> out_sw;      // final AttnRes score weight
  Matrix lm_head;                 // quantized (head bits)
  std::vector<MappedFile> maps;   // keeps K3_MMAP mappings alive
  uint64_t resident_bytes = 0;    // heap + mapped matrix bytes
  int64_t quantized_matrices = 0;
  int64_t container_matrices = 0;  // taken as stored (U8 + .qs)
  // Entries of the tensor table (k3/model/tensor_table.h) read: every non-expert
  // one of the loaded layers, and the head's when present.
  int64_t tensors_read = 0;
};

// Loads every non-expert tensor. `snapshot` must outlive the result (the
// embedding table reads from it).
ModelWeights LoadWeightsOrThrow(const Snapshot& snapshot, const ModelConfig& config,
                                const LoadOptions& options);

}  // namespace k3::model
