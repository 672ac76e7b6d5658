// The tensors config.json implies (k3::K3TensorTable) checked against what a
// snapshot or a container holds: one set of rules and messages, so k3-repack's
// pre-flight refuses a snapshot with exactly the problems k3-verify would report
// in the container made from it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "k3/container/safetensors.h"
#include "k3/model/config.h"
#include "k3/repack/classify.h"
#include "k3/repack/verify.h"

namespace k3::repack {

enum class TensorForm { kSnapshot, kContainer };

struct FoundTensor {
  std::string file;  // path of the file holding it
  int64_t offset = -1;
  const TensorInfo* info = nullptr;
};
// Looks a full tensor name up; nullopt when no file holds it.
using FindTensor = std::function<std::optional<FoundTensor>(const std::string&)>;

// `dir` names the tree in "missing" problems; `prefix` is "" or "language_model.".
// With `bits` (a container's fingerprint), int4 vs int8 is checked per class.
std::vector<Problem> CheckModelTensors(const ModelConfig& config, TensorForm form, const FindTensor& find,
                                       const std::string& dir, const std::string& prefix,
                                       const QuantBits* bits);

// "language_model." when the names carry the multimodal wrapper's prefix.
std::string ModelPrefix(const std::function<bool(const std::string&)>& has);

}  // namespace k3::repack
