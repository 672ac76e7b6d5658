#include "k3/model/tensor_table.h"

namespace k3 {

std::vector<ExpertPart> ExpertParts(const ModelConfig& c) {
  const int64_t lat = c.routed_expert_hidden_size, mi = c.moe_intermediate_size;
  return {{"w1.weight_packed", mi, lat / 2}, {"w1.weight_scale", mi, lat / 32},
          {"w2.weight_packed", lat, mi / 2}, {"w2.weight_scale", lat, mi / 32},
          {"w3.weight_packed", mi, lat / 2}, {"w3.weight_scale", mi, lat / 32}};
}

std::vector<TensorSpec> K3TensorTable(const ModelConfig& c) {
  std::vector<TensorSpec> e;
  const int64_t d = c.hidden_size;
  auto f = [&](std::string n, std::vector<int64_t> s, bool at_least = false) {
    e.push_back({std::move(n), TensorKind::kFloat, std::move(s), at_least});
  };
  auto q = [&](std::string n, int64_t o, int64_t i) { e.push_back({std::move(n), TensorKind::kMatrix, {o, i}}); };
  auto x = [&](std::string n, int64_t o, int64_t i) { e.push_back({std::move(n), TensorKind::kExpert, {o, i}}); };
  f("model.embed_tokens.weight", {c.vocab_size, d});
  f("model.norm.weight", {d});
  f("model.output_attn_res_norm.weight", {d});
  f("model.output_attn_res_proj.weight", {d});
  q("lm_head.weight", c.vocab_size, d);
  const std::vector<ExpertPart> parts = ExpertParts(c);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"input_layernorm", "post_attention_layernorm", "self_attention_res_norm",
                          "self_attention_res_proj", "mlp_res_norm", "mlp_res_proj"}) {
      f(p + n + ".weight", {d});
    }
    const std::string a = p + "self_attn.";
    if (l < static_cast<int64_t>(c.is_kda.size()) && c.is_kda[static_cast<size_t>(l)]) {
      const int64_t kp = c.kda_proj();
      for (const char* n : {"q_proj", "k_proj", "v_proj", "g_proj"}) q(a + n + ".weight", kp, d);
      q(a + "o_proj.weight", d, kp);
      for (const char* n : {"q_conv1d", "k_conv1d", "v_conv1d"}) f(a + n + ".weight", {kp * c.kda_conv_kernel});
      f(a + "f_a_proj.weight", {c.kda_head_dim, d});
      f(a + "f_b_proj.weight", {kp, c.kda_head_dim});
      f(a + "b_proj.weight", {c.kda_num_heads, d});
      f(a + "dt_bias", {kp});
      f(a + "A_log", {c.kda_num_heads}, /*at_least=*/true);
      f(a + "o_norm.weight", {c.kda_head_dim});
    } else {
      const int64_t h = c.num_attention_heads;
      q(a + "q_a_proj.weight", c.q_lora_rank, d);
      f(a + "q_a_layernorm.weight", {c.q_lora_rank});
      q(a + "q_b_proj.weight", h * c.qk_head_dim(), c.q_lora_rank);
      q(a + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, d);
      f(a + "kv_a_layernorm.weight", {c.kv_lora_rank});
      q(a + "kv_b_proj.weight", h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
      q(a + "o_proj.weight", d, h * c.v_head_dim);
      q(a + "g_proj.weight", h * c.v_head_dim, d);
    }
    if (!c.is_moe(l)) {
      q(p + "mlp.gate_proj.weight", c.intermediate_size, d);
      q(p + "mlp.up_proj.weight", c.intermediate_size, d);
      q(p + "mlp.down_proj.weight", d, c.intermediate_size);
      continue;
    }
    const std::string m = p + "block_sparse_moe.";
    const int64_t lat = c.routed_expert_hidden_size, si = c.shared_intermediate();
    f(m + "gate.weight", {c.num_experts, d});
    f(m + "gate.e_score_correction_bias", {c.num_experts});
    q(m + "routed_expert_down_proj.weight", lat, d);
    q(m + "routed_expert_up_proj.weight", d, lat);
    f(m + "routed_expert_norm.weight", {lat});
    q(m + "shared_experts.gate_proj.weight", si, d);
    q(m + "shared_experts.up_proj.weight", si, d);
    q(m + "shared_experts.down_proj.weight", d, si);
    for (int64_t id = 0; id < c.num_experts; ++id) {
      const std::string ep = m + "experts." + std::to_string(id) + ".";
      for (const ExpertPart& part : parts) x(ep + part.suffix, part.rows, part.cols);
    }
  }
  return e;
}

}  // namespace k3
