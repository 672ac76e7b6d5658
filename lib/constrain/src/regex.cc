// The `pattern` compiler (regex.h): parse -> syntax tree -> Thompson NFA over
// code point ranges -> DFA by subset construction over the ranges' elementary
// intervals -> per-state table of the lengths that reach acceptance.
//
// Where ECMA-262 and Python's `re` read a construct differently, the compiled
// set is the part both accept: \d, \w and \s match ASCII only (Python's match
// more of Unicode), their negations and negated classes exclude everything
// either engine might count in the class, and `.` excludes every line
// terminator of either (\n, \r, U+2028, U+2029). An output therefore matches
// under both engines; some strings both would accept are never generated.
#include "regex.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <map>

#include "k3/constrain/constrain.h"

namespace k3::constrain {
namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr uint32_t kUnboundedLen = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kInf = std::numeric_limits<uint32_t>::max();

[[noreturn]] void Refuse(std::string why) { throw PatternRefused{std::move(why)}; }

// What one automaton's construction spends: its work against the pattern's own
// cap (PatternRefused past it), and work and bytes against the request's
// CompileBudget (k3::Error past it). Work reaches the budget in batches: the
// steps are counted one closure state at a time.
class Spend {
 public:
  explicit Spend(CompileBudget* budget) : budget_(budget) {}
  void Work(uint64_t w) {
    work_ += w;
    if (work_ > kMaxWork) Refuse("the automaton would take too long to build (a simpler pattern is needed)");
    pending_ += w;
    if (pending_ >= kBatch) Flush();
  }
  void Bytes(uint64_t b) {
    Flush();
    if (budget_) budget_->Charge(0, b);
  }
  void Flush() {
    if (budget_ && pending_) budget_->Charge(pending_, 0);
    pending_ = 0;
  }

 private:
  static constexpr uint64_t kMaxWork = uint64_t{1} << 26;  // per automaton
  static constexpr uint64_t kBatch = 4096;
  CompileBudget* budget_;
  uint64_t work_ = 0, pending_ = 0;
};

// A set of code points: sorted, disjoint, non-adjacent inclusive ranges.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.push_back({lo, hi});
  }
  return out;
}

Ranges Complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return out;
}

Ranges Union(Ranges a, const Ranges& b) {
  a.insert(a.end(), b.begin(), b.end());
  return Normalize(std::move(a));
}

// The shorthand classes: `sure` = in the class under both engines, `maybe` =
// under either. A positive use compiles `sure`, a negated one the complement
// of `maybe`.
struct Shorthand {
  Ranges sure, maybe;
};

