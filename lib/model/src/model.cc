#include "k3/model/model.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/model/session_state.h"
#include "k3/quant/ops.h"

namespace k3::model {
namespace {

using quant::WeightFormat;

// MLA q_a/kv_a LoRA norms use the class default of Moonshot's code, not
// rms_norm_eps: the oracle wins over the spec here (docs/model.md).
constexpr float kLoraNormEps = 1e-6f;
// KDA q/k L2 norm: eps inside the sqrt, added to the sum of squares.
constexpr float kL2NormEps = 1e-6f;
// LogOnce keys.
constexpr char kRouterKey = 0;
constexpr char kTinyBudgetKey = 0;
std::atomic<bool> g_window_logged{false};

// K3_TOPP (§5.5 step 4) on one token's K renormalised weights w[base..base+K):
// a stable weight-descending order, the shortest prefix whose running mass
// reaches p is kept and renormalised; the tail gets weight 0 and keep = 0, so
// experts only the tail selected are never loaded.
void DropRoutingTail(size_t base, size_t K, std::vector<float>& w, float p,
                     std::vector<char>& keep) {
  std::vector<size_t> order(K);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return w[base + a] > w[base + b]; });
  size_t kept = K;
  float run = 0.0f;
  for (size_t i = 0; i < K; ++i) {
    run += w[base + order[i]];
    if (run >= p) {
      kept = i + 1;
      break;
    }
  }
  if (kept == K) return;
  float sum = 0.0f;
  for (size_t i = 0; i < kept; ++i) sum += w[base + order[i]];
  for (size_t i = 0; i < K; ++i) {
    const size_t kk = order[i];
    if (i < kept) {
      w[base + kk] /= (sum + 1e-20f);
    } else {
      w[base + kk] = 0.0f;
      keep[base + kk] = 0;
    }
  }
}

}  // namespace

std::unique_ptr<Model> Model::LoadOrThrow(const std::string& dir, const LoadOptions& options,
                                          const Snapshot::Options& snapshot_options) {
  const double t0 = NowSeconds();
  std::unique_ptr<Model> m(new Model());
  m->snapshot_ = std::make_unique<Snapshot>(Snapshot::OpenOrThrow(dir, snapshot_options));
  m->config_ = ModelConfig::ParseOrThrow(m->snapshot_->config_json(), JoinPath(dir, "config.json"));
  if (options.max_layers > 0 && options.max_layers < m->config_.num_hidden_layers) {
    // Truncated stack (K3_LAYERS): the AttnRes block count follows from the new depth.
    ModelConfig& c = m->config_;
    c.num_hidden_layers = options.max_layers;
    c.is_kda.resize(static_cast<size_t>(c.num_hidden_layers));
    c.first_k_dense_replace = std::min(c.first_k_dense_replace, c.num_hidden_layers);
  }
  m->weights_ = LoadWeightsOrThrow(*m->snapshot_, m->config_, options);
  // Expert cache: an even share of the budget per MoE layer (spec §8.2).
  SimpleExpertStore::Options so;
  {
    const ModelConfig& c = m->config_;
    const uint64_t slot = ExpertTable::SlotBytesFor(c);
    const double per_layer =
        options.expert_cache_bytes /
        (static_cast<double>(slot) * static_cast<double>(std::max<int64_t>(1, c.num_moe_layers())));
    so.slots_per_layer =
        std::clamp<int64_t>(static_cast<int64_t>(std::floor(per_layer)), 1, c.num_experts);
  }
  m->experts_ = std::make_unique<SimpleExpertStore>(*m->snapshot_, m->config_, so);
  m->load_seconds_ = NowSeconds() - t0;
  return m;
}

// ---------------------------------------------------------------------------
// Layer scratch kept between layers and windows (issue 25). Allocated afresh
// by every layer, a window's large buffers (KDA's projections are 7 x C x 8192
// floats at K3's shapes) were faulted in, zeroed and unmapped again by every
// layer of every window. Slot i grows to the largest request and keeps it;
// contents are not zeroed (every user writes all of a buffer it reads).
namespace {
class ScratchSet {
 public:
  float* Take(size_t slot, size_t n) {
    if (bufs_.size() <= slot) bufs_.resize(slot + 1);
    DefaultInitVector<float>& b = bufs_[slot];
    GrowScratch(b, n);  // large blocks fault in 2 MiB at a time (k3/core/sys.h)
    return b.data();
  }

 private:
  std::vector<DefaultInitVector<float>> bufs_;
};
}  // namespace

// Per-sequence state and scratch.
struct Session::Impl {
  struct KdaState {
    std::vector<float> s;           // [H][hd][hd], row = key dim, column = value dim
    std::vector<float> wq, wk, wv;  // conv windows [P][K], oldest first
  };
  struct MlaCache {
    std::vector<float> latent;  // [cap][kv_lora], normalised
    std::vector<float> rope;    // [cap][qk_rope], raw (NoPE)
  };
  std::vector<KdaState> kda;  // per layer (empty for MLA layers)
  std::vector<MlaCache> mla;  // per layer (empty for KDA layers)
  int64_t cache_cap = 0;

  quant::ActsQ8 acts;  // scratch for Linear()
  // Layer scratch (ScratchSet), one set for every phase of a layer, slots by
  // order of use: attention (KDA 0-7, or MLA 0-4 and its attention block 5-7), the MLPs (dense and shared
  // experts: gate 0, up 1), the MoE layer (router logits 2, latent in 3,
  // latent out 4, shared-expert output 5, the combine's held rows 8; its
  // shared MLP takes 0 and 1).
  ScratchSet scratch;
  // The window's own streams (ForwardChunk: h, p, x, a, f, m, block snapshots).
  ScratchSet window_bufs;
  // Routed experts when the model has no executor of its own.
  CpuExpertExecutor cpu_experts;

  // Checkpoints captured inside the current window: the KDA floats (layer
  // order, StateLayout) at `position`, filled as each layer's scan passes it.
  struct Capture {
    int64_t position = 0;
    DefaultInitVector<float> kda;
  };
  std::vector<Capture> captures;
  std::vector<int32_t> capture_of_token;  // [C]: index into captures after token t, or -1
  // CombineMayHold's answer for the store it was computed on.
  const ExpertStore* hold_store = nullptr;
  const ExpertExecutor* hold_executor = nullptr;
  bool hold = true;

  explicit Impl(const ModelConfig& config) : cpu_experts(config) {}
};

