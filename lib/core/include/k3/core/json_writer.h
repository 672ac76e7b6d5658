// A small streaming JSON writer for headers, --json events and reports.
// Produces compact JSON (no spaces). Not thread-safe; one writer per document.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace k3 {

// What AppendJsonString does with bytes >= 0x80 that are not valid UTF-8.
enum class InvalidUtf8 {
  kReplace,      // write \ufffd, so the output is always valid JSON
  kPassThrough,  // copy the bytes as they are (Python's ensure_ascii=False)
};

// Appends `s` to `out` as a JSON string literal (quotes included). Control bytes
// are escaped; non-ASCII is kept as UTF-8. By default, bytes that are not valid
// UTF-8 are written as \ufffd escapes so output is always valid JSON.
void AppendJsonString(std::string& out, std::string_view s,
                      InvalidUtf8 invalid = InvalidUtf8::kReplace);

class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(std::string_view k);
  JsonWriter& String(std::string_view v);
  JsonWriter& Int(int64_t v);
  JsonWriter& Uint(uint64_t v);
  JsonWriter& Double(double v);  // %.17g; NaN/inf become null
  JsonWriter& Bool(bool v);
  JsonWriter& Null();
  JsonWriter& Raw(std::string_view json);  // a pre-rendered value

  // Shorthands for "key": value.
  template <typename T>
  JsonWriter& Field(std::string_view k, const T& v);

  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void Separator();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element yet
  bool after_key_ = false;
};

template <typename T>
JsonWriter& JsonWriter::Field(std::string_view k, const T& v) {
  Key(k);
  if constexpr (std::is_same_v<T, bool>) return Bool(v);
  else if constexpr (std::is_floating_point_v<T>) return Double(v);
  else if constexpr (std::is_signed_v<T> && std::is_integral_v<T>) return Int(v);
  else if constexpr (std::is_unsigned_v<T> && std::is_integral_v<T>) return Uint(v);
  else return String(std::string_view(v));
}

}  // namespace k3