Shorthand ClassOf(char c) {
  const Ranges non_ascii = {{0x80, kMaxCp}};
  Shorthand s;
  switch (c) {
    case 'd': s.sure = {{'0', '9'}}; s.maybe = Union(s.sure, non_ascii); break;
    case 'w': s.sure = Normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}); s.maybe = Union(s.sure, non_ascii); break;
    case 's':
      s.sure = Normalize({{'\t', '\r'}, {' ', ' '}});
      // ECMA's WhiteSpace + LineTerminator and Python's str.isspace().
      s.maybe = Normalize({{'\t', '\r'}, {0x1C, 0x20}, {0x85, 0x85}, {0xA0, 0xA0}, {0x1680, 0x1680},
                           {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                           {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
      break;
    default: {  // D W S: the negations
      Shorthand base = ClassOf(char(c + ('a' - 'A')));
      s.sure = Complement(base.maybe);
      s.maybe = Complement(base.sure);
    }
  }
  return s;
}

struct Node {
  enum Kind { kSet, kCat, kAlt, kRepeat } kind = kSet;
  Ranges set;
  std::vector<Node> kids;
  uint32_t min = 0, max = 0;  // kRepeat (max kInf: unbounded)
};

class Parser {
 public:
  // relax: zero-width assertions (lookaround, \b, \B, a misplaced ^) match
  // the empty string, \p{..} any code point, a backreference any text, and
  // named groups are plain groups; left_out() says what was relaxed.
  Parser(std::string_view p, bool relax) : relax_(relax) {
    // Decode UTF-8 (the schema parser has already validated the JSON string).
    for (size_t i = 0; i < p.size();) {
      uint8_t b = uint8_t(p[i]);
      uint32_t cp;
      int n;
      if (b < 0x80) { cp = b; n = 1; }
      else if (b >= 0xC0 && b < 0xE0) { cp = b & 0x1F; n = 2; }
      else if (b >= 0xE0 && b < 0xF0) { cp = b & 0x0F; n = 3; }
      else if (b >= 0xF0 && b < 0xF8) { cp = b & 0x07; n = 4; }
      else Refuse("the pattern is not valid UTF-8");
      if (i + size_t(n) > p.size()) Refuse("the pattern is not valid UTF-8");
      for (int k = 1; k < n; ++k) {
        uint8_t c = uint8_t(p[i + size_t(k)]);
        if ((c & 0xC0) != 0x80) Refuse("the pattern is not valid UTF-8");
        cp = (cp << 6) | (c & 0x3F);
      }
      cps_.push_back(cp);
      i += size_t(n);
    }
  }

  // The top-level alternatives with their anchors: ^ may only open one and $
  // only close one.
  struct Branch {
    Node body;
    bool start_anchor = false, end_anchor = false;
  };
  std::vector<Branch> ParseTop() {
    std::vector<Branch> out;
    for (;;) {
      Branch b;
      if (Peek('^')) { b.start_anchor = true; ++i_; }
      b.body = ParseSeq(0);
      if (Peek('$')) {
        b.end_anchor = true;
        ++i_;
        if (!AtEnd() && !Peek('|')) Refuse("'$' only at the end of the pattern or of a top-level alternative");
      }
      out.push_back(std::move(b));
      if (AtEnd()) return out;
      if (Peek('|')) { ++i_; continue; }
      if (Peek(')')) Refuse("unbalanced ')' at character " + std::to_string(i_));
      Refuse("unexpected character at " + std::to_string(i_));
    }
  }

 private:
  bool AtEnd() const { return i_ >= cps_.size(); }
  bool Peek(uint32_t c) const { return !AtEnd() && cps_[i_] == c; }
  uint32_t Take() {
    if (AtEnd()) Refuse("the pattern ends inside a construct");
    return cps_[i_++];
  }

  Node ParseAlt(int depth) {
    Node first = ParseSeq(depth);
    if (!Peek('|')) return first;
    Node alt;
    alt.kind = Node::kAlt;
    alt.kids.push_back(std::move(first));
    while (Peek('|')) {
      ++i_;
      alt.kids.push_back(ParseSeq(depth));
    }
    return alt;
  }

  Node ParseSeq(int depth) {
    Node cat;
    cat.kind = Node::kCat;
    while (!AtEnd() && !Peek('|') && !Peek(')')) {
      if (Peek('$')) {
        if (depth == 0) break;  // the caller checks that it ends a branch
        if (!relax_) Refuse("'$' inside a group (anchors only at the ends)");
        ++i_;
        LeaveOut("anchors inside the pattern");
        continue;
      }
      Node atom = ParseAtom(depth);
      cat.kids.push_back(ParseQuantifier(std::move(atom)));
    }
    return cat;
  }

  static bool IsQuantifier(uint32_t c) { return c == '*' || c == '+' || c == '?' || c == '{'; }

  bool ReadInt(uint32_t& v) {
    size_t start = i_;
    uint64_t x = 0;
    while (!AtEnd() && cps_[i_] >= '0' && cps_[i_] <= '9') {
      x = x * 10 + (cps_[i_] - '0');
      if (x > 100000) Refuse("a repetition count beyond 100000");
      ++i_;
    }
    v = uint32_t(x);
    return i_ > start;
  }

  Node ParseQuantifier(Node atom) {
    if (AtEnd() || !IsQuantifier(cps_[i_])) return atom;
    Node r;
    r.kind = Node::kRepeat;
    uint32_t c = Take();
    if (c == '*') { r.min = 0; r.max = kInf; }
    else if (c == '+') { r.min = 1; r.max = kInf; }
    else if (c == '?') { r.min = 0; r.max = 1; }
    else {
      // {n} {n,} {n,m}; anything else ('{' as a literal, {,m}) is read
      // differently by the two engines and refused.
      if (!ReadInt(r.min)) Refuse("'{' must start a quantifier {n}, {n,} or {n,m} (escape a literal brace)");
      r.max = r.min;
      if (Peek(',')) {
        ++i_;
        if (!ReadInt(r.max)) r.max = kInf;
      }
      if (Take() != '}') Refuse("a quantifier must be {n}, {n,} or {n,m}");
      if (r.max < r.min) Refuse("a quantifier {n,m} with m < n");
    }
    if (Peek('?')) ++i_;  // lazy: the same language
    if (!AtEnd() && IsQuantifier(cps_[i_])) Refuse("a quantifier after a quantifier (possessive or nested)");
    r.kids.push_back(std::move(atom));
    return r;
  }

  static Node SetNode(Ranges r) {
    Node n;
    n.set = Normalize(std::move(r));
    return n;
  }

  uint32_t Hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      uint32_t c = Take();
      int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10)
            : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
      if (d < 0) Refuse("a hex escape needs " + std::to_string(digits) + " hex digits");
      v = v * 16 + uint32_t(d);
    }
    return v;
  }

  // After a backslash: a single code point (false: a shorthand class in `cls`).
  bool Escape(bool in_class, uint32_t& cp, Shorthand& cls) {
    uint32_t c = Take();
    switch (c) {
      case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        cls = ClassOf(char(c));
        return false;
      case 't': cp = '\t'; return true;
      case 'n': cp = '\n'; return true;
      case 'r': cp = '\r'; return true;
      case 'f': cp = '\f'; return true;
      case 'v': cp = '\v'; return true;
      case '0':
        if (!AtEnd() && cps_[i_] >= '0' && cps_[i_] <= '9') Refuse("octal escapes are not supported");
        cp = 0;
        return true;
      case 'x': cp = Hex(2); return true;
      case 'u':
        if (Peek('{')) Refuse("\\u{...} needs the unicode flag (use \\uXXXX)");
        cp = Hex(4);
        if (cp >= 0xD800 && cp <= 0xDFFF) Refuse("surrogate escapes are not supported");
        return true;
      case 'b':
        if (in_class) { cp = 8; return true; }
        Refuse("word boundaries (\\b) are not supported");
      case 'B': Refuse("word boundaries (\\B) are not supported");
      case 'p': case 'P': Refuse("unicode property classes (\\p{...}) are not supported");
      default:
        if (c >= '1' && c <= '9') Refuse("backreferences are not supported");
        if (c < 0x80 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
          Refuse(std::string("the escape \\") + char(c) + " is not supported");
        cp = c;  // an escaped punctuation character stands for itself
        return true;
    }
  }

  Node ParseClass() {
    bool negated = false;
    if (Peek('^')) { negated = true; ++i_; }
    if (Peek(']')) Refuse("a class starting with ']' (empty in ECMA-262, a literal in Python)");
    Ranges sure, maybe;
    auto add = [&](Ranges s, Ranges m) {
      sure.insert(sure.end(), s.begin(), s.end());
      maybe.insert(maybe.end(), m.begin(), m.end());
    };
    // One class atom: a code point (true) or a shorthand.
    auto atom = [&](uint32_t& cp, Shorthand& sh) -> bool {
      uint32_t c = Take();
      if (c == '\\' && relax_ && (Peek('p') || Peek('P'))) {
        ++i_;
        SkipPropertyName();
        LeaveOut("unicode property classes");
        sh.sure = sh.maybe = {{0, kMaxCp}};
        return false;
      }
      if (c == '\\') return Escape(true, cp, sh);
      if (c == '[') Refuse("'[' inside a class (a nested set in newer engines: escape it)");
      cp = c;
      return true;
    };
    for (;;) {
      if (AtEnd()) Refuse("an unterminated class '['");
      if (Peek(']')) { ++i_; break; }
      uint32_t lo;
      Shorthand sh;
      if (!atom(lo, sh)) {
        if (Peek('-') && i_ + 1 < cps_.size() && cps_[i_ + 1] != ']') Refuse("a range from a shorthand class");
        add(sh.sure, sh.maybe);
        continue;
      }
      if (Peek('-') && i_ + 1 < cps_.size() && cps_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi;
        if (!atom(hi, sh)) Refuse("a range to a shorthand class");
        if (hi < lo) Refuse("a class range out of order");
        add({{lo, hi}}, {{lo, hi}});
        continue;
      }
      add({{lo, lo}}, {{lo, lo}});
    }
    return SetNode(negated ? Complement(Normalize(maybe)) : sure);
  }

  Node ParseAtom(int depth) {
    uint32_t c = Take();
    switch (c) {
      case '(': {
        bool assertion = false;
        if (Peek('?')) {
          ++i_;
          uint32_t k = Take();
          if (k == '=' || k == '!') {
            LeaveOut("lookahead");
            assertion = true;
          } else if (k == '<' && (Peek('=') || Peek('!'))) {
            LeaveOut("lookbehind");
            ++i_;
            assertion = true;
          } else if (k == 'P' && Peek('=')) {
            LeaveOut("backreferences");
            while (Take() != ')') {
            }
            return AnyText();
          } else if (k == '<' || k == 'P') {
            if (!relax_)
              Refuse("named groups are spelled differently by ECMA-262 and Python (use (?:...))");
            if (k == 'P' && Take() != '<') Refuse("a named group (?P<name>...) needs its name");
            while (Take() != '>') {
            }
          } else if (k != ':') {
            Refuse("inline flags and other (?...) groups are not supported");
          }
        }
        if (depth >= 64) Refuse("groups nested deeper than 64");
        Node inner = ParseAlt(depth + 1);
        if (!Peek(')')) Refuse("an unterminated group '('");
        ++i_;
        return assertion ? Empty() : inner;
      }
      case '[': return ParseClass();
      case '.':
        // No line terminator of either engine.
        return SetNode(Complement(Normalize({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}})));
      case '\\': {
        if (relax_ && !AtEnd()) {
          const uint32_t k = cps_[i_];
          if (k == 'b' || k == 'B') {
            ++i_;
            LeaveOut("word boundaries");
            return Empty();
          }
          if (k == 'p' || k == 'P') {
            ++i_;
            SkipPropertyName();
            LeaveOut("unicode property classes");
            return SetNode({{0, kMaxCp}});
          }
          if (k >= '1' && k <= '9') {
            while (!AtEnd() && cps_[i_] >= '0' && cps_[i_] <= '9') ++i_;
            LeaveOut("backreferences");
            return AnyText();
          }
        }
        uint32_t cp;
        Shorthand sh;
        if (Escape(false, cp, sh)) return SetNode({{cp, cp}});
        return SetNode(sh.sure);
      }
      case '^':
        if (!relax_) Refuse("'^' only at the start of the pattern or of a top-level alternative");
        LeaveOut("anchors inside the pattern");
        return Empty();
      case '*': case '+': case '?': Refuse("a quantifier with nothing to repeat");
      case '{': Refuse("'{' must follow what it repeats (escape a literal brace)");
      case '}': case ']': Refuse(std::string("an unescaped '") + char(c) + "' (escape it)");
      default: return SetNode({{c, c}});
    }
  }

  // Notes a construct a relaxed parse left out; refuses it when strict.
  void LeaveOut(const std::string& what) {
    if (!relax_) Refuse(what + " is not supported");
    if (left_out_.find(what) == std::string::npos)
      left_out_ += (left_out_.empty() ? "" : "; ") + what;
  }
  static Node Empty() {
    Node n;
    n.kind = Node::kCat;
    return n;
  }
  static Node AnyText() {
    Node r;
    r.kind = Node::kRepeat;
    r.max = kInf;
    r.kids.push_back(SetNode({{0, kMaxCp}}));
    return r;
  }
  // \p{...} / \P{...} after the backslash and the letter.
  void SkipPropertyName() {
    if (!Peek('{')) Refuse("\\p needs {...}");
    while (Take() != '}') {
    }
  }

 public:
  const std::string& left_out() const { return left_out_; }

 private:
  std::vector<uint32_t> cps_;
  size_t i_ = 0;
  bool relax_ = false;
  std::string left_out_;
};

