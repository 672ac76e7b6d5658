// The forward pass's named scratch: the window's streams and the layer
// scratch whose arenas the phases of a layer share, kept by a Session.
#pragma once

#include <cstddef>

#include "k3/core/default_init.h"
#include "k3/core/sys.h"

namespace k3::model {

// A float buffer that grows to the largest request and keeps it, so a long
// prompt's later layers and windows reuse its pages instead of faulting in,
// zeroing and unmapping fresh ones (a window's KDA projections alone are
// 7 x C x 12288 floats at K3's shapes). Contents are never zeroed and do not
// survive a growth: every user writes all of a buffer before reading it.
// Large arenas fault in 2 MiB at a time (GrowScratch, k3/core/sys.h).
class Arena {
 public:
  float* Take(size_t n) {
    GrowScratch(buf_, n);
    return buf_.data();
  }

 private:
  DefaultInitVector<float> buf_;
};

// The window's streams (Session::ForwardChunk), live through the whole window.
struct WindowStreams {
  Arena h;       // [C][D] the AttnRes running sum
  Arena p;       // [C][D] the partial block sum
  Arena x;       // [C][D] a layer part's normalised input
  Arena attn;    // [C][D] the attention output
  Arena ffn;     // [C][D] the dense MLP's or the MoE layer's output
  Arena mix;     // [D] one token's FFN-side mix
  Arena blocks;  // [C][max_blocks][D] each token's block snapshots
};

// The layer scratch. A layer runs its attention phase (KDA or MLA) to the end
// before its FFN phase (the dense MLP, or the MoE layer, whose shared experts
// run the MLP inside it), so the two phases share arenas; the buffers of one
// phase never share one, nor do the MoE layer's with its MLP's. The phase
// views below are the only code that picks an arena, and PrefillWindowBytes
// counts each arena at its largest tenant (window_plan.cc). Tenants:
//
//   arena        KDA      MLA                 MLP    MoE
//   gate         q        q_a                 gate   -
//   up           k        q (all heads)       up     -
//   logits       v        c_kv                -      router logits
//   latent_in    g        g                   -      latent in
//   latent_out   f_b out  context             -      latent out
//   shared_out   f_a out  a group's buffers   -      shared-expert output
//   scores       b        a block's scores    -      -
//   attn_out     o        -                   -      -
//   held         -        -                   -      the combine's held rows
//
// Each accessor takes the float count its buffer needs and may grow the arena
// (which invalidates what an earlier call on the same arena returned): a
// phase carves each buffer once, where it first needs it.
class LayerScratch {
 public:
  // KDA (§5.3, kda.cc): rows of [C] tokens.
  struct Kda {
    LayerScratch& s;
    float* q(size_t n) { return s.gate_.Take(n); }   // [C][P]
    float* k(size_t n) { return s.up_.Take(n); }     // [C][P]
    float* v(size_t n) { return s.logits_.Take(n); }  // [C][P]
    float* g(size_t n) { return s.latent_in_.Take(n); }  // [C][P] output gate
    float* f(size_t n) { return s.latent_out_.Take(n); }  // [C][P] f_b out: the decay's input
    float* f_a(size_t n) { return s.shared_out_.Take(n); }  // [C][hd]
    float* b(size_t n) { return s.scores_.Take(n); }  // [C][H] raw beta
    float* o(size_t n) { return s.attn_out_.Take(n); }  // [C][P] gated scan output
  };
  // Gated MLA (§5.4, mla.cc).
  struct Mla {
    LayerScratch& s;
    float* q_a(size_t n) { return s.gate_.Take(n); }        // [C][q_lora]
    float* q(size_t n) { return s.up_.Take(n); }            // [C][H][qk_head]
    float* c_kv(size_t n) { return s.logits_.Take(n); }     // [C][kv_lora + rope]
    float* g(size_t n) { return s.latent_in_.Take(n); }     // [C][H][v_head]
    float* context(size_t n) { return s.latent_out_.Take(n); }  // [C][H][v_head]
    // A token group's absorbed and rope queries, latent sums and outputs, and
    // per thread one head's latent sums gathered.
    float* group(size_t n) { return s.shared_out_.Take(n); }
    float* scores(size_t n) { return s.scores_.Take(n); }  // a block's [Q][rows]
  };
  // Dense MLP and the shared experts (mlp.cc): one slice of tokens.
  struct Mlp {
    LayerScratch& s;
    float* gate(size_t n) { return s.gate_.Take(n); }  // [S][inter]
    float* up(size_t n) { return s.up_.Take(n); }      // [S][inter]
  };
  // LatentMoE (§5.5, moe.cc); its shared experts take Mlp's buffers.
  struct Moe {
    LayerScratch& s;
    float* logits(size_t n) { return s.logits_.Take(n); }         // [C][E]
    float* latent_in(size_t n) { return s.latent_in_.Take(n); }   // [C][LT]
    float* latent_out(size_t n) { return s.latent_out_.Take(n); }  // [C][LT]
    float* shared_out(size_t n) { return s.shared_out_.Take(n); }  // [C][D]
    // Outputs the combine holds until their turn in the sum.
    float* held(size_t n) { return s.held_.Take(n); }
  };

  Kda kda() { return {*this}; }
  Mla mla() { return {*this}; }
  Mlp mlp() { return {*this}; }
  Moe moe() { return {*this}; }

 private:
  Arena gate_, up_, logits_, latent_in_, latent_out_, shared_out_, scores_, attn_out_, held_;
};

}  // namespace k3::model
