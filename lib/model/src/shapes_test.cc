// Nothing may assume the oracle's dimensions. The k3-tiny fixture has several
// coincidences (qk_nope == v_head, kv_lora == KDA head_dim, latent == expert
// intermediate == q_lora) that would hide an index mix-up, so this test writes
// random-weight models of other shapes (no shared experts, no rope dims, dense
// prefix of 2 or 0, one AttnRes block, top-k == all experts, widths that are
// not multiples of 64 or 32, conv kernel 1) and compares the engine with an
// independent, deliberately naive f64 implementation written from the spec:
// per-position history instead of conv windows, non-absorbed MLA (k = W_UK c,
// v = W_UV c per position), experts dequantized with ldexp.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "k3/container/safetensors.h"
#include "k3/container/snapshot.h"
#include "k3/core/file.h"
#include "k3/core/numeric.h"
#include "k3/model/model.h"

using namespace k3;
using namespace k3::model;
namespace fs = std::filesystem;

namespace {

struct Shape {
  int hidden, layers, vocab, first_dense, inter;
  int mla_heads, q_lora, kv_lora, nope, rope, vh;
  int experts, topk, moe_inter, latent, shared;
  int block, kda_heads, kda_hd, conv;
  std::vector<int> kda_layers;  // 1-based
};

std::string ConfigJson(const Shape& s) {
  std::string kl;
  for (int v : s.kda_layers) kl += (kl.empty() ? "" : ",") + std::to_string(v);
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                R"({"text_config":{"hidden_size":%d,"num_hidden_layers":%d,"vocab_size":%d,
"first_k_dense_replace":%d,"intermediate_size":%d,"num_attention_heads":%d,"q_lora_rank":%d,
"kv_lora_rank":%d,"qk_nope_head_dim":%d,"qk_rope_head_dim":%d,"v_head_dim":%d,"num_experts":%d,
"num_experts_per_token":%d,"moe_intermediate_size":%d,"routed_expert_hidden_size":%d,
"num_shared_experts":%d,"attn_res_block_size":%d,"activation_situ_beta":4.0,
"activation_situ_linear_beta":25.0,"rms_norm_eps":1e-5,"linear_attn_config":{"num_heads":%d,
"head_dim":%d,"short_conv_kernel_size":%d,"gate_lower_bound":-5.0,"kda_layers":[%s]}}})",
                s.hidden, s.layers, s.vocab, s.first_dense, s.inter, s.mla_heads, s.q_lora,
                s.kv_lora, s.nope, s.rope, s.vh, s.experts, s.topk, s.moe_inter, s.latent, s.shared,
                s.block, s.kda_heads, s.kda_hd, s.conv, kl.c_str());
  return buf;
}

// Random model writer: BF16 matrices scaled by 1/sqrt(fan_in) so activations
// stay O(1); f32 A_log/dt_bias/bias; MXFP4 experts with scales near 2^-5.
class FixtureWriter {
 public:
  explicit FixtureWriter(uint64_t seed) : rng_(seed) {}

  void Bf16(const std::string& name, std::vector<int64_t> shape, float scale, float mean = 0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = F32ToBf16(mean + scale * nd(rng_));
    Add(name, DType::kBF16, shape, v.data(), v.size() * 2);
  }
  void F32(const std::string& name, std::vector<int64_t> shape, float scale, float mean = 0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = mean + scale * nd(rng_);
    Add(name, DType::kF32, shape, v.data(), v.size() * 4);
  }
  void Mxfp4(const std::string& name, int64_t rows, int64_t cols) {
    std::uniform_int_distribution<int> code(0, 255), sc(120, 123);
    std::vector<uint8_t> packed(static_cast<size_t>(rows * cols / 2));
    for (auto& b : packed) b = static_cast<uint8_t>(code(rng_));
    std::vector<uint8_t> scales(static_cast<size_t>(rows * cols / 32));
    for (auto& b : scales) b = static_cast<uint8_t>(sc(rng_));
    Add(name + ".weight_packed", DType::kU8, {rows, cols / 2}, packed.data(), packed.size());
    Add(name + ".weight_scale", DType::kU8, {rows, cols / 32}, scales.data(), scales.size());
  }
  void Write(const std::string& path) {
    SafetensorsWriter w(path, plan_);
    for (auto& d : data_) w.Write(d);
    w.Commit();
  }