// ---- Thompson NFA ----
struct NfaState {
  Ranges set;             // a character state: on these code points to `out`
  int32_t out = -1;
  int32_t eps[2] = {-1, -1};  // epsilon edges (character states have none)
  bool is_char = false;
};

class NfaBuilder {
 public:
  std::vector<NfaState> states;
  int32_t accept = -1;

  int32_t New() {
    if (states.size() >= kMaxPatternNfaStates)
      Refuse("the automaton would exceed " + std::to_string(kMaxPatternNfaStates) + " NFA states (large {n,m} counts?)");
    states.emplace_back();
    return int32_t(states.size() - 1);
  }
  // A fragment: entry state and the exit state (an epsilon state, edges unset).
  struct Frag {
    int32_t in, out;
  };
  void Link(int32_t from, int32_t to) {
    NfaState& s = states[size_t(from)];
    if (s.eps[0] < 0) s.eps[0] = to;
    else s.eps[1] = to;
  }
  Frag Build(const Node& n) {
    switch (n.kind) {
      case Node::kSet: {
        int32_t a = New(), b = New();
        states[size_t(a)].is_char = true;
        states[size_t(a)].set = n.set;
        states[size_t(a)].out = b;
        return {a, b};
      }
      case Node::kCat: {
        int32_t in = New();
        int32_t at = in;
        for (const Node& k : n.kids) {
          Frag f = Build(k);
          Link(at, f.in);
          at = f.out;
        }
        return {in, at};
      }
      case Node::kAlt: {
        // A chain of binary splits.
        int32_t in = New(), out = New();
        int32_t at = in;
        for (size_t k = 0; k < n.kids.size(); ++k) {
          Frag f = Build(n.kids[k]);
          Link(f.out, out);
          if (k + 1 == n.kids.size()) { Link(at, f.in); break; }
          int32_t next = New();
          Link(at, f.in);
          Link(at, next);
          at = next;
        }
        return {in, out};
      }
      case Node::kRepeat: {
        const Node& body = n.kids[0];
        int32_t in = New();
        int32_t at = in;
        for (uint32_t k = 0; k < n.min; ++k) {
          Frag f = Build(body);
          Link(at, f.in);
          at = f.out;
        }
        if (n.max == kInf) {
          // at -> (body -> back to at) | out
          int32_t out = New();
          Frag f = Build(body);
          Link(at, f.in);
          Link(at, out);
          Link(f.out, at);
          return {in, out};
        }
        int32_t out = New();
        for (uint32_t k = n.min; k < n.max; ++k) {
          Frag f = Build(body);
          Link(at, f.in);
          Link(at, out);
          at = f.out;
        }
        Link(at, out);
        return {in, out};
      }
    }
    return {-1, -1};
  }
};