namespace {

// MLA attention's block: all heads of this many tokens share each pass over
// the cached rows (about 512 query rows: 5 tokens x 96 heads on K3).
// AttnScores keeps a 64-key group in L2 while the queries pass; each thread's
// weighted latent sum reads every cached row once per block, so larger
// blocks read the cache less per query (k3-bench mla, 2 threads, 8192 rows:
// 53.5 us per query row at 2 tokens, 48.4-48.8 at 5, 48.1 at 8).
size_t MlaBlockTokens(size_t heads) { return std::max<size_t>(1, 512 / std::max<size_t>(heads, 1)); }

// MLA's blocks come in groups of this many tokens (a multiple of the block):
// the group's absorbed queries, latent sums and outputs, about kMlaGroupBytes,
// are made per head over all of its tokens, so kv_b is read once per group.
constexpr size_t kMlaGroupBytes = size_t{8} << 20;
size_t MlaGroupTokens(size_t heads, size_t kvl, size_t rope, size_t vh) {
  const size_t tb = MlaBlockTokens(heads);
  const size_t per_token = std::max<size_t>(heads, 1) * (2 * kvl + rope + vh) * sizeof(float);
  return std::max<size_t>(1, kMlaGroupBytes / std::max<size_t>(per_token, 1) / tb) * tb;
}

// The MLPs run over a window in slices of this many tokens (MlpForward): at
// K3's dense 33792 columns a slice's gate and up rows are 2 x 66 MiB, against
// 2 x 1.1 GiB for an 8192-token window taken whole.
constexpr size_t kMlpSliceTokens = 512;

// y[C, rows] = W x[C, cols]; int8 activations for quantized weights when
// `idot` (and the kernel's 32-column grouping fits), f32 otherwise.
void Linear(const Matrix& w, const float* x, size_t batch, float* y, bool idot,
            quant::ActsQ8* acts) {
  const quant::WeightView& v = w.view();
  if (idot && v.format != WeightFormat::kF32 && v.cols % 32 == 0) {
    quant::QuantizeActs(x, batch, v.cols, acts);
    quant::MatMulQ8(v, *acts, y);
  } else {
    quant::MatMul(v, x, batch, y);
  }
}

// AttnRes softmax mix (§5.2): entries e_0..e_{n-1} = snapshots, e_n = p.
// Scores in f64 (products formed in f64, summed in quant::DotSumSquares'
// fixed lane order), softmax in f32, mix in f32 with the snapshots first and
// p last. `scores` is scratch of n floats.
void Mix(const float* const* entries, size_t n, const float* w, size_t d, float eps, float* scores,
         float* out) {
  for (size_t j = 0; j < n; ++j) {
    double dot = 0, ss = 0;
    quant::DotSumSquares(entries[j], w, d, &dot, &ss);
    scores[j] =
        static_cast<float>(dot / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
  }
  quant::Softmax(scores, n);
  for (size_t i = 0; i < d; ++i) out[i] = scores[0] * entries[0][i];
  for (size_t j = 1; j < n; ++j) {
    const float pj = scores[j];
    const float* e = entries[j];
    for (size_t i = 0; i < d; ++i) out[i] += pj * e[i];
  }
}

// The combine of one MoE layer (§5.5 step 6, docs/model.md "The combine"):
// lat[t] = sum over token t's kept pairs, in ascending expert id, of
// w[t, kk] * y[t, kk], with lat zeroed first: the one sum order for every
// window size, store, executor and file layout. Outputs arrive through Put()
// in the executor's order; each is folded at once when it is its token's next
// in id order (then any held successors follow), else held until it is.
// Experts delivered in ascending id hold nothing; `Plan` replays a known
// arrival order to size the hold exactly before any row arrives.
class Combiner final : public PairSink {
 public:
  Combiner(size_t C, size_t K, size_t LT, const int32_t* sel, const float* sel_w, const char* keep,
           float* lat)
      : K_(K),
        LT_(LT),
        sel_w_(sel_w),
        lat_(lat),
        order_(C * K),
        count_(C),
        next_(C, 0),
        slot_(C * K, -1) {
    for (size_t t = 0; t < C; ++t) {
      uint32_t* o = order_.data() + t * K;
      uint32_t n = 0;
      for (size_t kk = 0; kk < K; ++kk) {
        if (keep[t * K + kk]) o[n++] = static_cast<uint32_t>(kk);
      }
      std::sort(o, o + n, [&](uint32_t a, uint32_t b) { return sel[t * K + a] < sel[t * K + b]; });
      count_[t] = n;
    }
    std::fill(lat, lat + C * LT, 0.0f);
  }

  // The most rows held at once if pairs arrive expert by expert in `experts`
  // order, each expert's pairs ascending (ExpertBatch's contract); reserves them.
  size_t Plan(std::span<const int32_t> experts, const std::vector<std::vector<uint32_t>>& users) {
    size_t held = 0, peak = 0;
    for (int32_t e : experts) {
      for (uint32_t pair : users[static_cast<size_t>(e)]) {
        const size_t t = pair / K_;
        if (order_[t * K_ + next_[t]] != pair % K_) {
          slot_[pair] = 0;  // marked held (no row yet)
          peak = std::max(peak, ++held);
          continue;
        }
        ++next_[t];
        while (next_[t] < count_[t] && slot_[t * K_ + order_[t * K_ + next_[t]]] >= 0) {
          slot_[t * K_ + order_[t * K_ + next_[t]]] = -1;
          --held;
          ++next_[t];
        }
      }
    }
    std::fill(next_.begin(), next_.end(), 0u);
    std::fill(slot_.begin(), slot_.end(), -1);
    return peak;
  }
  // Room for `rows` held rows at `hold` (rows * LT floats, the caller's, kept
  // between layers and windows so a layer does not fault in fresh pages).
  void Hold(float* hold, size_t rows) {
    hold_ = hold;
    hold_rows_ = rows;
    free_.reserve(rows);
  }

  void Put(uint32_t pair, const float* row) override {
    const size_t t = pair / K_;
    if (order_[t * K_ + next_[t]] != pair % K_) {
      int32_t s;
      if (!free_.empty()) {
        s = free_.back();
        free_.pop_back();
      } else {
        K3_CHECK(used_ < hold_rows_);  // Plan / Hold sized it for this arrival order
        s = static_cast<int32_t>(used_++);
      }
      std::memcpy(hold_ + static_cast<size_t>(s) * LT_, row, LT_ * sizeof(float));
      slot_[pair] = s;
      return;
    }
    Fold(pair, row);
    ++next_[t];
    while (next_[t] < count_[t]) {
      const size_t p = t * K_ + order_[t * K_ + next_[t]];
      const int32_t s = slot_[p];
      if (s < 0) break;
      Fold(p, hold_ + static_cast<size_t>(s) * LT_);
      slot_[p] = -1;
      free_.push_back(s);
      ++next_[t];
    }
  }

  // Feeds a [C*K][LT] buffer (an executor without a sink) in sum order.
  void FromBuffer(const float* contrib) {
    for (size_t t = 0; t < count_.size(); ++t) {
      for (uint32_t i = 0; i < count_[t]; ++i) {
        const uint32_t pair = static_cast<uint32_t>(t * K_ + order_[t * K_ + i]);
        Put(pair, contrib + static_cast<size_t>(pair) * LT_);
      }
    }
  }

  // Every kept pair folded (a pass that was not stopped delivers them all).
  bool complete() const {
    for (size_t t = 0; t < count_.size(); ++t) {
      if (next_[t] != count_[t]) return false;
    }
    return true;
  }

 private:
  void Fold(size_t pair, const float* row) {
    float* lt = lat_ + (pair / K_) * LT_;
    const float wk = sel_w_[pair];
    for (size_t i = 0; i < LT_; ++i) lt[i] += wk * row[i];
  }

  size_t K_, LT_;
  const float* sel_w_;
  float* lat_;
  std::vector<uint32_t> order_;  // [C][K]: kept ranks in ascending expert id
  std::vector<uint32_t> count_;  // [C]: kept ranks
  std::vector<uint32_t> next_;   // [C]: ranks folded so far
  std::vector<int32_t> slot_;    // [C*K]: hold slot of a pair that came early, or -1
  float* hold_ = nullptr;        // held rows: [hold_rows_][LT]
  size_t hold_rows_ = 0, used_ = 0;
  std::vector<int32_t> free_;
};

}  // namespace

Session::Session(Model& model, RunOptions options, int64_t max_tokens)
    : model_(model), options_(options), impl_(std::make_unique<Impl>(model.config())) {
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

// ---------------------------------------------------------------------------
// Checkpoints (issue 13). The state is exactly: every KDA layer's S and conv
// windows, the MLA rows [0, pos), pos and history. Nothing else a chunk reads
// survives between chunks (scratch is rewritten before use).
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
  // Grow the MLA caches (position-major, so growth is a prefix copy).
  const double row_bytes = 4.0 * static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim);
  double grown_bytes = 0;
  if (pos_ + total > impl_->cache_cap) {
    int64_t cap = std::max<int64_t>(pos_ + total, impl_->cache_cap * 2);
    grown_bytes = static_cast<double>(cap - impl_->cache_cap) * row_bytes *
                  static_cast<double>(c.num_mla_layers());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if (c.is_kda[static_cast<size_t>(i)]) continue;
      auto& mc = impl_->mla[static_cast<size_t>(i)];
      mc.latent.resize(static_cast<size_t>(cap * c.kv_lora_rank), 0.0f);
      mc.rope.resize(static_cast<size_t>(cap * c.qk_rope_head_dim), 0.0f);
    }
    impl_->cache_cap = cap;
  }

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

