// Sampling (spec §5.8): greedy argmax, or a seeded draw from the nucleus.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "k3/model/model.h"

namespace k3::model {

Sampler::Sampler(float temperature, float top_p, uint64_t seed)
    : temperature_(temperature), top_p_(top_p), rng_(seed) {}

int32_t Sampler::Argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (!(temperature_ > 0.0f) || logits.empty()) return Argmax(logits);
  const float mx = logits[static_cast<size_t>(Argmax(logits))];
  std::vector<std::pair<float, int32_t>> pr(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float pi = std::exp((logits[i] - mx) / temperature_);
    pr[i] = {pi, static_cast<int32_t>(i)};
    total += pi;
  }
  // Descending probability, ties by id so the draw is reproducible.
  std::sort(pr.begin(), pr.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const double cut = (top_p_ > 0.0f && top_p_ < 1.0f ? top_p_ : 1.0) * total;
  size_t kept = 0;
  double kept_mass = 0;
  while (kept < pr.size()) {
    kept_mass += pr[kept].first;
    ++kept;
    if (kept_mass >= cut) break;
  }
  std::uniform_real_distribution<double> dist(0.0, 1.0);
  const double r = dist(rng_) * kept_mass;
  double run = 0;
  for (size_t i = 0; i < kept; ++i) {
    run += pr[i].first;
    if (run >= r) return pr[i].second;
  }
  return pr[kept - 1].second;
}

}  // namespace k3::model
