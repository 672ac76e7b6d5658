// k3-bench mla: one block of MLA's absorbed attention at K3's shapes
// (docs/model.md §4): all heads of a few tokens (5 x 96 query rows) against N cached rows
// of the latent (512) and rope (64) caches. Per part, the time and its share
// of the FMA roof measured in the same run (quant::RoofLoop on the same
// threads): the scores (quant::AttnScores, alternating with the f32 MatMul pair
// and the add-and-scale pass they replaced: the same-run baseline), the softmax,
// and the weighted latent sum (quant::AddRows over the rows before the block).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "bench_util.h"
#include "command.h"
#include "k3/core/sys.h"
#include "k3/quant/isa.h"
#include "k3/quant/ops.h"
#include "k3/quant/quant.h"
#include "k3/quant/roof.h"

namespace k3::bench {
namespace {

struct MlaArgs {
  std::vector<int> rows = {1024, 4096, 8192};
  std::vector<int> threads = {1, 2};
  int heads = 96, tokens = 5, kvl = 512, rope = 64, reps = 15;
};

// FMA roof on `threads` threads: multiply-adds per second of the wall clock, in G (about 50 ms).
double FmaRoof(int threads) {
  uint64_t macs = 0;
  const double t0 = NowSeconds();
#pragma omp parallel num_threads(threads) reduction(+ : macs)
  {
    const double c0 = NowSeconds();
    do {
      macs += quant::RoofLoop(quant::RoofOp::kFma, 1 << 13);
    } while (NowSeconds() - c0 < 0.05);
  }
  return double(macs) / (NowSeconds() - t0) / 1e9;
}

void RunMla(const MlaArgs& a) {
  const size_t H = size_t(a.heads), kvl = size_t(a.kvl), rope = size_t(a.rope);
  const size_t Q = size_t(a.tokens) * H;
  const float scale = 1.0f / std::sqrt(float(128 + rope));
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t max_rows = size_t(*std::max_element(a.rows.begin(), a.rows.end()));
  std::vector<float> latent(max_rows * kvl), rcache(max_rows * rope), qabs(Q * kvl), qr(Q * rope);
  for (float& f : latent) f = nd(g);
  for (float& f : rcache) f = nd(g);
  for (float& f : qabs) f = 0.05f * nd(g);
  for (float& f : qr) f = 0.05f * nd(g);
  std::vector<float> s1(Q * max_rows), s2(Q * max_rows), clat(Q * kvl);
  const int saved = omp_get_max_threads();
  for (int threads : a.threads) {
    omp_set_num_threads(threads);
    for (int nr : a.rows) {
      const size_t nb = size_t(nr);
      quant::WeightView lat;
      lat.format = quant::WeightFormat::kF32;
      lat.rows = nb;
      lat.cols = kvl;
      lat.data = latent.data();
      quant::WeightView rv = lat;
      rv.cols = rope;
      rv.data = rcache.data();
      std::vector<double> t_new, t_old, t_soft, t_sum, roof;
      for (int r = 0; r < a.reps; ++r) {
        roof.push_back(FmaRoof(threads));
        double t0 = NowSeconds();
        quant::AttnScores(qabs.data(), latent.data(), kvl, qr.data(), rcache.data(), rope, Q, nb, scale, s1.data());
        double t1 = NowSeconds();
        t_new.push_back(t1 - t0);
        // The baseline: the MatMul pair and the pass that added and scaled.
        t0 = NowSeconds();
        quant::MatMul(lat, qabs.data(), Q, s2.data());
        if (rope > 0) quant::MatMul(rv, qr.data(), Q, s1.data());
#pragma omp parallel for schedule(static)
        for (size_t q = 0; q < Q; ++q) {
          for (size_t j = 0; j < nb; ++j) s2[q * nb + j] = (s2[q * nb + j] + s1[q * nb + j]) * scale;
        }
        t1 = NowSeconds();
        t_old.push_back(t1 - t0);
        const size_t per = (Q + size_t(threads) - 1) / size_t(threads);
        double soft = 0, sum = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(max : soft, sum)
        for (size_t q0 = 0; q0 < Q; q0 += per) {
          const size_t q1 = std::min(Q, q0 + per);
          const double a0 = NowSeconds();
          for (size_t q = q0; q < q1; ++q) quant::Softmax(s2.data() + q * nb, nb);
          const double a1 = NowSeconds();
          std::fill(clat.begin() + q0 * kvl, clat.begin() + q1 * kvl, 0.0f);
          quant::AddRows(lat, 0, nb, s2.data() + q0 * nb, nb, q1 - q0, clat.data() + q0 * kvl, kvl);
          soft = a1 - a0;
          sum = NowSeconds() - a1;
        }
        t_soft.push_back(soft);
        t_sum.push_back(sum);
      }
      const double roof_g = Median(roof);
      const double score_macs = double(Q) * double(nb) * double(kvl + rope);
      const double sum_macs = double(Q) * double(nb) * double(kvl);
      const Summary sn = Summarise(t_new), so = Summarise(t_old), ss = Summarise(t_soft), sa = Summarise(t_sum);
      JsonWriter j;
      j.BeginObject();
      j.Field("bench", "mla");
      j.Field("cpu", CpuModel());
      j.Field("git", SourceRevision());
      j.Field("isa", quant::IsaName(quant::ActiveIsa()));
      j.Field("threads", int64_t{threads});
      j.Field("query_rows", int64_t(Q));
      j.Field("cached_rows", int64_t(nb));
      j.Field("fma_roof_gmacs", roof_g);
      PutSummary(j, "scores_ms", Summary{sn.median * 1e3, sn.min * 1e3, sn.max * 1e3});
      PutSummary(j, "scores_matmul_pair_ms", Summary{so.median * 1e3, so.min * 1e3, so.max * 1e3});
      PutSummary(j, "softmax_ms", Summary{ss.median * 1e3, ss.min * 1e3, ss.max * 1e3});
      PutSummary(j, "latent_sum_ms", Summary{sa.median * 1e3, sa.min * 1e3, sa.max * 1e3});
      j.Field("scores_roof_share", score_macs / sn.median / 1e9 / roof_g);
      j.Field("scores_matmul_pair_roof_share", score_macs / so.median / 1e9 / roof_g);
      j.Field("scores_speedup", so.median / sn.median);
      j.Field("latent_sum_roof_share", sum_macs / sa.median / 1e9 / roof_g);
      j.EndObject();
      std::printf("%s\n", j.str().c_str());
      std::fflush(stdout);
    }
  }
  omp_set_num_threads(saved);
}

void SetupMlaBench(CLI::App& root) {
  auto args = std::make_shared<MlaArgs>();
  CLI::App* cmd = root.add_subcommand(
      "mla", "MLA attention block (5 x 96 query rows, K3's latent 512 + rope 64) vs N cached rows: scores, softmax, latent sum vs the FMA roof");
  cmd->add_option("--rows", args->rows, "cached rows (positions) the block attends to")->delimiter(',');
  cmd->add_option("--threads", args->threads, "OpenMP thread counts")->delimiter(',');
  cmd->add_option("--heads", args->heads, "query heads")->check(CLI::Range(1, 1024));
  cmd->add_option("--tokens", args->tokens, "tokens per block (query rows = tokens x heads)")->check(CLI::Range(1, 64));
  cmd->add_option("--reps", args->reps, "timed repetitions (median and range reported)")->check(CLI::Range(1, 1000));
  cmd->callback([args] { RunMla(*args); });
}

K3_REGISTER_BENCH(SetupMlaBench);

}  // namespace
}  // namespace k3::bench
