// Python's json.loads / json.dumps / str / repr for the XTML renderer. The rules
// are CPython 3.12's (Lib/json/decoder.py, Modules/_json.c, Objects/unicodeobject.c
// unicode_repr), restated; see py_json.h.
#include "py_json.h"

#include <cerrno>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "k3/core/error.h"
#include "k3/core/json_writer.h"

namespace k3::tok::py {
namespace {

// Decodes one UTF-8 code point at s[i] (advancing i); an invalid byte is
// returned as 0xFFFFFFFF and consumed alone.
uint32_t NextCp(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || i + n > s.size()) { ++i; return 0xFFFFFFFFu; }
  uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
  for (size_t k = 1; k < n; ++k) {
    auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) { ++i; return 0xFFFFFFFFu; }
    cp = (cp << 6) | (c & 0x3Fu);
  }
  i += n;
  return cp;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  // Lone surrogates are kept as their 3-byte form, as a Python str keeps them.
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  bool Run(Value& out, std::string& error) {
    if (s_.starts_with("\xEF\xBB\xBF")) return Fail(error, "Unexpected UTF-8 BOM", 0);
    SkipWs();
    if (!ParseValue(out, 0)) return Fail(error, what_, at_);
    SkipWs();
    if (i_ != s_.size()) return Fail(error, "Extra data", i_);
    return true;
  }

 private:
  static bool Fail(std::string& error, const std::string& what, size_t at) {
    error = what + " at byte " + std::to_string(at);
    return false;
  }
  bool Err(const char* what, size_t at) {
    what_ = what;
    at_ = at;
    return false;
  }
  void SkipWs() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool Literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  bool ParseValue(Value& v, int depth) {
    if (i_ >= s_.size()) return Err("Expecting value", i_);
    char c = s_[i_];
    if (c == '"') {
      v.kind = Value::Kind::kString;
      return ParseString(v.text);
    }
    if (c == '{' || c == '[') {
      if (depth >= kMaxDepth) {
        throw Error(ErrorCode::kInvalidArgument,
                    "JSON nested deeper than " + std::to_string(kMaxDepth) + " levels at byte " + std::to_string(i_));
      }
      return c == '{' ? ParseObject(v, depth + 1) : ParseArray(v, depth + 1);
    }
    if (Literal("null")) { v.kind = Value::Kind::kNull; return true; }
    if (Literal("true")) { v.kind = Value::Kind::kBool; v.boolean = true; return true; }
    if (Literal("false")) { v.kind = Value::Kind::kBool; v.boolean = false; return true; }
    if (Literal("NaN")) { v.kind = Value::Kind::kFloat; v.number = __builtin_nan(""); return true; }
    if (Literal("Infinity")) { v.kind = Value::Kind::kFloat; v.number = __builtin_inf(); return true; }
    if (Literal("-Infinity")) { v.kind = Value::Kind::kFloat; v.number = -__builtin_inf(); return true; }
    return ParseNumber(v);
  }

  // -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?  (Python's NUMBER_RE; a '.' or 'e' not
  // followed by digits ends the number before it, and the rest is "Extra data").
  bool ParseNumber(Value& v) {
    size_t start = i_, j = i_;
    auto digit = [&](size_t k) { return k < s_.size() && s_[k] >= '0' && s_[k] <= '9'; };
    if (j < s_.size() && s_[j] == '-') ++j;
    if (!digit(j)) return Err("Expecting value", start);
    if (s_[j] == '0') {
      ++j;
    } else {
      while (digit(j)) ++j;
    }
    size_t int_end = j;
    bool is_float = false;
    if (j < s_.size() && s_[j] == '.' && digit(j + 1)) {
      j += 1;
      while (digit(j)) ++j;
      is_float = true;
    }
    if (j < s_.size() && (s_[j] == 'e' || s_[j] == 'E')) {
      size_t k = j + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      if (digit(k)) {
        while (digit(k)) ++k;
        j = k;
        is_float = true;
      }
    }
    std::string lit(s_.substr(start, j - start));
    i_ = j;
    if (is_float) {
      v.kind = Value::Kind::kFloat;
      v.number = std::strtod(lit.c_str(), nullptr);  // correctly rounded; ERANGE gives inf / 0 like float()
      return true;
    }
    size_t digits = int_end - start - (lit[0] == '-' ? 1 : 0);
    if (digits > kMaxIntDigits) {
      throw Error(ErrorCode::kInvalidArgument, "JSON integer of " + std::to_string(digits) +
                                                   " digits at byte " + std::to_string(start) +
                                                   " exceeds Python's limit of 4300 digits");
    }
    v.kind = Value::Kind::kInt;
    v.text = lit == "-0" ? "0" : lit;
    return true;
  }

