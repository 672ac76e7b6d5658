#include "k3/model/config.h"

#include <simdjson.h>

#include <optional>

#include "k3/core/error.h"
#include "k3/core/file.h"

namespace k3 {
namespace {

class Reader {
 public:
  Reader(simdjson::dom::element root, simdjson::dom::element tc, const std::string& path)
      : root_(root), tc_(tc), path_(path) {}

  int64_t Int(const char* key, simdjson::dom::element obj) {
    int64_t v;
    if (obj[key].get_int64().get(v)) {
      // A whole number written as a double (1e3, 64.0), inside int64's range
      // before the cast (2e56 would be undefined behaviour, not an error).
      double d;
      if (!obj[key].get_double().get(d) && d >= -0x1p63 && d < 0x1p63 &&
          d == static_cast<double>(static_cast<int64_t>(d))) {
        return static_cast<int64_t>(d);
      }
      Fail(key, "missing or not an integer");
    }
    return v;
  }
  int64_t Int(const char* key) { return Int(key, tc_); }

  double Num(const char* key, simdjson::dom::element obj, std::optional<double> fallback) {
    double d;
    auto el = obj[key];
    if (el.error() == simdjson::NO_SUCH_FIELD && fallback) return *fallback;
    if (el.get_double().get(d)) {
      int64_t i;
      if (!el.get_int64().get(i)) return static_cast<double>(i);
      Fail(key, "missing or non-numeric");
    }
    return d;
  }
  double Num(const char* key, std::optional<double> fallback = std::nullopt) {
    return Num(key, tc_, fallback);
  }

  [[noreturn]] void Fail(const std::string& key, const std::string& what) {
    throw Error(ErrorCode::kCorrupt, what, path_, Error::kNoOffset, key);
  }