 private:
  void Add(const std::string& name, DType dt, std::vector<int64_t> shape, const void* p, size_t n) {
    plan_.push_back({name, dt, shape});
    std::vector<std::byte> b(n);
    std::memcpy(b.data(), p, n);
    data_.push_back(std::move(b));
  }
  std::mt19937_64 rng_;
  std::vector<PlannedTensor> plan_;
  std::vector<std::vector<std::byte>> data_;
};

void WriteFixture(const Shape& s, const std::string& dir, uint64_t seed) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  WriteFileAtomic(dir + "/config.json", ConfigJson(s));
  FixtureWriter w(seed);
  const int64_t D = s.hidden, P = int64_t{s.kda_heads} * s.kda_hd;
  auto inv = [](int64_t fan) { return 1.0f / std::sqrt(static_cast<float>(fan)); };
  for (int i = 0; i < s.layers; ++i) {
    const std::string pre = "model.layers." + std::to_string(i) + ".";
    bool kda = std::find(s.kda_layers.begin(), s.kda_layers.end(), i + 1) != s.kda_layers.end();
    w.Bf16(pre + "input_layernorm.weight", {D}, 0.1f, 1.0f);
    w.Bf16(pre + "post_attention_layernorm.weight", {D}, 0.1f, 1.0f);
    w.Bf16(pre + "self_attention_res_norm.weight", {D}, 0.1f, 1.0f);
    w.Bf16(pre + "self_attention_res_proj.weight", {1, D}, 0.3f);
    w.Bf16(pre + "mlp_res_norm.weight", {D}, 0.1f, 1.0f);
    w.Bf16(pre + "mlp_res_proj.weight", {1, D}, 0.3f);
    const std::string at = pre + "self_attn.";
    if (kda) {
      for (const char* n : {"q_proj", "k_proj", "v_proj", "g_proj"}) {
        w.Bf16(at + n + ".weight", {P, D}, inv(D));
      }
      w.Bf16(at + "o_proj.weight", {D, P}, inv(P));
      for (const char* n : {"q_conv1d", "k_conv1d", "v_conv1d"}) {
        w.Bf16(at + n + ".weight", {P, 1, s.conv}, 0.5f);
      }
      w.Bf16(at + "f_a_proj.weight", {s.kda_hd, D}, inv(D));
      w.Bf16(at + "f_b_proj.weight", {P, s.kda_hd}, inv(s.kda_hd));
      w.Bf16(at + "b_proj.weight", {s.kda_heads, D}, inv(D));
      w.F32(at + "dt_bias", {P}, 0.3f);
      w.F32(at + "A_log", {s.kda_heads}, 0.3f);
      w.Bf16(at + "o_norm.weight", {s.kda_hd}, 0.1f, 1.0f);
    } else {
      const int64_t qh = s.nope + s.rope;
      w.Bf16(at + "q_a_proj.weight", {s.q_lora, D}, inv(D));
      w.Bf16(at + "q_a_layernorm.weight", {s.q_lora}, 0.1f, 1.0f);
      w.Bf16(at + "q_b_proj.weight", {s.mla_heads * qh, s.q_lora}, inv(s.q_lora));
      w.Bf16(at + "kv_a_proj_with_mqa.weight", {s.kv_lora + s.rope, D}, inv(D));
      w.Bf16(at + "kv_a_layernorm.weight", {s.kv_lora}, 0.1f, 1.0f);
      w.Bf16(at + "kv_b_proj.weight", {s.mla_heads * (s.nope + s.vh), s.kv_lora}, inv(s.kv_lora));
      w.Bf16(at + "o_proj.weight", {D, s.mla_heads * s.vh}, inv(s.mla_heads * s.vh));
      w.Bf16(at + "g_proj.weight", {s.mla_heads * s.vh, D}, inv(D));
    }
    if (i < s.first_dense) {
      w.Bf16(pre + "mlp.gate_proj.weight", {s.inter, D}, inv(D));
      w.Bf16(pre + "mlp.up_proj.weight", {s.inter, D}, inv(D));
      w.Bf16(pre + "mlp.down_proj.weight", {D, s.inter}, inv(s.inter));
    } else {
      const std::string mp = pre + "block_sparse_moe.";
      w.Bf16(mp + "gate.weight", {s.experts, D}, inv(D));
      w.F32(mp + "gate.e_score_correction_bias", {s.experts}, 0.05f);
      w.Bf16(mp + "routed_expert_down_proj.weight", {s.latent, D}, inv(D));
      w.Bf16(mp + "routed_expert_up_proj.weight", {D, s.latent}, inv(s.latent));
      w.Bf16(mp + "routed_expert_norm.weight", {s.latent}, 0.1f, 1.0f);
      const int64_t sh = int64_t{s.moe_inter} * s.shared;
      if (sh > 0) {
        w.Bf16(mp + "shared_experts.gate_proj.weight", {sh, D}, inv(D));
        w.Bf16(mp + "shared_experts.up_proj.weight", {sh, D}, inv(D));
        w.Bf16(mp + "shared_experts.down_proj.weight", {D, sh}, inv(sh));
      }
      for (int e = s.experts - 1; e >= 0; --e) {  // not in id order on disk
        const std::string ep = mp + "experts." + std::to_string(e) + ".";
        w.Mxfp4(ep + "w1", s.moe_inter, s.latent);
        w.Mxfp4(ep + "w2", s.latent, s.moe_inter);
        w.Mxfp4(ep + "w3", s.moe_inter, s.latent);
      }
    }
  }
  w.Bf16("model.embed_tokens.weight", {s.vocab, D}, 1.0f);
  w.Bf16("model.norm.weight", {D}, 0.1f, 1.0f);
  w.Bf16("model.output_attn_res_norm.weight", {D}, 0.1f, 1.0f);
  w.Bf16("model.output_attn_res_proj.weight", {1, D}, 0.3f);
  w.Bf16("lm_head.weight", {s.vocab, D}, inv(D));
  w.Write(dir + "/model.safetensors");
}

