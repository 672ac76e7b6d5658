#include "k3/core/json_writer.h"

#include <cmath>
#include <cstdio>

namespace k3 {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid.
size_t Utf8SeqLen(std::string_view s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) { n = 2; cp = c & 0x1f; }
  else if ((c & 0xf0) == 0xe0) { n = 3; cp = c & 0x0f; }
  else if ((c & 0xf8) == 0xf0) { n = 4; cp = c & 0x07; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
      cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
    return 0;
  }
  return n;
}

}  // namespace

void AppendJsonString(std::string& out, std::string_view s, InvalidUtf8 invalid) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 && invalid == InvalidUtf8::kReplace) {
      size_t n = Utf8SeqLen(s, i);
      if (n == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

void JsonWriter::Separator() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
}

JsonWriter& JsonWriter::BeginObject() { Separator(); out_ += '{'; first_.push_back(true); return *this; }
JsonWriter& JsonWriter::EndObject() { out_ += '}'; first_.pop_back(); return *this; }
JsonWriter& JsonWriter::BeginArray() { Separator(); out_ += '['; first_.push_back(true); return *this; }
JsonWriter& JsonWriter::EndArray() { out_ += ']'; first_.pop_back(); return *this; }

JsonWriter& JsonWriter::Key(std::string_view k) {
  Separator();
  AppendJsonString(out_, k);
  out_ += ':';
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(std::string_view v) { Separator(); AppendJsonString(out_, v); return *this; }
JsonWriter& JsonWriter::Int(int64_t v) { Separator(); out_ += std::to_string(v); return *this; }
JsonWriter& JsonWriter::Uint(uint64_t v) { Separator(); out_ += std::to_string(v); return *this; }
JsonWriter& JsonWriter::Bool(bool v) { Separator(); out_ += v ? "true" : "false"; return *this; }
JsonWriter& JsonWriter::Null() { Separator(); out_ += "null"; return *this; }
JsonWriter& JsonWriter::Raw(std::string_view json) { Separator(); out_.append(json); return *this; }

JsonWriter& JsonWriter::Double(double v) {
  Separator();
  if (!std::isfinite(v)) {
    out_ += "null";
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    out_ += buf;
  }
  return *this;
}

}  // namespace k3
