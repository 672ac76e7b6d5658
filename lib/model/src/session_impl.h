// Session's private state, shared by the rooms of the forward pass
// (session.cc drives kda.cc, mla.cc, mlp.cc and moe.cc; checkpoint.cc copies it).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "k3/core/default_init.h"
#include "k3/core/sys.h"
#include "k3/model/expert_executor.h"
#include "k3/model/expert_store.h"
#include "k3/model/model.h"
#include "k3/quant/quant.h"
#include "scratch.h"

namespace k3::model {

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

  // The space a forward pass works in: scratch for Linear(), every phase's
  // buffers (scratch.h), the window's streams, the CPU expert executor (when
  // the model has no executor of its own) and the combine's hold rule.
  // Sessions made to share it (Session's constructor) hold one copy: the
  // sequences of one engine keep one set of arenas, not one each, and a step
  // over several of them (Session::Step) runs in it. Never used by two
  // forward passes at once.
  struct Work {
    quant::ActsQ8 acts;
    LayerScratch scratch;
    WindowStreams window;
    CpuExpertExecutor cpu_experts;
    // CombineMayHold's answer for the store and executor it was computed on.
    const ExpertStore* hold_store = nullptr;
    const ExpertExecutor* hold_executor = nullptr;
    bool hold = true;
    explicit Work(const ModelConfig& config) : cpu_experts(config) {}
  };
  std::shared_ptr<Work> work;

  // Checkpoints captured inside the current window: the KDA floats (layer
  // order, StateLayout) at `position`, filled as each layer's scan passes it.
  struct Capture {
    int64_t position = 0;
    DefaultInitVector<float> kda;
  };
  std::vector<Capture> captures;
  std::vector<int32_t> capture_of_token;  // [C]: index into captures after token t, or -1

  explicit Impl(std::shared_ptr<Work> w) : work(std::move(w)) {}
};

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

}  // namespace k3::model
