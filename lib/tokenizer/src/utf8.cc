// UTF-8 validation, repair and streaming reassembly (tokenizer.h).
#include <cstdint>
#include <string>
#include <string_view>

#include "k3/tokenizer/tokenizer.h"

namespace k3::tok {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the well-formed prefix of a sequence starting at s[0] (Unicode
// Table 3-7): returns {consumed, complete}. complete=false with consumed==n means
// the bytes so far are a valid but unfinished prefix (only possible at the end).
struct Step {
  size_t consumed;  // bytes that belong to this (possibly ill-formed) unit
  bool valid;       // a whole well-formed character
  bool truncated;   // a well-formed prefix cut by the end of input
};

Step NextUnit(const unsigned char* s, size_t n) {
  unsigned char b = s[0];
  if (b < 0x80) return {1, true, false};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {1, false, false};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (k >= n) return {k, false, true};
    unsigned char c = s[k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return {k, false, false};  // maximal subpart ends before c
  }
  return {need + 1, true, false};
}

}  // namespace

bool IsValidUtf8(std::string_view bytes) {
  auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size(), i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    Step st = NextUnit(s + i, n - i);
    if (!st.valid) return false;
    i += st.consumed;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view bytes) {
  if (IsValidUtf8(bytes)) return std::string(bytes);
  auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size(), i = 0;
  std::string out;
  out.reserve(n + 16);
  while (i < n) {
    Step st = NextUnit(s + i, n - i);
    if (st.valid) {
      out.append(bytes.substr(i, st.consumed));
    } else {
      out.append(kReplacement);
    }
    i += st.consumed;
  }
  return out;
}

std::string Utf8StreamDecoder::Push(std::string_view bytes) {
  pending_.append(bytes);
  auto* s = reinterpret_cast<const unsigned char*>(pending_.data());
  size_t n = pending_.size(), i = 0;
  std::string out;
  out.reserve(n);
  while (i < n) {
    Step st = NextUnit(s + i, n - i);
    if (st.truncated) break;  // wait for the rest of the character
    if (st.valid) {
      out.append(pending_, i, st.consumed);
    } else {
      out.append(kReplacement);
    }
    i += st.consumed;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8StreamDecoder::Flush() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace k3::tok
