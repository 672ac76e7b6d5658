#include "model_check.h"

#include "k3/model/tensor_table.h"
#include "k3/quant/quant.h"

namespace k3::repack {
namespace {

std::string Dt(DType d) { return std::string(DTypeName(d)); }

// A matrix in container form: U8 payload + F32 .qs, int8 [O,I]+[O] or int4-g64 [O,I/2]+[O,I/64].
void CheckQuantized(const TensorTableEntry& e, const std::string& full, const FoundTensor& l, const FindTensor& find,
                    const ModelConfig& config, const QuantBits* bits, std::vector<Problem>& out) {
  const TensorInfo& t = *l.info;
  const int64_t o = e.shape[0], i = e.shape[1];
  if (t.dtype != DType::kU8) {
    out.push_back({ErrorCode::kCorrupt, l.file, full, l.offset,
                   "dtype " + Dt(t.dtype) + ": a container stores this matrix quantized (U8 + .qs)"});
    return;
  }
  std::optional<FoundTensor> s = find(full + ".qs");
  if (!s) {
    out.push_back({ErrorCode::kNotFound, l.file, full + ".qs", -1, "scale sidecar missing"});
    return;
  }
  const TensorInfo& st = *s->info;
  const bool int8 = t.shape == std::vector<int64_t>{o, i} && st.shape == std::vector<int64_t>{o};
  const bool int4 =
      i % 64 == 0 && t.shape == std::vector<int64_t>{o, i / 2} && st.shape == std::vector<int64_t>{o, i / 64};
  if (st.dtype != DType::kF32) {
    out.push_back({ErrorCode::kCorrupt, s->file, full + ".qs", s->offset, "dtype " + Dt(st.dtype) + ", expected F32"});
  }
  if (!int8 && !int4) {
    const std::string os = std::to_string(o), is = std::to_string(i);
    out.push_back({ErrorCode::kCorrupt, l.file, full, l.offset,
                   "U8 " + ShapeString(t.shape) + " with .qs " + ShapeString(st.shape) + " is neither int8 [" + os +
                       "," + is + "]+[" + os + "] nor int4-g64 for a [" + os + "," + is + "] matrix"});
    return;
  }
  if (bits) {
    TensorRole role = ClassifyTensor(full, config.is_kda);
    bool want4 = quant::UsesInt4(bits->For(role), static_cast<size_t>(i));
    if (want4 != int4) {
      out.push_back({ErrorCode::kCorrupt, l.file, full, l.offset,
                     std::string("stored as ") + (int4 ? "int4-g64" : "int8") + " but the fingerprint's " +
                         std::string(TensorRoleName(role)) + " bits ask for " + (want4 ? "int4-g64" : "int8")});
    }
  }
}

}  // namespace

std::vector<Problem> CheckModelTensors(const ModelConfig& config, TensorForm form, const FindTensor& find,
                                       const std::string& dir, const std::string& prefix,
                                       const QuantBits* bits) {
  std::vector<Problem> out;
  for (const TensorTableEntry& e : K3TensorTable(config)) {
    const std::string full = prefix + e.name;
    std::optional<FoundTensor> l = find(full);
    if (!l) {
      out.push_back({ErrorCode::kNotFound, dir, full, -1, "tensor the model needs is missing"});
      continue;
    }
    const TensorInfo& t = *l->info;
    const bool float_form = e.kind == TensorKind::kFloat || (e.kind == TensorKind::kMatrix && form == TensorForm::kSnapshot);
    if (float_form) {
      if (!IsFloatReadable(t.dtype)) {
        out.push_back({ErrorCode::kUnsupported, l->file, full, l->offset,
                       "dtype " + Dt(t.dtype) + ", expected BF16/F16/F32"});
      }
      if (e.min_numel > 0) {
        if (t.numel() < static_cast<uint64_t>(e.min_numel)) {
          out.push_back({ErrorCode::kCorrupt, l->file, full, l->offset,
                         "shape " + ShapeString(t.shape) + ", expected at least " + std::to_string(e.min_numel) +
                             " elements"});
        }
      } else if (e.vector ? t.numel() != e.numel() : t.shape != e.shape) {
        out.push_back({ErrorCode::kCorrupt, l->file, full, l->offset,
                       "shape " + ShapeString(t.shape) + ", expected " + ShapeString(e.shape) +
                           (e.vector ? " (any shape of " + std::to_string(e.numel()) + " elements)" : "")});
      }
      continue;
    }
    if (e.kind == TensorKind::kExpert) {
      if (t.dtype != DType::kU8 || t.shape != e.shape) {
        out.push_back({ErrorCode::kCorrupt, l->file, full, l->offset,
                       Dt(t.dtype) + " " + ShapeString(t.shape) + ", expected U8 " + ShapeString(e.shape)});
      }
      continue;
    }
    CheckQuantized(e, full, *l, find, config, bits, out);
  }
  return out;
}

std::string ModelPrefix(const std::function<bool(const std::string&)>& has) {
  return has("language_model.model.layers.0.input_layernorm.weight") ||
                 has("language_model.model.embed_tokens.weight")
             ? "language_model."
             : "";
}

}  // namespace k3::repack
