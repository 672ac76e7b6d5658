// The K3 text model's tensors as config.json implies them (spec §3): names,
// kinds and logical shapes, in one table that k3-repack (source pre-flight) and
// k3-verify (container check) both read. Pure function of the config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "k3/model/config.h"

namespace k3 {

enum class TensorKind : uint8_t {
  kFloat,   // BF16/F16/F32 in a snapshot and in a container (norms, embeddings, gates)
  kMatrix,  // a 2-D float [O, I] in a snapshot; U8 + F32 ".qs" sidecar in a container
  kExpert,  // U8 MXFP4 packed / scale bytes, copied unchanged
};

struct TensorSpec {
  std::string name;            // without a "language_model." prefix
  TensorKind kind = TensorKind::kFloat;
  std::vector<int64_t> shape;  // logical shape ([O, I] for a matrix)
  bool at_least = false;       // numel >= product (A_log is padded to head_dim)
};

// Every tensor the text model needs, in layer order.
std::vector<TensorSpec> K3TensorTable(const ModelConfig& c);

// The parts of one routed expert in container order (w1 < w2 < w3, packed <
// scale) with their U8 shapes.
struct ExpertPart {
  const char* suffix;  // "w1.weight_packed", ...
  int64_t rows, cols;
};
std::vector<ExpertPart> ExpertParts(const ModelConfig& c);

}  // namespace k3
