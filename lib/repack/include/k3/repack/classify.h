// Which way each source tensor goes through k3-repack (spec §7.1): dropped,
// expert passthrough, quantized (and in which bits class) or plain passthrough.
// Pure functions on names; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace k3::repack {

inline constexpr std::string_view kLanguageModelPrefix = "language_model.";

enum class TensorRole : uint8_t {
  kDrop,         // vision tower / projector: not part of a text container
  kExpert,       // routed expert tensor: bytes copied unchanged, id-ordered
  kQuantBits,    // quantized with --bits
  kQuantMla,     // quantized with --mla-bits
  kQuantHead,    // quantized with --head-bits
  kPassthrough,  // kept in its source dtype
};

std::string_view TensorRoleName(TensorRole role);
inline bool IsQuantized(TensorRole r) {
  return r == TensorRole::kQuantBits || r == TensorRole::kQuantMla || r == TensorRole::kQuantHead;
}

// Name without the "language_model." prefix (unchanged if absent).
std::string_view StripLanguageModelPrefix(std::string_view name);

// Layer number from "model.layers.N.…" (prefix already stripped); nullopt if none.
std::optional<int64_t> LayerOf(std::string_view stripped_name);

// §7.1, first matching rule wins. `is_kda` comes from config (kda_layers); a
// layer outside it means the config and the checkpoint disagree: kCorrupt.
TensorRole ClassifyTensor(std::string_view full_name, const std::vector<bool>& is_kda);

// "…experts.E.wM.weight_packed|weight_scale": the order key of an expert tensor.
struct ExpertKey {
  int64_t expert = 0;
  int matrix = 0;      // 1, 2 or 3
  bool scale = false;  // packed (false) sorts before scale (true)
  auto operator<=>(const ExpertKey&) const = default;
};
std::optional<ExpertKey> ParseExpertName(std::string_view full_name);

// Bits per class; mla/head default to max(bits, 8) (spec §7).
struct QuantBits {
  int bits = 8;
  int mla_bits = 8;
  int head_bits = 8;
  int For(TensorRole role) const;
};

}  // namespace k3::repack
