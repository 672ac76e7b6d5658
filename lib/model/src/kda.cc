// KDA, the gated delta-rule linear attention (spec §5.3): projections, the
// causal short conv, the per-head scan, and checkpoint captures inside a window.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "k3/model/session_state.h"
#include "k3/quant/ops.h"
#include "linear.h"
#include "session_impl.h"

namespace k3::model {
namespace {
// The q/k L2 norm: eps inside the sqrt, added to the sum of squares.
constexpr float kL2NormEps = 1e-6f;
}  // namespace

// x: [C, D] normalised input; out: [C, D].
void Session::KdaForward(int64_t layer, const float* x, size_t C, float* out) {
  const ModelConfig& c = model_.config();
  const KdaWeights& w = model_.weights().layers[static_cast<size_t>(layer)].kda;
  const bool idot = options_.idot;
  const size_t H = static_cast<size_t>(c.kda_num_heads);
  const size_t hd = static_cast<size_t>(c.kda_head_dim);
  const size_t P = H * hd;
  const size_t K = static_cast<size_t>(c.kda_conv_kernel);
  const float eps = c.rms_norm_eps;
  const float lb = c.kda_gate_lower_bound;

  LayerScratch::Kda buf = impl_->work->scratch.kda();
  float *q = buf.q(C * P), *k = buf.k(C * P), *v = buf.v(C * P), *g = buf.g(C * P);
  float *z = buf.f(C * P), *t1 = buf.f_a(C * hd), *braw = buf.b(C * H);
  PhaseClock clk;
  Linear(w.q, x, C, q, idot, &impl_->work->acts, model_.dense_executor());
  Linear(w.k, x, C, k, idot, &impl_->work->acts, model_.dense_executor());
  Linear(w.v, x, C, v, idot, &impl_->work->acts, model_.dense_executor());
  Linear(w.g, x, C, g, idot, &impl_->work->acts, model_.dense_executor());
  quant::MatMul(w.f_a.view(), x, C, t1);
  quant::MatMul(w.f_b.view(), t1, C, z);
  quant::MatMul(w.b.view(), x, C, braw);
  clk.Lap(phases_.attn_proj);

  // Checkpoints inside the window (Session::Forward): after token t whose
  // capture_of_token is set, this layer's state is copied into that capture,
  // at offset kda_off of its floats (S, then the q, k, v conv windows).
  const std::vector<int32_t>& cap_of = impl_->capture_of_token;
  const bool capturing = !impl_->captures.empty() && cap_of.size() == C && segs_.size() == 1;
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
  // (a walk channel by channel would stride a whole token row, 48 KB at K3's
  // P, per step). Output t of channel d is sum_j taps[d][j] * in[t-K+1+j], j
  // ascending from 0: the bits of a per-channel sliding window. In place, last token first:
  // token t reads raw inputs t-K+1..t, which no output has replaced yet;
  // positions before the window come from `win`, which then takes the last K
  // raw inputs. Threads only pay off with enough work.
  std::vector<float> taps_t(K * P), next_win(P * K), sums(P);
  // One sequence's rows [r0, r0 + C) of the pass.
  auto conv = [&](float* y, size_t C, size_t r0, std::vector<float>& win,
                  const std::vector<float>& taps, size_t part) {
    const bool conv_par = P * C * K >= (1u << 16);
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
        return src >= 0 ? y[static_cast<size_t>(src) * P + d]
                        : win[d * K + static_cast<size_t>(static_cast<ptrdiff_t>(K) + src)];
      };
      for (size_t d = d0; d < d1; ++d) {
        for (size_t j = 0; j < K; ++j)
          next_win[d * K + j] = in(static_cast<ptrdiff_t>(C + j) - static_cast<ptrdiff_t>(K), d);
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
        if (float* cap = capture_at(r0 + t)) {
          float* cw = cap + H * hd * hd + part * P * K;
          for (size_t d = d0; d < d1; ++d) {
            for (size_t j = 0; j < K; ++j) cw[d * K + j] = in(first + static_cast<ptrdiff_t>(j), d);
          }
        }
        float* out = y + t * P;
        for (size_t d = d0; d < d1; ++d) out[d] = quant::Silu(acc[d]);
      }
      // Only this thread's channels read their windows: no barrier needed.
      for (size_t d = d0; d < d1; ++d)
        std::memcpy(win.data() + d * K, next_win.data() + d * K, K * sizeof(float));
    }
  };
  float* o = buf.o(C * P);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Per sequence of the pass (Forward: one; Step: one per slice), over its state.
  for (const Seg& sg : segs_) {
    Impl::KdaState& st = sg.s->impl_->kda[static_cast<size_t>(layer)];
    const size_t r0 = sg.r0, r1 = sg.r0 + sg.n;
    conv(q + r0 * P, sg.n, r0, st.wq, w.q_conv, 0);
    conv(k + r0 * P, sg.n, r0, st.wk, w.k_conv, 1);
    conv(v + r0 * P, sg.n, r0, st.wv, w.v_conv, 2);
    // Heads are independent: each owns its state and advances token by token.
    const bool head_par = H > 1 && H * hd * hd * sg.n >= (1u << 16);
#pragma omp parallel for schedule(static) if (head_par)
    for (size_t hh = 0; hh < H; ++hh) {
      std::vector<float> qn(hd), kn(hd), alpha(hd), ks(hd), vt(hd), oh(hd);
      float* S = st.s.data() + hh * hd * hd;
      const float a_h = w.a[hh];
      for (size_t t = r0; t < r1; ++t) {
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
  }
  clk.Lap(phases_.kda_scan);
  Linear(w.o, o, C, out, idot, &impl_->work->acts, model_.dense_executor());
  clk.Lap(phases_.attn_proj);
}

}  // namespace k3::model
