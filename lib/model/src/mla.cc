// Gated MLA, NoPE, in the absorbed form over the latent cache (spec §5.4):
// projections, the cache append, and attention by query blocks and token groups.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "k3/quant/ops.h"
#include "linear.h"
#include "session_impl.h"
#include "tiling.h"

namespace k3::model {
namespace {
// The q_a/kv_a LoRA norms use the class default of Moonshot's code, not
// rms_norm_eps: the oracle wins over the spec here (docs/model.md).
constexpr float kLoraNormEps = 1e-6f;

// MLA's dimensions as sizes: heads, the nope / rope / whole query head, the
// value head, the KV and query LoRA ranks.
struct MlaDims {
  size_t H, nope, rope, qh, vh, kvl, ql;
  static MlaDims Of(const ModelConfig& c) {
    const auto z = [](int64_t v) { return static_cast<size_t>(v); };
    return {z(c.num_attention_heads), z(c.qk_nope_head_dim),
            z(c.qk_rope_head_dim),    z(c.qk_nope_head_dim + c.qk_rope_head_dim),
            z(c.v_head_dim),          z(c.kv_lora_rank),
            z(c.q_lora_rank)};
  }
};
}  // namespace

// x: [C, D] normalised input; out: [C, D]. Each sequence's rows (segs_) join
// its own cache at its position and attend to it.
void Session::MlaForward(int64_t layer, const float* x, size_t C, float* out) {
  const ModelConfig& c = model_.config();
  const MlaWeights& w = model_.weights().layers[static_cast<size_t>(layer)].mla;
  const bool idot = options_.idot;
  const auto [H, nope, rope, qh, vh, kvl, ql] = MlaDims::Of(c);

  LayerScratch::Mla buf = impl_->work->scratch.mla();
  float *qa = buf.q_a(C * ql), *qv = buf.q(C * H * qh), *ckv = buf.c_kv(C * (kvl + rope)),
        *gv = buf.g(C * H * vh);
  PhaseClock clk;
  Linear(w.q_a, x, C, qa, idot, &impl_->work->acts, model_.dense_executor());
  for (size_t t = 0; t < C; ++t) {
    quant::RmsNorm(qa + t * ql, w.q_a_norm.data(), ql, kLoraNormEps, qa + t * ql);
  }
  Linear(w.q_b, qa, C, qv, idot, &impl_->work->acts, model_.dense_executor());
  Linear(w.kv_a, x, C, ckv, idot, &impl_->work->acts, model_.dense_executor());
  // Append each sequence's rows to its cache first; its token t then attends
  // to rows 0..pos0+t (causal).
  for (const Seg& sg : segs_) {
    Impl::MlaCache& mc = sg.s->impl_->mla[static_cast<size_t>(layer)];
    for (size_t t = 0; t < sg.n; ++t) {
      const size_t row = static_cast<size_t>(sg.pos0) + t;
      const float* src = ckv + (sg.r0 + t) * (kvl + rope);
      quant::RmsNorm(src, w.kv_a_norm.data(), kvl, kLoraNormEps, mc.latent.data() + row * kvl);
      if (rope) std::memcpy(mc.rope.data() + row * rope, src + kvl, rope * sizeof(float));
    }
  }
  Linear(w.g, x, C, gv, idot, &impl_->work->acts, model_.dense_executor());
  clk.Lap(phases_.attn_proj);

  float* ctx = buf.context(C * H * vh);
  for (const Seg& sg : segs_) {
    MlaAttend(layer, *sg.s->impl_, qv + sg.r0 * H * (nope + rope), gv + sg.r0 * H * vh, sg.n,
              sg.pos0, ctx + sg.r0 * H * vh);
  }
  clk.Lap(phases_.mla_attn);
  Linear(w.o, ctx, C, out, idot, &impl_->work->acts, model_.dense_executor());
  clk.Lap(phases_.attn_proj);
}

// One sequence's attention: its C rows' queries `qv` [C][H][qk_head] and
// gates `gv` [C][H][v_head] against its cache `st` (rows 0..pos0+C-1 filled),
// into `ctx` [C][H][v_head].
void Session::MlaAttend(int64_t layer, Impl& st, const float* qv, const float* gv, size_t C,
                        int64_t pos0, float* ctx) {
  const ModelConfig& c = model_.config();
  const MlaWeights& w = model_.weights().layers[static_cast<size_t>(layer)].mla;
  Impl::MlaCache& mc = st.mla[static_cast<size_t>(layer)];
  const auto [H, nope, rope, qh, vh, kvl, ql] = MlaDims::Of(c);
  (void)ql;
  LayerScratch::Mla buf = impl_->work->scratch.mla();
  const float scale = 1.0f / std::sqrt(static_cast<float>(qh));
  const quant::WeightView& kvb = w.kv_b.view();
  // A block of queries' scores against every cached row (latent and rope
  // parts) is one AttnScores call (attention over a long window runs on the
  // kernels). The cache is the same for every head (MLA's absorbed
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
  float* qabs = buf.group(G * H * (2 * kvl + rope + vh) + threads * G * kvl);
  float* clat = qabs + G * H * kvl;
  float* qr = clat + G * H * kvl;
  float* yv = qr + G * H * rope;
  float* gather = yv + G * H * vh;
  float* s1 = buf.scores(Q_max * rows_max);
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
        std::memcpy(qr + (t * H + hh) * rope, qv + (g0 + t) * H * qh + hh * qh + nope,
                    rope * sizeof(float));
      }
    }
    for (size_t t0 = g0; t0 < g0 + gn; t0 += tb_max) {
      const size_t tb = std::min(tb_max, g0 + gn - t0);
      const size_t Q = tb * H;
      const size_t nb = static_cast<size_t>(pos0) + t0 + tb;  // rows the block's last token sees
      const size_t seen_by_all = static_cast<size_t>(pos0) + t0;
      lat.rows = nb;
      const bool par = Q * nb * kvl >= (1u << 16);
      quant::AttnScores(qabs + (t0 - g0) * H * kvl, mc.latent.data(), kvl,
                        qr + (t0 - g0) * H * rope, mc.rope.data(), rope, Q, nb, scale, s1);
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
      for (size_t t = 0; t < gn; ++t)
        std::memcpy(x + t * kvl, clat + (t * H + hh) * kvl, kvl * sizeof(float));
      float* y = yv + hh * G * vh;
      quant::MatMul(quant::RowRange(kvb, hh * (nope + vh) + nope, vh), x, gn, y);
      for (size_t t = 0; t < gn; ++t) {
        float* ct = ctx + (g0 + t) * H * vh + hh * vh;
        const float* gt = gv + (g0 + t) * H * vh + hh * vh;
        for (size_t d = 0; d < vh; ++d) ct[d] = y[t * vh + d] * quant::Sigmoid(gt[d]);
      }
    }
  }
}

}  // namespace k3::model