bool Session::CombineMayHold() {
  const ExpertExecutor* ex = model_.executor();
  const ExpertStore* store = &model_.experts();
  Impl& im = *impl_;
  if (im.hold_store == store && im.hold_executor == ex) return im.hold;
  im.hold_store = store;
  im.hold_executor = ex;
  const PairOrder order = ex == nullptr ? PairOrder::kExpertOrder : ex->pair_order();
  im.hold = order != PairOrder::kExpertOrder;
  // Experts arrive in disk order: nothing is held when that is ascending id
  // in every MoE layer (k3 containers; HF snapshots may shuffle them).
  const ModelConfig& c = model_.config();
  for (int64_t l = 0; l < c.num_hidden_layers && !im.hold; ++l) {
    if (!c.is_moe(l)) continue;
    for (int64_t e = 1; e < c.num_experts && !im.hold; ++e) {
      if (!(store->DiskOrder(l, e - 1) < store->DiskOrder(l, e))) im.hold = true;
    }
  }
  return im.hold;
}

// One window through the whole stack, layer-major. Every matmul is batched
// over the window; per-token sequential state advances in token order.
namespace {
// Wall time into PhaseTimes fields: Lap adds the time since the last Lap (or
// construction, or Skip) to one field; Skip drops it (a part that timed itself).
class PhaseClock {
 public:
  PhaseClock() : t_(NowSeconds()) {}
  void Lap(double& field) {
    const double now = NowSeconds();
    field += now - t_;
    t_ = now;
  }
  void Skip() { t_ = NowSeconds(); }

 private:
  double t_;
};
}  // namespace

void Session::ForwardChunk(const int32_t* ids, int64_t n_tokens, int64_t t_base,
                           const ForwardOutputs& out, bool last_chunk) {
  const ModelConfig& c = model_.config();
  const ModelWeights& W = model_.weights();
  Impl& im = *impl_;
  const bool idot = options_.idot;
  const size_t C = static_cast<size_t>(n_tokens);
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t L = static_cast<size_t>(c.num_hidden_layers);
  const size_t nbmax = static_cast<size_t>(c.max_blocks());
  const float eps = c.rms_norm_eps;
  const int64_t pos0 = pos_;

  // The window's streams, kept by the session like the layer scratch (a long
  // prompt's later windows reuse the pages instead of faulting them in again;
  // every buffer is written before it is read: h by the embedding, p and the
  // snapshots by copies, x by the norms, a and f by the layer).
  ScratchSet& ws = im.window_bufs;
  float *h = ws.Take(0, C * D), *p = ws.Take(1, C * D), *x = ws.Take(2, C * D),
        *a = ws.Take(3, C * D), *f = ws.Take(4, C * D), *m = ws.Take(5, D);
  float* blocks = ws.Take(6, C * nbmax * D);  // per token: its block snapshots
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
    if (PollInterrupt(static_cast<int64_t>(li))) return;
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
      MlaForward(static_cast<int64_t>(li), x, C, pos0, a);
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
      MoeForward(static_cast<int64_t>(li), x, C, pos0, f);
      if (interrupted_) return;  // stopped between experts (the session was reset)
      clk.Skip();  // timed inside, by part
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

  // Head: every position when all logits / final vectors are wanted, else
  // only the last position of the call.
  const bool want_all = out.logits_all != nullptr || out.final_hidden != nullptr;
  const bool want_last = out.logits_last != nullptr && last_chunk;
  if (W.has_head && (want_all || want_last)) {
    PhaseClock clk;
    const size_t first = want_all ? 0 : C - 1;
    const size_t rows = C - first;
    std::vector<float> y(rows * D);
    for (size_t t = first; t < C; ++t) {
      float* yt = y.data() + (t - first) * D;
      mix(t, h + t * D, W.out_sw, m);
      quant::RmsNorm(m, W.final_norm.data(), D, eps, yt);
      if (out.final_hidden) {
        std::memcpy(out.final_hidden + (static_cast<size_t>(t_base) + t) * D, yt,
                    D * sizeof(float));
      }
    }
    const size_t V = static_cast<size_t>(c.vocab_size);
    std::vector<float> logits(rows * V);
    Linear(W.lm_head, y.data(), rows, logits.data(), idot, &im.acts);
    if (out.logits_all) {
      std::memcpy(out.logits_all + (static_cast<size_t>(t_base) + first) * V, logits.data(),
                  rows * V * sizeof(float));
    }
    if (want_last) {
      std::memcpy(out.logits_last, logits.data() + (rows - 1) * V, V * sizeof(float));
    }
    clk.Lap(ph.head);
  }
  pos_ += n_tokens;
}

