#include "k3/container/dtype.h"

namespace k3 {
namespace {
struct DTypeRow {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeRow kRows[] = {
    {DType::kBool, "BOOL", 1},       {DType::kU8, "U8", 1},         {DType::kI8, "I8", 1},
    {DType::kU16, "U16", 2},         {DType::kI16, "I16", 2},       {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},       {DType::kU32, "U32", 4},       {DType::kI32, "I32", 4},
    {DType::kF32, "F32", 4},         {DType::kU64, "U64", 8},       {DType::kI64, "I64", 8},
    {DType::kF64, "F64", 8},         {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kF8E8M0, "F8_E8M0", 1},
};
}  // namespace

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& r : kRows) {
    if (r.name == name) return r.dtype;
  }
  return std::nullopt;
}

std::string_view DTypeName(DType dtype) { return kRows[static_cast<int>(dtype)].name; }
size_t DTypeSize(DType dtype) { return kRows[static_cast<int>(dtype)].size; }

bool IsFloatReadable(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32;
}

}  // namespace k3
