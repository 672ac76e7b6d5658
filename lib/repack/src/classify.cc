#include "k3/repack/classify.h"

#include <charconv>

#include "k3/core/error.h"

namespace k3::repack {
namespace {

bool ParseInt(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

// Components of a dotted name.
std::vector<std::string_view> SplitDots(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (true) {
    size_t j = s.find('.', i);
    out.push_back(s.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i));
    if (j == std::string_view::npos) break;
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string_view TensorRoleName(TensorRole role) {
  switch (role) {
    case TensorRole::kDrop:
      return "drop";
    case TensorRole::kExpert:
      return "expert";
    case TensorRole::kQuantBits:
      return "bits";
    case TensorRole::kQuantMla:
      return "mla";
    case TensorRole::kQuantHead:
      return "head";
    case TensorRole::kPassthrough:
      return "passthrough";
  }
  return "?";
}

std::string_view StripLanguageModelPrefix(std::string_view name) {
  if (name.starts_with(kLanguageModelPrefix)) name.remove_prefix(kLanguageModelPrefix.size());
  return name;
}

std::optional<int64_t> LayerOf(std::string_view n) {
  constexpr std::string_view kLayers = "model.layers.";
  if (!n.starts_with(kLayers)) return std::nullopt;
  n.remove_prefix(kLayers.size());
  size_t dot = n.find('.');
  int64_t layer;
  if (!ParseInt(n.substr(0, dot), &layer)) return std::nullopt;
  return layer;
}

TensorRole ClassifyTensor(std::string_view full_name, const std::vector<bool>& is_kda) {
  const std::string_view n = StripLanguageModelPrefix(full_name);
  if (n.starts_with("vision_tower") || n.starts_with("mm_projector")) return TensorRole::kDrop;
  if (n.find(".block_sparse_moe.experts.") != std::string_view::npos) return TensorRole::kExpert;
  if (n == "lm_head.weight") return TensorRole::kQuantHead;
  if (n.find(".self_attn.") != std::string_view::npos && n.ends_with(".weight")) {
    auto parts = SplitDots(n);
    std::string_view leaf = parts.size() >= 2 ? parts[parts.size() - 2] : std::string_view();
    if (leaf == "q_a_proj" || leaf == "q_b_proj" || leaf == "kv_a_proj_with_mqa" ||
        leaf == "kv_b_proj") {
      return TensorRole::kQuantMla;
    }
    if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj") return TensorRole::kQuantBits;
    if (leaf == "o_proj" || leaf == "g_proj") {
      auto layer = LayerOf(n);
      if (!layer) return TensorRole::kQuantMla;
      if (*layer < 0 || static_cast<size_t>(*layer) >= is_kda.size()) {
        throw Error(ErrorCode::kCorrupt,
                    "layer " + std::to_string(*layer) + " is outside config.json's " +
                        std::to_string(is_kda.size()) + " layers",
                    {}, Error::kNoOffset, std::string(full_name));
      }
      return is_kda[static_cast<size_t>(*layer)] ? TensorRole::kQuantBits : TensorRole::kQuantMla;
    }
    return TensorRole::kPassthrough;
  }
  for (std::string_view suffix :
       {"routed_expert_down_proj.weight", "routed_expert_up_proj.weight",
        "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight",
        "shared_experts.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight"}) {
    if (n.ends_with(suffix)) return TensorRole::kQuantBits;
  }
  return TensorRole::kPassthrough;
}

std::optional<ExpertKey> ParseExpertName(std::string_view full_name) {
  constexpr std::string_view kExperts = ".block_sparse_moe.experts.";
  std::string_view n = StripLanguageModelPrefix(full_name);
  size_t at = n.find(kExperts);
  if (at == std::string_view::npos) return std::nullopt;
  auto parts = SplitDots(n.substr(at + kExperts.size()));
  // E . wM . weight_packed|weight_scale
  if (parts.size() != 3) return std::nullopt;
  ExpertKey key;
  if (!ParseInt(parts[0], &key.expert) || key.expert < 0) return std::nullopt;
  if (parts[1] == "w1")
    key.matrix = 1;
  else if (parts[1] == "w2")
    key.matrix = 2;
  else if (parts[1] == "w3")
    key.matrix = 3;
  else
    return std::nullopt;
  if (parts[2] == "weight_packed")
    key.scale = false;
  else if (parts[2] == "weight_scale")
    key.scale = true;
  else
    return std::nullopt;
  return key;
}

int QuantBits::For(TensorRole role) const {
  switch (role) {
    case TensorRole::kQuantMla:
      return mla_bits;
    case TensorRole::kQuantHead:
      return head_bits;
    default:
      return bits;
  }
}

}  // namespace k3::repack