// The common end of a DFA's construction (from a pattern, or an
// intersection): edges only to states that can still accept (sorted by lo),
// free states, and the length table for [min_len, max_len].
std::shared_ptr<const PatternDfa> FinishDfa(std::vector<uint8_t> accept,
                                            std::vector<std::vector<PatternDfa::Edge>> raw_edges,
                                            uint32_t min_len, uint32_t max_len, Spend& spend) {
  auto dfa = std::make_shared<PatternDfa>();
  const size_t n = accept.size();
  size_t num_raw = 0;
  for (const auto& row : raw_edges) num_raw += row.size();
  // The edges kept, their reverse lists and the per-state flags.
  spend.Bytes(2 * n * (sizeof(std::vector<PatternDfa::Edge>) + 2) + num_raw * (sizeof(PatternDfa::Edge) + 4));
  dfa->edges.resize(n);
  dfa->accept = std::move(accept);
  dfa->free.assign(n, 0);
  // Which states can reach acceptance at all (reverse reachability).
  std::vector<std::vector<uint32_t>> rev(n);
  for (size_t d = 0; d < n; ++d)
    for (const PatternDfa::Edge& e : raw_edges[d]) rev[e.to].push_back(uint32_t(d));
  std::vector<uint8_t> live(n, 0);
  std::vector<uint32_t> stack;
  for (size_t d = 0; d < n; ++d)
    if (dfa->accept[d]) {
      live[d] = 1;
      stack.push_back(uint32_t(d));
    }
  while (!stack.empty()) {
    uint32_t d = stack.back();
    stack.pop_back();
    for (uint32_t p : rev[d])
      if (!live[p]) {
        live[p] = 1;
        stack.push_back(p);
      }
  }
  for (size_t d = 0; d < n; ++d) {
    std::vector<PatternDfa::Edge>& out = dfa->edges[d];
    for (const PatternDfa::Edge& e : raw_edges[d]) {
      if (!live[e.to]) continue;
      if (!out.empty() && out.back().to == e.to && out.back().hi + 1 == e.lo)
        out.back().hi = e.hi;
      else
        out.push_back(e);
    }
    // Free: accepting, and all of [0, D7FF] and [E000, 10FFFF] loops here.
    const auto& e = out;
    dfa->free[d] = dfa->accept[d] && e.size() == 2 && e[0].lo == 0 && e[0].hi == 0xD7FF &&
                   e[0].to == d && e[1].lo == 0xE000 && e[1].hi == kMaxCp && e[1].to == d;
  }

  // Lengths reaching acceptance: table_len covers min_len + n (a longer
  // accepted path from s can be shortened by a cycle of at most n states
  // while staying at or above any need <= min_len), or max_len + 1.
  dfa->min_len = min_len;
  dfa->max_len = max_len;
  uint64_t t = uint64_t(min_len) + n + 1;
  if (max_len != kUnboundedLen) t = std::min<uint64_t>(t, uint64_t(max_len) + 1);
  if (t * n > kMaxPatternLengthBits)
    Refuse("the pattern with minLength/maxLength " + std::to_string(min_len) + "/" +
           (max_len == kUnboundedLen ? std::string("none") : std::to_string(max_len)) +
           " would need a length table beyond " + std::to_string(kMaxPatternLengthBits) + " bits");
  size_t num_edges = 0;
  for (const auto& e : dfa->edges) num_edges += e.size();
  spend.Work(t * (num_edges + n));  // the table below
  spend.Bytes(n * ((t + 63) / 64) * sizeof(uint64_t));
  spend.Flush();
  dfa->table_len = uint32_t(t);
  dfa->words = size_t((t + 63) / 64);
  dfa->reach.assign(n * dfa->words, 0);
  // Column by column: L = 0 is acceptance, L + 1 follows an edge.
  std::vector<uint8_t> cur(n), next(n);
  for (size_t d = 0; d < n; ++d) cur[d] = dfa->accept[d];
  for (uint64_t l = 0; l < t; ++l) {
    for (size_t d = 0; d < n; ++d)
      if (cur[d]) dfa->reach[d * dfa->words + l / 64] |= uint64_t{1} << (l % 64);
    if (l + 1 == t) break;
    for (size_t d = 0; d < n; ++d) {
      uint8_t any = 0;
      for (const PatternDfa::Edge& e : dfa->edges[d])
        if (cur[e.to]) {
          any = 1;
          break;
        }
      next[d] = any;
    }
    cur.swap(next);
  }
  return dfa;
}

}  // namespace

