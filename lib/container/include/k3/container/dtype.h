// Safetensors element types: names as they appear in headers, and sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace k3 {

enum class DType : uint8_t {
  kBool, kU8, kI8, kU16, kI16, kF16, kBF16, kU32, kI32, kF32, kU64, kI64, kF64,
  kF8E4M3, kF8E5M2, kF8E8M0,
};

std::optional<DType> ParseDType(std::string_view name);
std::string_view DTypeName(DType dtype);
size_t DTypeSize(DType dtype);
// True for dtypes the float readers convert (BF16, F16, F32).
bool IsFloatReadable(DType dtype);

}  // namespace k3
