// The Session: its state's lifetime, the window driver (Forward plans the
// windows, ForwardChunk runs one through the AttnRes stream, the layers and
// the head) and cancellation.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "attn_res.h"
#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/model/session_state.h"
#include "k3/quant/ops.h"
#include "linear.h"
#include "session_impl.h"

namespace k3::model {
namespace {
// A prefill's window choice is logged at info once per process.
std::atomic<bool> g_window_logged{false};
}  // namespace

Session::Session(Model& model, RunOptions options, int64_t max_tokens,
                 const Session* share_work_with)
    : model_(model),
      options_(options),
      impl_(std::make_unique<Impl>(share_work_with != nullptr
                                       ? share_work_with->impl_->work
                                       : std::make_shared<Impl::Work>(model.config()))) {
  if (share_work_with != nullptr && &share_work_with->model_ != &model) {
    throw Error(ErrorCode::kInvalidArgument,
                "a session shares work space only with one of its model");
  }
  if (options_.chunk < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "prefill window (K3_CHUNK) must be >= 0 (0: sized from the memory budget), got " +
                    std::to_string(options_.chunk));
  }
  const ModelConfig& c = model_.config();
  impl_->kda.resize(static_cast<size_t>(c.num_hidden_layers));
  impl_->mla.resize(static_cast<size_t>(c.num_hidden_layers));
  impl_->cache_cap = std::max<int64_t>(max_tokens, 0);
  Reset();
}

Session::~Session() = default;

void Session::Reset() {
  const ModelConfig& c = model_.config();
  const size_t p = static_cast<size_t>(c.kda_proj());
  const size_t hd = static_cast<size_t>(c.kda_head_dim);
  const size_t kh = static_cast<size_t>(c.kda_num_heads);
  const size_t k = static_cast<size_t>(c.kda_conv_kernel);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.is_kda[static_cast<size_t>(i)]) {
      auto& st = impl_->kda[static_cast<size_t>(i)];
      st.s.assign(kh * hd * hd, 0.0f);
      st.wq.assign(p * k, 0.0f);
      st.wk.assign(p * k, 0.0f);
      st.wv.assign(p * k, 0.0f);
    } else {
      auto& mc = impl_->mla[static_cast<size_t>(i)];
      mc.latent.assign(static_cast<size_t>(impl_->cache_cap * c.kv_lora_rank), 0.0f);
      mc.rope.assign(static_cast<size_t>(impl_->cache_cap * c.qk_rope_head_dim), 0.0f);
    }
  }
  pos_ = 0;
  history_.clear();
  routing_.clear();
}

