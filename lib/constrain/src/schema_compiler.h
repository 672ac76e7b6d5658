// The schema compiler: one Compiler per compile turns a JSON Schema document
// into the nodes of schema_internal.h. Its rooms: schema.cc (keywords, unions,
// literals, the entry points), schema_merge.cc (allOf), schema_typed.cc (one
// type's keywords), schema_ref.cc ($ref). Private to lib/constrain.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "schema_internal.h"

namespace k3::constrain {

using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;

// Keywords that only describe (JSON Schema annotations) or that validators do
// not assert by default (format): accepted and ignored.
extern const std::set<std::string_view> kAnnotations;

inline std::string Where(const std::string& ptr) { return ptr.empty() ? "/" : ptr; }

[[noreturn]] void Unsupported(const std::string& keyword, const std::string& ptr, const std::string& why);
[[noreturn]] void Corrupt(const std::string& ptr, const std::string& why);
[[noreturn]] void Unsatisfiable(const std::string& ptr, const std::string& why);

// The compact JSON text of a value (keys in document order, minimal escapes,
// numbers in the shortest round-trip form).
void AppendCompact(std::string& out, element e);

// Thrown where a recursive $ref would nest deeper than the unrolling allows:
// that copy of the reference is the schema false. Caught where false is
// harmless (an optional property, an anyOf alternative, array items with no
// minItems, additionalProperties); elsewhere it climbs to the next such place,
// and at the root it is kInvalidArgument (no finite value within the bound).
struct RecursionCut {};

// One compile of one schema document (Schema::CompileOrThrow makes one per
// try): owns the nodes it builds, the merged allOf documents and the $ref
// bookkeeping, and hands the nodes over with TakeNodes. Fails by throwing
// k3::Error (kCorrupt, kUnsupported, kInvalidArgument: constrain.h). Not
// thread-safe; used once.
class Compiler {
 public:
  // max_recursion: how many times a recursive $ref may be expanded inside itself.
  // relax: a non-strict compile (CompileOptions::strict false).
  // budget: charged for the work and the memory of what is built (k3::Error
  // past it); it must outlive the compiler.
  Compiler(element root, int max_recursion, bool relax, CompileBudget& budget)
      : root_(root), max_recursion_(max_recursion), budget_(budget), relax_(relax) {}

  // A keyword the subset cannot enforce as written: strict, kUnsupported
  // naming it; otherwise noted, and the caller relaxes it as `action` says.
  void Relaxed(const std::string& keyword, const std::string& ptr, const std::string& why,
               const std::string& action);
  std::vector<Relaxation> TakeNotes() { return std::move(notes_); }

  uint32_t CompileRoot();
  std::vector<SchemaNode> TakeNodes() { return std::move(nodes_); }
  // A recursive $ref was unrolled (a smaller bound may fit the node cap).
  bool recursed() const { return recursed_; }

  uint32_t Add(SchemaNode n);

  // Nodes of "any JSON value", created once.
  uint32_t AnyNode();

  // Any JSON object (the object alternative of AnyNode).
  uint32_t AnyObject();

  uint32_t StringNode(uint32_t min_len, uint32_t max_len);

  uint32_t LiteralNode(std::vector<std::string> lits, const std::string& ptr, const std::string& kw,
                       const char* why_empty = "has the schema's type");

  void SetFirst(uint32_t idx);

  // oneOf needs exactly one alternative to match. Alternatives that start with
  // different bytes cannot both match; two object alternatives cannot either
  // when both require a key whose values are disjoint literal sets (a
  // discriminator). Anything else could produce a text matching two: refused.
  void CheckDisjoint(const std::vector<uint32_t>& alts, const std::string& ptr);

  // Fills union node `u` from alternatives: nested unions are flattened and
  // literal alternatives merge into one literal set. The matcher follows every
  // alternative a byte allows in parallel, so alternatives may overlap.
  void FillUnion(uint32_t u, const std::vector<uint32_t>& alts_in, const std::string& ptr,
                 const std::string& kw);

  // skip_literals: compile as if enum and const were absent (the filter of
  // their values by the other keywords).
  uint32_t Compile(element e, const std::string& ptr, int depth, bool skip_literals = false);

  // Whether the automaton of `node` accepts `text` as a complete value
  // (compact spelling): the filter of enum/const values by other keywords.
  bool AcceptsText(uint32_t node, const std::string& text);

  // ---- allOf (schema_merge.cc): schemas merged into one JSON text, parsed, compiled ----
  // A schema object as its keywords and their compact JSON texts, in order.
  using Keywords = std::vector<std::pair<std::string, std::string>>;

