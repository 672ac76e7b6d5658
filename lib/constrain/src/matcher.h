// The byte automaton: a stack of frames (one per open object, array, string,
// number or literal) kept in an append-only arena so that a state is two
// integers and a trie walk can branch from any state by copying them. Frames are
// never changed in place: a step appends a changed copy of the top frame, so
// truncating the arena back to a saved size undoes everything after it, and
// states may share frames. A union (anyOf) whose alternatives a byte both
// allows turns one state into several, followed in parallel; the set of live
// states is the automaton's configuration.
#pragma once

#include <cstdint>
#include <vector>

#include "schema_internal.h"

namespace k3::constrain {

inline constexpr uint32_t kRootNode = 0xFFFFFFFFu;
inline constexpr uint32_t kFreeKey = 0xFFFFFFFFu;  // Frame::count of an object whose current key is free

struct Frame {
  int32_t parent = -1;     // arena index of the enclosing frame
  uint32_t node = kRootNode;
  uint8_t phase = 0;       // per kind (matcher.cc)
  uint8_t lex = 0;         // string lexer / number state
  uint16_t pos = 0;        // literal or key byte position; \u accumulator
  uint32_t count = 0;      // string code points, array items, chosen property (kFreeKey)
  uint64_t bits = 0;       // object: properties seen; literals: candidates; free key: reserved keys it still equals
  uint64_t bits2 = 0;      // object: key candidates; number: integer digits' value; free key: bytes so far
  uint64_t frac = 0;       // number: fraction digits' value
  uint8_t nd_int = 0, nd_frac = 0, nd_exp = 0;
  bool neg = false;
  uint32_t free_count = 0;  // object: entries with free keys
};

struct State {
  int32_t top = -1;  // arena index of the top frame
  int32_t depth = 0; // frames on the stack (root included)
};

class Matcher {
 public:
  Matcher(const CompiledSchema::Impl& schema, std::vector<Frame>& arena, Format format = {})
      : nodes_(schema.nodes), root_(schema.root), arena_(arena), format_(format) {}
  // Over nodes still being compiled (the compiler filters enum values with it).
  Matcher(const std::vector<SchemaNode>& nodes, uint32_t root, std::vector<Frame>& arena, Format format = {})
      : nodes_(nodes), root_(root), arena_(arena), format_(format) {}

  // Frame::phase of a raw (Format::raw_top_string) string or literal frame.
  static constexpr uint8_t kRawPhase = 1;

  // A fresh state (root frame appended to the arena).
  State Start();
  // Consumes one byte from `s`: appends to `out` every state it leads to (none
  // when the byte leaves the language).
  void Step(State s, uint8_t b, std::vector<State>& out);
  // The bytes so far form a complete value.
  bool Accepting(const State& s) const;
  // Two states with equal stacks (frame by frame, wherever they live).
  bool Same(const State& a, const State& b) const;
  // ORs into `set` (bit b of word b / 64) a superset of the bytes `s` takes
  // next, where the top frame tells them cheaply (objects, arrays, the root);
  // false (and `set` unspecified) for strings, numbers and literals. Needs
  // compiled nodes (SchemaNode::first_bits is set when compilation ends).
  bool NextBytes(const State& s, uint64_t set[4]) const;
  // Inside a `pattern` string: the next byte of a shortest way to a string the
  // pattern accepts (the closing quote once it does); -1 elsewhere.
  int PatternHint(const State& s) const;
  // Drops states equal to an earlier one, and any beyond `max_states`.
  void Dedupe(std::vector<State>& v, size_t max_states) const;

  const Frame& top(const State& s) const { return arena_[size_t(s.top)]; }
  const SchemaNode& node(uint32_t i) const { return nodes_[i]; }

 private:
  // kDone: `s` is the one successor; kOut: successors already in `out`;
  // kReprocess: the top frame ended without the byte, offer it to the parent.
  enum class R { kFail, kDone, kOut, kReprocess };
  Frame& Modify(State& s);                      // appends a copy of the top; returns it
  void Push(State& s, const Frame& f);
  void Pop(State& s) { s.top = arena_[size_t(s.top)].parent; --s.depth; }
  // `exclude`: literal candidates not to offer (values a uniqueItems array used).
  void StartValue(State s, uint32_t node, uint8_t b, std::vector<State>& out, uint64_t exclude = 0);
  void PopLiteral(State& s, uint64_t candidates);
  R StepObject(State& s, uint8_t b, std::vector<State>& out);
  R StepArray(State& s, uint8_t b, std::vector<State>& out);
  R StepString(State& s, uint8_t b);
  R StepNumber(State& s, uint8_t b);
  R StepLiterals(State& s, uint8_t b);
  bool NumberViable(const SchemaNode& n, const Frame& f) const;
  bool NumberEndOk(const SchemaNode& n, const Frame& f) const;
  bool LiteralEndOk(const SchemaNode& n, const Frame& f) const;

  const std::vector<std::string>& Literals(const SchemaNode& n, const Frame& f) const {
    return f.phase == kRawPhase ? n.literals_raw : format_.python_separators ? n.literals_py : n.literals;
  }

  const std::vector<SchemaNode>& nodes_;
  uint32_t root_;
  std::vector<Frame>& arena_;
  Format format_;
};

}  // namespace k3::constrain
