// Vocabulary preparation (a flattened token trie plus per-lexer-state token sets
// for free strings) and the token-level walk (TokenConstraint).
//
// Mask = walk the trie depth-first from the current state, one matcher step per
// trie edge, skipping a whole subtree as soon as its first byte is refused.
// Inside a string without a length limit almost every token is allowed, so
// that walk would visit most of the trie; instead the tokens that stay inside
// the string are OR-ed in from a table computed once per vocabulary (they
// depend only on the string lexer's state), and the walk enters only subtrees
// that contain a '"' (the only way a token leaves the string).
#include <algorithm>
#include <bit>
#include <cstring>

#include "k3/constrain/constrain.h"
#include "k3/core/error.h"
#include "k3/tokenizer/tokenizer.h"
#include "matcher.h"

namespace k3::constrain {

struct Vocabulary::Impl {
  std::vector<std::string> tokens;
  uint32_t vocab_size = 0;
  size_t words = 0;
  // Flattened trie in depth-first order: node i's subtree is [i, end[i]).
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;  // 1 for the root's children
  std::vector<uint32_t> end;
  std::vector<int32_t> token;   // id ending at this node, or -1
  std::vector<uint8_t> quote_below;  // this node's byte or one below it is '"'
  // From a node, the first of it and its later siblings with quote_below set,
  // or the end of the siblings: inside a string the walk jumps there at once.
  std::vector<uint32_t> quote_next;
  // The root's child for each first byte (node index), or -1.
  int32_t root_child[256];
  uint16_t max_depth = 0;
  // Per string-lexer class (StayKey): tokens that stay inside the string, and
  // the code points each of them starts (0xFFFF: leaves the string or is invalid).
  std::vector<uint64_t> stay_mask[kNumStayKeys];
  std::vector<uint16_t> stay_chars[kNumStayKeys];
  // Plain strings with a length limit (the common bounded case): the staying
  // tokens of at most c code points for c < kShortChars, and the ids of the
  // longer ones, so a mask is one copy plus a short list.
  static constexpr uint32_t kShortChars = 16;
  std::vector<uint64_t> plain_upto[kShortChars];
  std::vector<uint32_t> plain_long;
  // Tokens without a backslash: free keys beside declared ones are written
  // without escapes (their staying tokens are the plain ones without '\').
  std::vector<uint64_t> no_backslash;
};

namespace {

struct BuildNode {
  std::vector<std::pair<uint8_t, uint32_t>> kids;  // byte, index into pool
  int32_t token = -1;
};

void Flatten(const std::vector<BuildNode>& pool, uint32_t at, uint16_t d, uint8_t b, Vocabulary::Impl& v) {
  // Iterative would be safer for huge depths; token length bounds the depth.
  size_t me = v.byte.size();
  v.byte.push_back(b);
  v.depth.push_back(d);
  v.end.push_back(0);
  v.token.push_back(pool[at].token);
  v.quote_below.push_back(b == '"');
  if (d > v.max_depth) v.max_depth = d;
  auto kids = pool[at].kids;
  std::sort(kids.begin(), kids.end());
  for (auto& [kb, ki] : kids) {
    size_t child = v.byte.size();
    Flatten(pool, ki, uint16_t(d + 1), kb, v);
    if (v.quote_below[child]) v.quote_below[me] = 1;
  }
  v.end[me] = uint32_t(v.byte.size());
}

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, uint32_t vocab_size)
    : impl_(std::make_unique<Impl>()) {
  Impl& v = *impl_;
  if (vocab_size < token_bytes.size())
    throw Error(ErrorCode::kInvalidArgument, "vocab_size below the number of ranks");
  v.tokens = std::move(token_bytes);
  v.vocab_size = vocab_size;
  v.words = (size_t(vocab_size) + 63) / 64;
  std::vector<BuildNode> pool(1);
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const std::string& t = v.tokens[id];
    if (t.empty()) continue;
    if (t.size() > 0xFFF0) throw Error(ErrorCode::kUnsupported, "token longer than 65520 bytes", {}, Error::kNoOffset, "token " + std::to_string(id));
    uint32_t at = 0;
    for (char c : t) {
      uint8_t b = uint8_t(c);
      uint32_t next = 0;
      for (auto& [kb, ki] : pool[at].kids)
        if (kb == b) { next = ki; break; }
      if (!next) {
        pool.emplace_back();
        next = uint32_t(pool.size() - 1);
        pool[at].kids.emplace_back(b, next);
      }
      at = next;
    }
    if (pool[at].token >= 0)
      throw Error(ErrorCode::kInvalidArgument, "tokens " + std::to_string(pool[at].token) + " and " +
                                                   std::to_string(id) + " have the same bytes");
    pool[at].token = int32_t(id);
  }
  // The root itself is not stored: its children are the top-level entries.
  auto root_kids = pool[0].kids;
  std::sort(root_kids.begin(), root_kids.end());
  for (int32_t& c : v.root_child) c = -1;
  for (auto& [kb, ki] : root_kids) {
    v.root_child[kb] = int32_t(v.byte.size());
    Flatten(pool, ki, 1, kb, v);
  }
  // Siblings follow each other at equal depth: what follows a subtree at the
  // same depth is the next sibling, at a smaller one the parent's end.
  const size_t nodes = v.byte.size();
  v.quote_next.assign(nodes, 0);
  for (size_t i = nodes; i-- > 0;) {
    const uint32_t next = v.end[i];
    const bool sibling = next < nodes && v.depth[next] == v.depth[i];
    v.quote_next[i] = v.quote_below[i] ? uint32_t(i) : sibling ? v.quote_next[next] : next;
  }