size_t PatternDfa::bytes() const {
  size_t b = sizeof(PatternDfa) + edges.size() * sizeof(edges[0]) + accept.size() + free.size() +
             reach.size() * sizeof(uint64_t);
  for (const auto& e : edges) b += e.size() * sizeof(Edge);
  return b;
}

int32_t PatternDfa::Next(uint32_t s, uint32_t cp) const {
  const std::vector<Edge>& e = edges[s];
  auto it = std::upper_bound(e.begin(), e.end(), cp, [](uint32_t c, const Edge& x) { return c < x.lo; });
  if (it == e.begin()) return -1;
  --it;
  return cp <= it->hi ? int32_t(it->to) : -1;
}

int64_t PatternDfa::BestLen(uint32_t s, uint32_t count) const {
  // Lengths L with min_len <= count + L <= max_len. Beyond table_len - 1 no
  // new answer appears (regex.h: the table covers min_len + states).
  const uint64_t need = count < min_len ? min_len - count : 0;
  uint64_t hi = table_len - 1;
  if (max_len != kUnboundedLen) {
    if (count > max_len) return -1;
    hi = std::min<uint64_t>(hi, max_len - count);
  }
  if (need > hi) return -1;
  const uint64_t* row = reach.data() + size_t(s) * words;
  for (uint64_t w = need / 64; w <= hi / 64; ++w) {
    uint64_t bits = row[w];
    if (w == need / 64) bits &= ~uint64_t{0} << (need % 64);
    if (bits) {
      const uint64_t l = w * 64 + uint64_t(std::countr_zero(bits));
      return l <= hi ? int64_t(l) : -1;
    }
  }
  return -1;
}