  static Keywords KeywordsOf(object o);
  static const std::string* Find(const Keywords& k, std::string_view key);
  static void Erase(Keywords& k, std::string_view key);
  static void Set(Keywords& k, const std::string& key, std::string text);
  static std::string TextOf(const Keywords& k);
  static std::string AllOfText(const std::string& a, const std::string& b);

  // Parses merged text into a document this compiler keeps (elements point into it).
  element Own(const std::string& text, const std::string& ptr);

  // Whether every allOf member only holds `pattern` (and annotations): zod's
  // two .regex() on one string, intersected by the string node.
  static bool IsPatternList(object o);

  // One schema equivalent to `o` (allOf members, a combinator beside other
  // keywords): keywords merged by MergeTwo, non-recursive $refs inlined, and
  // an anyOf/oneOf left at the end distributed over its alternatives
  // ({"anyOf":[{"allOf":[rest, alt]}...]}). Strict: a keyword pair that cannot
  // be merged exactly is refused ('allOf'); not strict: the first is kept
  // (the merged schema is then a superset).
  element MergeAllOf(object o, const std::string& ptr);

  // Numbers of two texts (bounds and counts).
  static double NumberOfText(const std::string& t) { return std::strtod(t.c_str(), nullptr); }

  // Merges schema b into a (both plain keyword lists: no allOf left).
  Keywords MergeTwo(Keywords a, Keywords b, const std::string& ptr);

  // ---- one type's keywords (schema_typed.cc) ----
  std::vector<std::string> TypeList(object o, const std::string& ptr);

  static uint32_t Count(object o, const char* key, const std::string& ptr, uint32_t dflt);

  bool Number(object o, const char* key, const std::string& ptr, double& out);

  uint32_t CompileTyped(object o, const std::string& type, const std::string& ptr, int depth);

  static std::string KeyBytes(const std::string& key);

  // A bound as written: JSON integers exactly (int64 / uint64 text), other
  // numbers as the double every parser reads.
  struct Bound {
    double d = 0;
    bool exact_int = false;
    __int128 i = 0;
  };
  bool ReadBound(object o, const char* key, const std::string& ptr, Bound& out);

  static std::string BoundText(const Bound& b);

  uint32_t CompileNumber(object o, bool integer, const std::string& ptr);

  // ---- $ref (schema_ref.cc) ----
  // The element a local reference points to; kCorrupt when it resolves to nothing.
  element Resolve(const std::string& ref, const std::string& ptr);

  // The local references anywhere below a reference's target (every "$ref"
  // string, wherever it sits: more edges than the schema uses only makes
  // Cyclic() more cautious). Unresolvable ones are left to Compile.
  const std::vector<std::string>& RefsBelow(const std::string& ref);

  // Whether a cycle of references can be reached from `ref` (depth-first
  // search for a back edge). References that reach none compile to the same
  // nodes wherever they are used: compiled once and shared.
  bool Cyclic(const std::string& ref);

  // Local references are inlined. One that reaches no cycle compiles once and
  // is shared. A recursive one is unrolled: it may be expanded inside its own
  // expansion max_recursion_ times; one more is false (RecursionCut). Its
  // nodes depend on how often each reference is being expanded, so they are
  // shared only between uses with the same counts.
  uint32_t CompileRef(const std::string& ref, const std::string& ptr, int depth);

 private:
  element root_;
  // Budget work for one schema object visited or one node made, and for one
  // matcher state stepping one byte: in units of one step of the pattern
  // compiler's subset construction, the budget's unit.
  static constexpr uint64_t kNodeWork = 1024;
  static constexpr uint64_t kMatchStepWork = 64;
  int max_recursion_;
  CompileBudget& budget_;
  std::vector<SchemaNode> nodes_;
  int32_t any_ = -1;
  std::map<std::string, uint32_t> refs_;                     // acyclic references, compiled once
  std::map<std::string, std::vector<std::string>> refs_below_;
  std::map<std::string, bool> cyclic_;
  static constexpr size_t kMaxRefWalk = size_t{1} << 23;
  size_t walked_ = 0;
  static constexpr int kMaxExpansions = 1 << 16;
  int expansions_ = 0;
  std::map<std::string, int> active_;                        // cyclic references being expanded, and how often
  std::map<std::string, int64_t> unrolled_;                  // (ref, active) -> node, -1: cut
  std::string cut_ref_;
  bool recursed_ = false;
  simdjson::dom::parser literal_parser_;
  bool relax_ = false;
  std::vector<Relaxation> notes_;
  // Documents of merged allOf schemas (their elements are compiled like the root's).
  std::vector<std::unique_ptr<simdjson::dom::parser>> owned_;
  size_t merged_bytes_ = 0;
};

}  // namespace k3::constrain
