#include "k3/model/expert_store.h"

#include <algorithm>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/sys.h"
#include "k3/model/tensor_table.h"

namespace k3::model {
ExpertTable::ExpertTable(const Snapshot& snapshot, const ModelConfig& config)
    : snapshot_(&snapshot),
      num_layers_(config.num_hidden_layers),
      num_experts_(config.num_experts),
      first_moe_layer_(config.first_k_dense_replace),
      moe_inter_(config.moe_intermediate_size),
      latent_(config.routed_expert_hidden_size) {
  // The parts' U8 shapes come from the tensor table (w1/w3 [MI, LT], w2 [LT, MI]).
  const std::vector<k3::ExpertPart> parts = ExpertParts(config);
  K3_CHECK(static_cast<int>(parts.size()) == kExpertParts);
  for (int p = 0; p < kExpertParts; ++p) {
    part_bytes_[p] = static_cast<uint64_t>(parts[p].rows) * static_cast<uint64_t>(parts[p].cols);
    part_slot_offset_[p] = slot_bytes_;
    slot_bytes_ += part_bytes_[p];
  }

  const int64_t moe_layers = num_layers_ > first_moe_layer_ ? num_layers_ - first_moe_layer_ : 0;
  items_.resize(static_cast<size_t>(moe_layers * num_experts_));
  for (int64_t l = first_moe_layer_; l < num_layers_; ++l) {
    for (int64_t e = 0; e < num_experts_; ++e) {
      Item& it = items_[static_cast<size_t>((l - first_moe_layer_) * num_experts_ + e)];
      it.present = true;
      std::optional<TensorRef> refs[kExpertParts];
      for (int p = 0; p < kExpertParts; ++p) {
        refs[p] = snapshot.Find(TensorName(l, e, static_cast<ExpertPart>(p)));
        if (!refs[p]) it.present = false;
      }
      if (!it.present) {
        it.key = DiskKey{UINT32_MAX, static_cast<uint64_t>(e)};
        continue;
      }
      it.contiguous = true;
      it.file_idx = static_cast<uint32_t>(refs[0]->shard_idx);
      for (int p = 0; p < kExpertParts; ++p) {
        const TensorRef& r = *refs[p];
        if (r.info->nbytes() != part_bytes_[p]) {
          throw Error(ErrorCode::kCorrupt,
                      "expert tensor has " + std::to_string(r.info->nbytes()) +
                          " bytes, expected " + std::to_string(part_bytes_[p]) +
                          " (untrusted container)",
                      r.file->path(), static_cast<int64_t>(r.offset), r.info->name);
        }
        it.offsets[p] = r.offset;
        if (p > 0 && (r.shard_idx != refs[0]->shard_idx ||
                      r.offset != it.offsets[p - 1] + part_bytes_[p - 1])) {
          it.contiguous = false;
        }
      }
      it.key = DiskKey{it.file_idx, it.offsets[0]};
    }
  }
}

const ExpertTable::Item& ExpertTable::Entry(int64_t layer, int64_t expert) const {
  K3_CHECK(layer >= first_moe_layer_ && layer < num_layers_);
  K3_CHECK(expert >= 0 && expert < num_experts_);
  return items_[static_cast<size_t>((layer - first_moe_layer_) * num_experts_ + expert)];
}

std::string ExpertTable::TensorName(int64_t layer, int64_t expert, ExpertPart p) const {
  return "model.layers." + std::to_string(layer) + ".block_sparse_moe.experts." +
         std::to_string(expert) + "." + std::string(kExpertPartSuffix[static_cast<int>(p)]);
}

int ExpertTable::fd(int64_t layer, int64_t expert, ExpertPart p) const {
  const Item& it = Entry(layer, expert);
  K3_CHECK(it.present);
  if (it.contiguous) return snapshot_->shards()[it.file_idx].fd();
  return snapshot_->FindOrThrow(TensorName(layer, expert, p)).file->fd();
}

uint64_t ExpertTable::offset(int64_t layer, int64_t expert, ExpertPart p) const {
  return Entry(layer, expert).offsets[static_cast<int>(p)];
}

const std::string& ExpertTable::path(int64_t layer, int64_t expert) const {
  const Item& it = Entry(layer, expert);
  K3_CHECK(it.present);
  return snapshot_->shards()[it.file_idx].path();
}

uint64_t ExpertTable::ReadSlotOrThrow(int64_t layer, int64_t expert,
                                      std::span<std::byte> slot) const {
  K3_CHECK(slot.size() >= slot_bytes_);
  const Item& it = Entry(layer, expert);
  if (!it.present) {
    // Name the first missing part and the shard the index promises.
    for (int p = 0; p < kExpertParts; ++p) {
      std::string name = TensorName(layer, expert, static_cast<ExpertPart>(p));
      if (!snapshot_->Find(name)) snapshot_->FindOrThrow(name);
    }
  }
  if (it.contiguous) {
    const SafetensorsFile& f = snapshot_->shards()[it.file_idx];
    PreadFull(f.fd(), slot.first(slot_bytes_), it.offsets[0], f.path());
    return slot_bytes_;
  }
  for (int p = 0; p < kExpertParts; ++p) {
    TensorRef r = snapshot_->FindOrThrow(TensorName(layer, expert, static_cast<ExpertPart>(p)));
    PreadFull(r.file->fd(), slot.subspan(part_slot_offset_[p], part_bytes_[p]), r.offset,
              r.file->path());
  }
  return slot_bytes_;
}

ExpertView ExpertTable::ViewOfSlot(const std::byte* slot) const {
  auto u8 = [&](int p) { return reinterpret_cast<const uint8_t*>(slot + part_slot_offset_[p]); };
  const size_t mi = static_cast<size_t>(moe_inter_);
  const size_t lt = static_cast<size_t>(latent_);
  auto mx = [&](size_t rows, size_t cols, int packed) {
    quant::WeightView v;
    v.format = quant::WeightFormat::kMxfp4;
    v.rows = rows;
    v.cols = cols;
    v.data = u8(packed);
    v.e8m0 = u8(packed + 1);
    return v;
  };
  return ExpertView{mx(mi, lt, 0), mx(lt, mi, 2), mx(mi, lt, 4)};
}

SimpleExpertStore::SimpleExpertStore(const Snapshot& snapshot, const ModelConfig& config,
                                     Options options)
    : table_(snapshot, config), options_(options) {
  if (options_.slots_per_layer < 1) options_.slots_per_layer = 1;
  layers_.resize(static_cast<size_t>(config.num_hidden_layers));
}

void ExpertStore::NoteRouted(int64_t layer, std::span<const int32_t> experts) {
  const ExpertTable& t = table();
  if (routed_.empty()) routed_.assign(static_cast<size_t>(t.num_layers() * t.num_experts()), false);
  pass_experts_ += experts.size();
  for (int32_t e : experts) {
    if (layer < 0 || layer >= t.num_layers() || e < 0 || e >= t.num_experts()) continue;
    const size_t i = static_cast<size_t>(layer * t.num_experts() + e);
    if (!routed_[i]) {
      routed_[i] = true;
      ++distinct_routed_;
    }
  }
}

void SimpleExpertStore::BeginPass(int64_t layer, std::span<const int32_t> experts) {
  // No read-ahead: reads happen in Acquire, in the order the caller asks.
}

ExpertView SimpleExpertStore::Acquire(int64_t layer, int64_t expert) {
  auto& slots = layers_.at(static_cast<size_t>(layer));
  for (Slot& s : slots) {
    if (s.expert == expert) {
      s.used = ++clock_;
      ++s.refs;
      ++stats_.hits;
      return table_.ViewOfSlot(s.bytes.get());
    }
  }
  // Miss: an empty slot, else the least recently used unreferenced one, else a
  // temporary extra slot (trimmed again in EndLayer).
  Slot* dst = nullptr;
  if (static_cast<int64_t>(slots.size()) < options_.slots_per_layer) {
    slots.emplace_back();
    dst = &slots.back();
  } else {
    for (Slot& s : slots) {
      if (s.refs == 0 && (dst == nullptr || s.used < dst->used)) dst = &s;
    }
    if (dst == nullptr) {
      slots.emplace_back();
      dst = &slots.back();
    }
  }
  if (!dst->bytes) dst->bytes = std::make_unique<std::byte[]>(table_.slot_bytes());
  dst->expert = -1;  // invalid until the read succeeds
  double t0 = NowSeconds();
  uint64_t n = table_.ReadSlotOrThrow(layer, expert, {dst->bytes.get(), table_.slot_bytes()});
  stats_.blocked_seconds += NowSeconds() - t0;
  stats_.bytes_read += n;
  ++stats_.misses;
  dst->expert = expert;
  dst->used = ++clock_;
  dst->refs = 1;
  return table_.ViewOfSlot(dst->bytes.get());
}

void SimpleExpertStore::Release(int64_t layer, int64_t expert) noexcept {
  auto& slots = layers_[static_cast<size_t>(layer)];
  for (Slot& s : slots) {
    if (s.expert == expert && s.refs > 0) {
      --s.refs;
      return;
    }
  }
}

void SimpleExpertStore::EndLayer(int64_t layer) {
  auto& slots = layers_.at(static_cast<size_t>(layer));
  // Drop overflow slots (least recently used first) once nothing references them.
  while (static_cast<int64_t>(slots.size()) > options_.slots_per_layer) {
    auto victim = slots.end();
    for (auto it = slots.begin(); it != slots.end(); ++it) {
      if (it->refs == 0 && (victim == slots.end() || it->used < victim->used)) victim = it;
    }
    if (victim == slots.end()) break;
    slots.erase(victim);
  }
}

}  // namespace k3::model