  for (int l = 0; l < kNumStayKeys; ++l) {
    v.stay_mask[l].assign(v.words, 0);
    v.stay_chars[l].assign(v.tokens.size(), 0xFFFF);
    for (size_t id = 0; id < v.tokens.size(); ++id) {
      const std::string& t = v.tokens[id];
      if (t.empty()) continue;
      StrLexState s = StayKeyState(l);
      const bool raw = l >= kNumJsonStayKeys;
      uint32_t chars = 0;
      bool ok = true;
      for (char c : t) {
        StrStep r = StrLexStep(s, uint8_t(c), raw);
        if (r == StrStep::kFail || r == StrStep::kClose) { ok = false; break; }
        if (r == StrStep::kNewChar) ++chars;
      }
      if (!ok) continue;
      v.stay_chars[l][id] = uint16_t(std::min<uint32_t>(chars, 0xFFFE));
      v.stay_mask[l][id / 64] |= uint64_t{1} << (id % 64);
    }
  }
  v.no_backslash.assign(v.words, 0);
  for (size_t id = 0; id < v.tokens.size(); ++id)
    if (v.tokens[id].find('\\') == std::string::npos) v.no_backslash[id / 64] |= uint64_t{1} << (id % 64);
  for (uint32_t c = 0; c < Impl::kShortChars; ++c) v.plain_upto[c].assign(v.words, 0);
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    uint16_t chars = v.stay_chars[kStrPlain][id];
    if (chars == 0xFFFF) continue;
    if (chars >= Impl::kShortChars) {
      v.plain_long.push_back(uint32_t(id));
      continue;
    }
    for (uint32_t c = chars; c < Impl::kShortChars; ++c) v.plain_upto[c][id / 64] |= uint64_t{1} << (id % 64);
  }
}

Vocabulary Vocabulary::FromTokenizer(const tok::Tokenizer& tokenizer) {
  std::vector<std::string> bytes(tokenizer.num_ranks());
  for (uint32_t id = 0; id < tokenizer.num_ranks(); ++id) bytes[id] = std::string(tokenizer.TokenBytes(id));
  return Vocabulary(std::move(bytes), tokenizer.vocab_size());
}

Vocabulary::~Vocabulary() = default;
Vocabulary::Vocabulary(Vocabulary&&) noexcept = default;
Vocabulary& Vocabulary::operator=(Vocabulary&&) noexcept = default;
uint32_t Vocabulary::num_ranks() const { return uint32_t(impl_->tokens.size()); }
uint32_t Vocabulary::vocab_size() const { return impl_->vocab_size; }
std::string_view Vocabulary::TokenBytes(uint32_t id) const {
  return id < impl_->tokens.size() ? std::string_view(impl_->tokens[id]) : std::string_view{};
}

// The most states a configuration keeps (overlapping anyOf alternatives
// followed in parallel). Dropping more only narrows the language; every state
// kept is live, so nothing can dead-end.
constexpr size_t kMaxStates = 32;