  bool Hex4(size_t at, uint32_t& out) {
    if (at + 4 > s_.size()) return false;
    out = 0;
    for (size_t k = 0; k < 4; ++k) {
      char c = s_[at + k];
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return false;
      out = out * 16 + uint32_t(d);
    }
    return true;
  }

  bool ParseString(std::string& out) {
    size_t start = i_++;
    while (true) {
      if (i_ >= s_.size()) return Err("Unterminated string starting", start);
      auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') { ++i_; return true; }
      if (c < 0x20) return Err("Invalid control character", i_);
      if (c != '\\') { out += char(c); ++i_; continue; }
      if (i_ + 1 >= s_.size()) return Err("Unterminated string starting", start);
      char e = s_[i_ + 1];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(i_ + 2, cp)) return Err("Invalid \\uXXXX escape", i_ + 1);
          i_ += 6;
          uint32_t low;
          if (cp >= 0xD800 && cp <= 0xDBFF && s_.substr(i_, 2) == "\\u" && Hex4(i_ + 2, low) && low >= 0xDC00 &&
              low <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            i_ += 6;
          }
          AppendUtf8(out, cp);
          continue;
        }
        default: return Err("Invalid \\escape", i_);
      }
      i_ += 2;
    }
  }

  bool ParseArray(Value& v, int depth) {
    v.kind = Value::Kind::kArray;
    ++i_;
    SkipWs();
    if (i_ < s_.size() && s_[i_] == ']') { ++i_; return true; }
    while (true) {
      SkipWs();
      Value item;
      if (!ParseValue(item, depth)) return false;
      v.items.push_back(std::move(item));
      SkipWs();
      if (i_ < s_.size() && s_[i_] == ']') { ++i_; return true; }
      if (i_ >= s_.size() || s_[i_] != ',') return Err("Expecting ',' delimiter", i_);
      ++i_;
    }
  }

  bool ParseObject(Value& v, int depth) {
    v.kind = Value::Kind::kObject;
    ++i_;
    SkipWs();
    if (i_ < s_.size() && s_[i_] == '}') { ++i_; return true; }
    std::unordered_map<std::string, size_t> seen;
    while (true) {
      SkipWs();
      if (i_ >= s_.size() || s_[i_] != '"') {
        return Err("Expecting property name enclosed in double quotes", i_);
      }
      std::string key;
      if (!ParseString(key)) return false;
      SkipWs();
      if (i_ >= s_.size() || s_[i_] != ':') return Err("Expecting ':' delimiter", i_);
      ++i_;
      SkipWs();
      Value item;
      if (!ParseValue(item, depth)) return false;
      // A dict keeps the first key's position and the last value.
      if (auto it = seen.find(key); it != seen.end()) {
        v.fields[it->second].second = std::move(item);
      } else {
        seen.emplace(key, v.fields.size());
        v.fields.emplace_back(std::move(key), std::move(item));
      }
      SkipWs();
      if (i_ < s_.size() && s_[i_] == '}') { ++i_; return true; }
      if (i_ >= s_.size() || s_[i_] != ',') return Err("Expecting ',' delimiter", i_);
      ++i_;
    }
  }

  std::string_view s_;
  size_t i_ = 0;
  const char* what_ = "";
  size_t at_ = 0;
};

// str.isprintable() for one non-ASCII code point. Exact for the separators,
// format characters and private-use / surrogate ranges a request may carry;
// unassigned code points (not printable in Python) are treated as printable.
bool IsPrintableNonAscii(uint32_t cp) {
  if (cp <= 0xA0 || cp == 0xAD) return false;
  if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F || cp == 0x890 ||
      cp == 0x891 || cp == 0x8E2 || cp == 0x1680 || cp == 0x180E)
    return false;
  if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x2064) ||
      (cp >= 0x2066 && cp <= 0x206F) || cp == 0x3000)
    return false;
  if ((cp >= 0xD800 && cp <= 0xF8FF) || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB) || cp == 0xFFFE ||
      cp == 0xFFFF)
    return false;
  if (cp == 0x110BD || cp == 0x110CD || (cp >= 0x13430 && cp <= 0x1343F) || (cp >= 0x1BCA0 && cp <= 0x1BCA3) ||
      (cp >= 0x1D173 && cp <= 0x1D17A) || cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F) || cp >= 0xF0000)
    return false;
  return true;
}

void AppendStringRepr(std::string& out, std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos, has_double = s.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    uint32_t cp = NextCp(s, i);
    char buf[16];
    if (cp == uint32_t(quote) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(cp));
      out += buf;
    } else if (cp < 0x7F || cp == 0xFFFFFFFFu) {
      out.append(s.substr(at, i - at));  // ASCII, or a byte no Python str holds: as is
    } else if (IsPrintableNonAscii(cp)) {
      out.append(s.substr(at, i - at));
    } else {
      std::snprintf(buf, sizeof buf, cp <= 0xFF ? "\\x%02x" : cp <= 0xFFFF ? "\\u%04x" : "\\U%08x", unsigned(cp));
      out += buf;
    }
  }
  out += quote;
}

}  // namespace

