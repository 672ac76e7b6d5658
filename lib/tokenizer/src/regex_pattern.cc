// PCRE2 spelling of Kimi's pre-tokenizer regex.
#include "regex_pattern.h"

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

std::string KimiPcre2Pattern() {
  const std::string han = kHan, sp = kSpace;
  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]: PCRE2 10.42 has no class
  // intersection, but the general categories partition the code space, so
  // "Lu|Lt|Lm|Lo|M and not Han" is "not (Ll|N|P|S|Z|C or Han)": one negated
  // class, no per-character lookahead.
  const std::string upper = "[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}" + han + "]";
  // [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] likewise.
  const std::string lower = "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}" + han + "]";
  const std::string prefix = "[^\\r\\n\\p{L}\\p{N}]?";
  const std::string contraction = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
  const std::string s = "[" + sp + "]", not_s = "[^" + sp + "]";
  std::string p;
  p += "[" + han + "]+";
  p += "|" + prefix + upper + "*" + lower + "+" + contraction;
  p += "|" + prefix + upper + "+" + lower + "*" + contraction;
  p += "|\\p{N}{1,3}";
  p += "| ?[^" + sp + "\\p{L}\\p{N}]+[\\r\\n]*";
  p += "|" + s + "*[\\r\\n]+";
  p += "|" + s + "+(?!" + not_s + ")";
  p += "|" + s + "+";
  return p;
}

}  // namespace k3::tok
