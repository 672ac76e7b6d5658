// ModelConfig: every config.json key the K3 architecture needs, read from
// `text_config` (or the root), validated with errors that name the key.
// Plain value type; thread-safe once built.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace k3 {

struct ModelConfig {
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t vocab_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t intermediate_size = 0;
  // MLA
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // MoE
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  int64_t routed_expert_hidden_size = 0;  // latent width
  int64_t num_shared_experts = 0;
  // AttnRes / activations / norms
  int64_t attn_res_block_size = 0;
  float situ_beta = 0;         // activation_situ_beta (b1)
  float situ_linear_beta = 0;  // activation_situ_linear_beta (b2)
  float rms_norm_eps = 1e-5f;
  // KDA (linear_attn_config)
  int64_t kda_num_heads = 0;
  int64_t kda_head_dim = 0;
  int64_t kda_conv_kernel = 0;
  float kda_gate_lower_bound = -5.0f;
  std::vector<bool> is_kda;  // per 0-based layer; from 1-based kda_layers
  // Context length the model was trained for; 0 when config.json omits it.
  int64_t max_position_embeddings = 0;
  // Tokens (root first, then text_config)
  int64_t bos_token_id = -1;  // -1: none
  std::vector<int64_t> eos_token_ids;

  // Derived
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t kda_proj() const { return kda_num_heads * kda_head_dim; }
  int64_t shared_intermediate() const { return moe_intermediate_size * num_shared_experts; }
  bool is_moe(int64_t layer) const { return layer >= first_k_dense_replace; }
  int64_t num_moe_layers() const;
  int64_t num_mla_layers() const;
  // Number of AttnRes block snapshots after all layers: ceil(layers / block size).
  int64_t max_blocks() const;

  // Parses and validates config.json text. `path` is used in error messages.
  static ModelConfig ParseOrThrow(std::string_view json, const std::string& path);
  static ModelConfig LoadOrThrow(const std::string& model_dir);
};

}  // namespace k3
