#include "k3/cluster/placement.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "k3/core/error.h"
#include "k3/core/sys.h"

namespace k3::cluster {
namespace {

constexpr uint64_t kPlacementVersion = 1;  // bump when the algorithm changes

uint64_t Mix(uint64_t a, uint64_t b) {
  const uint64_t v[2] = {a, b};
  return XXH64(v, sizeof v, 0x6b33706c61636531ull);
}

}  // namespace

Placement Placement::Compute(const ModelConfig& config, std::vector<int> owners,
                             std::vector<Capacity> capacity) {
  if (owners.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "placement: no rank owns experts (a cluster of one "
                "rank needs --cluster-symmetric)");
  }
  if (capacity.size() != owners.size()) {
    throw Error(ErrorCode::kInvalidArgument, "placement: one capacity per owner rank");
  }
  Placement p;
  p.num_layers_ = config.num_hidden_layers;
  p.num_experts_ = config.num_experts;
  p.owners_ = owners;
  const size_t R = owners.size();
  const size_t E = static_cast<size_t>(config.num_experts);
  // Weights: all-zero capacities mean equal shares; otherwise a rank offering
  // nothing gets nothing unless every rank does.
  std::vector<double> w(R);
  double total = 0;
  for (size_t i = 0; i < R; ++i) {
    w[i] = static_cast<double>(capacity[i].ram_bytes) +
           kDiskSeconds * static_cast<double>(capacity[i].disk_bytes_per_s);
    total += w[i];
  }
  if (!(total > 0)) {
    std::fill(w.begin(), w.end(), 1.0);
    total = static_cast<double>(R);
  }
  p.owner_.assign(static_cast<size_t>(p.num_layers_) * E, -1);
  std::vector<std::pair<uint64_t, int64_t>> order(E);
  std::vector<int64_t> target(R), got(R);
  std::vector<double> rem(R);
  std::vector<size_t> by_rem(R);
  for (int64_t l = 0; l < p.num_layers_; ++l) {
    if (!config.is_moe(l)) continue;
    // Largest remainder; equal remainders go to the ranks after (l mod R)
    // first, so the extra experts of uneven layers rotate over the ranks.
    int64_t given = 0;
    for (size_t i = 0; i < R; ++i) {
      const double exact = static_cast<double>(E) * w[i] / total;
      target[i] = static_cast<int64_t>(std::floor(exact));
      rem[i] = exact - static_cast<double>(target[i]);
      given += target[i];
    }
    std::iota(by_rem.begin(), by_rem.end(), size_t{0});
    const size_t rot = static_cast<size_t>(l) % R;
    std::stable_sort(by_rem.begin(), by_rem.end(), [&](size_t a, size_t b) {
      if (rem[a] != rem[b]) return rem[a] > rem[b];
      return (a + R - rot) % R < (b + R - rot) % R;
    });
    for (size_t k = 0; given < static_cast<int64_t>(E); k = (k + 1) % R, ++given) {
      ++target[by_rem[k]];
    }
    // Deal the experts in hashed order: each goes to the rank furthest behind
    // its share so far (stride scheduling), so every rank's experts are spread.
    for (size_t e = 0; e < E; ++e) {
      order[e] = {Mix(static_cast<uint64_t>(l), e), static_cast<int64_t>(e)};
    }
    std::sort(order.begin(), order.end());
    std::fill(got.begin(), got.end(), 0);
    for (size_t k = 0; k < E; ++k) {
      size_t best = R;
      double best_lag = 0;
      for (size_t i = 0; i < R; ++i) {
        if (got[i] >= target[i]) continue;
        const double lag =
            static_cast<double>(target[i]) * static_cast<double>(k + 1) / static_cast<double>(E) -
            static_cast<double>(got[i]);
        if (best == R || lag > best_lag) {
          best = i;
          best_lag = lag;
        }
      }
      K3_CHECK(best < R);
      ++got[best];
      p.owner_[static_cast<size_t>(l) * E + static_cast<size_t>(order[k].second)] = owners[best];
    }
  }
  std::vector<uint64_t> id = {kPlacementVersion, static_cast<uint64_t>(p.num_layers_), E, R};
  for (int r : owners) id.push_back(static_cast<uint64_t>(r));
  for (int o : p.owner_) id.push_back(static_cast<uint64_t>(static_cast<int64_t>(o)));
  p.fingerprint_ = XXH64(id.data(), id.size() * sizeof(uint64_t), 0);
  return p;
}

int64_t Placement::CountOwned(int rank, int64_t layer) const {
  const auto* row = owner_.data() + static_cast<size_t>(layer * num_experts_);
  return std::count(row, row + num_experts_, rank);
}

int64_t Placement::CountOwned(int rank) const {
  return std::count(owner_.begin(), owner_.end(), rank);
}

std::string Placement::Describe(uint64_t slot_bytes) const {
  std::string s;
  for (int r : owners_) {
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t l = 0; l < num_layers_; ++l) {
      if (owner_[static_cast<size_t>(l * num_experts_)] < 0 && CountOwned(r, l) == 0) continue;
      const int64_t n = CountOwned(r, l);
      lo = std::min(lo, n);
      hi = std::max(hi, n);
    }
    const int64_t n = CountOwned(r);
    char line[160];
    std::snprintf(line, sizeof line, "%srank %d: %lld experts (%lld-%lld per layer), %s",
                  s.empty() ? "" : "; ", r, static_cast<long long>(n),
                  static_cast<long long>(lo == INT64_MAX ? 0 : lo), static_cast<long long>(hi),
                  FormatBytes(static_cast<uint64_t>(n) * slot_bytes).c_str());
    s += line;
  }
  return s;
}

}  // namespace k3::cluster