// ---------------------------------------------------------------------------
// The naive f64 reference.
using Vec = std::vector<double>;

class Reference {
 public:
  Reference(const Shape& s, const Snapshot& snap) : s_(s), snap_(snap) {}

  Vec T(const std::string& name) {
    std::vector<float> f = snap_.ReadF32OrThrow(name);
    return Vec(f.begin(), f.end());
  }
  // y = W x for W [rows, cols] row-major.
  static Vec Mv(const Vec& w, const Vec& x) {
    size_t cols = x.size(), rows = w.size() / cols;
    Vec y(rows, 0.0);
    for (size_t o = 0; o < rows; ++o) {
      for (size_t i = 0; i < cols; ++i) y[o] += w[o * cols + i] * x[i];
    }
    return y;
  }
  static Vec RmsNorm(const Vec& x, const Vec& w, double eps) {
    double ms = 0;
    for (double v : x) ms += v * v;
    double r = 1.0 / std::sqrt(ms / static_cast<double>(x.size()) + eps);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
    return y;
  }
  static double Sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
  static Vec Situ(const Vec& g, const Vec& u) {
    Vec y(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      y[i] = 4.0 * std::tanh(g[i] / 4.0) * Sig(g[i]) * 25.0 * std::tanh(u[i] / 25.0);
    }
    return y;
  }
  Vec Mxfp4(const std::string& name, int64_t rows, int64_t cols) {
    static const double kLut[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    TensorRef p = snap_.FindOrThrow(name + ".weight_packed");
    TensorRef sc = snap_.FindOrThrow(name + ".weight_scale");
    std::vector<std::byte> pb(p.info->nbytes()), sb(sc.info->nbytes());
    p.file->ReadOrThrow(*p.info, pb);
    sc.file->ReadOrThrow(*sc.info, sb);
    Vec w(static_cast<size_t>(rows * cols));
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t i = 0; i < cols; ++i) {
        uint8_t byte = static_cast<uint8_t>(pb[static_cast<size_t>(o * cols / 2 + i / 2)]);
        int code = (i % 2 == 0) ? (byte & 15) : (byte >> 4);
        double v = kLut[code & 7] * ((code & 8) ? -1 : 1);
        int e = static_cast<uint8_t>(sb[static_cast<size_t>(o * cols / 32 + i / 32)]);
        w[static_cast<size_t>(o * cols + i)] = std::ldexp(v, e - 127);
      }
    }
    return w;
  }
  // Softmax mix of entries (snapshots..., p) with score weight w = norm ⊙ proj.
  Vec Mix(const std::vector<Vec>& entries, const Vec& norm, const Vec& proj) {
    Vec score;
    for (const Vec& e : entries) score.push_back(Dot(proj, RmsNorm(e, norm, 1e-5)));
    double mx = *std::max_element(score.begin(), score.end()), sum = 0;
    for (double& v : score) sum += (v = std::exp(v - mx));
    Vec out(entries[0].size(), 0.0);
    for (size_t j = 0; j < entries.size(); ++j) {
      for (size_t i = 0; i < out.size(); ++i) out[i] += score[j] / sum * entries[j][i];
    }
    return out;
  }
  static double Dot(const Vec& a, const Vec& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
  }

  // Runs all ids; returns logits [T][V] and layer outputs [T][L][D].
  void Run(const std::vector<int32_t>& ids, Vec* logits, Vec* trace) {
    const int D = s_.hidden, L = s_.layers;
    Vec emb = T("model.embed_tokens.weight");
    std::vector<std::vector<Vec>> hist_q(L), hist_k(L), hist_v(L);  // pre-conv inputs per position
    std::vector<std::vector<Vec>> state(L);                         // KDA: per head hd x hd
    std::vector<std::vector<Vec>> lat(L), rope(L);                  // MLA cache
    for (size_t t = 0; t < ids.size(); ++t) {
      Vec h(emb.begin() + ids[t] * D, emb.begin() + (ids[t] + 1) * D);
      std::vector<Vec> blocks;
      for (int i = 0; i < L; ++i) {
        const std::string pre = "model.layers." + std::to_string(i) + ".";
        Vec p = h;
        if (!blocks.empty()) {
          auto e = blocks;
          e.push_back(p);
          h = Mix(e, T(pre + "self_attention_res_norm.weight"),
                  T(pre + "self_attention_res_proj.weight"));
        }
        bool snap = i % s_.block == 0;
        if (snap) blocks.push_back(p);
        Vec x = RmsNorm(h, T(pre + "input_layernorm.weight"), 1e-5);
        bool kda =
            std::find(s_.kda_layers.begin(), s_.kda_layers.end(), i + 1) != s_.kda_layers.end();
        Vec a =
            kda ? Kda(i, x, hist_q[i], hist_k[i], hist_v[i], state[i]) : Mla(i, x, lat[i], rope[i]);
        if (snap) {
          p = a;
        } else {
          for (int d = 0; d < D; ++d) p[d] += a[d];
        }
        auto e = blocks;
        e.push_back(p);
        Vec m = Mix(e, T(pre + "mlp_res_norm.weight"), T(pre + "mlp_res_proj.weight"));
        Vec xf = RmsNorm(m, T(pre + "post_attention_layernorm.weight"), 1e-5);
        Vec f = i < s_.first_dense ? Mlp(pre + "mlp.", xf) : Moe(i, xf);
        for (int d = 0; d < D; ++d) h[d] = p[d] + f[d];
        trace->insert(trace->end(), h.begin(), h.end());
      }
      auto e = blocks;
      e.push_back(h);
      Vec y = RmsNorm(
          Mix(e, T("model.output_attn_res_norm.weight"), T("model.output_attn_res_proj.weight")),
          T("model.norm.weight"), 1e-5);
      Vec lg = Mv(T("lm_head.weight"), y);
      logits->insert(logits->end(), lg.begin(), lg.end());
    }
  }

  Vec Mlp(const std::string& pre, const Vec& x) {
    return Mv(T(pre + "down_proj.weight"),
              Situ(Mv(T(pre + "gate_proj.weight"), x), Mv(T(pre + "up_proj.weight"), x)));
  }

  Vec Kda(int i, const Vec& x, std::vector<Vec>& hq, std::vector<Vec>& hk, std::vector<Vec>& hv,
          std::vector<Vec>& S) {
    const std::string at = "model.layers." + std::to_string(i) + ".self_attn.";
    const int H = s_.kda_heads, hd = s_.kda_hd, P = H * hd, K = s_.conv;
    hq.push_back(Mv(T(at + "q_proj.weight"), x));
    hk.push_back(Mv(T(at + "k_proj.weight"), x));
    hv.push_back(Mv(T(at + "v_proj.weight"), x));
    auto conv = [&](const std::vector<Vec>& hist, const Vec& taps) {
      Vec y(P, 0.0);
      const int n = static_cast<int>(hist.size());
      for (int d = 0; d < P; ++d) {
        for (int j = 0; j < K; ++j) {
          int src = n - K + j;  // tap K-1 multiplies the current input
          if (src >= 0) y[d] += taps[d * K + j] * hist[src][d];
        }
        y[d] = y[d] * Sig(y[d]);
      }
      return y;
    };
    Vec q = conv(hq, T(at + "q_conv1d.weight"));
    Vec k = conv(hk, T(at + "k_conv1d.weight"));
    Vec v = conv(hv, T(at + "v_conv1d.weight"));
    Vec z = Mv(T(at + "f_b_proj.weight"), Mv(T(at + "f_a_proj.weight"), x));
    Vec b = Mv(T(at + "b_proj.weight"), x);
    Vec g = Mv(T(at + "g_proj.weight"), x);
    Vec dt = T(at + "dt_bias"), alog = T(at + "A_log"), onorm = T(at + "o_norm.weight");
    if (S.empty()) S.assign(H, Vec(hd * hd, 0.0));
    Vec out(P);
    for (int h = 0; h < H; ++h) {
      double sq = 0, sk = 0;
      for (int j = 0; j < hd; ++j)
        sq += q[h * hd + j] * q[h * hd + j], sk += k[h * hd + j] * k[h * hd + j];
      Vec qn(hd), kn(hd), vv(hd), alpha(hd);
      for (int j = 0; j < hd; ++j) {
        qn[j] = q[h * hd + j] / std::sqrt(sq + 1e-6) / std::sqrt(static_cast<double>(hd));
        kn[j] = k[h * hd + j] / std::sqrt(sk + 1e-6);
        vv[j] = v[h * hd + j];
        alpha[j] = std::exp(-5.0 * Sig(std::exp(alog[h]) * (z[h * hd + j] + dt[h * hd + j])));
      }
      const double beta = Sig(b[h]);
      Vec& M = S[h];
      // S = (I - beta k k^T) Diag(alpha) S + beta k v^T, o = S^T q.
      Vec decayed(hd * hd);
      for (int r = 0; r < hd; ++r)
        for (int c = 0; c < hd; ++c) decayed[r * hd + c] = alpha[r] * M[r * hd + c];
      Vec kS(hd, 0.0);
      for (int c = 0; c < hd; ++c)
        for (int r = 0; r < hd; ++r) kS[c] += kn[r] * decayed[r * hd + c];
      for (int r = 0; r < hd; ++r) {
        for (int c = 0; c < hd; ++c) {
          M[r * hd + c] = decayed[r * hd + c] - beta * kn[r] * kS[c] + beta * kn[r] * vv[c];
        }
      }
      Vec o(hd, 0.0);
      for (int c = 0; c < hd; ++c)
        for (int r = 0; r < hd; ++r) o[c] += M[r * hd + c] * qn[r];
      Vec on = RmsNorm(o, onorm, 1e-5);
      for (int c = 0; c < hd; ++c) out[h * hd + c] = on[c] * Sig(g[h * hd + c]);
    }
    return Mv(T(at + "o_proj.weight"), out);
  }

  Vec Mla(int i, const Vec& x, std::vector<Vec>& lat, std::vector<Vec>& rope) {
    const std::string at = "model.layers." + std::to_string(i) + ".self_attn.";
    const int H = s_.mla_heads, nope = s_.nope, rp = s_.rope, vh = s_.vh, kvl = s_.kv_lora;
    Vec qa = RmsNorm(Mv(T(at + "q_a_proj.weight"), x), T(at + "q_a_layernorm.weight"), 1e-6);
    Vec q = Mv(T(at + "q_b_proj.weight"), qa);
    Vec ckv = Mv(T(at + "kv_a_proj_with_mqa.weight"), x);
    lat.push_back(
        RmsNorm(Vec(ckv.begin(), ckv.begin() + kvl), T(at + "kv_a_layernorm.weight"), 1e-6));
    rope.push_back(Vec(ckv.begin() + kvl, ckv.end()));
    Vec kvb = T(at + "kv_b_proj.weight");
    Vec g = Mv(T(at + "g_proj.weight"), x);
    Vec ctx(H * vh);
    for (int h = 0; h < H; ++h) {
      // Non-absorbed: per position k = [W_UK c ; rope], v = W_UV c.
      Vec score;
      std::vector<Vec> vals;
      for (size_t j = 0; j < lat.size(); ++j) {
        double s = 0;
        for (int d = 0; d < nope; ++d) {
          double kd = 0;
          for (int c = 0; c < kvl; ++c) kd += kvb[(h * (nope + vh) + d) * kvl + c] * lat[j][c];
          s += q[h * (nope + rp) + d] * kd;
        }
        for (int d = 0; d < rp; ++d) s += q[h * (nope + rp) + nope + d] * rope[j][d];
        score.push_back(s / std::sqrt(static_cast<double>(nope + rp)));
        Vec v(vh, 0.0);
        for (int d = 0; d < vh; ++d) {
          for (int c = 0; c < kvl; ++c)
            v[d] += kvb[(h * (nope + vh) + nope + d) * kvl + c] * lat[j][c];
        }
        vals.push_back(v);
      }
      double mx = *std::max_element(score.begin(), score.end()), sum = 0;
      for (double& v : score) sum += (v = std::exp(v - mx));
      for (int d = 0; d < vh; ++d) {
        double acc = 0;
        for (size_t j = 0; j < vals.size(); ++j) acc += score[j] / sum * vals[j][d];
        ctx[h * vh + d] = acc * Sig(g[h * vh + d]);
      }
    }
    return Mv(T(at + "o_proj.weight"), ctx);
  }

  Vec Moe(int i, const Vec& x) {
    const std::string mp = "model.layers." + std::to_string(i) + ".block_sparse_moe.";
    Vec lg = Mv(T(mp + "gate.weight"), x), bias = T(mp + "gate.e_score_correction_bias");
    std::vector<int> order(s_.experts);
    for (int e = 0; e < s_.experts; ++e) order[e] = e;
    // f32 scores as the engine forms them: the routing decision itself is discrete.
    std::vector<float> sc(s_.experts);
    for (int e = 0; e < s_.experts; ++e) {
      sc[e] = 1.0f / (1.0f + std::exp(-static_cast<float>(lg[e])));
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return sc[a] + static_cast<float>(bias[a]) > sc[b] + static_cast<float>(bias[b]);
    });
    double wsum = 0;
    for (int k = 0; k < s_.topk; ++k) wsum += Sig(lg[order[k]]);
    Vec z = Mv(T(mp + "routed_expert_down_proj.weight"), x);
    Vec u(s_.latent, 0.0);
    for (int k = 0; k < s_.topk; ++k) {
      const int e = order[k];
      const std::string ep = mp + "experts." + std::to_string(e) + ".";
      Vec a = Situ(Mv(Mxfp4(ep + "w1", s_.moe_inter, s_.latent), z),
                   Mv(Mxfp4(ep + "w3", s_.moe_inter, s_.latent), z));
      Vec y = Mv(Mxfp4(ep + "w2", s_.latent, s_.moe_inter), a);
      const double w = Sig(lg[e]) / wsum;
      for (int j = 0; j < s_.latent; ++j) u[j] += w * y[j];
    }
    Vec out = Mv(T(mp + "routed_expert_up_proj.weight"),
                 RmsNorm(u, T(mp + "routed_expert_norm.weight"), 1e-5));
    if (s_.shared > 0) {
      Vec sh = Mlp(mp + "shared_experts.", x);
      for (int d = 0; d < s_.hidden; ++d) out[d] += sh[d];
    }
    return out;
  }

 private:
  const Shape& s_;
  const Snapshot& snap_;
};

