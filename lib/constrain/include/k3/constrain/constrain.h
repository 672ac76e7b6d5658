// k3::constrain — JSON-Schema-constrained decoding: a schema compiles to a byte
// automaton, and a TokenConstraint walks it over a real vocabulary to say which
// tokens keep the output a valid prefix of a COMPACT JSON text that validates.
//
// Ownership and threads: a CompiledSchema and a Vocabulary are immutable after
// construction and may be shared by any number of threads and constraints. A
// TokenConstraint holds one generation's state; it shares its schema's nodes
// (keeping them alive) and points to the Vocabulary, which must outlive it. It
// is not thread-safe.
// Failures: Schema::CompileOrThrow throws k3::Error — kCorrupt for text that is
// not JSON or not a schema, kUnsupported naming the keyword and the JSON pointer
// for a schema that needs what k3 does not constrain (docs/constrain.md lists the
// subset), kInvalidArgument for a schema no value can satisfy or one whose
// automata would cost more than its CompileBudget (object kBudgetObject). Advance() throws
// kInvalidArgument for a token that is not allowed (and leaves the state as it
// was). Mask queries never throw.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace k3::tok {
class Tokenizer;
}

namespace k3::constrain {

// A keyword that a non-strict compile did not enforce as written: what it
// did instead (always a superset: every value valid under the original schema
// stays valid under what is enforced). docs/constrain.md lists the rules.
struct Relaxation {
  std::string keyword;  // e.g. "pattern", "oneOf", "schema" (the whole schema)
  std::string pointer;  // JSON pointer of the schema object that holds it ("/" = root)
  std::string what;     // e.g. "dropped: lookahead is not supported"
};

// A compiled schema: the nodes of the byte automaton (private layout,
// src/schema_internal.h). Copies share the same immutable nodes.
class CompiledSchema {
 public:
  struct Impl;
  explicit CompiledSchema(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  const Impl& impl() const { return *impl_; }
  // Empty for a strict compile (and for a non-strict one that relaxed nothing).
  const std::vector<Relaxation>& relaxations() const;
  // About the memory the nodes and pattern automata hold (what a cache of
  // compiled schemas should count, not the schema's text).
  size_t bytes() const;

 private:
  std::shared_ptr<const Impl> impl_;
};

// Limits of what the automaton generates (all outputs still validate; these
// bound the language so that every prefix can finish and a number parses as a
// 64-bit value everywhere). docs/constrain.md gives the reasons.
inline constexpr int kMaxDepth = 64;         // nested objects/arrays
inline constexpr int kMaxIntDigits = 15;     // digits before the point
inline constexpr int kMaxFracDigits = 15;    // digits after the point
inline constexpr int kMaxExpDigits = 3;      // exponent digits (unbounded numbers only)
inline constexpr int kMaxProperties = 64;    // declared properties per object
inline constexpr int kMaxLiterals = 64;      // enum values per enum
inline constexpr int kMaxAlternatives = 64;  // anyOf / oneOf / type alternatives (after flattening)
inline constexpr int kMaxNodes = 20000;      // compiled nodes per schema (bounds compile time and memory)
inline constexpr size_t kMaxSchemaBytes = 4u << 20;  // schema text

// What one request may spend compiling schemas: every compile given the same
// budget (each tool's parameters, response_format's schema) draws on it. Work
// counts the steps that build automata (schema objects visited, nodes made,
// NFA/DFA states and the code point intervals each DFA state examines, length
// table cells, product pairs, matcher steps that filter enum values); bytes
// count the memory those structures take as they are made (a refused compile
// frees all of it). The caps bound one compile to about a second of one core
// and tens of MB, whatever the schema (docs/constrain.md, "Compile budget").
// Not thread-safe: one request's compiles run one after another.
class CompileBudget {
 public:
  static constexpr uint64_t kDefaultWork = uint64_t{1} << 27;
  static constexpr uint64_t kDefaultBytes = uint64_t{64} << 20;
  CompileBudget() = default;
  CompileBudget(uint64_t max_work, uint64_t max_bytes) : max_work_(max_work), max_bytes_(max_bytes) {}

