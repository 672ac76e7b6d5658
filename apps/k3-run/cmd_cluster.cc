// k3-run cluster-share: a cluster's placement for N ranks, and one host's
// share of a model: list its byte ranges, check a directory holds them, or
// write them as sparse shards (docs/cluster.md "Preparing each host's share").
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "k3/cluster/cluster.h"
#include "k3/core/error.h"
#include "k3/core/sys.h"
#include "k3/model/config.h"

namespace k3::run {
namespace {

struct ShareArgs {
  std::string model_dir;
  int ranks = 0;
  int rank = -1;
  bool symmetric = false;
  std::vector<double> ram_gb, disk_gbps;  // per owner rank, in rank order
  std::string prepare_dir;
  std::string check_dir;
  bool ranges = false;
};

void RunShare(const ShareArgs& a) {
  const Snapshot snap = Snapshot::OpenOrThrow(a.model_dir);
  const ModelConfig config =
      ModelConfig::ParseOrThrow(snap.config_json(), a.model_dir + "/config.json");
  const std::vector<int> owners = cluster::OwnerRanks(a.ranks, a.symmetric);
  if (owners.empty()) throw Error(ErrorCode::kInvalidArgument, "--ranks 1 needs --symmetric");
  std::vector<cluster::Capacity> cap(owners.size());
  for (auto [list, name] :
       {std::pair{&a.ram_gb, "--ram-gb"}, std::pair{&a.disk_gbps, "--disk-gbps"}}) {
    if (!list->empty() && list->size() != owners.size()) {
      throw Error(ErrorCode::kInvalidArgument, std::string(name) + ": one value per owner rank (" +
                                                   std::to_string(owners.size()) + ")");
    }
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    if (!a.ram_gb.empty()) cap[i].ram_bytes = static_cast<uint64_t>(std::llround(a.ram_gb[i] * 1e9));
    if (!a.disk_gbps.empty()) cap[i].disk_bytes_per_s = static_cast<uint64_t>(std::llround(a.disk_gbps[i] * 1e9));
  }
  const cluster::Placement p = cluster::Placement::Compute(config, owners, cap);
  const model::ExpertTable table(snap, config);
  std::printf("placement %016llx for %d ranks%s: %s\n",
              static_cast<unsigned long long>(p.fingerprint()), a.ranks,
              a.symmetric ? " (symmetric)" : "", p.Describe(table.slot_bytes()).c_str());
  if (a.rank < 0) return;
  if (a.rank >= a.ranks) throw Error(ErrorCode::kInvalidArgument, "--rank must be below --ranks");
  if (a.ranges) {
    for (const cluster::ShareRange& r : cluster::ShareRanges(table, p, a.rank)) {
      std::printf("%s %llu %llu\n", snap.shards()[r.shard].path().c_str(),
                  static_cast<unsigned long long>(r.offset),
                  static_cast<unsigned long long>(r.length));
    }
  }
  if (!a.check_dir.empty()) {
    const Snapshot other = Snapshot::OpenOrThrow(a.check_dir);
    const model::ExpertTable t(other, config);
    const std::string missing = cluster::CheckShare(t, p, a.rank);
    if (!missing.empty()) {
      throw Error(ErrorCode::kNotFound,
                  "rank " + std::to_string(a.rank) + " lacks bytes it owns: " + missing,
                  a.check_dir);
    }
    std::printf("%s holds every byte rank %d owns\n", a.check_dir.c_str(), a.rank);
  }
  if (!a.prepare_dir.empty()) {
    const double t0 = NowSeconds();
    const uint64_t n = cluster::PrepareShareOrThrow(a.model_dir, p, a.rank, a.prepare_dir);
    std::printf("wrote rank %d's share to %s: %s in %.2f s\n", a.rank, a.prepare_dir.c_str(),
                FormatBytes(n).c_str(), NowSeconds() - t0);
  }
}

void SetupShare(CLI::App& root) {
  auto args = std::make_shared<ShareArgs>();
  CLI::App* cmd = root.add_subcommand(
      "cluster-share",
      "the --cluster placement for N ranks and one rank's share of the experts: list, "
      "check or write it (docs/cluster.md)");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container directory")->required();
  cmd->add_option("--ranks", args->ranks, "MPI ranks of the job (mpirun -np)")
      ->required()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--rank", args->rank, "the rank whose share to list, check or write")
      ->check(CLI::Range(0, 4095));
  cmd->add_flag("--symmetric", args->symmetric, "rank 0 owns experts too (--cluster-symmetric)");
  cmd->add_option("--ram-gb", args->ram_gb, "each owner rank's --cluster-ram-gb, in rank order")
      ->delimiter(',');
  cmd->add_option("--disk-gbps", args->disk_gbps,
                  "each owner rank's --cluster-disk-gbps, in rank order")
      ->delimiter(',');
  cmd->add_flag("--ranges", args->ranges, "print the rank's byte ranges: shard offset length");
  cmd->add_option("--check", args->check_dir,
                  "verify DIR holds every byte the rank owns (exit 3 if not)");
  cmd->add_option(
      "--prepare", args->prepare_dir,
      "write the rank's share to DIR: metadata whole, shards sparse with only its experts");
  cmd->callback([args] { RunShare(*args); });
}

K3_REGISTER_COMMAND(SetupShare);

}  // namespace
}  // namespace k3::run