  simdjson::dom::element root_, tc_;
  const std::string& path_;
};

void Range(Reader& r, const char* key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    r.Fail(key, "value " + std::to_string(v) + " out of range [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
  }
}

}  // namespace

int64_t ModelConfig::num_moe_layers() const {
  return num_hidden_layers > first_k_dense_replace ? num_hidden_layers - first_k_dense_replace : 0;
}

int64_t ModelConfig::num_mla_layers() const {
  int64_t n = 0;
  for (bool k : is_kda) n += k ? 0 : 1;
  return n;
}

int64_t ModelConfig::max_blocks() const {
  return (num_hidden_layers + attn_res_block_size - 1) / attn_res_block_size;
}

ModelConfig ModelConfig::ParseOrThrow(std::string_view json, const std::string& path) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json.data(), json.size());
  simdjson::dom::element root;
  if (auto err = parser.parse(padded).get(root); err) {
    throw Error(ErrorCode::kCorrupt,
                std::string("config is not valid JSON: ") + simdjson::error_message(err), path);
  }
  if (!root.is_object()) throw Error(ErrorCode::kCorrupt, "config is not a JSON object", path);
  simdjson::dom::element tc = root;
  simdjson::dom::object tco;
  if (!root["text_config"].get_object().get(tco)) tc = root["text_config"].value_unsafe();

  Reader r(root, tc, path);
  ModelConfig c;
  c.hidden_size = r.Int("hidden_size");
  c.num_hidden_layers = r.Int("num_hidden_layers");
  c.vocab_size = r.Int("vocab_size");
  c.first_k_dense_replace = r.Int("first_k_dense_replace");
  c.intermediate_size = r.Int("intermediate_size");
  c.num_attention_heads = r.Int("num_attention_heads");
  c.q_lora_rank = r.Int("q_lora_rank");
  c.kv_lora_rank = r.Int("kv_lora_rank");
  c.qk_nope_head_dim = r.Int("qk_nope_head_dim");
  c.qk_rope_head_dim = r.Int("qk_rope_head_dim");
  c.v_head_dim = r.Int("v_head_dim");
  c.num_experts = r.Int("num_experts");
  c.num_experts_per_token = r.Int("num_experts_per_token");
  c.moe_intermediate_size = r.Int("moe_intermediate_size");
  c.routed_expert_hidden_size = r.Int("routed_expert_hidden_size");
  c.num_shared_experts = r.Int("num_shared_experts");
  c.attn_res_block_size = r.Int("attn_res_block_size");
  c.situ_beta = static_cast<float>(r.Num("activation_situ_beta"));
  c.situ_linear_beta = static_cast<float>(r.Num("activation_situ_linear_beta"));
  c.rms_norm_eps = static_cast<float>(r.Num("rms_norm_eps", 1e-5));

  simdjson::dom::element lac;
  if (tc["linear_attn_config"].get(lac) || !lac.is_object()) {
    r.Fail("linear_attn_config", "missing or not an object");
  }
  auto sub = [&](const char* key) { return std::string("linear_attn_config.") + key; };
  try {
    c.kda_num_heads = r.Int("num_heads", lac);
    c.kda_head_dim = r.Int("head_dim", lac);
    c.kda_conv_kernel = r.Int("short_conv_kernel_size", lac);
    c.kda_gate_lower_bound = static_cast<float>(r.Num("gate_lower_bound", lac, -5.0));
  } catch (const Error& e) {
    r.Fail(sub(e.object().c_str()), e.detail());
  }
  simdjson::dom::array kda;
  if (lac["kda_layers"].get_array().get(kda)) r.Fail(sub("kda_layers"), "missing or not an array");

  Range(r, "hidden_size", c.hidden_size, 1, 65536);
  Range(r, "num_hidden_layers", c.num_hidden_layers, 1, 128);
  Range(r, "vocab_size", c.vocab_size, 1, int64_t{1} << 22);
  Range(r, "first_k_dense_replace", c.first_k_dense_replace, 0, c.num_hidden_layers);
  Range(r, "intermediate_size", c.intermediate_size, 1, int64_t{1} << 20);
  Range(r, "num_attention_heads", c.num_attention_heads, 1, 1024);
  Range(r, "q_lora_rank", c.q_lora_rank, 1, 65536);
  Range(r, "kv_lora_rank", c.kv_lora_rank, 1, 4096);
  Range(r, "qk_nope_head_dim", c.qk_nope_head_dim, 1, 1024);
  Range(r, "qk_rope_head_dim", c.qk_rope_head_dim, 0, 1024);
  Range(r, "v_head_dim", c.v_head_dim, 1, 1024);
  Range(r, "num_experts", c.num_experts, 1, 4096);
  Range(r, "num_experts_per_token", c.num_experts_per_token, 1,
        std::min<int64_t>(64, c.num_experts));
  Range(r, "moe_intermediate_size", c.moe_intermediate_size, 32, int64_t{1} << 20);
  if (c.moe_intermediate_size % 32) r.Fail("moe_intermediate_size", "must be a multiple of 32");
  Range(r, "routed_expert_hidden_size", c.routed_expert_hidden_size, 32, int64_t{1} << 20);
  if (c.routed_expert_hidden_size % 32) {
    r.Fail("routed_expert_hidden_size", "must be a multiple of 32");
  }
  Range(r, "num_shared_experts", c.num_shared_experts, 0, 64);
  Range(r, "attn_res_block_size", c.attn_res_block_size, 1, 1024);
  Range(r, sub("num_heads").c_str(), c.kda_num_heads, 1, 1 << 20);
  Range(r, sub("head_dim").c_str(), c.kda_head_dim, 1, 512);
  Range(r, sub("short_conv_kernel_size").c_str(), c.kda_conv_kernel, 1, 8);
  if (c.kda_proj() > (int64_t{1} << 20)) r.Fail(sub("num_heads"), "heads x head_dim exceeds 2^20");
  if (!(c.rms_norm_eps > 0)) r.Fail("rms_norm_eps", "must be positive");

  // Optional: absent means the context length is unknown (0).
  if (int64_t mpe; !tc["max_position_embeddings"].get_int64().get(mpe)) {
    c.max_position_embeddings = mpe;
    Range(r, "max_position_embeddings", c.max_position_embeddings, 1, int64_t{1} << 32);
  }

  c.is_kda.assign(static_cast<size_t>(c.num_hidden_layers), false);
  for (auto v : kda) {
    int64_t id;
    if (v.get_int64().get(id)) r.Fail(sub("kda_layers"), "entries must be integers");
    if (id >= 1 && id <= c.num_hidden_layers) c.is_kda[static_cast<size_t>(id - 1)] = true;
  }

  // Token ids: root first, then text_config.
  // A default-constructed dom::element is not a valid value (reading it
  // crashes), so absence is an empty optional.
  auto token = [&](const char* key) -> std::optional<simdjson::dom::element> {
    simdjson::dom::element e;
    if (!root[key].get(e) && !e.is_null()) return e;
    if (!tc[key].get(e) && !e.is_null()) return e;
    return std::nullopt;
  };
  if (auto b = token("bos_token_id"); b && b->is_int64()) {
    c.bos_token_id = b->get_int64().value_unsafe();
  }
  if (auto e = token("eos_token_id"); e && e->is_int64()) {
    c.eos_token_ids.push_back(e->get_int64().value_unsafe());
  } else if (e && e->is_array()) {
    for (auto v : e->get_array().value_unsafe()) {
      int64_t id;
      if (!v.get_int64().get(id) && c.eos_token_ids.size() < 8) c.eos_token_ids.push_back(id);
    }
  }
  return c;
}

ModelConfig ModelConfig::LoadOrThrow(const std::string& model_dir) {
  std::string path = JoinPath(model_dir, "config.json");
  return ParseOrThrow(ReadFileOrThrow(path, 64ull << 20), path);
}

}  // namespace k3