// KDA (§5.3). x: [C, D] normalised input; out: [C, D].
void Session::KdaForward(int64_t layer, const float* x, size_t C, float* out) {
  const ModelConfig& c = model_.config();
  const KdaWeights& w = model_.weights().layers[static_cast<size_t>(layer)].kda;
  Impl::KdaState& st = impl_->kda[static_cast<size_t>(layer)];
  const bool idot = options_.idot;
  const size_t H = static_cast<size_t>(c.kda_num_heads);
  const size_t hd = static_cast<size_t>(c.kda_head_dim);
  const size_t P = H * hd;
  const size_t K = static_cast<size_t>(c.kda_conv_kernel);
  const float eps = c.rms_norm_eps;
  const float lb = c.kda_gate_lower_bound;

  ScratchSet& scratch = impl_->scratch;
  float *q = scratch.Take(0, C * P), *k = scratch.Take(1, C * P), *v = scratch.Take(2, C * P), *g = scratch.Take(3, C * P),
        *z = scratch.Take(4, C * P), *t1 = scratch.Take(5, C * hd), *braw = scratch.Take(6, C * H);
  PhaseClock clk;
  Linear(w.q, x, C, q, idot, &impl_->acts);
  Linear(w.k, x, C, k, idot, &impl_->acts);
  Linear(w.v, x, C, v, idot, &impl_->acts);
  Linear(w.g, x, C, g, idot, &impl_->acts);
  quant::MatMul(w.f_a.view(), x, C, t1);
  quant::MatMul(w.f_b.view(), t1, C, z);
  quant::MatMul(w.b.view(), x, C, braw);
  clk.Lap(phases_.attn_proj);

  // Checkpoints inside the window (Session::Forward): after token t whose
  // capture_of_token is set, this layer's state is copied into that capture,
  // at offset kda_off of its floats (S, then the q, k, v conv windows).
  const std::vector<int32_t>& cap_of = impl_->capture_of_token;
  const bool capturing = !impl_->captures.empty() && cap_of.size() == C;
  size_t kda_off = 0;
  if (capturing) {
    const StateLayout lay = StateLayout::For(c);
    for (int64_t i = 0; i < layer; ++i) {
      if (c.is_kda[static_cast<size_t>(i)]) kda_off += lay.kda_layer_floats();
    }
  }
  auto capture_at = [&](size_t t) -> float* {
    if (!capturing || cap_of[t] < 0) return nullptr;
    return impl_->captures[static_cast<size_t>(cap_of[t])].kda.data() + kda_off;
  };

  // Causal depthwise conv + SiLU. Each thread takes a range of channels and
  // walks the tokens over it, so a step reads consecutive floats of a token row
  // (channel by channel, every token's row was a 48 KB stride apart). Output t
  // of channel d is sum_j taps[d][j] * in[t-K+1+j], j ascending from 0: the
  // bits of the per-channel window it replaces. In place, last token first:
  // token t reads raw inputs t-K+1..t, which no output has replaced yet;
  // positions before the window come from `win`, which then takes the last K
  // raw inputs. Threads only pay off with enough work.
  const bool conv_par = P * C * K >= (1u << 16);
  std::vector<float> taps_t(K * P), next_win(P * K), sums(P);
  auto conv = [&](float* y, std::vector<float>& win, const std::vector<float>& taps, size_t part) {
    for (size_t d = 0; d < P; ++d) {
      for (size_t j = 0; j < K; ++j) taps_t[j * P + d] = taps[d * K + j];
    }
#pragma omp parallel if (conv_par)
    {
      const size_t nth = static_cast<size_t>(omp_get_num_threads());
      const size_t me = static_cast<size_t>(omp_get_thread_num());
      const size_t d0 = P * me / nth, d1 = P * (me + 1) / nth;
      // Raw input at token src (negative: the window before this chunk).
      auto in = [&](ptrdiff_t src, size_t d) {
        return src >= 0 ? y[static_cast<size_t>(src) * P + d] : win[d * K + static_cast<size_t>(static_cast<ptrdiff_t>(K) + src)];
      };
      for (size_t d = d0; d < d1; ++d) {
        for (size_t j = 0; j < K; ++j) next_win[d * K + j] = in(static_cast<ptrdiff_t>(C + j) - static_cast<ptrdiff_t>(K), d);
      }
      for (size_t t = C; t-- > 0;) {
        const ptrdiff_t first = static_cast<ptrdiff_t>(t + 1) - static_cast<ptrdiff_t>(K);
        float* acc = sums.data();
        for (size_t d = d0; d < d1; ++d) acc[d] = 0.0f;
        for (size_t j = 0; j < K; ++j) {
          const ptrdiff_t src = first + static_cast<ptrdiff_t>(j);
          const float* tj = taps_t.data() + j * P;
          if (src >= 0) {
            const float* row = y + static_cast<size_t>(src) * P;
            for (size_t d = d0; d < d1; ++d) acc[d] += tj[d] * row[d];
          } else {
            for (size_t d = d0; d < d1; ++d) acc[d] += tj[d] * in(src, d);
          }
        }
        if (float* cap = capture_at(t)) {
          float* cw = cap + H * hd * hd + part * P * K;
          for (size_t d = d0; d < d1; ++d) {
            for (size_t j = 0; j < K; ++j) cw[d * K + j] = in(first + static_cast<ptrdiff_t>(j), d);
          }
        }
        float* out = y + t * P;
        for (size_t d = d0; d < d1; ++d) out[d] = quant::Silu(acc[d]);
      }
      // Only this thread's channels read their windows: no barrier needed.
      for (size_t d = d0; d < d1; ++d) std::memcpy(win.data() + d * K, next_win.data() + d * K, K * sizeof(float));
    }
  };
  conv(q, st.wq, w.q_conv, 0);
  conv(k, st.wk, w.k_conv, 1);
  conv(v, st.wv, w.v_conv, 2);

  float* o = scratch.Take(7, C * P);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Heads are independent: each owns its state and advances token by token.
  const bool head_par = H > 1 && H * hd * hd * C >= (1u << 16);
#pragma omp parallel for schedule(static) if (head_par)
  for (size_t hh = 0; hh < H; ++hh) {
    std::vector<float> qn(hd), kn(hd), alpha(hd), ks(hd), vt(hd), oh(hd);
    float* S = st.s.data() + hh * hd * hd;
    const float a_h = w.a[hh];
    for (size_t t = 0; t < C; ++t) {
      const float* qt = q + t * P + hh * hd;
      const float* kt = k + t * P + hh * hd;
      const float* vtok = v + t * P + hh * hd;
      float sq = 0.0f, sk = 0.0f;
      for (size_t i = 0; i < hd; ++i) sq += qt[i] * qt[i];
      for (size_t i = 0; i < hd; ++i) sk += kt[i] * kt[i];
      const float rq = 1.0f / std::sqrt(sq + kL2NormEps);
      const float rk = 1.0f / std::sqrt(sk + kL2NormEps);
      for (size_t i = 0; i < hd; ++i) qn[i] = qt[i] * rq * q_scale;
      for (size_t i = 0; i < hd; ++i) kn[i] = kt[i] * rk;
      for (size_t i = 0; i < hd; ++i) {
        const size_t ch = hh * hd + i;
        const float zz = z[t * P + ch] + w.dt_bias[ch];
        alpha[i] = std::exp(lb * quant::Sigmoid(a_h * zz));
      }
      const float beta = quant::Sigmoid(braw[t * H + hh]);
      // S <- Diag(alpha) S; kS = k^T S (lib/quant's vectorized sweep, same bits).
      quant::KdaDecay(S, hd, alpha.data(), kn.data(), ks.data());
      for (size_t vv = 0; vv < hd; ++vv) vt[vv] = (vtok[vv] - ks[vv]) * beta;
      // S += k vt^T; o = S^T q.
      quant::KdaUpdate(S, hd, kn.data(), vt.data(), qn.data(), oh.data());
      if (float* cap = capture_at(t)) {
        std::memcpy(cap + hh * hd * hd, S, hd * hd * sizeof(float));
      }
      float* ot = o + t * P + hh * hd;
      quant::RmsNorm(oh.data(), w.o_norm.data(), hd, eps, ot);
      const float* gt = g + t * P + hh * hd;
      for (size_t vv = 0; vv < hd; ++vv) ot[vv] *= quant::Sigmoid(gt[vv]);
    }
  }
  clk.Lap(phases_.kda_scan);
  Linear(w.o, o, C, out, idot, &impl_->acts);
  clk.Lap(phases_.attn_proj);
}