const Value* Value::Get(std::string_view key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& [k, v] : fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Parse(std::string_view text, Value& out, std::string& error) {
  out = Value{};
  return Parser(text).Run(out, error);
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kNull: return false;
    case Value::Kind::kBool: return v.boolean;
    case Value::Kind::kInt: return v.text != "0";
    case Value::Kind::kFloat: return v.number != 0;
    case Value::Kind::kString: return !v.text.empty();
    case Value::Kind::kArray: return !v.items.empty();
    case Value::Kind::kObject: return !v.fields.empty();
  }
  return false;
}

bool Truthy(const Value* v) { return v != nullptr && Truthy(*v); }

void AppendPythonFloat(std::string& out, double v) {
  if (v != v) { out += "NaN"; return; }
  if (v == __builtin_inf()) { out += "Infinity"; return; }
  if (v == -__builtin_inf()) { out += "-Infinity"; return; }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') { sign = "-"; sci.erase(0, 1); }
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant) if (c != '.') digits += c;
  out += sign;
  // repr(float): fixed notation for decimal exponents -4..15, scientific outside.
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (digits.size() <= size_t(exp) + 1) {
        out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
}

void AppendRepr(std::string& out, const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString: AppendStringRepr(out, v.text); return;
    case Value::Kind::kArray: {
      out += '[';
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += ", ";
        AppendRepr(out, v.items[i]);
      }
      out += ']';
      return;
    }
    case Value::Kind::kObject: {
      out += '{';
      for (size_t i = 0; i < v.fields.size(); ++i) {
        if (i) out += ", ";
        AppendStringRepr(out, v.fields[i].first);
        out += ": ";
        AppendRepr(out, v.fields[i].second);
      }
      out += '}';
      return;
    }
    default: out += Str(v); return;
  }
}

std::string Str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kNull: return "None";
    case Value::Kind::kBool: return v.boolean ? "True" : "False";
    case Value::Kind::kInt:
    case Value::Kind::kString: return v.text;
    case Value::Kind::kFloat: {
      // str(float) is repr(float) except that inf and nan print as Python names.
      if (v.number != v.number) return "nan";
      if (v.number == __builtin_inf()) return "inf";
      if (v.number == -__builtin_inf()) return "-inf";
      std::string out;
      AppendPythonFloat(out, v.number);
      return out;
    }
    case Value::Kind::kArray:
    case Value::Kind::kObject: {
      std::string out;
      AppendRepr(out, v);
      return out;
    }
  }
  return {};
}

void AppendDumps(std::string& out, const Value& v, bool sort_keys, bool compact) {
  const char* item_sep = compact ? "," : ", ";
  const char* key_sep = compact ? ":" : ": ";
  switch (v.kind) {
    case Value::Kind::kNull: out += "null"; return;
    case Value::Kind::kBool: out += v.boolean ? "true" : "false"; return;
    case Value::Kind::kInt: out += v.text; return;
    case Value::Kind::kFloat: AppendPythonFloat(out, v.number); return;
    case Value::Kind::kString: AppendJsonString(out, v.text, InvalidUtf8::kPassThrough); return;
    case Value::Kind::kArray:
      out += '[';
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += item_sep;
        AppendDumps(out, v.items[i], sort_keys, compact);
      }
      out += ']';
      return;
    case Value::Kind::kObject: {
      std::vector<const std::pair<std::string, Value>*> fields;
      for (const auto& f : v.fields) fields.push_back(&f);
      // Keys are unique, and UTF-8 byte order is code point order (Python's).
      if (sort_keys) std::sort(fields.begin(), fields.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < fields.size(); ++i) {
        if (i) out += item_sep;
        AppendJsonString(out, fields[i]->first, InvalidUtf8::kPassThrough);
        out += key_sep;
        AppendDumps(out, fields[i]->second, sort_keys, compact);
      }
      out += '}';
      return;
    }
  }
}

bool IsSpace(uint32_t cp) {
  if (cp <= 0x20) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string_view Strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t next = begin;
    if (!IsSpace(NextCp(s, next))) break;
    begin = next;
  }
  size_t end = begin;
  // The last non-space code point's end, scanning forward (UTF-8 is not
  // reliably decodable backwards when bytes are invalid).
  for (size_t i = begin; i < s.size();) {
    uint32_t cp = NextCp(s, i);
    if (!IsSpace(cp)) end = i;
  }
  return s.substr(begin, end - begin);
}

}  // namespace k3::tok::py
