// The window memory model (PrefillWindowBytes) and the window it picks for a
// call (PlanWindow): docs/model.md "Windows".
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "k3/core/log.h"
#include "k3/core/sys.h"
#include "k3/model/model.h"
#include "k3/model/session_state.h"
#include "tiling.h"

namespace k3::model {
namespace {
// LogOnce key.
constexpr char kTinyBudgetKey = 0;
}  // namespace

// Mirrors the allocations of ForwardChunk and the layer rooms: what lives
// through the whole window, plus scratch that keeps its capacity between
// layers (the int8 activations, the CPU executor's rows, the layer scratch's
// arenas), plus the largest of the transient parts of one layer's phases
// (per-thread attention scratch, the MoE layer's routing and held rows, the
// head).
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

  // The layer scratch is kept by the session: each arena counts at its largest
  // tenant (LayerScratch's table, scratch.h).
  {
    struct {
      double gate = 0, up = 0, logits = 0, latent_in = 0, latent_out = 0, shared_out = 0,
             scores = 0, attn_out = 0, held = 0;
    } a;
    auto need = [](double& arena, double floats) { arena = std::max(arena, floats); };
    if (any_kda) {
      need(a.gate, C * P);        // q
      need(a.up, C * P);          // k
      need(a.logits, C * P);      // v
      need(a.latent_in, C * P);   // g
      need(a.latent_out, C * P);  // f_b out
      need(a.shared_out, C * hd);  // f_a out
      need(a.scores, C * Hk);     // b
      need(a.attn_out, C * P);    // o
    }
    if (any_mla) {
      need(a.gate, C * ql);               // q_a
      need(a.up, C * H * qh);             // q
      need(a.logits, C * (kvl + rope));   // c_kv
      need(a.latent_in, C * H * vh);      // g
      need(a.latent_out, C * H * vh);     // context
      const double Q = std::min(C, static_cast<double>(MlaBlockTokens(static_cast<size_t>(H)))) * H;
      const double G = std::min(
          C, static_cast<double>(s.mla_group > 0 ? static_cast<size_t>(s.mla_group)
                                                 : MlaGroupTokens(static_cast<size_t>(H), static_cast<size_t>(kvl),
                                                                  static_cast<size_t>(rope), static_cast<size_t>(vh))));
      const double rows = static_cast<double>(s.position) + C;
      need(a.shared_out, G * H * (2 * kvl + rope + vh) + T * G * kvl);  // a group's buffers
      need(a.scores, Q * rows);                                          // a block's scores
    }
    double mlp = any_dense ? inter : 0;  // gate and up, dense or shared experts
    if (any_moe) mlp = std::max(mlp, shared);
    need(a.gate, slice * mlp);
    need(a.up, slice * mlp);
    if (any_moe) {
      need(a.logits, C * E);
      need(a.latent_in, C * LT);
      need(a.latent_out, C * LT);
      if (shared > 0) need(a.shared_out, C * D);
      if (s.combine_buffer) need(a.held, C * K * LT);
    }
    for (double floats : {a.gate, a.up, a.logits, a.latent_in, a.latent_out, a.shared_out,
                          a.scores, a.attn_out, a.held}) {
      bytes += f * floats;
    }
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

}  // namespace k3::model