void Session::Forward(std::span<const int32_t> ids, const ForwardOutputs& out,
                      std::span<const int64_t> checkpoint_at, const CheckpointSink& on_checkpoint) {
  const int64_t total = static_cast<int64_t>(ids.size());
  if (total == 0) return;
  const ModelConfig& c = model_.config();
  // Refuse bad ids before any state moves, so a failed call leaves the session as it was.
  for (int32_t id : ids) {
    if (id < 0 || id >= c.vocab_size) {
      throw Error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                   " outside the vocabulary [0, " +
                                                   std::to_string(c.vocab_size) + ")");
    }
  }
  for (size_t i = 0; i < checkpoint_at.size(); ++i) {
    const int64_t at = checkpoint_at[i];
    if (at <= pos_ || at > pos_ + total || (i > 0 && at <= checkpoint_at[i - 1])) {
      throw Error(ErrorCode::kInvalidArgument,
                  "checkpoint positions must ascend inside the fed range (" + std::to_string(pos_) +
                      ", " + std::to_string(pos_ + total) + "], got " + std::to_string(at));
    }
  }
  const double grown_bytes = GrowMlaCache(pos_ + total);

  // The window: forced (K3_CHUNK), or the fewest that fit the budget left
  // after the MLA rows this call adds.
  std::vector<int64_t> rel_at(checkpoint_at.size());
  for (size_t i = 0; i < rel_at.size(); ++i) rel_at[i] = checkpoint_at[i] - pos_;
  int64_t window;
  if (options_.chunk > 0) {
    window = std::min<int64_t>(options_.chunk, total);
  } else {
    WindowShape shape;
    shape.position = pos_;
    shape.threads = omp_get_max_threads();
    shape.idot = options_.idot;
    shape.head_all = out.logits_all != nullptr || out.final_hidden != nullptr;
    shape.head_last = out.logits_last != nullptr;
    shape.combine_buffer = CombineMayHold();
    shape.mla_group = options_.mla_group;
    const double budget = options_.prefill_budget_bytes - grown_bytes;
    window = PlanWindow(c, total, budget, shape, rel_at);
    if (total > 1) {
      shape.tokens = window;
      shape.captures = static_cast<int64_t>(rel_at.size());
      const std::string msg = "prefill: " + std::to_string(total) + " tokens in windows of " +
                              std::to_string(window) + " (" +
                              FormatBytes(PrefillWindowBytes(c, shape)) + " at most each; budget " +
                              FormatBytes(static_cast<uint64_t>(std::max(0.0, budget))) + ")";
      // Once per process at info (the choice is the news), then at debug.
      if (!g_window_logged.exchange(true)) {
        K3_LOG_INFO("%s", msg.c_str());
      } else {
        K3_LOG_DEBUG("%s", msg.c_str());
      }
    }
  }
  const int64_t n_windows = (total + window - 1) / window;
  // Automatic windows are equalised (the last may be a little shorter); a
  // forced K3_CHUNK is taken as given.
  if (options_.chunk == 0) window = (total + n_windows - 1) / n_windows;
  last_window_ = window;
  last_windows_ = n_windows;

  interrupted_ = false;
  point_ = PrefillPoint{};
  point_.layers = c.num_hidden_layers;
  const StateLayout lay = StateLayout::For(c);
  size_t next_at = 0;
  for (int64_t t0 = 0; t0 < total; t0 += window) {
    const int64_t n = std::min<int64_t>(window, total - t0);
    point_.tokens_done = t0;
    point_.window_begin = t0;
    point_.window_tokens = n;
    // Checkpoints strictly inside this window are captured layer by layer;
    // one at its end is a plain SaveCheckpoint after it.
    impl_->captures.clear();
    impl_->capture_of_token.assign(static_cast<size_t>(n), -1);
    for (size_t i = next_at; i < rel_at.size() && rel_at[i] < t0 + n; ++i) {
      Impl::Capture cap;
      cap.position = checkpoint_at[i];
      cap.kda.resize(lay.kda_layer_floats() * static_cast<size_t>(lay.kda_layers));
      impl_->capture_of_token[static_cast<size_t>(rel_at[i] - t0 - 1)] =
          static_cast<int32_t>(impl_->captures.size());
      impl_->captures.push_back(std::move(cap));
    }
    ForwardChunk(ids.data() + t0, n, t0, out, t0 + n == total);
    if (interrupted_) {
      impl_->captures.clear();
      return;
    }
    history_.insert(history_.end(), ids.begin() + t0, ids.begin() + t0 + n);
    for (Impl::Capture& cap : impl_->captures) {
      auto ck = BuildCheckpoint(cap.position, std::move(cap.kda));
      if (on_checkpoint) on_checkpoint(std::move(ck));
      ++next_at;
    }
    impl_->captures.clear();
    if (next_at < rel_at.size() && rel_at[next_at] == t0 + n) {
      auto ck = SaveCheckpoint();
      if (on_checkpoint) on_checkpoint(std::move(ck));
      ++next_at;
    }
  }
  point_.tokens_done = total;
}