std::shared_ptr<const PatternDfa> CompilePattern(std::string_view pattern, uint32_t min_len,
                                                 uint32_t max_len, bool relax,
                                                 std::string* left_out, CompileBudget* budget) {
  if (pattern.size() > kMaxPatternBytes)
    Refuse("a pattern longer than " + std::to_string(kMaxPatternBytes) + " bytes");
  Parser parser(pattern, relax);
  std::vector<Parser::Branch> branches = parser.ParseTop();
  if (left_out) *left_out = parser.left_out();

  // Unanchored search: a missing ^ or $ adds "any code points" on that side.
  NfaBuilder nb;
  Node any_star;
  any_star.kind = Node::kRepeat;
  any_star.max = kInf;
  {
    Node any;
    any.set = {{0, kMaxCp}};
    any_star.kids.push_back(std::move(any));
  }
  Node top;
  top.kind = Node::kAlt;
  for (auto& b : branches) {
    Node cat;
    cat.kind = Node::kCat;
    if (!b.start_anchor) cat.kids.push_back(any_star);
    cat.kids.push_back(std::move(b.body));
    if (!b.end_anchor) cat.kids.push_back(any_star);
    top.kids.push_back(std::move(cat));
  }
  NfaBuilder::Frag whole = nb.Build(top);
  const int32_t nfa_accept = whole.out;
  Spend spend(budget);
  {
    size_t ranges = 0;
    for (const NfaState& s : nb.states) ranges += s.set.size();
    spend.Bytes(nb.states.size() * sizeof(NfaState) + ranges * sizeof(Ranges::value_type));
  }
  // No surrogate code points anywhere (JSON strings never decode to one alone).
  for (NfaState& s : nb.states) {
    if (!s.is_char) continue;
    Ranges cut;
    for (auto [lo, hi] : s.set) {
      if (hi < 0xD800 || lo > 0xDFFF) { cut.push_back({lo, hi}); continue; }
      if (lo < 0xD800) cut.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) cut.push_back({0xE000, hi});
    }
    s.set = std::move(cut);
  }

  // Elementary intervals: between consecutive range boundaries.
  std::vector<uint32_t> cuts = {0, 0xD800, 0xE000, kMaxCp + 1};
  for (const NfaState& s : nb.states)
    for (auto [lo, hi] : s.set) {
      cuts.push_back(lo);
      cuts.push_back(hi + 1);
    }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  const size_t num_iv = cuts.size() - 1;  // interval k = [cuts[k], cuts[k+1])
  // Each character state covers interval spans.
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> spans(nb.states.size());
  for (size_t i = 0; i < nb.states.size(); ++i)
    for (auto [lo, hi] : nb.states[i].set) {
      uint32_t a = uint32_t(std::lower_bound(cuts.begin(), cuts.end(), lo) - cuts.begin());
      uint32_t b = uint32_t(std::lower_bound(cuts.begin(), cuts.end(), hi + 1) - cuts.begin());
      spans[i].push_back({a, b});
    }

  // Work cap: the subset construction touches states x intervals, and each
  // closure the NFA's states.
  auto charge = [&](uint64_t w) { spend.Work(w); };
  spend.Bytes(num_iv * sizeof(std::vector<int32_t>) + nb.states.size() * 2 * sizeof(uint32_t));
  auto closure = [&](std::vector<int32_t> seeds) {
    charge(nb.states.size() / 8 + seeds.size());
    std::vector<uint8_t> seen(nb.states.size(), 0);
    std::vector<int32_t> stack = std::move(seeds), out;
    while (!stack.empty()) {
      int32_t s = stack.back();
      stack.pop_back();
      if (s < 0 || seen[size_t(s)]) continue;
      seen[size_t(s)] = 1;
      charge(1);
      const NfaState& st = nb.states[size_t(s)];
      if (st.is_char || s == nfa_accept) out.push_back(s);
      stack.push_back(st.eps[0]);
      stack.push_back(st.eps[1]);
    }
    std::sort(out.begin(), out.end());
    return out;
  };

  std::map<std::vector<int32_t>, uint32_t> ids;
  std::vector<std::vector<int32_t>> sets;
  auto intern = [&](std::vector<int32_t> set) -> uint32_t {
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    if (sets.size() >= kMaxPatternDfaStates)
      Refuse("the automaton would exceed " + std::to_string(kMaxPatternDfaStates) + " DFA states");
    uint32_t id = uint32_t(sets.size());
    // The set twice (its map key and the list), with the map node.
    spend.Bytes(2 * set.size() * sizeof(int32_t) + 128);
    ids.emplace(set, id);
    sets.push_back(std::move(set));
    return id;
  };
  intern(closure({whole.in}));
  std::vector<std::vector<int32_t>> by_iv(num_iv);
  std::vector<std::vector<std::pair<uint32_t, int32_t>>> raw_edges;  // per DFA state: interval, target
  for (size_t d = 0; d < sets.size(); ++d) {
    for (auto& v : by_iv) v.clear();
    for (int32_t s : sets[d]) {
      if (!nb.states[size_t(s)].is_char) continue;
      for (auto [a, b] : spans[size_t(s)]) {
        charge(b - a);
        for (uint32_t k = a; k < b; ++k) by_iv[k].push_back(nb.states[size_t(s)].out);
      }
    }
    std::vector<std::pair<uint32_t, int32_t>> row;
    std::map<std::vector<int32_t>, uint32_t> memo;  // seeds -> DFA id for this row
    for (uint32_t k = 0; k < num_iv; ++k) {
      if (by_iv[k].empty()) continue;
      std::vector<int32_t> seeds = by_iv[k];
      std::sort(seeds.begin(), seeds.end());
      seeds.erase(std::unique(seeds.begin(), seeds.end()), seeds.end());
      auto m = memo.find(seeds);
      uint32_t to;
      if (m != memo.end()) {
        to = m->second;
      } else {
        to = intern(closure(seeds));
        memo.emplace(seeds, to);
      }
      row.push_back({k, int32_t(to)});
    }
    spend.Bytes(row.size() * sizeof(row[0]) + sizeof(row));
    raw_edges.push_back(std::move(row));
  }
  std::vector<uint8_t> accept(sets.size());
  std::vector<std::vector<PatternDfa::Edge>> edges(sets.size());
  for (size_t d = 0; d < sets.size(); ++d) {
    accept[d] = std::binary_search(sets[d].begin(), sets[d].end(), nfa_accept);
    for (auto [k, to] : raw_edges[d]) edges[d].push_back({cuts[k], cuts[k + 1] - 1, uint32_t(to)});
  }
  return FinishDfa(std::move(accept), std::move(edges), min_len, max_len, spend);
}