struct TokenConstraint::Impl {
  Impl(const CompiledSchema& s, const Vocabulary::Impl* v, Format f)
      : keep(s), schema(&keep.impl()), vocab(v), format(f), matcher(*schema, arena, f) {
    if (format.raw_top_string) {
      const SchemaNode& root = schema->nodes[schema->root];
      if (root.kind != NodeKind::kString && !(root.kind == NodeKind::kLiterals && root.raw_ok))
        throw Error(ErrorCode::kInvalidArgument, "raw_top_string needs a string schema (or an enum of strings)");
    }
    Reset();
  }
  void Reset() {
    arena.clear();
    states.assign(1, matcher.Start());
    committed = arena.size();
    text.clear();
    mask_valid = false;
  }
  // Runs bytes from the committed configuration into `cur`; false when no
  // state survives. The arena keeps what the run appended.
  bool RunFrom(std::string_view bytes, std::vector<State>& cur) const {
    cur = states;
    std::vector<State>& next = scratch;
    for (char c : bytes) {
      next.clear();
      for (const State& s : cur) matcher.Step(s, uint8_t(c), next);
      matcher.Dedupe(next, kMaxStates);
      if (next.empty()) return false;
      cur.swap(next);
    }
    return true;
  }
  // Runs bytes; on success the new configuration is committed. Steps only
  // append frames, so the arena holds dead ones too: once they outnumber the
  // live ones (with some slack) the live chains are compacted to a fresh arena.
  // Amortized, a byte costs its steps and no copy; probes that commit one byte
  // at a time (GreedyCompletion) stay cheap.
  bool Run(std::string_view bytes) {
    if (!RunFrom(bytes, run_cur)) {
      arena.resize(committed);
      return false;
    }
    states.swap(run_cur);
    size_t live = 0;
    for (const State& s : states) live += size_t(s.depth);
    if (arena.size() > 4 * live + kCompactSlack) {
      CompactLive(arena, states, spare_arena, spare_states);
      arena.swap(spare_arena);
      states.swap(spare_states);
    }
    committed = arena.size();
    text.append(bytes);
    mask_valid = false;
    return true;
  }
  // Copies each live chain (root to top) of `from` over `src` to `dst` (replaced),
  // with `to` the same states over `dst`. Shared frames are copied once per state.
  static void CompactLive(const std::vector<Frame>& src, const std::vector<State>& from, std::vector<Frame>& dst,
                          std::vector<State>& to) {
    dst.clear();
    to.clear();
    for (const State& s : from) {
      // The chain is written top first at the end of dst, then reversed in place
      // so that parents come before children (as the matcher appends them).
      const size_t base = dst.size();
      for (int32_t i = s.top; i >= 0; i = src[size_t(i)].parent) dst.push_back(src[size_t(i)]);
      std::reverse(dst.begin() + std::ptrdiff_t(base), dst.end());
      int32_t parent = -1;
      for (size_t k = base; k < dst.size(); ++k) {
        dst[k].parent = parent;
        parent = int32_t(k);
      }
      to.push_back(State{parent, int32_t(dst.size() - base)});
    }
  }
  static constexpr size_t kCompactSlack = 256;  // frames (64 bytes each)
  void ComputeMask();
  void WalkFrom(const State& start);

  CompiledSchema keep;  // shares the nodes: the constraint keeps its schema alive
  const CompiledSchema::Impl* schema;
  const Vocabulary::Impl* vocab;
  Format format;
  mutable std::vector<Frame> arena;
  mutable Matcher matcher;
  std::vector<State> states;  // the committed configuration
  size_t committed = 0;
  std::string text;
  std::vector<uint64_t> mask;
  bool mask_valid = false;
  mutable std::vector<State> scratch;
  mutable std::vector<State> run_cur;  // Run / Allowed: the configuration being stepped
  std::vector<Frame> spare_arena;      // compaction targets, kept for their capacity
  std::vector<State> spare_states;
  // Walk scratch, per trie depth.
  std::vector<std::vector<State>> path;
  std::vector<size_t> saved;
  std::vector<uint8_t> exited;
};

// The allowed set of a configuration is the union of its states' sets.
void TokenConstraint::Impl::ComputeMask() {
  mask.assign(vocab->words, 0);
  for (const State& s : states) WalkFrom(s);
  arena.resize(committed);
  mask_valid = true;
}

