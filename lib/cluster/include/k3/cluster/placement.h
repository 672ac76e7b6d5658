// Placement: which rank owns each routed (layer, expert) of a cluster run.
//
// Pure and deterministic: the same capacities and options give the same owner
// table on every host, so each rank computes it itself and only the 64-bit
// fingerprint crosses the wire (a mismatch is a startup error naming the
// rank). Every MoE layer is balanced on its own: a rank's share of each layer
// is proportional to its capacity weight (largest remainder, the remainders
// rotated over layers), so every layer's work is spread over all owners.
// Within a layer the experts are dealt in a hashed order, so neighbouring ids
// (which a router often co-selects) land on different ranks.
//
// Thread-safety: immutable after construction. Failures: kInvalidArgument.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "k3/model/config.h"

namespace k3::cluster {

// What one rank offers. Weight = ram_bytes + kDiskSeconds x disk_bytes_per_s
// (the bytes it can hold plus what its disk streams in kDiskSeconds); all zero
// on every rank: equal shares.
struct Capacity {
  uint64_t ram_bytes = 0;
  uint64_t disk_bytes_per_s = 0;
};
inline constexpr double kDiskSeconds = 10.0;

class Placement {
 public:
  // `owners` are the ranks that own experts (workers 1..N-1, plus rank 0 in
  // the symmetric mode), `capacity[i]` belongs to `owners[i]`.
  static Placement Compute(const ModelConfig& config, std::vector<int> owners,
                           std::vector<Capacity> capacity);

  int64_t num_layers() const { return num_layers_; }
  int64_t num_experts() const { return num_experts_; }
  // -1 for a layer without routed experts (dense).
  int owner(int64_t layer, int64_t expert) const {
    return owner_[static_cast<size_t>(layer * num_experts_ + expert)];
  }
  const std::vector<int>& owners() const { return owners_; }
  // Experts `rank` owns in `layer` / over all layers.
  int64_t CountOwned(int rank, int64_t layer) const;
  int64_t CountOwned(int rank) const;
  // XXH64 of the version, the owner list and the table.
  uint64_t fingerprint() const { return fingerprint_; }
  // "rank 1: 24 experts (8/layer), rank 2: ..." for logs and `k3-run info`.
  std::string Describe(uint64_t slot_bytes) const;

 private:
  int64_t num_layers_ = 0;
  int64_t num_experts_ = 0;
  std::vector<int> owners_;
  std::vector<int> owner_;  // [layer][expert]
  uint64_t fingerprint_ = 0;
};

}  // namespace k3::cluster
