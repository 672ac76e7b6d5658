// Kimi's pre-tokenizer regex rewritten for PCRE2 (docs/tokenizer.md explains each
// substitution and why it is equivalent to the fancy-regex original).
#pragma once

#include <string>

namespace k3::tok {

// Kimi's pattern exactly as tokenization_kimi.py / tiktoken compile it (uses the
// fancy-regex class intersection `&&`); kept for documentation and tests.
inline constexpr const char* kKimiPatternOriginal =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The same language for PCRE2 10.42 in UTF mode.
std::string KimiPcre2Pattern();

}  // namespace k3::tok
