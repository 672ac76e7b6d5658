// JSON Schema `pattern` -> a DFA over Unicode code points, for the string
// matcher (schema_internal.h) and the shortest-completion hint. The subset is
// the part of ECMA-262 (what JSON Schema specifies, ajv runs) and Python's `re`
// (what python-jsonschema runs) that both read the same way; docs/constrain.md
// lists it. Immutable once built; shared by the schema's nodes across threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace k3::constrain {

class CompileBudget;

// Caps that bound compile time and memory for hostile patterns (a pattern
// beyond them is refused, never approximated).
inline constexpr size_t kMaxPatternBytes = 4096;       // pattern text
inline constexpr size_t kMaxPatternNfaStates = 4096;   // after expanding {n,m}
inline constexpr size_t kMaxPatternDfaStates = 1024;   // subset construction
inline constexpr size_t kMaxPatternLengthBits = 1u << 24;  // DFA states x lengths table

// What the subset does not cover (CompilePattern's only exception); the
// schema compiler turns it into kUnsupported naming `pattern` and the pointer.
struct PatternRefused {
  std::string why;
};

struct PatternDfa {
  struct Edge {
    uint32_t lo, hi;  // inclusive code point range (never a surrogate)
    uint32_t to;
  };
  // Per state, edges sorted by lo; edges only to states that can still accept.
  std::vector<std::vector<Edge>> edges;
  std::vector<uint8_t> accept;
  // Accepting, and every code point leads back here: the rest of the string is free.
  std::vector<uint8_t> free;
  // State 0 is the start. A state with no way to acceptance has no edges in.
  //
  // Lengths: reach[s] holds bit L (L < table_len) when some string of exactly L
  // code points leads from s to acceptance. With the node's length bounds this
  // decides whether a prefix can finish (Viable) and how soon (BestLen).
  uint32_t min_len = 0, max_len = 0;  // the string node's bounds (max: kUnbounded)
  uint32_t table_len = 0;
  size_t words = 0;
  std::vector<uint64_t> reach;

  // The target of code point cp from state s, or -1.
  int32_t Next(uint32_t s, uint32_t cp) const;
  // Some completion from state s, after `count` code points, has an accepted
  // total length within [min_len, max_len].
  bool Viable(uint32_t s, uint32_t count) const { return BestLen(s, count) >= 0; }
  // The fewest code points still needed from s after `count` ones, or -1.
  int64_t BestLen(uint32_t s, uint32_t count) const;
  // About the memory the automaton holds.
  size_t bytes() const;
};

// Compiles `pattern` (UTF-8, as decoded from the schema's JSON) for strings of
// min_len..max_len code points (max_len may be kUnbounded). Throws
// PatternRefused for syntax outside the subset or past the caps. relax: a
// superset of the pattern where it uses lookaround, \b/\B, misplaced anchors
// (all left out: they only restrict), \p{..} (any code point), backreferences
// (any text) or named groups (plain groups); *left_out then names them.
// budget: the request's, charged as the automaton is built (k3::Error past it).
std::shared_ptr<const PatternDfa> CompilePattern(std::string_view pattern, uint32_t min_len,
                                                 uint32_t max_len, bool relax = false,
                                                 std::string* left_out = nullptr,
                                                 CompileBudget* budget = nullptr);

// Strings both accept (an allOf of patterns, a pattern with a format), with
// the length table for min_len..max_len. Throws PatternRefused past the caps.
std::shared_ptr<const PatternDfa> IntersectPatterns(const PatternDfa& a, const PatternDfa& b,
                                                    uint32_t min_len, uint32_t max_len,
                                                    CompileBudget* budget = nullptr);

}  // namespace k3::constrain
