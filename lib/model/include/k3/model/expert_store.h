// Expert store: where the LatentMoE gets the MXFP4 bytes of its routed experts.
//
// The MoE math (lib/model) only talks to the abstract ExpertStore below, so a
// streaming store (io_uring, O_DIRECT, per-layer LRU, loader threads reading
// expert j+1 while j computes) plugs in without touching the forward pass.
//
// Protocol for one MoE layer over one chunk of tokens (single consumer thread):
//   1. the MoE builds the union of the experts its tokens selected and sorts it
//      by DiskOrder() (file, byte offset) so reads sweep each shard forwards;
//   2. BeginLayer(layer, union) announces the whole pass; a streaming store may
//      start reading every miss now, in this order;
//   3. for each expert in that order: Acquire() (blocks until resident) ...
//      compute ... Release();
//   4. EndLayer(layer): the store may promote/evict.
// Before step 1 the model may call Prefetch(layer, likely) when a large
// prefill window will almost surely use most of a layer's experts: a
// streaming store starts reading them (as many as the layer's free cache
// capacity holds) while the trunk still computes, and BeginLayer adopts the
// reads its pass needs. Only a hint: a store may ignore it.
// The numerics do not depend on the order in which experts are delivered: the
// MoE sums each token's experts in a fixed order of its own (docs/model.md), so
// a store may serve hits before misses without changing a single bit.
//
// ExpertTable is the shared part every store needs: where the six tensors of
// each (layer, expert) live, their validated byte sizes, and whether they are
// contiguous (one read) or scattered (six reads).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "k3/container/snapshot.h"
#include "k3/model/config.h"
#include "k3/quant/quant.h"

namespace k3::model {

// Position of an expert on disk; orders a layer's union for sequential reads.
// Missing experts sort last.
struct DiskKey {
  uint32_t file_idx = 0;  // index into Snapshot::shards()
  uint64_t offset = 0;    // absolute byte offset of w1.weight_packed
  auto operator<=>(const DiskKey&) const = default;
};

// The three MXFP4 matrices of one routed expert. w1 = gate [MI, LT],
// w3 = up [MI, LT], w2 = down [LT, MI] (MI = moe_intermediate_size,
// LT = routed_expert_hidden_size). Non-owning: valid until Release().
struct ExpertView {
  quant::WeightView w1;
  quant::WeightView w2;
  quant::WeightView w3;
};

// Canonical slot layout: w1p, w1s, w2p, w2s, w3p, w3s back to back (the order
// of the HF shards and of k3-repack containers).
enum class ExpertPart : uint8_t { kW1p = 0, kW1s, kW2p, kW2s, kW3p, kW3s };
inline constexpr int kExpertParts = 6;

struct ExpertStoreStats {
  uint64_t bytes_read = 0;     // bytes fetched from disk for experts
  uint64_t hits = 0;           // Acquire() served from the cache
  uint64_t misses = 0;         // Acquire() that needed a read
  double blocked_seconds = 0;  // time Acquire() waited for I/O
  // (layer, expert) pairs a pass asked for (BeginLayer's lists) for the first
  // time since load: on a fresh store, the distinct experts the prompts so far
  // routed to, so distinct_routed x slot bytes is one pass over them -- the
  // bytes an I/O floor divides by, whatever read-ahead and re-reads added.
  uint64_t distinct_routed = 0;
  // Experts asked for, summed over passes (each pass's union once): per
  // routed row, pass_experts / (rows x top_k) is the share of a step's
  // routing that needed a distinct expert (1: no two rows shared one).
  uint64_t pass_experts = 0;
  double hit_rate() const {
    uint64_t n = hits + misses;
    return n ? static_cast<double>(hits) / static_cast<double>(n) : 0.0;
  }
};

// Locations and sizes of every routed expert of a model. Built once at load;
// immutable afterwards, so thread-safe for readers. Holds a pointer to the
// Snapshot, which must outlive it.
//
// Construction validates the byte size of every present expert tensor exactly
// (kCorrupt naming the tensor: an "untrusted container"). Missing experts are
// recorded, not fatal: touching one (ReadSlotOrThrow) throws kNotFound naming
// the tensor and the shard the index says holds it.
class ExpertTable {
 public:
  ExpertTable(const Snapshot& snapshot, const ModelConfig& config);

  const Snapshot& snapshot() const { return *snapshot_; }
  int64_t num_layers() const { return num_layers_; }
  int64_t first_moe_layer() const { return first_moe_layer_; }  // MoE layers: [first, num_layers)
  int64_t num_experts() const { return num_experts_; }
  // Bytes of each part and of a whole slot (sum of the six parts).
  uint64_t part_bytes(ExpertPart p) const { return part_bytes_[static_cast<int>(p)]; }
  uint64_t part_offset_in_slot(ExpertPart p) const {
    return part_slot_offset_[static_cast<int>(p)];
  }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Slot size a config implies (for cache sizing before a table exists).
  static uint64_t SlotBytesFor(const ModelConfig& config) {
    const uint64_t n = static_cast<uint64_t>(config.moe_intermediate_size) *
                       static_cast<uint64_t>(config.routed_expert_hidden_size);
    return 3 * (n / 2 + n / 32);
  }

