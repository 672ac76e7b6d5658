// LatentMoE (spec §5.5): the router, K3_TOPP, the latent projections, the
// routed experts' pass through the executor, the combine in expert-id order,
// and the read-ahead of a window's experts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/log.h"
#include "k3/quant/ops.h"
#include "linear.h"
#include "session_impl.h"

namespace k3::model {
namespace {

// LogOnce key.
constexpr char kRouterKey = 0;

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

bool Session::CombineMayHold() {
  const ExpertExecutor* ex = model_.executor();
  const ExpertStore* store = &model_.experts();
  Impl& im = *impl_;
  if (im.work->hold_store == store && im.work->hold_executor == ex) return im.work->hold;
  im.work->hold_store = store;
  im.work->hold_executor = ex;
  const PairOrder order = ex == nullptr ? PairOrder::kExpertOrder : ex->pair_order();
  im.work->hold = order != PairOrder::kExpertOrder;
  // Experts arrive in disk order: nothing is held when that is ascending id
  // in every MoE layer (k3 containers; HF snapshots may shuffle them).
  const ModelConfig& c = model_.config();
  for (int64_t l = 0; l < c.num_hidden_layers && !im.work->hold; ++l) {
    if (!c.is_moe(l)) continue;
    for (int64_t e = 1; e < c.num_experts && !im.work->hold; ++e) {
      if (!(store->DiskOrder(l, e - 1) < store->DiskOrder(l, e))) im.work->hold = true;
    }
  }
  return im.work->hold;
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
  // is then not what a window uses, and the tail must not be read.
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
  return ex != nullptr ? *ex : impl_->work->cpu_experts;
}

// x: [C, D] normalised input; out: [C, D]. The routed experts, then the
// fused shared experts added.
void Session::MoeForward(int64_t layer, const float* x, size_t C, float* out) {
  const ModelConfig& c = model_.config();
  const MoeWeights& w = model_.weights().layers[static_cast<size_t>(layer)].moe;
  const bool idot = options_.idot;
  const size_t D = static_cast<size_t>(c.hidden_size);
  const size_t E = static_cast<size_t>(c.num_experts);
  const size_t K = static_cast<size_t>(c.num_experts_per_token);
  const size_t LT = static_cast<size_t>(c.routed_expert_hidden_size);

  // Router: sigmoid scores; top-k by score + bias (strict >, ties -> lowest
  // id); weights = raw scores renormalised.
  LayerScratch::Moe buf = impl_->work->scratch.moe();
  PhaseClock clk;
  // The fused shared experts start on the model's DenseExecutor when it holds
  // them, and run there while the router and the routed experts run here.
  DenseExecutor* dense = model_.dense_executor();
  const bool shared_async = dense != nullptr && !w.shared.gate.empty() &&
                            dense->BeginMlp(w.shared, x, C, c.situ_beta, c.situ_linear_beta);
  float* logits = buf.logits(C * E);
  quant::MatMul(w.router.view(), x, C, logits);
  std::vector<int32_t> sel(C * K);
  std::vector<float> sel_w(C * K);
  std::vector<float> s(E);
  std::vector<char> taken(E);
  std::vector<char> keep(C * K, 1);  // 0: dropped by K3_TOPP
  size_t seg = 0;                    // the sequence of row t (routing records)
  for (size_t t = 0; t < C; ++t) {
    while (t >= segs_[seg].r0 + segs_[seg].n) ++seg;
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
    if (Session& owner = *segs_[seg].s; owner.record_routing_) {
      RoutingRecord r;
      r.layer = layer;
      r.position = segs_[seg].pos0 + static_cast<int64_t>(t - segs_[seg].r0);
      r.experts.assign(sel.begin() + static_cast<ptrdiff_t>(t * K),
                       sel.begin() + static_cast<ptrdiff_t>((t + 1) * K));
      r.weights.assign(sel_w.begin() + static_cast<ptrdiff_t>(t * K),
                       sel_w.begin() + static_cast<ptrdiff_t>((t + 1) * K));
      owner.routing_.push_back(std::move(r));
    }
  }

  // Latent down-projection, then the union of the window's experts, each
  // fetched once and applied to all its tokens by the executor (the CPU one
  // unless the model has another, e.g. the Vulkan tier).
  float* zlat = buf.latent_in(C * LT);
  Linear(w.latent_down, x, C, zlat, idot, &impl_->work->acts, model_.dense_executor());
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

  // The combine folds outputs as they arrive (Combiner). Held rows are the
  // layer scratch's, kept by the session, so a MoE layer does not fault in a
  // fresh [rows][LT] block (docs/model.md).
  float* lat = buf.latent_out(C * LT);  // zeroed by the Combiner
  Combiner combine(C, K, LT, sel.data(), sel_w.data(), keep.data(), lat);
  if (order == PairOrder::kExpertOrder) {
    const size_t peak = combine.Plan(uni, users);
    combine.Hold(peak > 0 ? buf.held(peak * LT) : nullptr, peak);
  } else {
    combine.Hold(buf.held(C * K * LT), C * K);
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
  batch.sink = &combine;
  // Cancel and progress between experts (PollInterrupt resets the session).
  const std::function<bool(size_t)> stop = [&](size_t done) {
    return PollInterrupt(layer, static_cast<int64_t>(done), static_cast<int64_t>(uni.size()));
  };
  if (interrupt_) batch.stop = &stop;
  ex->Run(batch, store);
  if (interrupted_) {
    if (shared_async) dense->FinishMlp(buf.shared_out(C * D));  // nothing left pending
    return;
  }
  ReadAhead(layer + 1, C);  // the next MoE layer's reads overlap the rest of this one
  K3_CHECK(combine.complete());
  clk.Lap(phases_.moe_experts);
  // Then the latent norm per token.
  for (size_t t = 0; t < C; ++t) {
    float* lt = lat + t * LT;
    quant::RmsNorm(lt, w.latent_norm.data(), LT, c.rms_norm_eps, lt);
  }
  Linear(w.latent_up, lat, C, out, idot, &impl_->work->acts, model_.dense_executor());
  clk.Lap(phases_.moe_latent_up);
  if (!w.shared.gate.empty()) {
    float* sh = buf.shared_out(C * D);
    if (!shared_async || !dense->FinishMlp(sh)) MlpForward(w.shared, x, C, sh);
    for (size_t i = 0; i < C * D; ++i) out[i] += sh[i];
    clk.Lap(phases_.mlp);
  }
}

}  // namespace k3::model
