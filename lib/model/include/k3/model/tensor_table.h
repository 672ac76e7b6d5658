// The K3 text model's tensors as config.json implies them (spec §3): names,
// kinds, release dtypes and shapes, in the one table that k3-repack (source
// pre-flight), k3-verify (container check), the weight loader and the fixture
// generator all read. Pure function of the config; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "k3/container/dtype.h"
#include "k3/model/config.h"

namespace k3 {

enum class TensorKind : uint8_t {
  kFloat,   // BF16/F16/F32 in a snapshot and in a container (norms, embeddings, gates)
  kMatrix,  // a 2-D float [O, I] in a snapshot; U8 + F32 ".qs" sidecar in a container
  kExpert,  // U8 MXFP4 packed / scale bytes, copied unchanged
};

struct TensorTableEntry {
  std::string name;  // without a "language_model." prefix
  TensorKind kind = TensorKind::kFloat;
  // What the release stores (and k3-fixture writes): BF16, F32 for the KDA
  // decay vectors and the router bias, U8 for the experts. Readers accept any
  // float dtype for kFloat / kMatrix (spec §3: small dtypes were not observable).
  DType dtype = DType::kBF16;
  // The release's shape: [O, I] for a matrix; the unit dimensions of [1, D]
  // vectors and [P, 1, K] conv taps included.
  std::vector<int64_t> shape;
  // Read as a flat vector: only the element count is enforced ([D] or [1, D],
  // [P, K] or [P, 1, K] are the same bytes; spec §13 open question 2).
  bool vector = false;
  // > 0: any element count >= this is accepted (A_log holds one value per
  // head; the release zero-pads it to head_dim).
  int64_t min_numel = 0;
  int64_t layer = -1;   // -1 for the globals
  int64_t expert = -1;  // kExpert: routed expert id
  int part = -1;        // kExpert: index into kExpertPartSuffix

  uint64_t numel() const;
};

// Leaf names of one routed expert's six tensors in container order (w1 < w2 <
// w3, packed < scale): w1 = gate and w3 = up map latent -> intermediate, w2 =
// down maps back.
inline constexpr std::string_view kExpertPartSuffix[6] = {
    "w1.weight_packed", "w1.weight_scale",  "w2.weight_packed",
    "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};

// Every tensor the text model needs: the globals, then per layer the common,
// attention and MLP tensors followed by the experts in id and part order.
std::vector<TensorTableEntry> K3TensorTable(const ModelConfig& c);

// The parts of one routed expert in container order with their U8 shapes:
// packed rows hold two E2M1 codes per byte, scale rows one E8M0 per 32 inputs.
struct ExpertPart {
  std::string_view suffix;  // kExpertPartSuffix[i]
  int64_t rows, cols;
};
std::vector<ExpertPart> ExpertParts(const ModelConfig& c);

}  // namespace k3
