// The compiled schema's nodes and the byte-level string lexer that the schema
// matcher and the vocabulary's precomputed string tables share.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "k3/constrain/constrain.h"
#include "regex.h"

namespace k3::constrain {

enum class NodeKind : uint8_t {
  kObject,    // '{' ... '}' with declared properties, free keys (map_value), or both
  kArray,     // '[' items ']'
  kString,    // '"' ... '"' with optional length bounds (code points)
  kNumber,    // JSON number; integer-only and bounds optional
  kLiterals,  // one of a few compact JSON texts (enum, const, true/false/null)
  kUnion,     // alternatives tracked in parallel (anyOf, oneOf, type lists)
};

// How many times a recursive $ref may be expanded inside its own expansion;
// one more is the schema false (docs/constrain.md, "$ref"). Beside the other
// limits of constrain.h, kept here so that the public header stays as it is.
inline constexpr int kMaxRefRecursion = 4;

// Integer bounds are exact within int64; an integer needs at most this many
// digits (10^18 - 1 < 2^63) to meet them.
inline constexpr int kMaxBoundIntDigits = 18;

inline constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();
inline constexpr int32_t kNoNode = -1;

struct Property {
  std::string key;  // the key's bytes between the quotes, as generated (compact escapes)
  uint32_t child = 0;
  bool required = false;
};

struct SchemaNode {
  NodeKind kind = NodeKind::kLiterals;
  // kObject
  std::vector<Property> props;
  uint64_t required_mask = 0;
  int32_t map_value = kNoNode;  // free keys with values of this node (additionalProperties)
  uint32_t key_node = 0;        // the free-key string node (map_value set)
  // Free keys beside declared ones: every key a free key must differ from (the
  // declared keys as generated, those whose schema is false or cut included).
  std::vector<std::string> reserved;
  uint32_t min_props = 0, max_props = kUnbounded;  // minProperties / maxProperties
  // kArray
  uint32_t items = 0;            // items after the tuple's
  std::vector<uint32_t> prefix;  // a tuple's positions (prefixItems / array-form items)
  uint32_t min_items = 0, max_items = kUnbounded;
  bool unique = false;  // uniqueItems over literal items: Frame::bits holds the values used
  // kString
  uint32_t min_len = 0, max_len = kUnbounded;
  // A free key of object node key_of beside its declared keys: written without
  // escapes (so its bytes are its value) and never equal to a reserved key.
  int32_t key_of = kNoNode;
  // `pattern`: the DFA the decoded code points must lead to acceptance (its
  // length table is for this node's min_len / max_len). Frame::bits holds the
  // DFA state, Frame::bits2 the code point decoded so far (matcher.cc).
  std::shared_ptr<const PatternDfa> pattern;
  // The pattern includes a `format`'s (validators do not assert format by
  // default, so k3's language is narrower than theirs here).
  bool format_narrowed = false;
  // kNumber
  bool integer = false;
  // multipleOf (integer nodes only): every value is a multiple of it; 0 = none.
  int64_t multiple = 0;
  bool bounded = false;  // any of the four bounds present
  // Integer digits generated: kMaxIntDigits, or up to kMaxBoundIntDigits when
  // the bounds leave no integer of fewer digits (e.g. minimum 1e16).
  uint8_t int_digits = kMaxIntDigits;
  // integer: inclusive integer bounds; number: double bounds with exclusivity
  int64_t ilo = std::numeric_limits<int64_t>::min(), ihi = std::numeric_limits<int64_t>::max();
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_excl = false, hi_excl = false;
  // kLiterals: each value's compact JSON text, its Python json.dumps form
  // (", " and ": " separators), and for strings the raw value (no quotes or
  // escapes; empty with raw_ok false for other types)
  std::vector<std::string> literals, literals_py, literals_raw;
  bool raw_ok = false;  // every literal is a string
  // kUnion: the alternatives (never unions themselves; literal ones merged)
  std::vector<uint32_t> alts;
  // every kind: the bytes a value of this node may start with
  std::array<bool, 256> first{};
  // the same as bits (byte b: bit b % 64 of word b / 64), set once compiled
  std::array<uint64_t, 4> first_bits{};
};

struct CompiledSchema::Impl {
  std::vector<SchemaNode> nodes;
  uint32_t root = 0;
  std::vector<Relaxation> relaxations;  // non-strict compiles only
  size_t bytes = 0;                     // CompiledSchema::bytes()
};

// About the memory a node holds beyond its pattern automaton (the budget's
// and the cache's measure).
size_t NodeBytes(const SchemaNode& n);

// ---- string lexer (inside the quotes) ----
// States 0..7 carry no escape in progress ("plain" states; the vocabulary keeps
// a token set per plain state); 8.. are escape states.
enum StrLex : uint8_t {
  kStrPlain = 0,
  kStrU1,     // one continuation byte 80..BF left
  kStrU2,     // two left, the first 80..BF
  kStrU2E0,   // after E0: A0..BF then one more
  kStrU2ED,   // after ED: 80..9F (no surrogates) then one more
  kStrU3,     // after F1..F3: three left
  kStrU3F0,   // after F0: 90..BF then two more
  kStrU3F4,   // after F4: 80..8F then two more
  kNumPlainStrLex,
  kStrEsc = kNumPlainStrLex,  // after '\'
  kStrHex0, kStrHex1, kStrHex2, kStrHex3,  // \u and 0..3 hex digits
  kStrLowBackslash,  // after a high surrogate: '\' must follow
  kStrLowU,          // then 'u'
  kStrLowHex0, kStrLowHex1, kStrLowHex2, kStrLowHex3,
};

struct StrLexState {
  uint8_t lex = kStrPlain;
  uint16_t hex = 0;  // \uXXXX accumulator
};

enum class StrStep : int8_t { kFail = -1, kMore = 0, kNewChar = 1, kClose = 2 };

// One byte inside a JSON string. kNewChar: a code point starts at this byte
// (what maxLength counts; a surrogate pair counts once). kClose: the closing
// quote (only in kStrPlain). `raw`: a raw string (no quotes, no escapes: any
// valid UTF-8 but control characters other than tab, LF and CR).
inline StrStep StrLexStep(StrLexState& s, uint8_t b, bool raw = false) {
  auto hexval = [](uint8_t c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  switch (s.lex) {
    case kStrPlain:
      if (raw) {
        if (b < 0x20 && b != '\t' && b != '\n' && b != '\r') return StrStep::kFail;
        if (b < 0x80) return StrStep::kNewChar;
      }
      if (b == '"') return StrStep::kClose;
      if (b == '\\') { s.lex = kStrEsc; return StrStep::kNewChar; }
      if (b < 0x20) return StrStep::kFail;
      if (b < 0x80) return StrStep::kNewChar;
      if (b >= 0xC2 && b <= 0xDF) { s.lex = kStrU1; return StrStep::kNewChar; }
      if (b == 0xE0) { s.lex = kStrU2E0; return StrStep::kNewChar; }
      if (b == 0xED) { s.lex = kStrU2ED; return StrStep::kNewChar; }
      if (b >= 0xE1 && b <= 0xEF) { s.lex = kStrU2; return StrStep::kNewChar; }
      if (b == 0xF0) { s.lex = kStrU3F0; return StrStep::kNewChar; }
      if (b >= 0xF1 && b <= 0xF3) { s.lex = kStrU3; return StrStep::kNewChar; }
      if (b == 0xF4) { s.lex = kStrU3F4; return StrStep::kNewChar; }
      return StrStep::kFail;
    case kStrU1:
      if (b < 0x80 || b > 0xBF) return StrStep::kFail;
      s.lex = kStrPlain; return StrStep::kMore;
    case kStrU2:
      if (b < 0x80 || b > 0xBF) return StrStep::kFail;
      s.lex = kStrU1; return StrStep::kMore;
    case kStrU2E0:
      if (b < 0xA0 || b > 0xBF) return StrStep::kFail;
      s.lex = kStrU1; return StrStep::kMore;
    case kStrU2ED:
      if (b < 0x80 || b > 0x9F) return StrStep::kFail;
      s.lex = kStrU1; return StrStep::kMore;
    case kStrU3:
      if (b < 0x80 || b > 0xBF) return StrStep::kFail;
      s.lex = kStrU2; return StrStep::kMore;
    case kStrU3F0:
      if (b < 0x90 || b > 0xBF) return StrStep::kFail;
      s.lex = kStrU2; return StrStep::kMore;
    case kStrU3F4:
      if (b < 0x80 || b > 0x8F) return StrStep::kFail;
      s.lex = kStrU2; return StrStep::kMore;
    case kStrEsc:
      switch (b) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
          s.lex = kStrPlain; return StrStep::kMore;
        case 'u': s.lex = kStrHex0; s.hex = 0; return StrStep::kMore;
        default: return StrStep::kFail;
      }
    case kStrHex0: case kStrHex1: case kStrHex2: case kStrHex3:
    case kStrLowHex0: case kStrLowHex1: case kStrLowHex2: case kStrLowHex3: {
      int v = hexval(b);
      if (v < 0) return StrStep::kFail;
      s.hex = uint16_t((s.hex << 4) | v);
      bool low = s.lex >= kStrLowHex0;
      int digits = (low ? s.lex - kStrLowHex0 : s.lex - kStrHex0) + 1;
      // Reject a surrogate as soon as its first digits show it cannot fit: a
      // low surrogate's digits must start with D, then C..F.
      if (digits == 1 && low && s.hex != 0xD) return StrStep::kFail;
      if (digits == 2) {
        unsigned hi8 = s.hex & 0xFF;
        if (low && (hi8 < 0xDC || hi8 > 0xDF)) return StrStep::kFail;
        if (!low && hi8 >= 0xDC && hi8 <= 0xDF) return StrStep::kFail;  // lone low surrogate
      }
      if (digits < 4) { s.lex = uint8_t(s.lex + 1); return StrStep::kMore; }
      if (!low && s.hex >= 0xD800 && s.hex <= 0xDBFF) { s.lex = kStrLowBackslash; return StrStep::kMore; }
      s.lex = kStrPlain;
      return StrStep::kMore;
    }
    case kStrLowBackslash:
      if (b != '\\') return StrStep::kFail;
      s.lex = kStrLowU; return StrStep::kMore;
    case kStrLowU:
      if (b != 'u') return StrStep::kFail;
      s.lex = kStrLowHex0; s.hex = 0; return StrStep::kMore;
    default:
      return StrStep::kFail;
  }
}

// The string lexer's behaviour on the bytes that follow depends on its state
// and, in \uXXXX escapes, only on whether the digits so far are a high
// surrogate's (or a low one's). StayKey() names each behaviour class, so the
// vocabulary keeps one "tokens that stay in the string" set per class.
// Raw strings (Format::raw_top_string) add one class per plain state.
inline constexpr int kNumJsonStayKeys = 23;
inline constexpr int kNumStayKeys = kNumJsonStayKeys + kNumPlainStrLex;
inline int RawStayKey(uint8_t lex) { return kNumJsonStayKeys + lex; }

inline int StayKey(const StrLexState& s) {
  switch (s.lex) {
    case kStrHex1: return kNumPlainStrLex + 2 + (s.hex == 0xD);
    case kStrHex2: return kNumPlainStrLex + 4 + (s.hex >= 0xD8 && s.hex <= 0xDB);
    case kStrHex3: return kNumPlainStrLex + 6 + ((s.hex >> 4) >= 0xD8 && (s.hex >> 4) <= 0xDB);
    case kStrLowBackslash: return kNumPlainStrLex + 8;
    case kStrLowU: return kNumPlainStrLex + 9;
    case kStrLowHex0: return kNumPlainStrLex + 10;
    case kStrLowHex1: return kNumPlainStrLex + 11 + (s.hex == 0xD);
    case kStrLowHex2: return kNumPlainStrLex + 13;
    case kStrLowHex3: return kNumPlainStrLex + 14;
    case kStrEsc: return kNumPlainStrLex;
    case kStrHex0: return kNumPlainStrLex + 1;
    default: return s.lex;  // plain and UTF-8 states
  }
}

// A state of each class (inverse of StayKey and RawStayKey).
inline StrLexState StayKeyState(int key) {
  if (key < kNumPlainStrLex) return {uint8_t(key), 0};
  if (key >= kNumJsonStayKeys) return {uint8_t(key - kNumJsonStayKeys), 0};
  switch (key - kNumPlainStrLex) {
    case 0: return {kStrEsc, 0};
    case 1: return {kStrHex0, 0};
    case 2: return {kStrHex1, 0x0};
    case 3: return {kStrHex1, 0xD};
    case 4: return {kStrHex2, 0x00};
    case 5: return {kStrHex2, 0xD8};
    case 6: return {kStrHex3, 0x000};
    case 7: return {kStrHex3, 0xD80};
    case 8: return {kStrLowBackslash, 0};
    case 9: return {kStrLowU, 0};
    case 10: return {kStrLowHex0, 0};
    case 11: return {kStrLowHex1, 0x0};
    case 12: return {kStrLowHex1, 0xD};
    case 13: return {kStrLowHex2, 0xDC};
    default: return {kStrLowHex3, 0xDC0};
  }
}

}  // namespace k3::constrain