// Gated MLA, NoPE, absorbed form over the latent cache (§5.4).
void Session::MlaForward(int64_t layer, const float* x, size_t C, int64_t pos0, float* out) {
  const ModelConfig& c = model_.config();
  const MlaWeights& w = model_.weights().layers[static_cast<size_t>(layer)].mla;
  Impl::MlaCache& mc = impl_->mla[static_cast<size_t>(layer)];
  const bool idot = options_.idot;
  const size_t H = static_cast<size_t>(c.num_attention_heads);
  const size_t nope = static_cast<size_t>(c.qk_nope_head_dim);
  const size_t rope = static_cast<size_t>(c.qk_rope_head_dim);
  const size_t qh = nope + rope;
  const size_t vh = static_cast<size_t>(c.v_head_dim);
  const size_t kvl = static_cast<size_t>(c.kv_lora_rank);
  const size_t ql = static_cast<size_t>(c.q_lora_rank);

  ScratchSet& scratch = impl_->scratch;
  float *qa = scratch.Take(0, C * ql), *qv = scratch.Take(1, C * H * qh), *ckv = scratch.Take(2, C * (kvl + rope)),
        *gv = scratch.Take(3, C * H * vh);
  PhaseClock clk;
  Linear(w.q_a, x, C, qa, idot, &impl_->acts);
  for (size_t t = 0; t < C; ++t) {
    quant::RmsNorm(qa + t * ql, w.q_a_norm.data(), ql, kLoraNormEps, qa + t * ql);
  }
  Linear(w.q_b, qa, C, qv, idot, &impl_->acts);
  Linear(w.kv_a, x, C, ckv, idot, &impl_->acts);
  // Append the whole chunk to the cache first; token t then attends to rows
  // 0..pos0+t (causal).
  for (size_t t = 0; t < C; ++t) {
    const size_t row = static_cast<size_t>(pos0) + t;
    const float* src = ckv + t * (kvl + rope);
    quant::RmsNorm(src, w.kv_a_norm.data(), kvl, kLoraNormEps, mc.latent.data() + row * kvl);
    if (rope) std::memcpy(mc.rope.data() + row * rope, src + kvl, rope * sizeof(float));
  }
  Linear(w.g, x, C, gv, idot, &impl_->acts);
  clk.Lap(phases_.attn_proj);

  float* ctx = scratch.Take(4, C * H * vh);
  const float scale = 1.0f / std::sqrt(static_cast<float>(qh));
  const quant::WeightView& kvb = w.kv_b.view();
  // A block of queries' scores against every cached row (latent and rope
  // parts) is one AttnScores call (issue 25 §2: attention over a long window
  // runs on the kernels). The cache is the same for every head (MLA's absorbed
  // form), so a block is all heads of `tb` tokens, query row q = t * H + head:
  // each cached row is read once per block for all of them, not once per head.
  // AttnScores computes each element with the same operations whatever the
  // queries, the keys and the threads, Softmax is per row, and
  // each query's weighted sum of latent rows goes over the rows in ascending
  // order, so any window and any block gives the bits of token-at-a-time.
  //
  // Blocks come in groups of `G` tokens: the absorbed queries of a group are
  // made before its blocks and its outputs after them, per head over the
  // group's tokens at once, so that kv_b (96 heads x 256 rows: 12 MiB at K3's
  // dims in int8) is read once per group, not once per block.
  // The absorb is AddRows (each element's rows in ascending order, whatever the
  // tokens) and the output a MatMul over the head's kv_b rows (RowDot's
  // operations per element): the same bits as per block.
  const size_t tb_max = std::min(C, MlaBlockTokens(H));
  const size_t G = std::min(C, options_.mla_group > 0 ? static_cast<size_t>(options_.mla_group)
                                                     : MlaGroupTokens(H, kvl, rope, vh));
  const size_t Q_max = tb_max * H;
  const size_t rows_max = static_cast<size_t>(pos0) + C;
  // Per group, in query order [t][head]: qabs, clat (a thread's query rows are
  // one AddRows call, so it streams the cached rows once per block), qr; the
  // outputs per head [head][t], and per thread a head's latent sums gathered
  // as one MatMul's contiguous rows.
  const size_t threads = static_cast<size_t>(std::max(omp_get_max_threads(), 1));
  float* qabs = scratch.Take(5, G * H * (2 * kvl + rope + vh) + threads * G * kvl);
  float* clat = qabs + G * H * kvl;
  float* qr = clat + G * H * kvl;
  float* yv = qr + G * H * rope;
  float* gather = yv + G * H * vh;
  float* s1 = scratch.Take(6, Q_max * rows_max);
  quant::WeightView lat;
  lat.format = quant::WeightFormat::kF32;
  lat.cols = kvl;
  lat.data = mc.latent.data();
  for (size_t g0 = 0; g0 < C; g0 += G) {
    const size_t gn = std::min(G, C - g0);
    const bool gpar = gn * H * nope * kvl >= (1u << 16);
    // The absorbed queries: qabs[t, head] = sum over d of qn[t][d] * kv_b row
    // d of the head, the group's tokens at once (AddRows: the AddRow loop's bits).
#pragma omp parallel for schedule(static) if (gpar && H > 1)
    for (size_t hh = 0; hh < H; ++hh) {
      for (size_t t = 0; t < gn; ++t) std::fill_n(qabs + (t * H + hh) * kvl, kvl, 0.0f);
      quant::AddRows(kvb, hh * (nope + vh), nope, qv + g0 * H * qh + hh * qh, H * qh, gn,
                     qabs + hh * kvl, H * kvl);
      for (size_t t = 0; t < gn && rope; ++t) {
        std::memcpy(qr + (t * H + hh) * rope, qv + (g0 + t) * H * qh + hh * qh + nope, rope * sizeof(float));
      }
    }
    for (size_t t0 = g0; t0 < g0 + gn; t0 += tb_max) {
      const size_t tb = std::min(tb_max, g0 + gn - t0);
      const size_t Q = tb * H;
      const size_t nb = static_cast<size_t>(pos0) + t0 + tb;  // rows the block's last token sees
      const size_t seen_by_all = static_cast<size_t>(pos0) + t0;
      lat.rows = nb;
      const bool par = Q * nb * kvl >= (1u << 16);
      quant::AttnScores(qabs + (t0 - g0) * H * kvl, mc.latent.data(), kvl, qr + (t0 - g0) * H * rope,
                        mc.rope.data(), rope, Q, nb, scale, s1);
      // Per query row: scores, softmax, then its weighted sum of the latent rows
      // it sees in ascending order (the rows before the block reach every row of
      // it, AddRows; then the block's own rows up to its token).
      const int nthreads = par ? omp_get_max_threads() : 1;
      const size_t per = (Q + static_cast<size_t>(nthreads) - 1) / static_cast<size_t>(nthreads);
#pragma omp parallel for schedule(static) num_threads(nthreads)
      for (size_t q0 = 0; q0 < Q; q0 += per) {
        const size_t q1 = std::min(Q, q0 + per);
        for (size_t q = q0; q < q1; ++q) {
          const size_t nt = seen_by_all + q / H + 1;
          quant::Softmax(s1 + q * nb, nt);
        }
        float* cb = clat + (t0 - g0) * H * kvl;
        std::fill(cb + q0 * kvl, cb + q1 * kvl, 0.0f);
        quant::AddRows(lat, 0, seen_by_all, s1 + q0 * nb, nb, q1 - q0, cb + q0 * kvl, kvl);
        for (size_t q = q0; q < q1; ++q) {
          for (size_t j = seen_by_all; j <= seen_by_all + q / H; ++j) {
            quant::AddRow(lat, j, s1[q * nb + j], cb + q * kvl);
          }
        }
      }
    }
    // The outputs: per head, its v rows of kv_b against the group's latent
    // sums, then the gate.
#pragma omp parallel for schedule(static) if (gpar && H > 1)
    for (size_t hh = 0; hh < H; ++hh) {
      float* x = gather + static_cast<size_t>(omp_get_thread_num()) * G * kvl;
      for (size_t t = 0; t < gn; ++t) std::memcpy(x + t * kvl, clat + (t * H + hh) * kvl, kvl * sizeof(float));
      float* y = yv + hh * G * vh;
      quant::MatMul(quant::RowRange(kvb, hh * (nope + vh) + nope, vh), x, gn, y);
      for (size_t t = 0; t < gn; ++t) {
        float* ct = ctx + (g0 + t) * H * vh + hh * vh;
        const float* gt = gv + (g0 + t) * H * vh + hh * vh;
        for (size_t d = 0; d < vh; ++d) ct[d] = y[t * vh + d] * quant::Sigmoid(gt[d]);
      }
    }
  }
  clk.Lap(phases_.mla_attn);
  Linear(w.o, ctx, C, out, idot, &impl_->acts);
  clk.Lap(phases_.attn_proj);
}