double RelL2(const float* a, const double* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

void CheckShape(const Shape& s, uint64_t seed) {
  const std::string dir = (fs::temp_directory_path() /
                           ("k3_shapes_" + std::to_string(::getpid()) + "_" + std::to_string(seed)))
                              .string();
  WriteFixture(s, dir, seed);
  LoadOptions lo;
  lo.bits = lo.mla_bits = lo.head_bits = 32;
  lo.progress = false;
  auto m = Model::LoadOrThrow(dir, lo);
  std::vector<int32_t> ids;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int i = 0; i < 9; ++i)
    ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(s.vocab)));
  const size_t T = ids.size(), V = static_cast<size_t>(s.vocab), D = static_cast<size_t>(s.hidden),
               L = static_cast<size_t>(s.layers);

  Vec ref_logits, ref_trace;
  Reference ref(s, m->snapshot());
  ref.Run(ids, &ref_logits, &ref_trace);

  std::vector<float> chunked_logits;
  for (int chunk : {4, 1}) {
    RunOptions ro;
    ro.idot = false;
    ro.chunk = chunk;
    Session sess(*m, ro);
    std::vector<float> logits(T * V), trace(T * L * D);
    ForwardOutputs out;
    out.logits_all = logits.data();
    out.trace = trace.data();
    sess.Forward(ids, out);
    for (size_t l = 0; l < L; ++l) {
      std::vector<float> a;
      Vec b;
      for (size_t t = 0; t < T; ++t) {
        a.insert(a.end(), trace.begin() + (t * L + l) * D, trace.begin() + (t * L + l + 1) * D);
        b.insert(b.end(), ref_trace.begin() + (t * L + l) * D,
                 ref_trace.begin() + (t * L + l + 1) * D);
      }
      double e = RelL2(a.data(), b.data(), a.size());
      INFO("layer " << l << " rel-L2 " << e);
      CHECK(e <= 1e-4);
    }
    double el = RelL2(logits.data(), ref_logits.data(), logits.size());
    MESSAGE("shape seed " << seed << " chunk " << chunk << ": logits rel-L2 vs f64 reference "
                          << el);
    CHECK(el <= 1e-4);
    if (chunked_logits.empty()) {
      chunked_logits = logits;
    } else {
      CHECK(std::memcmp(chunked_logits.data(), logits.data(), logits.size() * 4) == 0);
    }
  }
  // The quantized and IDOT paths must at least run on these shapes
  // (widths not multiples of 64/32 fall back to int8 / f32 activations).
  LoadOptions q;
  q.progress = false;
  auto mq = Model::LoadOrThrow(dir, q);
  Session sq(*mq, RunOptions{});
  std::vector<float> last(V);
  ForwardOutputs o;
  o.logits_last = last.data();
  sq.Forward(ids, o);
  CHECK(std::isfinite(last[0]));
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("other shapes: engine == naive f64 reference (no shared experts, no rope, odd widths)") {
  Shape s{.hidden = 96,
          .layers = 5,
          .vocab = 300,
          .first_dense = 2,
          .inter = 80,
          .mla_heads = 3,
          .q_lora = 48,
          .kv_lora = 40,
          .nope = 12,
          .rope = 0,
          .vh = 20,
          .experts = 6,
          .topk = 6,
          .moe_inter = 32,
          .latent = 96,
          .shared = 0,
          .block = 2,
          .kda_heads = 3,
          .kda_hd = 20,
          .conv = 3,
          .kda_layers = {1, 3, 4}};
  CheckShape(s, 11);
}

TEST_CASE("other shapes: no dense layer, one AttnRes block, conv kernel 1, shared expert") {
  Shape s{.hidden = 64,
          .layers = 4,
          .vocab = 200,
          .first_dense = 0,
          .inter = 64,
          .mla_heads = 2,
          .q_lora = 32,
          .kv_lora = 32,
          .nope = 8,
          .rope = 6,
          .vh = 10,
          .experts = 8,
          .topk = 3,
          .moe_inter = 64,
          .latent = 32,
          .shared = 1,
          .block = 5,
          .kda_heads = 2,
          .kda_hd = 16,
          .conv = 1,
          .kda_layers = {2, 4, 9}};
  CheckShape(s, 12);
}
