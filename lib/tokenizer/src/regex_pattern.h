// Kimi's pre-tokenizer regex rewritten for PCRE2 (docs/tokenizer.md explains each
// substitution and why it is equivalent to the fancy-regex original).
#pragma once

#include <string>
#include <string_view>

namespace k3::tok {

// Kimi's pattern exactly as tokenization_kimi.py / tiktoken compile it (uses the
// fancy-regex class intersection `&&`); kept for documentation and tests.
inline constexpr const char* kKimiPatternOriginal =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The same language for PCRE2 10.42 in UTF mode. with_unicode16 adds the
// letters, marks and numbers Unicode 15.0-16.0 assigned (tiktoken's tables are
// Unicode 16, PCRE2 10.42's are 14); without it the pattern is faster and
// equivalent on any text for which NeedsUnicode16Pattern() is false.
std::string KimiPcre2Pattern(bool with_unicode16);
bool NeedsUnicode16Pattern(std::string_view valid_utf8);

}  // namespace k3::tok
