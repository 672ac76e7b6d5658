// Prefill windows: every window size gives the bits of
// token-at-a-time; the combine that folds expert outputs as they arrive gives
// the bits of the [C*K][LT] buffer whatever order the executor delivers
// them in; PrefillWindowBytes matches what a window really allocates (counted
// by this binary's operator new) and PlanWindow picks the fewest windows
// that fit.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "k3/model/model.h"
#include "k3/model/session_state.h"
#include "k3_test_support.h"
#include "test_models.h"

// ---------------------------------------------------------------------------
// A counting allocator for the whole binary: live bytes and their peak. Each
// block carries its size in a 16-byte header (the alignment operator new
// promises).
namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void* CountedAlloc(size_t n) {
  void* p = std::malloc(n + 16);
  if (p == nullptr) return nullptr;
  *static_cast<size_t*>(p) = n;
  const int64_t now = g_live.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return static_cast<char*>(p) + 16;
}
void CountedFree(void* q) noexcept {
  if (q == nullptr) return;
  void* p = static_cast<char*>(q) - 16;
  g_live.fetch_sub(static_cast<int64_t>(*static_cast<size_t*>(p)));
  std::free(p);
}
}  // namespace

void* operator new(size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept { return CountedAlloc(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return CountedAlloc(n); }
void operator delete(void* p) noexcept { CountedFree(p); }
void operator delete[](void* p) noexcept { CountedFree(p); }
void operator delete(void* p, size_t) noexcept { CountedFree(p); }
void operator delete[](void* p, size_t) noexcept { CountedFree(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { CountedFree(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { CountedFree(p); }

using namespace k3;
using namespace k3::model;
namespace fs = std::filesystem;

namespace {

const std::string& kTiny = test::kTinyModel;
using test::RandomIds;
using test::ScramblingExecutor;
std::string ShuffledFixture() { return test::ShuffledTinyFixture(); }
LoadOptions Load(int bits) { return test::TinyLoad(bits); }

struct Outputs {
  std::vector<float> logits, final_hidden, last;
  int64_t window = 0, windows = 0;
};

Outputs Run(Model& m, RunOptions ro, const std::vector<int32_t>& ids) {
  const size_t V = static_cast<size_t>(m.config().vocab_size);
  const size_t D = static_cast<size_t>(m.config().hidden_size);
  Outputs o;
  o.logits.resize(ids.size() * V);
  o.final_hidden.resize(ids.size() * D);
  o.last.resize(V);
  Session s(m, ro, 0);
  ForwardOutputs out;
  out.logits_all = o.logits.data();
  out.final_hidden = o.final_hidden.data();
  out.logits_last = o.last.data();
  s.Forward(ids, out);
  o.window = s.last_window();
  o.windows = s.last_windows();
  return o;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("windows 1, 7, 32, 600 and the whole prompt give token-at-a-time's bits") {
  omp_set_num_threads(1);
  struct Variant {
    const char* what;
    std::string dir;
    int bits;
    bool idot;
    float topp;
  };
  const std::vector<Variant> variants = {
      {"oracle tiny, f32 weights and activations", kTiny, 32, false, 0.0f},
      {"oracle tiny, int4 + IDOT, K3_TOPP 0.7", kTiny, 4, true, 0.7f},
      {"fixture tiny (experts shuffled on disk), int8 + IDOT", ShuffledFixture(), 8, true, 0.0f},
  };
  for (const Variant& v : variants) {
    CAPTURE(v.what);
    auto m = Model::LoadOrThrow(v.dir, Load(v.bits));
    const std::vector<int32_t> ids = RandomIds(650, m->config().vocab_size, 11);
    RunOptions ro;
    ro.idot = v.idot;
    ro.topp = v.topp;
    ro.chunk = 1;
    const Outputs ref = Run(*m, ro, ids);
    CHECK(ref.windows == 650);
    for (int w : {7, 32, 600, 0}) {
      CAPTURE(w);
      ro.chunk = w;
      ro.prefill_budget_bytes = 1e12;  // auto (0): the whole prompt in one window
      const Outputs got = Run(*m, ro, ids);
      CHECK(got.window == (w == 0 ? 650 : w));
      CHECK(SameBits(got.logits, ref.logits));
      CHECK(SameBits(got.final_hidden, ref.final_hidden));
      CHECK(SameBits(got.last, ref.last));
    }
    // MLA's token groups (absorbed queries and outputs per head over a
    // group): groups of 5 and 70 tokens cut its blocks short and split the window.
    for (int g : {5, 70}) {
      CAPTURE(g);
      ro.chunk = 0;
      ro.mla_group = g;
      const Outputs got = Run(*m, ro, ids);
      CHECK(got.window == 650);
      CHECK(SameBits(got.logits, ref.logits));
      CHECK(SameBits(got.final_hidden, ref.final_hidden));
    }
    ro.mla_group = 0;
    // Automatic windows under a budget that holds ~100 tokens: several equal windows.
    WindowShape shape;
    shape.tokens = 100;
    shape.threads = 1;
    shape.idot = v.idot;
    shape.head_all = true;
    ro.chunk = 0;
    ro.prefill_budget_bytes = static_cast<double>(PrefillWindowBytes(m->config(), shape)) +
                              1e6;  // + the MLA rows of the call
    const Outputs split = Run(*m, ro, ids);
    CHECK(split.windows >= 3);
    CHECK(split.windows <= 8);
    CHECK(SameBits(split.logits, ref.logits));
    CHECK(SameBits(split.final_hidden, ref.final_hidden));
  }
}

TEST_CASE("the combine gives the buffer's bits whatever order the executor delivers pairs in") {
  omp_set_num_threads(1);
  for (const std::string& dir : {kTiny, ShuffledFixture()}) {
    CAPTURE(dir);
    auto m = Model::LoadOrThrow(dir, Load(8));
    const std::vector<int32_t> ids = RandomIds(90, m->config().vocab_size, 5);
    RunOptions ro;
    ro.chunk = 45;
    const Outputs cpu = Run(*m, ro, ids);  // the CPU executor: expert by expert
    m->SetExpertExecutor(std::make_unique<ScramblingExecutor>(m->config()));
    const Outputs got = Run(*m, ro, ids);
    CHECK(SameBits(got.logits, cpu.logits));
    CHECK(SameBits(got.final_hidden, cpu.final_hidden));
    m->SetExpertExecutor(nullptr);
  }
}

TEST_CASE("PrefillWindowBytes matches the bytes a window allocates") {
  omp_set_num_threads(1);
  for (const std::string& dir : {kTiny, ShuffledFixture()}) {
    for (bool idot : {false, true}) {
      for (int64_t C : {int64_t{16}, int64_t{200}, int64_t{600}}) {
        // MLA groups of 9 tokens once (C = 200): the group buffers counted at G, not C.
        for (int g : C == 200 ? std::vector<int>{0, 9} : std::vector<int>{0}) {
          CAPTURE(dir);
          CAPTURE(g);
          CAPTURE(idot);
          CAPTURE(C);
          auto m = Model::LoadOrThrow(dir, Load(idot ? 4 : 32));
          const ModelConfig& c = m->config();
          const std::vector<int32_t> ids = RandomIds(static_cast<size_t>(C), c.vocab_size, 3);
          RunOptions ro;
          ro.idot = idot;
          ro.chunk = static_cast<int>(C);
          ro.mla_group = g;
          std::vector<float> last(static_cast<size_t>(c.vocab_size));
          ForwardOutputs out;
          out.logits_last = last.data();
          {
            Session warm(*m, ro, C);  // fills the expert cache (not the window's memory)
            warm.Forward(ids, out);
          }
          Session s(*m, ro, C);  // the MLA rows are allocated here, before the window
          const bool hold = [&] {
            // Shuffled disk order holds outputs; the oracle's id-ordered experts do not.
            for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l) {
              for (int64_t e = 1; e < c.num_experts; ++e) {
                if (!(m->experts().DiskOrder(l, e - 1) < m->experts().DiskOrder(l, e))) return true;
              }
            }
            return false;
          }();
          const int64_t base = g_live.load();
          g_peak.store(base);
          s.Forward(ids, out);
          const int64_t used = g_peak.load() - base;
          WindowShape shape;
          shape.tokens = C;
          shape.threads = 1;
          shape.idot = idot;
          shape.combine_buffer = hold;
          shape.mla_group = g;
          const int64_t est = static_cast<int64_t>(PrefillWindowBytes(c, shape));
          INFO("measured " << used << " B, estimated " << est << " B");
          // Never under (a window must not outgrow its budget); over by little.
          CHECK(used <= est);
          CHECK(static_cast<double>(est) <= 1.15 * static_cast<double>(used) + 16384.0);
        }
      }
    }
  }
}

TEST_CASE("PlanWindow: one window when the call fits, else the fewest that fit") {
  auto m = Model::LoadOrThrow(kTiny, Load(32));
  const ModelConfig& c = m->config();
  WindowShape shape;
  shape.threads = 2;
  shape.tokens = 5000;
  const double all = static_cast<double>(PrefillWindowBytes(c, shape));
  CHECK(PlanWindow(c, 5000, all, shape) == 5000);
  shape.tokens = 700;
  const double budget = static_cast<double>(PrefillWindowBytes(c, shape));
  const int64_t w = PlanWindow(c, 5000, budget, shape);
  const int64_t n = (5000 + w - 1) / w;
  CHECK(n == 8);  // ceil(5000 / 700): 7 windows of 700 cannot hold 5000
  shape.tokens = (5000 + n - 1) / n;
  CHECK(static_cast<double>(PrefillWindowBytes(c, shape)) <= budget);
  shape.tokens = (5000 + n - 2) / (n - 1);  // one window fewer does not fit
  CHECK(static_cast<double>(PrefillWindowBytes(c, shape)) > budget);
  // Memory grows with the window: more tokens, more bytes; checkpoints inside cost their state.
  WindowShape a = shape, b = shape;
  a.tokens = 100;
  b.tokens = 101;
  CHECK(PrefillWindowBytes(c, a) < PrefillWindowBytes(c, b));
  b = a;
  b.captures = 2;
  CHECK(PrefillWindowBytes(c, b) - PrefillWindowBytes(c, a) == 2 * StateLayout::For(c).kda_bytes());
  // Nothing fits: one token at a time.
  CHECK(PlanWindow(c, 5000, 10.0, shape) == 1);
}