// Position-major caches, so growth is a prefix copy.
double Session::GrowMlaCache(int64_t need) {
  if (need <= impl_->cache_cap) return 0;
  const ModelConfig& c = model_.config();
  const double row_bytes = 4.0 * static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim);
  const int64_t cap = std::max<int64_t>(need, impl_->cache_cap * 2);
  const double grown = static_cast<double>(cap - impl_->cache_cap) * row_bytes *
                       static_cast<double>(c.num_mla_layers());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.is_kda[static_cast<size_t>(i)]) continue;
    auto& mc = impl_->mla[static_cast<size_t>(i)];
    mc.latent.resize(static_cast<size_t>(cap * c.kv_lora_rank), 0.0f);
    mc.rope.resize(static_cast<size_t>(cap * c.qk_rope_head_dim), 0.0f);
  }
  impl_->cache_cap = cap;
  return grown;
}

bool Session::PollInterrupt(int64_t layer, int64_t experts_done, int64_t experts_total) {
  if (!interrupt_) return false;
  point_.layer = layer;
  point_.experts_done = experts_done;
  point_.experts_total = experts_total;
  if (!interrupt_(point_)) return false;
  interrupted_ = true;
  // Before a window's first layer nothing of the window has touched the
  // state: the session holds exactly the windows fed so far. Later (also
  // inside layer 0's expert pass), KDA state and conv windows have advanced
  // for some layers and cannot be rolled back.
  if (layer > 0 || experts_total > 0) Reset();
  return true;
}

// One window through the whole stack, layer-major, then the head.
void Session::ForwardChunk(const int32_t* ids, int64_t n_tokens, int64_t t_base,
                           const ForwardOutputs& out, bool last_chunk) {
  const ModelConfig& c = model_.config();
  const size_t C = static_cast<size_t>(n_tokens);
  segs_.assign(1, Seg{this, 0, C, pos_});
  const int64_t nb = RunLayers(ids, C, out, t_base);
  if (nb < 0) return;
  // Head: every position when all logits / final vectors are wanted, else
  // only the last position of the call.
  const bool want_all = out.logits_all != nullptr || out.final_hidden != nullptr;
  const bool want_last = out.logits_last != nullptr && last_chunk;
  if (model_.weights().has_head && (want_all || want_last)) {
    const size_t first = want_all ? 0 : C - 1;
    std::vector<size_t> rows(C - first);
    for (size_t t = first; t < C; ++t) rows[t - first] = t;
    const size_t D = static_cast<size_t>(c.hidden_size), V = static_cast<size_t>(c.vocab_size);
    std::vector<float> logits(rows.size() * V);
    Head(rows, static_cast<size_t>(nb),
         out.final_hidden ? out.final_hidden + (static_cast<size_t>(t_base) + first) * D : nullptr,
         logits.data());
    if (out.logits_all) {
      std::memcpy(out.logits_all + (static_cast<size_t>(t_base) + first) * V, logits.data(),
                  rows.size() * V * sizeof(float));
    }
    if (want_last) {
      std::memcpy(out.logits_last, logits.data() + (rows.size() - 1) * V, V * sizeof(float));
    }
  }
  pos_ += n_tokens;
}

