// PCRE2 spelling of Kimi's pre-tokenizer regex.
#include "regex_pattern.h"

#include <cstdint>
#include <iterator>

#include "unicode16_delta.inc"

namespace k3::tok {
namespace {

// Script=Han as Unicode 15.1 assigns it (what tiktoken's Rust regex tables use).
// Spelled out instead of \p{sc:Han} so PCRE2's older Unicode tables (14.0 in
// 10.42) cannot drop the CJK extension blocks added since; PCRE2's bare \p{Han}
// would be worse still: it means Script_Extensions there and matches U+3001 (、).
constexpr const char* kHan =
    "\\x{2E80}-\\x{2E99}\\x{2E9B}-\\x{2EF3}\\x{2F00}-\\x{2FD5}\\x{3005}\\x{3007}"
    "\\x{3021}-\\x{3029}\\x{3038}-\\x{303B}\\x{3400}-\\x{4DBF}\\x{4E00}-\\x{9FFF}"
    "\\x{F900}-\\x{FA6D}\\x{FA70}-\\x{FAD9}\\x{16FE2}-\\x{16FE3}\\x{16FF0}-\\x{16FF1}"
    "\\x{20000}-\\x{2A6DF}\\x{2A700}-\\x{2B739}\\x{2B740}-\\x{2B81D}\\x{2B820}-\\x{2CEA1}"
    "\\x{2CEB0}-\\x{2EBE0}\\x{2EBF0}-\\x{2EE5D}\\x{2F800}-\\x{2FA1D}\\x{30000}-\\x{3134A}"
    "\\x{31350}-\\x{323AF}";

// Rust regex's Unicode \s is the White_Space property. PCRE2's \s differs (it
// omits U+0085 and follows Zs), so the set is listed.
constexpr const char* kSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

}  // namespace

std::string KimiPcre2Pattern(bool with_unicode16) {
  const std::string han = kHan, sp = kSpace;
  // PCRE2 10.42 knows Unicode 14; tiktoken's regex knows Unicode 16. The
  // letters, marks and numbers assigned in between are added explicitly
  // (unicode16_delta.inc), so text in those scripts splits as tiktoken splits it.
  // That costs ~30% speed, so it is a second pattern, used only for text that
  // holds such a character (NeedsUnicode16Pattern); elsewhere both agree.
  const std::string letter_or_number =
      std::string("\\p{L}\\p{N}") + (with_unicode16 ? K3_U16_DELTA_L K3_U16_DELTA_N : "");
  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]: PCRE2 10.42 has no class
  // intersection, but the general categories partition the code space, so
  // "Lu|Lt|Lm|Lo|M and not Han" is "not (Ll|N|P|S|Z|C or Han)": one negated
  // class, no per-character lookahead. The Unicode 16 additions are Cn (so in
  // \p{C}) for PCRE2 and join through a second branch, tried only for Cn.
  std::string upper = "[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}" + han + "]";
  if (with_unicode16) upper = "(?:" + upper + "|(?=\\p{Cn})[" K3_U16_DELTA_UPPER "])";
  // [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] likewise.
  std::string lower = "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}" + han + "]";
  if (with_unicode16) lower = "(?:" + lower + "|(?=\\p{Cn})[" K3_U16_DELTA_LOWER "])";
  const std::string prefix = "[^\\r\\n" + letter_or_number + "]?";
  const std::string contraction = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
  const std::string s = "[" + sp + "]", not_s = "[^" + sp + "]";
  std::string p;
  p += "[" + han + "]+";
  p += "|" + prefix + upper + "*" + lower + "+" + contraction;
  p += "|" + prefix + upper + "+" + lower + "*" + contraction;
  p += std::string("|[\\p{N}") + (with_unicode16 ? K3_U16_DELTA_N : "") + "]{1,3}";
  p += "| ?[^" + sp + letter_or_number + "]+[\\r\\n]*";
  p += "|" + s + "*[\\r\\n]+";
  p += "|" + s + "+(?!" + not_s + ")";
  p += "|" + s + "+";
  return p;
}

bool NeedsUnicode16Pattern(std::string_view text) {
  static constexpr uint32_t kRanges[][2] = {K3_U16_DELTA_RANGES};
  auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size(), i = 0;
  while (i < n) {
    // Every delta code point is >= U+0897: a 3- or 4-byte sequence.
    if (s[i] < 0xE0) {
      ++i;
      continue;
    }
    uint32_t cp;
    if (s[i] < 0xF0) {
      if (i + 2 >= n) break;
      cp = ((s[i] & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu);
      i += 3;
    } else {
      if (i + 3 >= n) break;
      cp = ((s[i] & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3Fu);
      i += 4;
    }
    if (cp < kRanges[0][0]) continue;
    size_t lo = 0, hi = std::size(kRanges);
    while (lo < hi) {  // first range whose end is >= cp
      size_t mid = (lo + hi) / 2;
      if (kRanges[mid][1] < cp) lo = mid + 1;
      else hi = mid;
    }
    if (lo < std::size(kRanges) && kRanges[lo][0] <= cp) return true;
  }
  return false;
}

}  // namespace k3::tok
