#include "shard_plan.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include "k3/core/error.h"
#include "k3/quant/quant.h"

namespace k3::repack {
namespace {

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

SourceStat SourceStatOf(const struct stat& st) {
  SourceStat s;
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime = st.st_mtim;
  s.ctime = st.st_ctim;
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  return s;
}

std::string TimeText(const struct timespec& t) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%09ld", static_cast<long long>(t.tv_sec), t.tv_nsec);
  return buf;
}

bool SameTime(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

ShardPlan PlanShard(const SafetensorsFile& src, int64_t number, int64_t total,
                    const std::vector<bool>& is_kda, const QuantBits& bits) {
  ShardPlan p;
  p.number = number;
  p.src = &src;
  p.out_name = FormatShardName(number, total);
  std::vector<Item> non_experts;
  std::vector<std::pair<Item, std::optional<ExpertKey>>> experts;
  for (const auto& t : src.tensors()) {  // data-offset order = source order
    Item it;
    it.src = &t;
    try {
      it.role = ClassifyTensor(t.name, is_kda);
    } catch (const Error& e) {
      throw e.WithPath(src.path());
    }
    if (it.role == TensorRole::kDrop) continue;
    if (it.role == TensorRole::kExpert) {
      experts.emplace_back(it, ParseExpertName(t.name));
      continue;
    }
    if (IsQuantized(it.role)) {
      if (!IsFloatReadable(t.dtype) || t.shape.size() != 2 || t.shape[0] == 0 || t.shape[1] == 0) {
        throw Error(ErrorCode::kUnsupported,
                    "class '" + std::string(TensorRoleName(it.role)) +
                        "' must be quantized but it is " + std::string(DTypeName(t.dtype)) + " " +
                        ShapeString(t.shape) +
                        ", not a 2-D BF16/F16/F32 matrix (is the source already a container?)",
                    src.path(), static_cast<int64_t>(src.AbsoluteOffset(t)), t.name);
      }
      it.op = Op::kQuant;
      it.rows = static_cast<uint64_t>(t.shape[0]);
      it.cols = static_cast<uint64_t>(t.shape[1]);
      it.qshape.int4 = quant::UsesInt4(bits.For(it.role), it.cols);
    }
    non_experts.push_back(it);
  }
  // Experts by (id, matrix, packed before scale); names we cannot parse keep their
  // source order after the parsed ones.
  std::stable_sort(experts.begin(), experts.end(), [](const auto& a, const auto& b) {
    if (a.second.has_value() != b.second.has_value()) return a.second.has_value();
    if (!a.second) return false;
    return *a.second < *b.second;
  });
  p.items = std::move(non_experts);
  for (auto& e : experts) p.items.push_back(e.first);

  for (auto& it : p.items) {
    const TensorInfo& t = *it.src;
    it.out_index = p.out.size();
    p.src_bytes += t.nbytes();
    if (it.op == Op::kCopy) {
      p.out.push_back({t.name, t.dtype, t.shape});
      if (it.role == TensorRole::kExpert) p.expert_bytes += t.nbytes();
    } else {
      const int64_t rows = static_cast<int64_t>(it.rows);
      const int64_t qcols = static_cast<int64_t>(it.qshape.q_row_bytes(it.cols));
      p.out.push_back({t.name, DType::kU8, {rows, qcols}});
      if (it.qshape.int4) {
        p.out.push_back({t.name + ".qs", DType::kF32, {rows, static_cast<int64_t>(it.cols / 64)}});
      } else {
        p.out.push_back({t.name + ".qs", DType::kF32, {rows}});
      }
    }
  }
  p.header = BuildSafetensorsHeader(p.out);
  uint64_t data = 0;
  for (const auto& o : p.out) data += o.nbytes();
  p.file_bytes = 8 + p.header.size() + data;
  return p;
}

std::vector<Segment> Segments(const ShardPlan& p, uint64_t block_bytes) {
  std::vector<Segment> segs;
  for (size_t i = 0; i < p.items.size(); ++i) {
    const Item& it = p.items[i];
    const uint64_t at = p.src->AbsoluteOffset(*it.src);
    const uint64_t n = it.src->nbytes();
    if (it.op == Op::kCopy) {
      for (uint64_t off = 0; off < n; off += block_bytes) {
        Segment s;
        s.kind = Segment::kCopy;
        s.item = i;
        s.src_off = at + off;
        s.src_len = std::min(block_bytes, n - off);
        s.dst_len = s.src_len;
        segs.push_back(s);
      }
      continue;
    }
    const uint64_t row_bytes = it.cols * DTypeSize(it.src->dtype);
    const uint64_t rows_per_block = std::max<uint64_t>(1, block_bytes / row_bytes);
    for (uint64_t r = 0; r < it.rows; r += rows_per_block) {
      Segment s;
      s.kind = Segment::kQuant;
      s.item = i;
      s.row0 = r;
      s.rows = std::min(rows_per_block, it.rows - r);
      s.src_off = at + r * row_bytes;
      s.src_len = s.rows * row_bytes;
      s.dst_len = s.rows * it.qshape.q_row_bytes(it.cols);
      segs.push_back(s);
    }
    Segment s;
    s.kind = Segment::kScales;
    s.item = i;
    s.dst_len = it.rows * it.qshape.scales_per_row(it.cols) * 4;
    segs.push_back(s);
  }
  return segs;
}

}  // namespace k3::repack