void Session::Step(std::span<const StepSlice> slices) {
  if (slices.empty()) return;
  Session& host = *slices[0].session;
  const ModelConfig& c = host.model_.config();
  // Everything is checked before any state moves.
  for (size_t i = 0; i < slices.size(); ++i) {
    const StepSlice& sl = slices[i];
    if (sl.session == nullptr || sl.ids.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "a step slice needs a session and at least one id");
    }
    if (&sl.session->model_ != &host.model_ || sl.session->options_.idot != host.options_.idot) {
      throw Error(ErrorCode::kInvalidArgument,
                  "a step's sessions must share one model and one activation choice (K3_IDOT)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (slices[j].session == sl.session) {
        throw Error(ErrorCode::kInvalidArgument, "a session appears twice in one step");
      }
    }
    for (int32_t id : sl.ids) {
      if (id < 0 || id >= c.vocab_size) {
        throw Error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                     " outside the vocabulary [0, " +
                                                     std::to_string(c.vocab_size) + ")");
      }
    }
  }
  // The rows, slice after slice.
  std::vector<int32_t> ids;
  host.segs_.clear();
  for (const StepSlice& sl : slices) {
    Session& s = *sl.session;
    s.GrowMlaCache(s.pos_ + static_cast<int64_t>(sl.ids.size()));
    host.segs_.push_back(Seg{&s, ids.size(), sl.ids.size(), s.pos_});
    ids.insert(ids.end(), sl.ids.begin(), sl.ids.end());
  }
  // No polls and no captures inside a step (the host's own Forward state is
  // put aside and back).
  InterruptPoll poll = std::move(host.interrupt_);
  host.interrupt_ = {};
  host.impl_->captures.clear();
  host.impl_->capture_of_token.clear();
  host.interrupted_ = false;
  int64_t nb = -1;
  try {
    nb = host.RunLayers(ids.data(), ids.size(), ForwardOutputs{}, 0);
  } catch (...) {
    host.interrupt_ = std::move(poll);
    throw;
  }
  host.interrupt_ = std::move(poll);
  K3_CHECK(nb >= 0);
  // The head over each slice's last row that is wanted, all at once.
  std::vector<size_t> rows;
  std::vector<float*> dst;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].logits_last == nullptr) continue;
    rows.push_back(host.segs_[i].r0 + host.segs_[i].n - 1);
    dst.push_back(slices[i].logits_last);
  }
  if (!rows.empty() && host.model_.weights().has_head) {
    const size_t V = static_cast<size_t>(c.vocab_size);
    std::vector<float> logits(rows.size() * V);
    host.Head(rows, static_cast<size_t>(nb), nullptr, logits.data());
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(dst[i], logits.data() + i * V, V * sizeof(float));
    }
  }
  for (const StepSlice& sl : slices) {
    Session& s = *sl.session;
    s.pos_ += static_cast<int64_t>(sl.ids.size());
    s.history_.insert(s.history_.end(), sl.ids.begin(), sl.ids.end());
  }
}

