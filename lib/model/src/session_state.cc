// Checkpoint layout and fingerprint (session_state.h). Saving and restoring a
// Session's state is checkpoint.cc's.
#include "k3/model/session_state.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/quant/isa.h"

namespace k3::model {
namespace {

// A streaming XXH3-128 over typed fields; every variable-length field is
// preceded by its length so that no two field sequences hash alike by accident.
class Hasher {
 public:
  Hasher() : state_(XXH3_createState()) {
    K3_CHECK(state_ != nullptr);
    XXH3_128bits_reset(state_);
  }
  ~Hasher() { XXH3_freeState(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void Bytes(const void* p, size_t n) {
    U64(n);
    if (n) XXH3_128bits_update(state_, p, n);
  }
  void Text(std::string_view s) { Bytes(s.data(), s.size()); }
  void U64(uint64_t v) { XXH3_128bits_update(state_, &v, sizeof v); }
  void Floats(const std::vector<float>& v) { Bytes(v.data(), v.size() * sizeof(float)); }
  // Shape, format and the first row's bytes of a resident matrix: enough to
  // tell apart models of the same shapes, without reading gigabytes.
  void Matrix(const model::Matrix& m) {
    const quant::WeightView& v = m.view();
    U64(static_cast<uint64_t>(v.format));
    U64(v.rows);
    U64(v.cols);
    if (v.rows == 0 || v.data == nullptr) return;
    Bytes(v.data, v.data_bytes() / v.rows);
    if (v.scales != nullptr) Bytes(v.scales, v.scale_count() / v.rows * sizeof(float));
    if (v.e8m0 != nullptr) Bytes(v.e8m0, v.cols / 32);
  }
  std::string Hex() {
    const XXH128_hash_t h = XXH3_128bits_digest(state_);
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016" PRIx64 "%016" PRIx64, static_cast<uint64_t>(h.high64),
                  static_cast<uint64_t>(h.low64));
    return buf;
  }

 private:
  XXH3_state_t* state_;
};

std::string ModelIdentity(const Model& model) {
  Hasher h;
  h.Text("k3 state fingerprint v1");
  const Snapshot& snap = model.snapshot();
  h.Text(snap.config_json());
  h.U64(static_cast<uint64_t>(model.config().num_hidden_layers));
  h.U64(snap.shards().size());
  for (const SafetensorsFile& f : snap.shards()) {
    h.Text(BaseName(f.path()));
    h.U64(f.file_size());
    h.U64(f.tensors().size());
    for (const TensorInfo& t : f.tensors()) {
      h.Text(t.name);
      h.U64(static_cast<uint64_t>(t.dtype));
      h.Bytes(t.shape.data(), t.shape.size() * sizeof(int64_t));
      h.U64(t.begin);
      h.U64(t.end);
    }
  }
  const ModelWeights& w = model.weights();
  h.U64(w.layers.size());
  for (const LayerWeights& l : w.layers) {
    h.U64(l.is_kda);
    h.U64(l.is_moe);
    h.Floats(l.input_norm);
    h.Floats(l.post_norm);
    h.Floats(l.attn_sw);
    h.Floats(l.mlp_sw);
    if (l.is_kda) {
      for (const auto* m : {&l.kda.q, &l.kda.k, &l.kda.v, &l.kda.g, &l.kda.o, &l.kda.f_a,
                            &l.kda.f_b, &l.kda.b}) {
        h.Matrix(*m);
      }
      h.Floats(l.kda.q_conv);
      h.Floats(l.kda.dt_bias);
      h.Floats(l.kda.a);
      h.Floats(l.kda.o_norm);
    } else {
      for (const auto* m : {&l.mla.q_a, &l.mla.q_b, &l.mla.kv_a, &l.mla.kv_b, &l.mla.o, &l.mla.g}) {
        h.Matrix(*m);
      }
      h.Floats(l.mla.q_a_norm);
      h.Floats(l.mla.kv_a_norm);
    }
    if (l.is_moe) {
      h.Matrix(l.moe.router);
      h.Floats(l.moe.score_bias);
      h.Matrix(l.moe.latent_down);
      h.Matrix(l.moe.latent_up);
      h.Floats(l.moe.latent_norm);
      for (const auto* m : {&l.moe.shared.gate, &l.moe.shared.up, &l.moe.shared.down}) h.Matrix(*m);
    } else {
      for (const auto* m : {&l.dense.gate, &l.dense.up, &l.dense.down}) h.Matrix(*m);
    }
  }
  h.U64(w.has_head);
  h.Floats(w.final_norm);
  h.Floats(w.out_sw);
  h.Matrix(w.lm_head);
  return h.Hex();
}

}  // namespace

StateLayout StateLayout::For(const ModelConfig& c) {
  StateLayout l;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.is_kda[static_cast<size_t>(i)]) {
      ++l.kda_layers;
    } else {
      ++l.mla_layers;
    }
  }
  l.kda_heads = c.kda_num_heads;
  l.kda_head_dim = c.kda_head_dim;
  l.kda_proj = c.kda_proj();
  l.conv_kernel = c.kda_conv_kernel;
  l.kv_lora = c.kv_lora_rank;
  l.qk_rope = c.qk_rope_head_dim;
  return l;
}

uint64_t SessionCheckpoint::mla_bytes() const {
  uint64_t n = 0;
  for (const auto& s : mla) n += s->bytes();
  return n;
}

const float* SessionCheckpoint::MlaRow(int64_t mla_layer, int64_t row) const {
  K3_CHECK(row >= 0 && row < position && mla_layer >= 0 && mla_layer < layout.mla_layers);
  auto it = std::upper_bound(mla.begin(), mla.end(), row,
                             [](int64_t r, const auto& seg) { return r < seg->end; });
  K3_CHECK(it != mla.end());
  const MlaSegment& s = **it;
  const uint64_t n = static_cast<uint64_t>(s.end - s.begin);
  const uint64_t rf = layout.mla_row_floats();
  return s.rows.data() + (static_cast<uint64_t>(mla_layer) * n +
                          static_cast<uint64_t>(row - s.begin)) * rf;
}

StateFingerprint ComputeFingerprint(const Model& model, const RunOptions& options,
                                    const std::string* model_id) {
  StateFingerprint f;
  f.model = model_id != nullptr ? *model_id : ModelIdentity(model);
  // K3_TOPP outside (0, 1) is off, whatever the value.
  const float topp = options.topp > 0.0f && options.topp < 1.0f ? options.topp : 0.0f;
  char buf[128];
  std::snprintf(buf, sizeof buf, "idot=%d chunk=%d topp=%.9g isa=%s", options.idot ? 1 : 0,
                options.chunk, static_cast<double>(topp),
                quant::IsaName(quant::ActiveIsa()));
  f.options = buf;
  return f;
}

}  // namespace k3::model