// Below this expected share of a layer's experts (uniform routing) a window
// does not read ahead: reads it would not use would cost more than waiting.
// 0.95 is C >= 167 tokens at K3's 16 of 896.
constexpr double kReadAheadShare = 0.95;

void Session::ReadAhead(int64_t from, size_t n) {
  const ModelConfig& c = model_.config();
  const double E = static_cast<double>(c.num_experts);
  const double K = static_cast<double>(c.num_experts_per_token);
  if (E <= 0 || K <= 0) return;
  // K3_TOPP drops each token's routing tail: what the uniform share predicts
  // is no longer what a window uses, and the tail must not be read.
  if (options_.topp > 0.0f && options_.topp < 1.0f) return;
  const double share = 1.0 - std::pow(1.0 - std::min(1.0, K / E), static_cast<double>(n));
  if (share < kReadAheadShare) return;
  const auto& layers = model_.weights().layers;
  for (size_t l = static_cast<size_t>(std::max<int64_t>(from, 0)); l < layers.size(); ++l) {
    if (!layers[l].is_moe) continue;
    ExpertStore& store = model_.experts();
    const int64_t layer = static_cast<int64_t>(l);
    std::vector<int32_t> order(static_cast<size_t>(c.num_experts));
    for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int32_t>(e);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return store.DiskOrder(layer, a) < store.DiskOrder(layer, b);
    });
    Executor().Prefetch(layer, order, store);
    return;
  }
}

ExpertExecutor& Session::Executor() {
  ExpertExecutor* ex = model_.executor();
  return ex != nullptr ? *ex : impl_->cpu_experts;
}

// Dense MLP / fused shared experts: down(SiTU(gate x, up x)), in slices of at
// most kMlpSliceTokens tokens. The gate and up outputs are the widest rows of
// the forward pass (K3's dense layer: 33792 floats, 2.4x a KDA projection):
// over a whole window they were the largest part of its memory and of the
// pages a first prefill faults in. Every GEMM already walks its weights once
// per L2-sized chunk of activation rows, so slices read no more weight bytes;
// each row is computed alone, so the bits are those of the whole window.
void Session::MlpForward(const MlpWeights& w, const float* x, size_t C, float* out) {
  const ModelConfig& c = model_.config();
  const bool idot = options_.idot;
  const size_t inter = w.gate.rows(), in = w.gate.cols(), outc = w.down.rows();
  const size_t S = std::min(C, kMlpSliceTokens);
  float *g = impl_->scratch.Take(0, S * inter), *u = impl_->scratch.Take(1, S * inter);
  for (size_t t0 = 0; t0 < C; t0 += S) {
    const size_t n = std::min(S, C - t0);
    Linear(w.gate, x + t0 * in, n, g, idot, &impl_->acts);
    Linear(w.up, x + t0 * in, n, u, idot, &impl_->acts);
    quant::SituGlu(g, u, n * inter, c.situ_beta, c.situ_linear_beta, g);
    Linear(w.down, g, n, out + t0 * outc, idot, &impl_->acts);
  }
}

