// Saving and restoring a Session's state (session_state.h). The state is
// exactly: every KDA layer's S and conv windows, the MLA rows [0, pos), pos
// and history. Nothing else a window reads survives between windows (scratch
// is rewritten before use).
#include <algorithm>
#include <cstring>
#include <string>

#include "k3/core/error.h"
#include "k3/model/session_state.h"
#include "session_impl.h"

namespace k3::model {

StateFingerprint Session::Fingerprint() const {
  StateFingerprint f = ComputeFingerprint(model_, options_, ckpt_model_id_.empty() ? nullptr : &ckpt_model_id_);
  if (ckpt_model_id_.empty()) ckpt_model_id_ = f.model;
  return f;
}

std::shared_ptr<const SessionCheckpoint> Session::SaveCheckpoint() {
  const ModelConfig& c = model_.config();
  const StateLayout lay = StateLayout::For(c);
  DefaultInitVector<float> kda(lay.kda_layer_floats() * static_cast<size_t>(lay.kda_layers));
  float* dst = kda.data();
  auto put = [&dst](const std::vector<float>& v) {
    std::memcpy(dst, v.data(), v.size() * sizeof(float));
    dst += v.size();
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.is_kda[static_cast<size_t>(i)]) continue;
    const auto& st = impl_->kda[static_cast<size_t>(i)];
    put(st.s);
    put(st.wq);
    put(st.wk);
    put(st.wv);
  }
  return BuildCheckpoint(pos_, std::move(kda));
}

std::shared_ptr<const SessionCheckpoint> Session::BuildCheckpoint(int64_t position,
                                                                  DefaultInitVector<float> kda) {
  const ModelConfig& c = model_.config();
  K3_CHECK(position <= pos_ && position <= static_cast<int64_t>(history_.size()));
  auto ck = std::make_shared<SessionCheckpoint>();
  ck->fingerprint = Fingerprint();
  ck->layout = StateLayout::For(c);
  ck->position = position;
  ck->ids.assign(history_.begin(), history_.begin() + position);
  const StateLayout& lay = ck->layout;
  K3_CHECK(kda.size() == lay.kda_layer_floats() * static_cast<size_t>(lay.kda_layers));
  ck->kda = std::move(kda);
  // Share the segments of the previous checkpoint while they still describe
  // a prefix of what this session fed (it may have been Reset or restored
  // elsewhere since).
  int64_t shared_end = 0;
  for (const auto& seg : ckpt_mla_) {
    if (seg->end > position ||
        !std::equal(seg->ids.begin(), seg->ids.end(), history_.begin() + seg->begin)) {
      break;
    }
    ck->mla.push_back(seg);
    shared_end = seg->end;
  }
  if (shared_end < position) {
    auto seg = std::make_shared<MlaSegment>();
    seg->begin = shared_end;
    seg->end = position;
    seg->ids.assign(history_.begin() + shared_end, history_.begin() + position);
    const size_t n = static_cast<size_t>(position - shared_end);
    const size_t kvl = static_cast<size_t>(c.kv_lora_rank);
    const size_t rope = static_cast<size_t>(c.qk_rope_head_dim);
    seg->rows.resize(static_cast<size_t>(lay.mla_layers) * n * (kvl + rope));
    float* out = seg->rows.data();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if (c.is_kda[static_cast<size_t>(i)]) continue;
      const auto& mc = impl_->mla[static_cast<size_t>(i)];
      for (size_t r = 0; r < n; ++r) {
        const size_t row = static_cast<size_t>(shared_end) + r;
        std::memcpy(out, mc.latent.data() + row * kvl, kvl * sizeof(float));
        if (rope) std::memcpy(out + kvl, mc.rope.data() + row * rope, rope * sizeof(float));
        out += kvl + rope;
      }
    }
    ck->mla.push_back(std::move(seg));
  }
  ckpt_mla_ = ck->mla;
  return ck;
}

void Session::RestoreCheckpoint(const SessionCheckpoint& ck) {
  const ModelConfig& c = model_.config();
  const StateLayout lay = StateLayout::For(c);
  const StateFingerprint mine = Fingerprint();
  if (ck.fingerprint.model != mine.model) {
    throw Error(ErrorCode::kInvalidArgument, "checkpoint of another model (" +
                                                 ck.fingerprint.model + ", this model is " +
                                                 mine.model + ")");
  }
  if (ck.fingerprint.options != mine.options) {
    throw Error(ErrorCode::kInvalidArgument, "checkpoint made with other options (" +
                                                 ck.fingerprint.options + ", this session runs " +
                                                 mine.options + ")");
  }
  int64_t covered = 0;
  for (const auto& seg : ck.mla) {
    if (seg->begin != covered || seg->end < seg->begin ||
        seg->ids.size() != static_cast<size_t>(seg->end - seg->begin) ||
        seg->rows.size() != static_cast<size_t>(seg->end - seg->begin) *
                                static_cast<size_t>(lay.mla_layers) * lay.mla_row_floats() ||
        !std::equal(seg->ids.begin(), seg->ids.end(), ck.ids.begin() + seg->begin)) {
      throw Error(ErrorCode::kInvalidArgument, "checkpoint MLA segments do not tile its ids");
    }
    covered = seg->end;
  }
  if (!(ck.layout == lay) || ck.position < 0 || ck.ids.size() != static_cast<size_t>(ck.position) ||
      ck.kda.size() != lay.kda_layer_floats() * static_cast<size_t>(lay.kda_layers) ||
      covered != ck.position) {
    throw Error(ErrorCode::kInvalidArgument,
                "checkpoint layout does not match this model (position " +
                    std::to_string(ck.position) + ")");
  }
  // Validated: from here on nothing throws except allocation.
  if (ck.position > impl_->cache_cap) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if (c.is_kda[static_cast<size_t>(i)]) continue;
      auto& mc = impl_->mla[static_cast<size_t>(i)];
      mc.latent.resize(static_cast<size_t>(ck.position * c.kv_lora_rank), 0.0f);
      mc.rope.resize(static_cast<size_t>(ck.position * c.qk_rope_head_dim), 0.0f);
    }
    impl_->cache_cap = ck.position;
  }
  const float* src = ck.kda.data();
  auto take = [&src](std::vector<float>& v) {
    std::memcpy(v.data(), src, v.size() * sizeof(float));
    src += v.size();
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.is_kda[static_cast<size_t>(i)]) continue;
    auto& st = impl_->kda[static_cast<size_t>(i)];
    take(st.s);
    take(st.wq);
    take(st.wk);
    take(st.wv);
  }
  const size_t kvl = static_cast<size_t>(c.kv_lora_rank);
  const size_t rope = static_cast<size_t>(c.qk_rope_head_dim);
  for (const auto& seg : ck.mla) {
    const size_t n = static_cast<size_t>(seg->end - seg->begin);
    const float* in = seg->rows.data();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if (c.is_kda[static_cast<size_t>(i)]) continue;
      auto& mc = impl_->mla[static_cast<size_t>(i)];
      for (size_t r = 0; r < n; ++r) {
        const size_t row = static_cast<size_t>(seg->begin) + r;
        std::memcpy(mc.latent.data() + row * kvl, in, kvl * sizeof(float));
        if (rope) std::memcpy(mc.rope.data() + row * rope, in + kvl, rope * sizeof(float));
        in += kvl + rope;
      }
    }
  }
  pos_ = ck.position;
  history_ = ck.ids;
  routing_.clear();
  ckpt_mla_ = ck.mla;
}

}  // namespace k3::model