  bool present(int64_t layer, int64_t expert) const { return Entry(layer, expert).present; }
  // True if the six parts are back to back in one file (one pread suffices).
  bool contiguous(int64_t layer, int64_t expert) const { return Entry(layer, expert).contiguous; }
  DiskKey disk_key(int64_t layer, int64_t expert) const { return Entry(layer, expert).key; }
  // File descriptor and absolute offset of one part (present experts only).
  int fd(int64_t layer, int64_t expert, ExpertPart p) const;
  uint64_t offset(int64_t layer, int64_t expert, ExpertPart p) const;
  const std::string& path(int64_t layer, int64_t expert) const;
  // Full tensor name of one part (without the snapshot prefix).
  std::string TensorName(int64_t layer, int64_t expert, ExpertPart p) const;

  // Reads one expert into `slot` (slot_bytes() long) in the canonical layout,
  // one pread if contiguous, six otherwise. Thread-safe. Returns bytes read.
  uint64_t ReadSlotOrThrow(int64_t layer, int64_t expert, std::span<std::byte> slot) const;
  // Views of the three matrices inside a canonical slot.
  ExpertView ViewOfSlot(const std::byte* slot) const;

 private:
  struct Item {
    bool present = false;
    bool contiguous = false;
    uint32_t file_idx = 0;
    DiskKey key;
    uint64_t offsets[kExpertParts] = {};
  };
  const Item& Entry(int64_t layer, int64_t expert) const;

  const Snapshot* snapshot_;
  int64_t num_layers_ = 0;
  int64_t num_experts_ = 0;
  int64_t first_moe_layer_ = 0;
  int64_t moe_inter_ = 0;
  int64_t latent_ = 0;
  uint64_t part_bytes_[kExpertParts] = {};
  uint64_t part_slot_offset_[kExpertParts] = {};
  uint64_t slot_bytes_ = 0;
  std::vector<Item> items_;  // [layer - first_moe_layer][expert]
};

// Where the MoE gets experts from. One consumer thread drives a store (see the
// protocol above); implementations may run their own I/O threads. Failures
// (I/O, truncation, missing tensors) throw k3::Error from BeginLayer/Acquire.
class ExpertStore {
 public:
  virtual ~ExpertStore() = default;

  virtual const ExpertTable& table() const = 0;
  // Sort key for a layer's union: ascending (file, offset of w1p).
  DiskKey DiskOrder(int64_t layer, int64_t expert) const { return table().disk_key(layer, expert); }
  // `experts` = the unique experts this pass will Acquire, in that order.
  // Counts the newly routed ones (distinct_routed), then the store's own BeginPass.
  void BeginLayer(int64_t layer, std::span<const int32_t> experts) {
    NoteRouted(layer, experts);
    BeginPass(layer, experts);
  }
  // Blocks until the expert is resident; the view stays valid until Release().
  virtual ExpertView Acquire(int64_t layer, int64_t expert) = 0;
  virtual void Release(int64_t layer, int64_t expert) noexcept = 0;
  virtual void EndLayer(int64_t layer) = 0;
  // The implementation's counters, with distinct_routed filled in here.
  ExpertStoreStats stats() const {
    ExpertStoreStats s = CounterStats();
    s.distinct_routed = distinct_routed_;
    s.pass_experts = pass_experts_;
    return s;
  }
  // Read-ahead hint for the next pass of `layer` (protocol above): `likely`
  // in the order to read them (disk order). Not during a pass. Default: none.
  virtual void Prefetch(int64_t layer, std::span<const int32_t> likely) {
    (void)layer;
    (void)likely;
  }

 protected:
  virtual ExpertStoreStats CounterStats() const = 0;
  // BeginLayer's work in the implementation (the protocol above).
  virtual void BeginPass(int64_t layer, std::span<const int32_t> experts) = 0;

 private:
  void NoteRouted(int64_t layer, std::span<const int32_t> experts);
  std::vector<bool> routed_;  // [layer * num_experts + expert], sized on first use
  uint64_t distinct_routed_ = 0;
  uint64_t pass_experts_ = 0;
};

// The simple correct store: a per-layer LRU of `slots_per_layer` experts read
// with pread on demand (no read-ahead, no threads). Owns its slot buffers and
// its ExpertTable; borrows the Snapshot, which must outlive it. Not thread-safe
// (one consumer, as the protocol says).
class SimpleExpertStore final : public ExpertStore {
 public:
  struct Options {
    int64_t slots_per_layer = 4;  // >= 1; more slots: more hits, more memory
  };
  SimpleExpertStore(const Snapshot& snapshot, const ModelConfig& config, Options options);
  SimpleExpertStore(const Snapshot& snapshot, const ModelConfig& config)
      : SimpleExpertStore(snapshot, config, Options{}) {}

  const ExpertTable& table() const override { return table_; }
  ExpertView Acquire(int64_t layer, int64_t expert) override;
  void Release(int64_t layer, int64_t expert) noexcept override;
  void EndLayer(int64_t layer) override;
  ExpertStoreStats CounterStats() const override { return stats_; }
  void BeginPass(int64_t layer, std::span<const int32_t> experts) override;

 private:
  struct Slot {
    int64_t expert = -1;
    uint64_t used = 0;  // LRU stamp
    int refs = 0;       // outstanding Acquire()s
    std::unique_ptr<std::byte[]> bytes;
  };
  ExpertTable table_;
  Options options_;
  std::vector<std::vector<Slot>> layers_;  // indexed by layer
  uint64_t clock_ = 0;
  ExpertStoreStats stats_;
};

}  // namespace k3::model