// LatentMoE (§5.5) + fused shared experts.
void Session::MoeForward(int64_t layer, const float* x, size_t C, int64_t pos0, float* out) {
  const ModelConfig& c = model_.config();
  const MoeWeights& w = model_.weights().layers[static_cast<size_t>(layer)].moe;
  const bool idot = options_.idot;
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t E = static_cast<size_t>(c.num_experts);
  const size_t K = static_cast<size_t>(c.num_experts_per_token);
  const size_t LT = static_cast<size_t>(c.routed_expert_hidden_size);

  // Router: sigmoid scores; top-k by score + bias (strict >, ties -> lowest
  // id); weights = raw scores renormalised.
  ScratchSet& scratch = impl_->scratch;
  PhaseClock clk;
  float* logits = scratch.Take(2, C * E);
  quant::MatMul(w.router.view(), x, C, logits);
  std::vector<int32_t> sel(C * K);
  std::vector<float> sel_w(C * K);
  std::vector<float> s(E);
  std::vector<char> taken(E);
  std::vector<char> keep(C * K, 1);  // 0: dropped by K3_TOPP
  for (size_t t = 0; t < C; ++t) {
    for (size_t e = 0; e < E; ++e) s[e] = quant::Sigmoid(logits[t * E + e]);
    std::fill(taken.begin(), taken.end(), 0);
    float sum = 0.0f;
    for (size_t kk = 0; kk < K; ++kk) {
      int64_t best = -1;
      float best_v = -1e30f;
      for (size_t e = 0; e < E; ++e) {
        if (taken[e]) continue;
        const float v = s[e] + w.score_bias[e];
        if (v > best_v) {
          best_v = v;
          best = static_cast<int64_t>(e);
        }
      }
      if (best < 0) {
        LogOnce(&kRouterKey, LogLevel::kWarn,
                "router: no finite candidate; falling back to id order");
        for (size_t e = 0; e < E; ++e) {
          if (!taken[e]) {
            best = static_cast<int64_t>(e);
            break;
          }
        }
      }
      taken[static_cast<size_t>(best)] = 1;
      sel[t * K + kk] = static_cast<int32_t>(best);
      sel_w[t * K + kk] = s[static_cast<size_t>(best)];
      sum += s[static_cast<size_t>(best)];
    }
    for (size_t kk = 0; kk < K; ++kk) sel_w[t * K + kk] /= (sum + 1e-20f);
    if (options_.topp > 0.0f && options_.topp < 1.0f) {
      DropRoutingTail(t * K, K, sel_w, options_.topp, keep);
    }
    if (record_routing_) {
      RoutingRecord r;
      r.layer = layer;
      r.position = pos0 + static_cast<int64_t>(t);
      r.experts.assign(sel.begin() + static_cast<ptrdiff_t>(t * K),
                       sel.begin() + static_cast<ptrdiff_t>((t + 1) * K));
      r.weights.assign(sel_w.begin() + static_cast<ptrdiff_t>(t * K),
                       sel_w.begin() + static_cast<ptrdiff_t>((t + 1) * K));
      routing_.push_back(std::move(r));
    }
  }

  // Latent down-projection, then the union of the window's experts, each
  // fetched once and applied to all its tokens by the executor (the CPU one
  // unless the model has another, e.g. the Vulkan tier).
  float* zlat = scratch.Take(3, C * LT);
  Linear(w.latent_down, x, C, zlat, idot, &impl_->acts);
  clk.Lap(phases_.moe_router);
  std::vector<std::vector<uint32_t>> users(E);  // (t * K + kk) per expert, sized exactly
  {
    std::vector<uint32_t> n(E, 0);
    for (size_t i = 0; i < C * K; ++i) n[static_cast<size_t>(sel[i])] += keep[i] ? 1 : 0;
    for (size_t e = 0; e < E; ++e) users[e].reserve(n[e]);
  }
  for (size_t i = 0; i < C * K; ++i) {
    if (keep[i]) users[static_cast<size_t>(sel[i])].push_back(static_cast<uint32_t>(i));
  }
  std::vector<int32_t> uni;
  for (size_t e = 0; e < E; ++e) {
    if (!users[e].empty()) uni.push_back(static_cast<int32_t>(e));
  }
  ExpertStore& store = model_.experts();
  std::stable_sort(uni.begin(), uni.end(), [&](int32_t a, int32_t b) {
    return store.DiskOrder(layer, a) < store.DiskOrder(layer, b);
  });
  ExpertExecutor* ex = &Executor();
  const PairOrder order = ex->pair_order();

  // The combine folds outputs as they arrive (Combiner); only an executor
  // without a sink still needs the [C*K][LT] buffer of every pair.
  // Held rows (or the executor's buffer) live in layer scratch slot 8, kept
  // by the session: a fresh [rows][LT] block per layer faulted in a quarter
  // GB of new pages per MoE layer at 2048 tokens (docs/PERFORMANCE.md).
  float* lat = scratch.Take(4, C * LT);  // zeroed by the Combiner
  Combiner combine(C, K, LT, sel.data(), sel_w.data(), keep.data(), lat);
  float* contrib = nullptr;
  if (order == PairOrder::kExpertOrder) {
    const size_t peak = combine.Plan(uni, users);
    combine.Hold(peak > 0 ? scratch.Take(8, peak * LT) : nullptr, peak);
  } else if (order == PairOrder::kAnyOrder) {
    combine.Hold(scratch.Take(8, C * K * LT), C * K);
  } else {
    contrib = scratch.Take(8, C * K * LT);
  }
  ExpertBatch batch;
  batch.layer = layer;
  batch.num_tokens = C;
  batch.top_k = K;
  batch.latent = zlat;
  batch.experts = uni;
  batch.users = &users;
  batch.int8_acts = idot;
  batch.latent_dim = LT;
  if (order == PairOrder::kBuffer) {
    batch.out = contrib;
  } else {
    batch.sink = &combine;
  }
  // Cancel and progress between experts (PollInterrupt resets the session).
  const std::function<bool(size_t)> stop = [&](size_t done) {
    return PollInterrupt(layer, static_cast<int64_t>(done), static_cast<int64_t>(uni.size()));
  };
  if (interrupt_) batch.stop = &stop;
  ex->Run(batch, store);
  if (interrupted_) return;
  ReadAhead(layer + 1, C);  // the next MoE layer's reads overlap the rest of this one
  if (order == PairOrder::kBuffer) combine.FromBuffer(contrib);
  K3_CHECK(combine.complete());
  clk.Lap(phases_.moe_experts);
  // Then the latent norm per token.
  for (size_t t = 0; t < C; ++t) {
    float* lt = lat + t * LT;
    quant::RmsNorm(lt, w.latent_norm.data(), LT, c.rms_norm_eps, lt);
  }
  Linear(w.latent_up, lat, C, out, idot, &impl_->acts);
  clk.Lap(phases_.moe_latent_up);
  if (!w.shared.gate.empty()) {
    float* sh = scratch.Take(5, C * D);
    MlpForward(w.shared, x, C, sh);
    for (size_t i = 0; i < C * D; ++i) out[i] += sh[i];
    clk.Lap(phases_.mlp);
  }
}

