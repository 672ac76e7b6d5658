#include "k3/model/tensor_table.h"

#include <algorithm>

namespace k3 {

uint64_t TensorTableEntry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::vector<ExpertPart> ExpertParts(const ModelConfig& c) {
  const int64_t lat = c.routed_expert_hidden_size, mi = c.moe_intermediate_size;
  const int64_t rows[6] = {mi, mi, lat, lat, mi, mi};
  const int64_t cols[6] = {lat / 2, lat / 32, mi / 2, mi / 32, lat / 2, lat / 32};
  std::vector<ExpertPart> parts;
  for (int p = 0; p < 6; ++p) parts.push_back({kExpertPartSuffix[p], rows[p], cols[p]});
  return parts;
}

namespace {

// Appends entries for one layer (or the globals, layer -1).
class TableBuilder {
 public:
  TableBuilder(std::vector<TensorTableEntry>& out, int64_t layer, std::string prefix)
      : out_(out), layer_(layer), prefix_(std::move(prefix)) {}

  // A float tensor kept as stored; rank-1 ones are vectors.
  TensorTableEntry& F(const std::string& leaf, std::vector<int64_t> shape, DType dtype = DType::kBF16) {
    TensorTableEntry& t = Add(leaf, TensorKind::kFloat, std::move(shape), dtype);
    t.vector = t.shape.size() == 1;
    return t;
  }
  // A vector the release stores with unit dimensions ([1, D], [P, 1, K]).
  void V(const std::string& leaf, std::vector<int64_t> shape) { F(leaf, std::move(shape)).vector = true; }
  // A matrix [O, I] that a container stores quantized.
  void Q(const std::string& leaf, int64_t o, int64_t i) { Add(leaf, TensorKind::kMatrix, {o, i}, DType::kBF16); }
  void Expert(const std::string& leaf, int64_t id, int part, int64_t o, int64_t i) {
    TensorTableEntry& t = Add(leaf, TensorKind::kExpert, {o, i}, DType::kU8);
    t.expert = id;
    t.part = part;
  }

 private:
  TensorTableEntry& Add(const std::string& leaf, TensorKind kind, std::vector<int64_t> shape, DType dtype) {
    TensorTableEntry t;
    t.name = prefix_ + leaf;
    t.kind = kind;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.layer = layer_;
    out_.push_back(std::move(t));
    return out_.back();
  }
  std::vector<TensorTableEntry>& out_;
  int64_t layer_;
  std::string prefix_;
};

void AddKda(TableBuilder& b, const ModelConfig& c) {
  const int64_t d = c.hidden_size, kp = c.kda_proj(), hd = c.kda_head_dim;
  for (const char* n : {"q_proj", "k_proj", "v_proj", "g_proj"}) b.Q(std::string("self_attn.") + n + ".weight", kp, d);
  b.Q("self_attn.o_proj.weight", d, kp);
  for (const char* n : {"q_conv1d", "k_conv1d", "v_conv1d"}) {
    b.V(std::string("self_attn.") + n + ".weight", {kp, 1, c.kda_conv_kernel});
  }
  b.F("self_attn.f_a_proj.weight", {hd, d});
  b.F("self_attn.f_b_proj.weight", {kp, hd});
  b.F("self_attn.b_proj.weight", {c.kda_num_heads, d});
  b.F("self_attn.dt_bias", {kp}, DType::kF32);
  // The release pads the per-head A_log to head_dim entries (spec §3.4).
  b.F("self_attn.A_log", {std::max(c.kda_num_heads, hd)}, DType::kF32).min_numel = c.kda_num_heads;
  b.F("self_attn.o_norm.weight", {hd});
}

void AddMla(TableBuilder& b, const ModelConfig& c) {
  const int64_t d = c.hidden_size, h = c.num_attention_heads;
  b.Q("self_attn.q_a_proj.weight", c.q_lora_rank, d);
  b.F("self_attn.q_a_layernorm.weight", {c.q_lora_rank});
  b.Q("self_attn.q_b_proj.weight", h * c.qk_head_dim(), c.q_lora_rank);
  b.Q("self_attn.kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, d);
  b.F("self_attn.kv_a_layernorm.weight", {c.kv_lora_rank});
  b.Q("self_attn.kv_b_proj.weight", h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  b.Q("self_attn.o_proj.weight", d, h * c.v_head_dim);
  b.Q("self_attn.g_proj.weight", h * c.v_head_dim, d);
}

void AddMoe(TableBuilder& b, const ModelConfig& c, const std::vector<ExpertPart>& parts) {
  const int64_t d = c.hidden_size, lat = c.routed_expert_hidden_size, si = c.shared_intermediate();
  b.F("block_sparse_moe.gate.weight", {c.num_experts, d});
  b.F("block_sparse_moe.gate.e_score_correction_bias", {c.num_experts}, DType::kF32);
  b.Q("block_sparse_moe.routed_expert_down_proj.weight", lat, d);
  b.Q("block_sparse_moe.routed_expert_up_proj.weight", d, lat);
  b.F("block_sparse_moe.routed_expert_norm.weight", {lat});
  if (si > 0) {  // num_shared_experts 0: no shared expert tensors at all
    b.Q("block_sparse_moe.shared_experts.gate_proj.weight", si, d);
    b.Q("block_sparse_moe.shared_experts.up_proj.weight", si, d);
    b.Q("block_sparse_moe.shared_experts.down_proj.weight", d, si);
  }
  for (int64_t id = 0; id < c.num_experts; ++id) {
    const std::string ep = "block_sparse_moe.experts." + std::to_string(id) + ".";
    for (int p = 0; p < 6; ++p) {
      b.Expert(ep + std::string(parts[p].suffix), id, p, parts[p].rows, parts[p].cols);
    }
  }
}

}  // namespace

std::vector<TensorTableEntry> K3TensorTable(const ModelConfig& c) {
  std::vector<TensorTableEntry> e;
  const int64_t d = c.hidden_size;
  TableBuilder g(e, -1, "");
  g.F("model.embed_tokens.weight", {c.vocab_size, d});
  g.F("model.norm.weight", {d});
  g.F("model.output_attn_res_norm.weight", {d});
  g.V("model.output_attn_res_proj.weight", {1, d});
  g.Q("lm_head.weight", c.vocab_size, d);
  const std::vector<ExpertPart> parts = ExpertParts(c);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    TableBuilder b(e, l, "model.layers." + std::to_string(l) + ".");
    b.F("input_layernorm.weight", {d});
    b.F("post_attention_layernorm.weight", {d});
    b.F("self_attention_res_norm.weight", {d});
    b.V("self_attention_res_proj.weight", {1, d});
    b.F("mlp_res_norm.weight", {d});
    b.V("mlp_res_proj.weight", {1, d});
    if (l < static_cast<int64_t>(c.is_kda.size()) && c.is_kda[static_cast<size_t>(l)]) {
      AddKda(b, c);
    } else {
      AddMla(b, c);
    }
    if (c.is_moe(l)) {
      AddMoe(b, c, parts);
    } else {
      b.Q("mlp.gate_proj.weight", c.intermediate_size, d);
      b.Q("mlp.up_proj.weight", c.intermediate_size, d);
      b.Q("mlp.down_proj.weight", d, c.intermediate_size);
    }
  }
  return e;
}

}  // namespace k3