// ORs in the tokens that stay inside a string from lexer class `key` with
// `left` code points still allowed (kUnbounded: no limit).
static void OrStayingTokens(const Vocabulary::Impl& v, int key, uint32_t left, std::vector<uint64_t>& mask) {
  constexpr uint32_t kShort = Vocabulary::Impl::kShortChars;
  const std::vector<uint64_t>* set = nullptr;
  if (left == kUnbounded) set = &v.stay_mask[key];
  else if (key == kStrPlain && left < kShort) set = &v.plain_upto[left];
  if (set) {
    for (size_t w = 0; w < v.words; ++w) mask[w] |= (*set)[w];
    return;
  }
  const uint16_t* chars = v.stay_chars[key].data();
  if (key == kStrPlain) {
    const std::vector<uint64_t>& upto = v.plain_upto[kShort - 1];
    for (size_t w = 0; w < v.words; ++w) mask[w] |= upto[w];
    for (uint32_t id : v.plain_long)
      if (chars[id] <= left) mask[id / 64] |= uint64_t{1} << (id % 64);
    return;
  }
  // Other classes keep few tokens (they must continue a character or an
  // escape), or are raw strings with a limit: visit only the staying ones.
  const std::vector<uint64_t>& stay = v.stay_mask[key];
  for (size_t w = 0; w < v.words; ++w)
    for (uint64_t b = stay[w]; b; b &= b - 1) {
      size_t id = w * 64 + size_t(std::countr_zero(b));
      if (chars[id] <= left) mask[w] |= uint64_t{1} << (id % 64);
    }
}

void TokenConstraint::Impl::WalkFrom(const State& start) {
  const Vocabulary::Impl& v = *vocab;
  const Frame& top = matcher.top(start);
  bool shortcut = false;
  // A `pattern` string takes the walk (its DFA decides), unless the pattern
  // has nothing left to say (a free state).
  auto free_string = [&](const SchemaNode& n, uint64_t dfa_state) {
    return !n.pattern || n.pattern->free[dfa_state];
  };
  if (top.node == kRootNode && top.phase == 0 && format.raw_top_string &&
      schema->nodes[schema->root].kind == NodeKind::kString && free_string(schema->nodes[schema->root], 0)) {
    // A raw string never ends by itself: the staying tokens are all of them.
    const SchemaNode& n = schema->nodes[schema->root];
    OrStayingTokens(v, RawStayKey(kStrPlain), n.max_len, mask);
    return;
  }
  if (top.node != kRootNode) {
    const SchemaNode& n = matcher.node(top.node);
    if (n.kind == NodeKind::kString && free_string(n, top.bits)) {
      const uint32_t left = n.max_len == kUnbounded ? kUnbounded : n.max_len - top.count;
      if (top.phase == Matcher::kRawPhase) {
        OrStayingTokens(v, RawStayKey(top.lex), left, mask);
        return;
      }
      shortcut = true;
      if (n.key_of >= 0) {
        // A free key beside declared ones: unbounded, never in an escape.
        const std::vector<uint64_t>& stay = v.stay_mask[StayKey(StrLexState{top.lex, top.pos})];
        for (size_t w = 0; w < v.words; ++w) mask[w] |= stay[w] & v.no_backslash[w];
      } else {
        OrStayingTokens(v, StayKey(StrLexState{top.lex, top.pos}), left, mask);
      }
    }
  }
  const size_t levels = size_t(v.max_depth) + 1;
  path.resize(levels);
  saved.resize(levels);
  exited.resize(levels);
  path[0].assign(1, start);
  saved[0] = committed;
  exited[0] = !shortcut;
  const int32_t string_depth = start.depth;
  // Between values the first bytes a state takes are known: the walk visits
  // only the root's children for those (not each of up to 256 with a step).
  uint64_t first[4] = {0, 0, 0, 0};
  const bool first_known = !shortcut && matcher.NextBytes(start, first);
  const size_t count = v.byte.size();
  // The next root child at or after first byte `b` whose byte the state takes.
  auto next_root = [&](unsigned b) -> size_t {
    for (; b < 256; ++b) {
      const uint64_t rest = first[b / 64] >> (b % 64);
      if (!rest) {
        b = (b / 64) * 64 + 63;  // nothing left in this word
        continue;
      }
      b += unsigned(std::countr_zero(rest));
      if (v.root_child[b] >= 0) return size_t(v.root_child[b]);
    }
    return count;
  };
  size_t i = first_known ? next_root(0) : 0;
  while (i < count) {
    const uint16_t d = v.depth[i];
    if (!exited[d - 1] && !v.quote_below[i]) { i = v.quote_next[i]; continue; }
    if (d == 1 && first_known && !((first[v.byte[i] / 64] >> (v.byte[i] % 64)) & 1)) { i = next_root(v.byte[i]); continue; }
    arena.resize(saved[d - 1]);
    std::vector<State>& here = path[d];
    here.clear();
    for (const State& s : path[d - 1]) matcher.Step(s, v.byte[i], here);
    if (here.empty()) { i = v.end[i]; continue; }
    matcher.Dedupe(here, kMaxStates);
    saved[d] = arena.size();
    exited[d] = exited[d - 1] || here.size() != 1 || here[0].depth < string_depth;
    if (int32_t t = v.token[i]; t >= 0) mask[size_t(t) / 64] |= uint64_t{1} << (t % 64);
    ++i;
  }
}