std::shared_ptr<const PatternDfa> IntersectPatterns(const PatternDfa& a, const PatternDfa& b,
                                                    uint32_t min_len, uint32_t max_len,
                                                    CompileBudget* budget) {
  Spend spend(budget);
  // The product automaton over the reachable pairs: on a code point both
  // move, and a pair accepts when both do.
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> ids;
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  auto intern = [&](uint32_t x, uint32_t y) -> uint32_t {
    auto [it, fresh] = ids.emplace(std::make_pair(x, y), uint32_t(pairs.size()));
    if (fresh) {
      if (pairs.size() >= kMaxPatternDfaStates)
        Refuse("the patterns together would exceed " + std::to_string(kMaxPatternDfaStates) +
               " DFA states");
      pairs.emplace_back(x, y);
      spend.Bytes(96);  // the pair, its map node
    }
    return it->second;
  };
  intern(0, 0);
  std::vector<uint8_t> accept;
  std::vector<std::vector<PatternDfa::Edge>> edges;
  for (size_t d = 0; d < pairs.size(); ++d) {
    const auto [x, y] = pairs[d];
    accept.push_back(a.accept[x] && b.accept[y]);
    const std::vector<PatternDfa::Edge>&ea = a.edges[x], &eb = b.edges[y];
    std::vector<PatternDfa::Edge> row;
    for (size_t i = 0, j = 0; i < ea.size() && j < eb.size();) {
      const uint32_t lo = std::max(ea[i].lo, eb[j].lo), hi = std::min(ea[i].hi, eb[j].hi);
      if (lo <= hi) row.push_back({lo, hi, intern(ea[i].to, eb[j].to)});
      if (ea[i].hi < eb[j].hi)
        ++i;
      else
        ++j;
      spend.Work(1);
    }
    edges.push_back(std::move(row));
  }
  return FinishDfa(std::move(accept), std::move(edges), min_len, max_len, spend);
}

}  // namespace k3::constrain