// The rows of segs_ through the whole stack, layer-major. Every matmul is
// batched over all rows; per-token sequential state advances in token order
// per sequence.
int64_t Session::RunLayers(const int32_t* ids, size_t C, const ForwardOutputs& out,
                           int64_t t_base) {
  const ModelConfig& c = model_.config();
  const ModelWeights& W = model_.weights();
  Impl& im = *impl_;
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t L = static_cast<size_t>(c.num_hidden_layers);
  const size_t nbmax = static_cast<size_t>(c.max_blocks());
  const float eps = c.rms_norm_eps;

  // The window's streams, kept by the work space like the layer scratch (a
  // long prompt's later windows reuse the pages instead of faulting them in
  // again; every buffer is written before it is read: h by the embedding, p
  // and the snapshots by copies, x by the norms, a and f by the layer).
  WindowStreams& ws = im.work->window;
  float *h = ws.h.Take(C * D), *p = ws.p.Take(C * D), *x = ws.x.Take(C * D),
        *a = ws.attn.Take(C * D), *f = ws.ffn.Take(C * D), *m = ws.mix.Take(D);
  float* blocks = ws.blocks.Take(C * nbmax * D);  // per token: its block snapshots
  size_t nb = 0;
  for (size_t t = 0; t < C; ++t) W.embed.RowOrThrow(ids[t], h + t * D);

  std::vector<const float*> entries(nbmax + 1);
  std::vector<float> mix_scores(nbmax + 1);
  auto mix = [&](size_t t, const float* last, const std::vector<float>& sw, float* dst) {
    for (size_t j = 0; j < nb; ++j) entries[j] = blocks + (t * nbmax + j) * D;
    entries[nb] = last;
    Mix(entries.data(), nb + 1, sw.data(), D, eps, mix_scores.data(), dst);
  };

  PhaseTimes& ph = phases_;
  ReadAhead(0, C);
  for (size_t li = 0; li < L; ++li) {
    if (PollInterrupt(static_cast<int64_t>(li))) return -1;
    PhaseClock clk;
    const LayerWeights& lw = W.layers[li];
    const bool snap = li % static_cast<size_t>(c.attn_res_block_size) == 0;
    for (size_t t = 0; t < C; ++t) {
      float* ht = h + t * D;
      float* pt = p + t * D;
      std::memcpy(pt, ht, D * sizeof(float));
      if (nb > 0) mix(t, pt, lw.attn_sw, ht);
      if (snap) std::memcpy(blocks + (t * nbmax + nb) * D, pt, D * sizeof(float));
    }
    if (snap) {
      K3_CHECK(nb < nbmax);
      ++nb;
    }
    for (size_t t = 0; t < C; ++t) {
      quant::RmsNorm(h + t * D, lw.input_norm.data(), D, eps, x + t * D);
    }
    clk.Lap(ph.residual);
    if (lw.is_kda) {
      KdaForward(static_cast<int64_t>(li), x, C, a);
    } else {
      MlaForward(static_cast<int64_t>(li), x, C, a);
    }
    clk.Skip();  // timed inside, by part
    for (size_t t = 0; t < C; ++t) {
      float* pt = p + t * D;
      const float* at = a + t * D;
      if (snap) {
        std::memcpy(pt, at, D * sizeof(float));
      } else {
        for (size_t i = 0; i < D; ++i) pt[i] += at[i];
      }
      mix(t, pt, lw.mlp_sw, m);
      quant::RmsNorm(m, lw.post_norm.data(), D, eps, x + t * D);
    }
    clk.Lap(ph.residual);
    if (lw.is_moe) {
      MoeForward(static_cast<int64_t>(li), x, C, f);
      if (interrupted_) return -1;  // stopped between experts (the session was reset)
      clk.Skip();                   // timed inside, by part
    } else {
      MlpForward(lw.dense, x, C, f);
      clk.Lap(ph.mlp);
    }
    for (size_t t = 0; t < C; ++t) {
      float* ht = h + t * D;
      const float* pt = p + t * D;
      const float* ft = f + t * D;
      for (size_t i = 0; i < D; ++i) ht[i] = pt[i] + ft[i];
      if (out.trace) {
        std::memcpy(out.trace + ((static_cast<size_t>(t_base) + t) * L + li) * D, ht,
                    D * sizeof(float));
      }
    }
    clk.Lap(ph.residual);
  }
  return static_cast<int64_t>(nb);
}

void Session::Head(std::span<const size_t> rows, size_t nb, float* final_hidden, float* logits) {
  const ModelConfig& c = model_.config();
  const ModelWeights& W = model_.weights();
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t nbmax = static_cast<size_t>(c.max_blocks());
  WindowStreams& ws = impl_->work->window;
  // The streams RunLayers left (Take returns the same buffers: no growth).
  const float* h = ws.h.Take(0);
  const float* blocks = ws.blocks.Take(0);
  float* m = ws.mix.Take(D);
  PhaseClock clk;
  std::vector<const float*> entries(nb + 1);
  std::vector<float> mix_scores(nb + 1);
  std::vector<float> y(rows.size() * D);
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t t = rows[i];
    for (size_t j = 0; j < nb; ++j) entries[j] = blocks + (t * nbmax + j) * D;
    entries[nb] = h + t * D;
    Mix(entries.data(), nb + 1, W.out_sw.data(), D, c.rms_norm_eps, mix_scores.data(), m);
    float* yt = y.data() + i * D;
    quant::RmsNorm(m, W.final_norm.data(), D, c.rms_norm_eps, yt);
    if (final_hidden) std::memcpy(final_hidden + i * D, yt, D * sizeof(float));
  }
  Linear(W.lm_head, y.data(), rows.size(), logits, options_.idot, &impl_->work->acts,
         model_.dense_executor());
  clk.Lap(phases_.head);
}

}  // namespace k3::model
