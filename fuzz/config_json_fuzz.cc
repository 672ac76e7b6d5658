// libFuzzer target: config.json, which sizes every table the loader, repack and
// verify build. Any k3::Error is a correct refusal; an accepted config must give
// a tensor table with one entry per name.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "k3/core/error.h"
#include "k3/model/config.h"
#include "k3/model/tensor_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  try {
    k3::ModelConfig c = k3::ModelConfig::ParseOrThrow(json, "fuzz/config.json");
    K3_CHECK(static_cast<int64_t>(c.is_kda.size()) == c.num_hidden_layers);
    // Only tables a test can afford (the real model's has ~500k entries).
    if (c.num_hidden_layers * (c.num_experts + 1) <= 4096) {
      std::set<std::string> names;
      for (const auto& t : k3::K3TensorTable(c)) K3_CHECK(names.insert(t.name).second);
    }
  } catch (const k3::Error& e) {
    K3_CHECK(e.code() != k3::ErrorCode::kOk && e.code() != k3::ErrorCode::kInternal);
  }
  return 0;
}
