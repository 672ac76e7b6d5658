// k3-run info MODEL: what a model directory is (snapshot or container, complete
// or not), its weights, experts, tokenizer, and the memory a run would take.
// The logic is lib/model's (k3/model/info.h).
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "k3/cluster/cluster.h"
#include "k3/core/sys.h"
#include "k3/model/expert_store.h"
#include "k3/model/info.h"
#include "k3/quant/isa.h"

namespace k3::run {
namespace {

struct InfoArgs {
  std::string model_dir;
  bool json = false;
  int cluster_ranks = 0;  // > 0: also the --cluster placement for this many ranks
  bool cluster_symmetric = false;
};

void SetupInfo(CLI::App& root) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* cmd = root.add_subcommand("info", "describe a snapshot or container: kind, weights, shards, experts, "
                                              "tokenizer, fingerprint, projected memory");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container directory")->required();
  cmd->add_flag("--json", args->json, "one JSON object");
  cmd->add_option("--cluster-ranks", args->cluster_ranks,
                  "also print the --cluster placement for this many MPI ranks (equal capacities)")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--cluster-symmetric", args->cluster_symmetric, "with --cluster-ranks: rank 0 owns experts too");
  cmd->callback([args] {
    // The same budget generate uses (K3_EXPERT_GB, decimal GB; default 8).
    const double cache = GetEnvDouble("K3_EXPERT_GB", 8.0) * 1e9;
    ModelInfo info = DescribeModelOrThrow(args->model_dir, static_cast<uint64_t>(cache));
    std::fputs(RenderModelInfo(info, args->json).c_str(), stdout);
    // Which matrix kernels a run here would use (per-CPU rules included).
    if (!args->json) std::printf("kernels     %s\n", quant::DispatchDetail().c_str());
    if (args->cluster_ranks > 0 && !args->json) {
      // Equal capacities; `k3-run cluster-share` takes per-rank ones.
      const ModelConfig config = ModelConfig::LoadOrThrow(args->model_dir);
      const std::vector<int> owners = cluster::OwnerRanks(args->cluster_ranks, args->cluster_symmetric);
      const cluster::Placement p =
          cluster::Placement::Compute(config, owners, std::vector<cluster::Capacity>(owners.size()));
      std::printf("cluster     %d ranks%s, placement %016llx: %s\n", args->cluster_ranks,
                  args->cluster_symmetric ? " (symmetric)" : "", static_cast<unsigned long long>(p.fingerprint()),
                  p.Describe(model::ExpertTable::SlotBytesFor(config)).c_str());
    }
  });
}

K3_REGISTER_COMMAND(SetupInfo);

}  // namespace
}  // namespace k3::run
