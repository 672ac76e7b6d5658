// libFuzzer target for the safetensors header parser, the first code that touches
// an untrusted model file. Input: 8 bytes little-endian data-section size, then the
// header JSON. Any k3::Error is a correct refusal; a crash, a sanitizer report or a
// broken invariant on an accepted header is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "k3/container/safetensors.h"
#include "k3/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_bytes = 0;
  for (int i = 7; i >= 0; --i) data_bytes = (data_bytes << 8) | data[i];
  // Keep the size in a range where a valid header is plausible, so the fuzzer
  // spends its time past the offset checks rather than on "file too short".
  data_bytes %= uint64_t{1} << 20;
  std::string_view json(reinterpret_cast<const char*>(data) + 8, size - 8);
  try {
    k3::SafetensorsHeader h = k3::SafetensorsHeader::ParseOrThrow(json, data_bytes, "fuzz");
    // Invariants of an accepted header: offset-ordered, contiguous from 0 to the
    // end of the data section, sizes consistent, every name findable.
    uint64_t expect = 0;
    for (const k3::TensorInfo& t : h.tensors()) {
      K3_CHECK(t.begin == expect);
      K3_CHECK(t.end >= t.begin);
      K3_CHECK(t.numel() * k3::DTypeSize(t.dtype) == t.nbytes());
      K3_CHECK(h.Find(t.name) == &t);
      expect = t.end;
    }
    K3_CHECK(expect == data_bytes);
    K3_CHECK(h.data_offset() == 8 + json.size());
  } catch (const k3::Error& e) {
    K3_CHECK(e.code() != k3::ErrorCode::kOk && e.code() != k3::ErrorCode::kInternal);
  }
  return 0;
}