// ---------------------------------------------------------------------------
// Window memory (issue 25, docs/model.md "Windows"). Mirrors the allocations
// of ForwardChunk and the layer functions: what lives through the whole
// window, plus scratch that keeps its capacity between layers (the int8
// activations, the CPU executor's rows, the layer scratch sets), plus the
// largest of the transient parts of one layer's phases (per-thread attention
// scratch, the MoE layer's routing and held rows, the head).
uint64_t PrefillWindowBytes(const ModelConfig& c, const WindowShape& s) {
  const double C = static_cast<double>(std::max<int64_t>(s.tokens, 0));
  const double T = static_cast<double>(std::max(s.threads, 1));
  const double D = static_cast<double>(c.hidden_size);
  const double nbmax = static_cast<double>(c.max_blocks());
  const double P = static_cast<double>(c.kda_proj());
  const double Hk = static_cast<double>(c.kda_num_heads);
  const double hd = static_cast<double>(c.kda_head_dim);
  const double H = static_cast<double>(c.num_attention_heads);
  const double qh = static_cast<double>(c.qk_head_dim());
  const double rope = static_cast<double>(c.qk_rope_head_dim);
  const double vh = static_cast<double>(c.v_head_dim);
  const double kvl = static_cast<double>(c.kv_lora_rank);
  const double ql = static_cast<double>(c.q_lora_rank);
  const double E = static_cast<double>(c.num_experts);
  const double K = static_cast<double>(c.num_experts_per_token);
  const double LT = static_cast<double>(c.routed_expert_hidden_size);
  const double MI = static_cast<double>(c.moe_intermediate_size);
  const double inter = static_cast<double>(c.intermediate_size);
  const double shared = static_cast<double>(c.shared_intermediate());
  const double V = static_cast<double>(c.vocab_size);
  const bool any_kda = std::find(c.is_kda.begin(), c.is_kda.end(), true) != c.is_kda.end();
  const bool any_mla = c.num_mla_layers() > 0;
  const bool any_dense = c.first_k_dense_replace > 0;
  const bool any_moe = c.num_moe_layers() > 0;
  constexpr double f = sizeof(float);
  // int8 rows + one f32 scale per 32 columns (quant::ActsQ8).
  auto q8 = [](double rows, double cols) { return rows * cols * (1.0 + f / 32.0); };

  // Through the window: h, p, x, a, f, the AttnRes snapshots, m, mix scratch,
  // and the window's ids appended to the session's history.
  double bytes =
      f * (5 * C * D + C * nbmax * D + D) + (nbmax + 1) * (f + sizeof(void*)) + sizeof(int32_t) * C;
  // Session scratch that keeps its capacity: Linear's int8 activations (the
  // widest input of any Linear over C rows) and the CPU executor's rows (an
  // expert has at most one pair per token, so at most C rows).
  // The MLPs' down projections (inter or shared columns) see one slice of
  // at most kMlpSliceTokens rows (Session::MlpForward).
  const double slice = std::min(C, static_cast<double>(kMlpSliceTokens));
  if (s.idot) {
    double cols = D, mlp_cols = 0;
    if (any_kda) cols = std::max(cols, P);
    if (any_mla) cols = std::max({cols, ql, H * vh});
    if (any_dense) mlp_cols = std::max(mlp_cols, inter);
    if (any_moe) {
      cols = std::max(cols, LT);
      mlp_cols = std::max(mlp_cols, shared);
    }
    bytes += std::max(q8(C, cols), q8(slice, mlp_cols));
  }
  if (any_moe) {
    bytes += f * (2 * C * MI + C * LT);                                  // g_, u_, y_
    bytes += s.idot ? q8(C, LT) + q8(C, std::max(LT, MI)) : f * C * LT;  // acts or zg_
  }
  // Checkpoints captured inside the window: every KDA layer's state each.
  const StateLayout lay = StateLayout::For(c);
  bytes += static_cast<double>(s.captures) * f * static_cast<double>(lay.kda_layer_floats()) *
               static_cast<double>(lay.kda_layers) +
           sizeof(int32_t) * C;

  // Layer scratch (ScratchSet) is kept by the session: each slot counts at the
  // largest size any phase asks of it (slots as in Session::Impl::scratch).
  {
    double slot[9] = {};
    auto need = [&](int i, double floats) { slot[i] = std::max(slot[i], floats); };
    if (any_kda) {  // q, k, v, g, z; t1; braw; o
      for (int i = 0; i < 5; ++i) need(i, C * P);
      need(5, C * hd);
      need(6, C * Hk);
      need(7, C * P);
    }
    if (any_mla) {  // qa, qv, ckv, gv, ctx; a block's queries and latent sums; its scores
      need(0, C * ql);
      need(1, C * H * qh);
      need(2, C * (kvl + rope));
      need(3, C * H * vh);
      need(4, C * H * vh);
      const double Q = std::min(C, static_cast<double>(MlaBlockTokens(static_cast<size_t>(H)))) * H;
      const double G = std::min(
          C, static_cast<double>(s.mla_group > 0 ? static_cast<size_t>(s.mla_group)
                                                 : MlaGroupTokens(static_cast<size_t>(H), static_cast<size_t>(kvl),
                                                                  static_cast<size_t>(rope), static_cast<size_t>(vh))));
      const double rows = static_cast<double>(s.position) + C;
      need(5, G * H * (2 * kvl + rope + vh) + T * G * kvl);
      need(6, Q * rows);
    }
    double mlp = any_dense ? inter : 0;  // gate and up, dense or shared experts
    if (any_moe) mlp = std::max(mlp, shared);
    need(0, slice * mlp);
    need(1, slice * mlp);
    if (any_moe) {  // router logits, latent in, latent out, shared-expert output, held rows
      need(2, C * E);
      need(3, C * LT);
      need(4, C * LT);
      if (shared > 0) need(5, C * D);
      if (s.combine_buffer) need(8, C * K * LT);
    }
    for (double floats : slot) bytes += f * floats;
  }

  double phase = 0;
  if (any_kda) phase = std::max(phase, T * f * 6 * hd);  // per-thread head scratch
  if (any_moe) {
    double moe = 2 * f * C * K + C * K + f * E + E;                     // sel, sel_w, keep, s, taken
    moe += E * sizeof(std::vector<uint32_t>) + f * C * K + 2 * f * E;  // users, counts, uni
    moe += f * (2 * C * K + 2 * C);                                     // the combiner's index
    if (s.combine_buffer) moe += f * C * K;                             // free hold slots
    phase = std::max(phase, moe);
  }
  const double head_rows = s.head_all ? C : (s.head_last ? 1 : 0);
  phase = std::max(phase, f * head_rows * (D + V));
  bytes += phase;
  // Small bookkeeping not worth a term each (per-head vectors, the stop
  // function, index vectors of the planner): measured below 4 KiB on the
  // tiny model.
  bytes += 8192;
  return static_cast<uint64_t>(std::ceil(bytes));
}

int64_t PlanWindow(const ModelConfig& config, int64_t total, double budget_bytes, WindowShape shape,
                   std::span<const int64_t> captures_at) {
  if (total <= 1) return std::max<int64_t>(total, 1);
  // Windows of `w` are equalised (the fewest of at most w tokens); a window
  // captures the checkpoints strictly inside it.
  auto bytes_for = [&](int64_t w) {
    const int64_t n = (total + w - 1) / w;
    const int64_t eq = (total + n - 1) / n;
    int64_t most = 0;
    size_t i = 0;
    for (int64_t t0 = 0; t0 < total; t0 += eq) {
      int64_t in = 0;
      for (; i < captures_at.size() && captures_at[i] <= t0 + eq; ++i) {
        if (captures_at[i] > t0 && captures_at[i] < t0 + eq) ++in;
      }
      most = std::max(most, in);
    }
    shape.tokens = eq;
    shape.captures = most;
    return static_cast<double>(PrefillWindowBytes(config, shape));
  };
  if (bytes_for(total) <= budget_bytes) return total;
  int64_t lo = 0, hi = total;  // bytes_for(hi) > budget; lo fits (0: none yet)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (bytes_for(mid) <= budget_bytes) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (lo == 0) {
    LogOnce(&kTinyBudgetKey, LogLevel::kWarn,
            "prefill: not even a one-token window fits the memory budget (%s); using 1 token",
            FormatBytes(static_cast<uint64_t>(std::max(0.0, budget_bytes))).c_str());
    return 1;
  }
  return lo;
}

// ---------------------------------------------------------------------------
Sampler::Sampler(float temperature, float top_p, uint64_t seed)
    : temperature_(temperature), top_p_(top_p), rng_(seed) {}

int32_t Sampler::Argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (!(temperature_ > 0.0f) || logits.empty()) return Argmax(logits);
  const float mx = logits[static_cast<size_t>(Argmax(logits))];
  std::vector<std::pair<float, int32_t>> pr(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float pi = std::exp((logits[i] - mx) / temperature_);
    pr[i] = {pi, static_cast<int32_t>(i)};
    total += pi;
  }
  // Descending probability, ties by id so the draw is reproducible.
  std::sort(pr.begin(), pr.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const double cut = (top_p_ > 0.0f && top_p_ < 1.0f ? top_p_ : 1.0) * total;
  size_t kept = 0;
  double kept_mass = 0;
  while (kept < pr.size()) {
    kept_mass += pr[kept].first;
    ++kept;
    if (kept_mass >= cut) break;
  }
  std::uniform_real_distribution<double> dist(0.0, 1.0);
  const double r = dist(rng_) * kept_mass;
  double run = 0;
  for (size_t i = 0; i < kept; ++i) {
    run += pr[i].first;
    if (run >= r) return pr[i].second;
  }
  return pr[kept - 1].second;
}

}  // namespace k3::model
