// Loading a Model: the snapshot, the config (K3_LAYERS may truncate the
// stack), the resident weights and the default expert store.
#include "k3/model/model.h"

#include <algorithm>
#include <cmath>

#include "k3/core/file.h"
#include "k3/core/sys.h"

namespace k3::model {

std::unique_ptr<Model> Model::LoadOrThrow(const std::string& dir, const LoadOptions& options,
                                          const Snapshot::Options& snapshot_options) {
  const double t0 = NowSeconds();
  std::unique_ptr<Model> m(new Model());
  m->snapshot_ = std::make_unique<Snapshot>(Snapshot::OpenOrThrow(dir, snapshot_options));
  m->config_ = ModelConfig::ParseOrThrow(m->snapshot_->config_json(), JoinPath(dir, "config.json"));
  if (options.max_layers > 0 && options.max_layers < m->config_.num_hidden_layers) {
    // Truncated stack (K3_LAYERS): the AttnRes block count follows from the new depth.
    ModelConfig& c = m->config_;
    c.num_hidden_layers = options.max_layers;
    c.is_kda.resize(static_cast<size_t>(c.num_hidden_layers));
    c.first_k_dense_replace = std::min(c.first_k_dense_replace, c.num_hidden_layers);
  }
  m->weights_ = LoadWeightsOrThrow(*m->snapshot_, m->config_, options);
  // Expert cache: an even share of the budget per MoE layer (spec §8.2).
  SimpleExpertStore::Options so;
  {
    const ModelConfig& c = m->config_;
    const uint64_t slot = ExpertTable::SlotBytesFor(c);
    const double per_layer =
        options.expert_cache_bytes /
        (static_cast<double>(slot) * static_cast<double>(std::max<int64_t>(1, c.num_moe_layers())));
    so.slots_per_layer =
        std::clamp<int64_t>(static_cast<int64_t>(std::floor(per_layer)), 1, c.num_experts);
  }
  m->experts_ = std::make_unique<SimpleExpertStore>(*m->snapshot_, m->config_, so);
  m->load_seconds_ = NowSeconds() - t0;
  return m;
}

}  // namespace k3::model