  // Adds to the spend; throws k3::Error (kInvalidArgument, object
  // kBudgetObject, naming both caps) once either passes its cap, and on every
  // later call: a spent budget stays spent.
  void Charge(uint64_t work, uint64_t bytes);
  bool spent() const { return work_ > max_work_ || bytes_ > max_bytes_; }
  uint64_t work() const { return work_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t max_work() const { return max_work_; }
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  uint64_t max_work_ = kDefaultWork, max_bytes_ = kDefaultBytes;
  uint64_t work_ = 0, bytes_ = 0;
};
// The Error::object of a compile refused for its budget.
inline constexpr const char* kBudgetObject = "schema budget";

struct CompileOptions {
  // true: a keyword the subset cannot enforce is refused (kUnsupported naming
  // the keyword and its JSON pointer). false: it is relaxed to a superset
  // (dropped, oneOf read as anyOf, a lookahead left out of a pattern, ...) and
  // noted in CompiledSchema::relaxations(); a schema that still does not
  // compile (not a schema, unsatisfiable, past a cap) becomes "any value" (a
  // Relaxation with keyword "schema"), so only oversized text is refused.
  bool strict = true;
  // Shared by every schema of one request; nullptr: this compile has a budget
  // of its own with the default caps. A non-strict compile past the budget is
  // "any value" like any other that does not compile (never refused).
  CompileBudget* budget = nullptr;
};

struct Schema {
  // Compiles a JSON Schema document (draft 2020-12 / 7 keywords of the subset).
  static CompiledSchema CompileOrThrow(std::string_view schema_json);
  static CompiledSchema CompileOrThrow(std::string_view schema_json, const CompileOptions& options);
  // response_format json_object: any compact JSON object.
  static CompiledSchema JsonObject();
  // Any compact JSON value.
  static CompiledSchema AnyJson();
};

// A vocabulary prepared for masking: the byte strings of the ordinary tokens
// (ids below num_ranks) in a trie, plus per-lexer-state token sets used inside
// free strings. Ids at or above num_ranks (specials) are never allowed.
class Vocabulary {
 public:
  // token_bytes[id] for id < num_ranks; vocab_size >= num_ranks counts the
  // specials too (mask width). Empty byte strings are never allowed.
  Vocabulary(std::vector<std::string> token_bytes, uint32_t vocab_size);
  static Vocabulary FromTokenizer(const tok::Tokenizer& tokenizer);
  ~Vocabulary();
  Vocabulary(Vocabulary&&) noexcept;
  Vocabulary& operator=(Vocabulary&&) noexcept;

  uint32_t num_ranks() const;
  uint32_t vocab_size() const;
  std::string_view TokenBytes(uint32_t id) const;  // "" for specials / out of range

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// How the value is spelled. The default is compact JSON (response_format,
// json blocks). K3's XTML tool arguments (docs/tokenizer.md) spell non-string
// values as Python json.dumps text and string values raw.
struct Format {
  // ", " and ": " between elements, as Python's json.dumps writes them.
  bool python_separators = false;
  // A top-level string (or enum of strings) is written raw: no quotes, no
  // escapes, any valid UTF-8 except control characters other than tab/LF/CR.
  // It never ends by itself: Accepting() says when the caller may end it.
  // TokenConstraint throws kInvalidArgument when the schema is not a string.
  bool raw_top_string = false;
};

// One generation's constraint. Typical use per step (docs/constrain.md):
//   c.AllowedMask(bits); mask logits where the bit is 0; sample id;
//   c.Advance(id); stop when c.Complete() (or force EOS once c.Accepting()).
class TokenConstraint {
 public:
  TokenConstraint(const CompiledSchema& schema, const Vocabulary& vocab, Format format = {});
  ~TokenConstraint();
  TokenConstraint(TokenConstraint&&) noexcept;
  TokenConstraint& operator=(TokenConstraint&&) noexcept;

  // bits is resized to ceil(vocab_size / 64) words; bit id set = allowed.
  void AllowedMask(std::vector<uint64_t>& bits);
  // One token, without building the mask.
  bool Allowed(uint32_t id) const;
  // Consumes one allowed token; throws kInvalidArgument otherwise.
  void Advance(uint32_t id);
  // Consumes raw bytes (e.g. a prefix the caller forced); false and no change
  // when they would leave the language.
  bool AdvanceBytes(std::string_view bytes);
  // A superset of the bytes AdvanceBytes takes next, as bits (byte b: bit
  // b % 64 of set[b / 64]), where the state tells them cheaply (inside objects
  // and arrays, between values); false when it does not (strings, numbers,
  // literals: any byte may be). Lets a byte-by-byte search skip refused tries.
  bool NextBytes(uint64_t set[4]) const;
  // The output so far is a complete value that validates (EOS may be forced).
  bool Accepting() const;
  // Accepting and no token can extend it: generation must end now.
  bool Complete();
  // Inside a `pattern` string: the next byte of a shortest way to a string the
  // pattern accepts (its closing quote once it does), or -1 elsewhere. A
  // shortest-completion walk tries it first: a fixed byte order can loop
  // (with ^a*b$ it would add 'a' forever).
  int PreferredByte() const;
  // The bytes consumed so far.
  const std::string& text() const;
  // Back to the empty output.
  void Reset();
  // An independent copy of this state (same schema, vocabulary and format):
  // lets a caller look ahead (e.g. probe a short completion) without
  // disturbing the generation's constraint. Cost: the live stacks (one copy per
  // state) and the text; the copy has no dead frames.
  TokenConstraint Clone() const;

  struct Impl;

 private:
  explicit TokenConstraint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::constrain