TokenConstraint::TokenConstraint(const CompiledSchema& schema, const Vocabulary& vocab, Format format)
    : impl_(std::make_unique<Impl>(schema, &vocab.impl(), format)) {}
TokenConstraint::TokenConstraint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenConstraint::~TokenConstraint() = default;
TokenConstraint::TokenConstraint(TokenConstraint&&) noexcept = default;
TokenConstraint& TokenConstraint::operator=(TokenConstraint&&) noexcept = default;

void TokenConstraint::AllowedMask(std::vector<uint64_t>& bits) {
  if (!impl_->mask_valid) impl_->ComputeMask();
  bits = impl_->mask;
}

bool TokenConstraint::Allowed(uint32_t id) const {
  const Impl& m = *impl_;
  if (id >= m.vocab->tokens.size() || m.vocab->tokens[id].empty()) return false;
  if (m.mask_valid) return (m.mask[id / 64] >> (id % 64)) & 1;
  bool ok = m.RunFrom(m.vocab->tokens[id], m.run_cur);
  m.arena.resize(m.committed);
  return ok;
}

void TokenConstraint::Advance(uint32_t id) {
  if (id >= impl_->vocab->tokens.size() || impl_->vocab->tokens[id].empty())
    throw Error(ErrorCode::kInvalidArgument, "token " + std::to_string(id) + " is not allowed here (special or out of range)");
  if (!impl_->Run(impl_->vocab->tokens[id]))
    throw Error(ErrorCode::kInvalidArgument, "token " + std::to_string(id) + " is not allowed after " +
                                                 std::to_string(impl_->text.size()) + " bytes of output");
}

bool TokenConstraint::AdvanceBytes(std::string_view bytes) { return impl_->Run(bytes); }

bool TokenConstraint::NextBytes(uint64_t set[4]) const {
  set[0] = set[1] = set[2] = set[3] = 0;
  for (const State& s : impl_->states)
    if (!impl_->matcher.NextBytes(s, set)) return false;
  return true;
}

bool TokenConstraint::Accepting() const {
  for (const State& s : impl_->states)
    if (impl_->matcher.Accepting(s)) return true;
  return false;
}

bool TokenConstraint::Complete() {
  if (!Accepting()) return false;
  if (!impl_->mask_valid) impl_->ComputeMask();
  for (uint64_t w : impl_->mask)
    if (w) return false;
  return true;
}

int TokenConstraint::PreferredByte() const {
  for (const State& s : impl_->states)
    if (int b = impl_->matcher.PatternHint(s); b >= 0) return b;
  return -1;
}

const std::string& TokenConstraint::text() const { return impl_->text; }
void TokenConstraint::Reset() { impl_->Reset(); }

TokenConstraint TokenConstraint::Clone() const {
  const Impl& m = *impl_;
  // A fresh Impl (its matcher must point at its own arena), then the live
  // chains of the state only (the source's dead frames stay behind).
  TokenConstraint c(std::make_unique<Impl>(m.keep, m.vocab, m.format));
  Impl::CompactLive(m.arena, m.states, c.impl_->arena, c.impl_->states);
  c.impl_->committed = c.impl_->arena.size();
  c.impl_->text = m.text;
  return c;
}

}  // namespace k3::constrain
