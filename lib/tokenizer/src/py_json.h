// JSON values as Python's json.loads builds them, and Python's str(), repr() and
// json.dumps of them: the data model Moonshot's encoding_k3.py renders from, so
// the XTML renderer can follow it exactly (integers of any size, NaN and
// Infinity, duplicate keys, str(None) == "None", ...). Private to lib/tokenizer.
//
// Values are plain data (copyable, thread-compatible). Parse never throws on
// text json.loads would refuse with JSONDecodeError (it returns false and a
// message); it throws k3::Error kInvalidArgument where Python raises another
// error instead (an integer of more than 4300 digits, nesting past kMaxDepth).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace k3::tok::py {

struct Value {
  enum class Kind : uint8_t { kNull, kBool, kInt, kFloat, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;   // kFloat
  std::string text;    // kInt: decimal digits as Python prints them; kString: UTF-8
  std::vector<Value> items;                           // kArray
  std::vector<std::pair<std::string, Value>> fields;  // kObject: unique keys, first-seen order

  bool is(Kind k) const { return kind == k; }
  bool is_null() const { return kind == Kind::kNull; }
  bool is_object() const { return kind == Kind::kObject; }
  bool is_array() const { return kind == Kind::kArray; }
  bool is_string() const { return kind == Kind::kString; }
  // Python `value == "literal"`: true only for a str with those bytes.
  bool Equals(std::string_view s) const { return kind == Kind::kString && text == s; }
  // dict.get(key): nullptr when absent or when this is not an object.
  const Value* Get(std::string_view key) const;
};

// Python's nesting limit is the interpreter's recursion limit (~1000); ours is
// lower so a hostile request cannot exhaust the stack.
inline constexpr int kMaxDepth = 512;
// Python refuses int(str) of more digits than this (sys.int_info.str_digits_check_threshold).
inline constexpr size_t kMaxIntDigits = 4300;

// json.loads(text). On a decode error returns false and sets `error` to
// "<what> at byte N".
bool Parse(std::string_view text, Value& out, std::string& error);

bool Truthy(const Value& v);                 // bool(v)
bool Truthy(const Value* v);                 // nullptr (absent) is falsy
std::string Str(const Value& v);             // str(v)
void AppendRepr(std::string& out, const Value& v);
// json.dumps(v, ensure_ascii=False[, sort_keys][, separators=(",", ":") if compact]).
void AppendDumps(std::string& out, const Value& v, bool sort_keys, bool compact);
// repr(float): shortest round-trip digits, Python's fixed/scientific switch.
void AppendPythonFloat(std::string& out, double v);

bool IsSpace(uint32_t cp);                   // str.isspace() of one code point
std::string_view Strip(std::string_view s);  // str.strip()

}  // namespace k3::tok::py
