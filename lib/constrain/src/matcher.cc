// The byte automaton's transitions (matcher.h). Every byte either moves the top
// frame on, opens a child frame, closes the top frame, or is refused; a number
// or number literal ends at the first byte that cannot continue it, and that
// byte is then offered to the enclosing frame (kReprocess).
#include "matcher.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace k3::constrain {
namespace {

// The *Space phases expect the space of Python's separators (", " and ": ").
enum ObjPhase : uint8_t { kObjOpen, kObjKey, kObjAfterKey, kObjValue, kObjAfterValue, kObjComma,
                          kObjCommaSpace, kObjColonSpace };
enum ArrPhase : uint8_t { kArrOpen, kArrAfterValue, kArrComma, kArrCommaSpace };
enum NumLex : uint8_t { kN0, kNMinus, kNZero, kNInt, kNDot, kNFrac, kNE, kNESign, kNExp };

// Digits of a bounded number, before and after the point together: the value is
// then an exact integer over an exact power of ten, so one division gives the
// correctly rounded double a JSON parser reads.
constexpr int kMaxBoundedDigits = 15;

// An unbounded number's mantissa digits plus its positive exponent stay within
// this, so that every value is below 10^308 < DBL_MAX: finite in every parser.
constexpr uint32_t kMaxDecimalExp = 308;

constexpr double kPow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                             1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

constexpr int64_t kPow10i[] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000,
                               10000000000, 100000000000, 1000000000000, 10000000000000, 100000000000000,
                               1000000000000000, 10000000000000000, 100000000000000000, 1000000000000000000};

bool IsDigit(uint8_t b) { return b >= '0' && b <= '9'; }

uint64_t AllLiterals(const SchemaNode& n) {
  return n.literals.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.literals.size()) - 1;
}

uint64_t AllProps(const SchemaNode& n) {
  return n.props.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.props.size()) - 1;
}

uint64_t AllReserved(const SchemaNode& n) {
  return n.reserved.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.reserved.size()) - 1;
}

// [a, b] with each end open or closed, intersected with the node's bounds.
bool Meets(const SchemaNode& n, double a, bool a_closed, double b, bool b_closed) {
  double lo = a;
  bool lo_closed = a_closed;
  if (n.lo > a || (n.lo == a && n.lo_excl)) { lo = n.lo; lo_closed = !n.lo_excl; }
  double hi = b;
  bool hi_closed = b_closed;
  if (n.hi < b || (n.hi == b && n.hi_excl)) { hi = n.hi; hi_closed = !n.hi_excl; }
  return lo < hi || (lo == hi && lo_closed && hi_closed);
}

// Some integer of [a, b] meets the node's bounds (and is a multiple of its multipleOf).
bool MeetsInt(const SchemaNode& n, int64_t a, int64_t b) {
  const int64_t lo = std::max(a, n.ilo), hi = std::min(b, n.ihi);
  if (lo > hi) return false;
  if (n.multiple <= 1) return true;
  __int128 r = __int128(lo) % n.multiple;
  if (r < 0) r += n.multiple;
  return r == 0 || __int128(lo) + (n.multiple - r) <= hi;
}

// The array's schema for its item at `index` (a tuple's position, or items).
uint32_t ItemNode(const SchemaNode& n, uint32_t index) {
  return index < n.prefix.size() ? n.prefix[index] : n.items;
}

double NumberValue(const Frame& f) {
  double mant = double(f.bits2 * uint64_t(kPow10[f.nd_frac]) + f.frac);
  double v = mant / kPow10[f.nd_frac];
  return f.neg ? -v : v;
}

// ---- `pattern` strings: the decoded code points drive the pattern's DFA ----
// Frame::bits = DFA state, Frame::bits2 = the code point (or high surrogate)
// decoded so far in a character that is not complete yet.

// Code points a character in progress may still become: up to three ranges.
struct CpRanges {
  uint32_t lo[3], hi[3];
  int n = 0;
  void Add(uint32_t a, uint32_t b) {  // clipped to non-surrogates
    if (b > 0x10FFFF) b = 0x10FFFF;
    if (a > b) return;
    if (a < 0xD800) Put(a, std::min<uint32_t>(b, 0xD7FF));
    if (b > 0xDFFF) Put(std::max<uint32_t>(a, 0xE000), b);
  }
  void Put(uint32_t a, uint32_t b) {
    if (a <= b && n < 3) { lo[n] = a; hi[n] = b; ++n; }
  }
};

uint32_t Supplementary(uint32_t high, uint32_t low) { return 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00); }

// What a partial character (lexer state `now`, accumulator `acc`) may become.
CpRanges PossibleCps(const StrLexState& now, uint64_t acc) {
  CpRanges r;
  auto hex_span = [&](int digits, uint32_t& lo, uint32_t& hi) {
    const int shift = 4 * (4 - digits);
    lo = uint32_t(now.hex) << shift;
    hi = ((uint32_t(now.hex) + 1) << shift) - 1;
  };
  switch (now.lex) {
    case kStrEsc:
    case kStrHex0: r.Add(0, 0x10FFFF); break;  // an escape can still spell any code point
    case kStrHex1: case kStrHex2: case kStrHex3: {
      uint32_t lo, hi;
      hex_span(now.lex - kStrHex0, lo, hi);
      r.Add(lo, hi);
      const uint32_t a = std::max<uint32_t>(lo, 0xD800), b = std::min<uint32_t>(hi, 0xDBFF);
      if (a <= b) r.Add(Supplementary(a, 0xDC00), Supplementary(b, 0xDFFF));
      break;
    }
    case kStrLowBackslash: case kStrLowU: case kStrLowHex0:
      r.Add(Supplementary(uint32_t(acc), 0xDC00), Supplementary(uint32_t(acc), 0xDFFF));
      break;
    case kStrLowHex1: case kStrLowHex2: case kStrLowHex3: {
      uint32_t lo, hi;
      hex_span(now.lex - kStrLowHex0, lo, hi);
      lo = std::max<uint32_t>(lo, 0xDC00);
      hi = std::min<uint32_t>(hi, 0xDFFF);
      if (lo <= hi) r.Add(Supplementary(uint32_t(acc), lo), Supplementary(uint32_t(acc), hi));
      break;
    }
    default: {  // UTF-8 continuation bytes left
      const int left = now.lex == kStrU1 ? 1 : (now.lex == kStrU2 || now.lex == kStrU2E0 || now.lex == kStrU2ED) ? 2 : 3;
      uint32_t lo = uint32_t(acc) << (6 * left), hi = ((uint32_t(acc) + 1) << (6 * left)) - 1;
      if (now.lex == kStrU2E0) lo = std::max<uint32_t>(lo, 0x800);
      if (now.lex == kStrU3F0) lo = std::max<uint32_t>(lo, 0x10000);
      r.Add(lo, hi);
    }
  }
  return r;
}

// Moves the DFA over one byte of the string (the lexer already went from
// `was` to `now`); false when no completion can be accepted any more.
bool PatternByte(const PatternDfa& d, uint8_t was, const StrLexState& now, uint8_t b, bool raw, uint32_t count,
                 uint64_t& state, uint64_t& acc) {
  int64_t cp = -1;  // a code point completed by this byte
  switch (was) {
    case kStrPlain:
      if (b < 0x80) {
        if (raw || b != '\\') cp = b;
        else acc = 0;
      } else {
        acc = b & (b >= 0xF0 ? 0x07 : b >= 0xE0 ? 0x0F : 0x1F);
      }
      break;
    case kStrEsc:
      switch (b) {
        case 'b': cp = 0x08; break;
        case 'f': cp = 0x0C; break;
        case 'n': cp = 0x0A; break;
        case 'r': cp = 0x0D; break;
        case 't': cp = 0x09; break;
        case 'u': break;
        default: cp = b;  // " \ /
      }
      break;
    case kStrHex0: case kStrHex1: case kStrHex2: case kStrHex3:
      if (now.lex == kStrPlain) cp = now.hex;
      else if (now.lex == kStrLowBackslash) acc = now.hex;  // a high surrogate
      break;
    case kStrLowBackslash: case kStrLowU: break;
    case kStrLowHex0: case kStrLowHex1: case kStrLowHex2: case kStrLowHex3:
      if (now.lex == kStrPlain) cp = Supplementary(uint32_t(acc), now.hex);
      break;
    default:  // UTF-8 continuation
      acc = (acc << 6) | (b & 0x3F);
      if (now.lex == kStrPlain) cp = int64_t(acc);
  }
  if (cp >= 0) {
    const int32_t t = d.Next(uint32_t(state), uint32_t(cp));
    if (t < 0 || !d.Viable(uint32_t(t), count)) return false;
    state = uint64_t(t);
    acc = 0;  // equal states merge
    return true;
  }
  const CpRanges r = PossibleCps(now, acc);
  for (const PatternDfa::Edge& e : d.edges[state])
    for (int k = 0; k < r.n; ++k)
      if (e.lo <= r.hi[k] && r.lo[k] <= e.hi && d.Viable(e.to, count)) return true;
  return false;
}

// A pleasant code point of [a, b] and its rank (lower = preferred): letters,
// digits, other printable ASCII, then the rest; control characters last.
std::pair<int, uint32_t> NiceCp(uint32_t a, uint32_t b) {
  static constexpr std::pair<uint32_t, uint32_t> kOrder[] = {
      {'a', 'z'}, {'0', '9'}, {'A', 'Z'}, {0x23, 0x5B}, {0x5D, 0x7E}, {0x21, 0x21}, {0x20, 0x20},
      {0xA0, 0x10FFFF}, {0x80, 0x9F}, {'"', '"'}, {'\\', '\\'}, {0x09, 0x0A}, {0x0D, 0x0D}, {0, 0x1F}};
  int rank = 0;
  for (auto [lo, hi] : kOrder) {
    if (std::max(a, lo) <= std::min(b, hi)) return {rank, std::max(a, lo)};
    ++rank;
  }
  return {rank, a};
}

// The next byte that spells code point cp from lexer state `now`.
int SpellByte(uint32_t cp, const StrLexState& now, bool raw) {
  auto lead = [](uint32_t c) -> int {
    if (c < 0x80) return int(c);
    if (c < 0x800) return int(0xC0 | (c >> 6));
    if (c < 0x10000) return int(0xE0 | (c >> 12));
    return int(0xF0 | (c >> 18));
  };
  auto hex_digit = [](uint32_t unit, int k) { return int("0123456789abcdef"[(unit >> (4 * (3 - k))) & 0xF]); };
  const uint32_t high = 0xD800 + ((cp - 0x10000) >> 10), low = 0xDC00 + ((cp - 0x10000) & 0x3FF);
  switch (now.lex) {
    case kStrPlain:
      if (!raw && (cp == '"' || cp == '\\' || cp < 0x20)) return '\\';
      return lead(cp);
    case kStrU1: return int(0x80 | (cp & 0x3F));
    case kStrU2: case kStrU2E0: case kStrU2ED: return int(0x80 | ((cp >> 6) & 0x3F));
    case kStrU3: case kStrU3F0: case kStrU3F4: return int(0x80 | ((cp >> 12) & 0x3F));
    case kStrEsc:
      switch (cp) {
        case '"': case '\\': case '/': return int(cp);
        case 0x08: return 'b';
        case 0x0C: return 'f';
        case 0x0A: return 'n';
        case 0x0D: return 'r';
        case 0x09: return 't';
        default: return 'u';
      }
    case kStrHex0: case kStrHex1: case kStrHex2: case kStrHex3:
      return hex_digit(cp >= 0x10000 ? high : cp, now.lex - kStrHex0);
    case kStrLowBackslash: return '\\';
    case kStrLowU: return 'u';
    default: return hex_digit(low, now.lex - kStrLowHex0);
  }
}

}  // namespace

int Matcher::PatternHint(const State& s) const {
  const Frame& f = arena_[size_t(s.top)];
  Frame raw_start;  // a raw top-level string that has not started
  const Frame* g = &f;
  if (f.node == kRootNode) {
    if (!format_.raw_top_string || f.phase != 0) return -1;
    raw_start.node = root_;
    raw_start.phase = kRawPhase;
    g = &raw_start;
  }
  const SchemaNode& n = nodes_[g->node];
  if (n.kind != NodeKind::kString || !n.pattern) return -1;
  const PatternDfa& d = *n.pattern;
  const bool raw = g->phase == kRawPhase;
  const StrLexState now{g->lex, g->pos};
  CpRanges r;
  uint32_t after = g->count;  // code points once this character is done
  if (g->lex == kStrPlain) {
    if (d.accept[g->bits] && g->count >= n.min_len) return raw ? -1 : '"';
    r.Add(0, 0x10FFFF);
    ++after;
  } else {
    r = PossibleCps(now, g->bits2);
  }
  int64_t best_len = -1;
  int best_rank = 0;
  uint32_t best_cp = 0;
  for (const PatternDfa::Edge& e : d.edges[g->bits])
    for (int k = 0; k < r.n; ++k) {
      const uint32_t a = std::max(e.lo, r.lo[k]), b = std::min(e.hi, r.hi[k]);
      if (a > b) continue;
      const int64_t len = d.BestLen(e.to, after);
      if (len < 0) continue;
      auto [rank, cp] = NiceCp(a, b);
      if (raw && cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r') continue;
      if (best_len < 0 || len < best_len || (len == best_len && rank < best_rank)) {
        best_len = len;
        best_rank = rank;
        best_cp = cp;
      }
    }
  if (best_len < 0) return -1;
  return SpellByte(best_cp, now, raw);
}

State Matcher::Start() {
  Frame root;
  arena_.push_back(root);
  return State{int32_t(arena_.size() - 1), 1};
}

Frame& Matcher::Modify(State& s) {
  Frame copy = arena_[size_t(s.top)];
  arena_.push_back(copy);
  s.top = int32_t(arena_.size() - 1);
  return arena_.back();
}

void Matcher::Push(State& s, const Frame& f) {
  Frame c = f;
  c.parent = s.top;
  arena_.push_back(c);
  s.top = int32_t(arena_.size() - 1);
  ++s.depth;
}

void Matcher::Step(State s, uint8_t b, std::vector<State>& out) {
  for (;;) {
    const Frame& f = arena_[size_t(s.top)];
    if (f.node == kRootNode) {
      if (f.phase != 0) return;
      Modify(s).phase = 1;
      if (format_.raw_top_string) {
        // The first byte is already content: no opening quote.
        Frame v;
        v.node = root_;
        v.phase = kRawPhase;
        const SchemaNode& n = nodes_[root_];
        if (n.kind == NodeKind::kLiterals) v.bits = n.literals.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.literals.size()) - 1;
        Push(s, v);
        continue;
      }
      StartValue(s, root_, b, out);
      return;
    }
    R r = R::kFail;
    switch (nodes_[f.node].kind) {
      case NodeKind::kObject: r = StepObject(s, b, out); break;
      case NodeKind::kArray: r = StepArray(s, b, out); break;
      case NodeKind::kString: r = StepString(s, b); break;
      case NodeKind::kNumber: r = StepNumber(s, b); break;
      case NodeKind::kLiterals: r = StepLiterals(s, b); break;
      case NodeKind::kUnion: return;  // never on the stack
    }
    if (r == R::kDone) out.push_back(s);
    if (r != R::kReprocess) return;
  }
}

void Matcher::StartValue(State s, uint32_t node, uint8_t b, std::vector<State>& out, uint64_t exclude) {
  const SchemaNode& n = nodes_[node];
  if (!n.first[b]) return;
  Frame f;
  f.node = node;
  switch (n.kind) {
    case NodeKind::kUnion:
      // Each alternative continues from the same (shared) frames below.
      for (uint32_t alt : n.alts) StartValue(s, alt, b, out);
      return;
    case NodeKind::kObject:
    case NodeKind::kArray:
      if (s.depth > kMaxDepth) return;
      Push(s, f);
      out.push_back(s);
      return;
    case NodeKind::kString:
      Push(s, f);
      out.push_back(s);
      return;
    case NodeKind::kNumber:
      Push(s, f);
      if (StepNumber(s, b) == R::kDone) out.push_back(s);
      return;
    case NodeKind::kLiterals:
      f.bits = (n.literals.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.literals.size()) - 1) & ~exclude;
      if (!f.bits) return;
      Push(s, f);
      if (StepLiterals(s, b) == R::kDone) out.push_back(s);
      return;
  }
}

bool Matcher::Same(const State& a, const State& b) const {
  if (a.depth != b.depth) return false;
  for (int32_t i = a.top, j = b.top; i != j; i = arena_[size_t(i)].parent, j = arena_[size_t(j)].parent) {
    if (i < 0 || j < 0) return false;
    const Frame &x = arena_[size_t(i)], &y = arena_[size_t(j)];
    if (x.node != y.node || x.phase != y.phase || x.lex != y.lex || x.pos != y.pos || x.count != y.count ||
        x.bits != y.bits || x.bits2 != y.bits2 || x.frac != y.frac || x.nd_int != y.nd_int ||
        x.nd_frac != y.nd_frac || x.nd_exp != y.nd_exp || x.neg != y.neg || x.free_count != y.free_count)
      return false;
  }
  return true;
}

void Matcher::Dedupe(std::vector<State>& v, size_t max_states) const {
  if (v.size() < 2) return;
  size_t n = 0;
  for (size_t i = 0; i < v.size() && n < max_states; ++i) {
    bool dup = false;
    for (size_t k = 0; k < n && !dup; ++k) dup = Same(v[k], v[i]);
    if (!dup) v[n++] = v[i];
  }
  v.resize(n);
}

bool Matcher::NextBytes(const State& s, uint64_t set[4]) const {
  auto add = [&](uint8_t b) { set[b / 64] |= uint64_t{1} << (b % 64); };
  auto add_first = [&](uint32_t node) {
    for (size_t w = 0; w < 4; ++w) set[w] |= nodes_[node].first_bits[w];
  };
  const Frame& f = arena_[size_t(s.top)];
  if (f.node == kRootNode) {
    if (f.phase != 0) return true;  // the value is complete: nothing follows
    if (format_.raw_top_string) return false;
    add_first(root_);
    return true;
  }
  const SchemaNode& n = nodes_[f.node];
  // Objects and arrays take every byte themselves (they never hand one on).
  if (n.kind == NodeKind::kObject) {
    switch (f.phase) {
      case kObjOpen: add('"'); add('}'); return true;
      case kObjComma: add('"'); return true;
      case kObjCommaSpace:
      case kObjColonSpace: add(' '); return true;
      case kObjAfterKey: add(':'); return true;
      case kObjAfterValue: add(','); add('}'); return true;
      case kObjKey:
        for (uint64_t c = f.bits2; c; c &= c - 1) {
          const std::string& key = n.props[size_t(std::countr_zero(c))].key;
          if (f.pos < key.size()) add(uint8_t(key[f.pos]));
          else if (f.pos == key.size()) add('"');
        }
        return true;
      case kObjValue:
        add_first(f.count == kFreeKey ? uint32_t(n.map_value) : n.props[f.count].child);
        return true;
    }
    return false;
  }
  if (n.kind == NodeKind::kArray) {
    switch (f.phase) {
      case kArrOpen:
        add(']');
        add_first(ItemNode(n, 0));
        return true;
      case kArrAfterValue: add(','); add(']'); return true;
      case kArrCommaSpace: add(' '); return true;
      case kArrComma:
        add_first(ItemNode(n, f.count));
        return true;
    }
    return false;
  }
  return false;
}

Matcher::R Matcher::StepObject(State& s, uint8_t b, std::vector<State>& out) {
  const Frame f = arena_[size_t(s.top)];
  const SchemaNode& n = nodes_[f.node];
  // What may come next where a key or the close can (the key-byte, colon and
  // value phases, most of a mask walk's steps inside an object, need none of it).
  uint64_t unseen = 0;
  bool can_close = false, free_ok = false, can_add = false;
  if (f.phase == kObjOpen || f.phase == kObjComma || f.phase == kObjAfterValue) {
    const bool free_keys = n.map_value >= 0;  // keys other than the declared ones (additionalProperties)
    unseen = AllProps(n) & ~f.bits;
    const uint64_t seen = uint64_t(std::popcount(f.bits));
    const uint64_t have = seen + f.free_count;  // entries so far
    const uint64_t missing = uint64_t(std::popcount(n.required_mask & ~f.bits));
    // minProperties counts distinct keys: free keys may repeat (a parser keeps
    // one of each), so at most one of them counts.
    const uint64_t distinct = seen + (f.free_count ? 1 : 0);
    can_close = missing == 0 && distinct >= n.min_props;
    // Keys that may come next: an optional declared key only if the required
    // ones left still fit under maxProperties. A free key only once nothing
    // else is needed (every required key written, minProperties met with this
    // one): then the object may close after it, so a shortest completion never
    // loops on free keys, and what is needed always fits.
    if (have + 1 + missing > n.max_props) unseen &= n.required_mask;
    if (have >= n.max_props) unseen = 0;
    free_ok = free_keys && missing == 0 && n.min_props <= seen + 1 && have < n.max_props;
    can_add = unseen || free_ok;
  }
  // A key starts: a declared one (matched byte by byte against the candidates)
  // and, beside it, a free key (a string frame); both are followed until the
  // key's bytes tell them apart.
  auto begin_key = [&]() -> R {
    if (!can_add) return R::kFail;
    if (unseen) {
      State d = s;
      Frame& m = Modify(d);
      m.phase = kObjKey;
      m.bits2 = unseen;
      m.pos = 0;
      out.push_back(d);
    }
    if (free_ok) {
      State k = s;
      Frame& m = Modify(k);
      m.phase = kObjAfterKey;
      m.count = kFreeKey;
      Frame key;
      key.node = n.key_node;
      key.bits = nodes_[n.key_node].key_of >= 0 ? AllReserved(n) : 0;
      Push(k, key);
      out.push_back(k);
    }
    return R::kOut;
  };
  switch (f.phase) {
    case kObjOpen:
      if (b == '"') return begin_key();
      if (b == '}' && can_close) { Pop(s); return R::kDone; }
      return R::kFail;
    case kObjComma:
      return b == '"' ? begin_key() : R::kFail;
    case kObjCommaSpace:
      if (b != ' ') return R::kFail;
      Modify(s).phase = kObjComma;
      return R::kDone;
    case kObjColonSpace:
      if (b != ' ') return R::kFail;
      Modify(s).phase = kObjValue;
      return R::kDone;
    case kObjKey: {
      uint64_t nb = 0;
      for (uint64_t c = f.bits2; c; c &= c - 1) {
        int i = std::countr_zero(c);
        const std::string& key = n.props[size_t(i)].key;
        if (f.pos < key.size() && uint8_t(key[f.pos]) == b) nb |= uint64_t{1} << i;
      }
      if (nb) {
        Frame& m = Modify(s);
        m.bits2 = nb;
        m.pos = uint16_t(f.pos + 1);
        return R::kDone;
      }
      if (b != '"') return R::kFail;
      for (uint64_t c = f.bits2; c; c &= c - 1) {
        int i = std::countr_zero(c);
        if (n.props[size_t(i)].key.size() == f.pos) {
          Frame& m = Modify(s);
          m.phase = kObjAfterKey;
          m.count = uint32_t(i);
          return R::kDone;
        }
      }
      return R::kFail;
    }
    case kObjAfterKey:
      if (b != ':') return R::kFail;
      Modify(s).phase = format_.python_separators ? kObjColonSpace : kObjValue;
      return R::kDone;
    case kObjValue: {
      const bool free_key = f.count == kFreeKey;
      uint32_t child = free_key ? uint32_t(n.map_value) : n.props[f.count].child;
      Frame& m = Modify(s);
      m.phase = kObjAfterValue;
      if (free_key) ++m.free_count;  // entries, for min/maxProperties
      else m.bits |= uint64_t{1} << f.count;
      StartValue(s, child, b, out);
      return R::kOut;
    }
    case kObjAfterValue:
      if (b == ',' && can_add) {
        Modify(s).phase = format_.python_separators ? kObjCommaSpace : kObjComma;
        return R::kDone;
      }
      if (b == '}' && can_close) { Pop(s); return R::kDone; }
      return R::kFail;
  }
  return R::kFail;
}

Matcher::R Matcher::StepArray(State& s, uint8_t b, std::vector<State>& out) {
  const Frame f = arena_[size_t(s.top)];
  const SchemaNode& n = nodes_[f.node];
  switch (f.phase) {
    case kArrOpen:
      if (b == ']') {
        if (n.min_items != 0) return R::kFail;
        Pop(s);
        return R::kDone;
      }
      if (n.max_items == 0) return R::kFail;
      {
        Frame& m = Modify(s);
        m.phase = kArrAfterValue;
        m.count = 1;
      }
      StartValue(s, ItemNode(n, 0), b, out, f.bits);
      return R::kOut;
    case kArrAfterValue:
      // A uniqueItems array may add an item only while a value is left unused.
      if (b == ',' && f.count < n.max_items &&
          (!n.unique || (~f.bits & AllLiterals(nodes_[n.items])) != 0)) {
        Modify(s).phase = format_.python_separators ? kArrCommaSpace : kArrComma;
        return R::kDone;
      }
      if (b == ']' && f.count >= n.min_items) { Pop(s); return R::kDone; }
      return R::kFail;
    case kArrCommaSpace:
      if (b != ' ') return R::kFail;
      Modify(s).phase = kArrComma;
      return R::kDone;
    case kArrComma: {
      Frame& m = Modify(s);
      m.phase = kArrAfterValue;
      m.count = f.count + 1;
      StartValue(s, ItemNode(n, f.count), b, out, f.bits);
      return R::kOut;
    }
  }
  return R::kFail;
}

Matcher::R Matcher::StepString(State& s, uint8_t b) {
  const Frame f = arena_[size_t(s.top)];
  const SchemaNode& n = nodes_[f.node];
  StrLexState ls{f.lex, f.pos};
  StrStep r = StrLexStep(ls, b, f.phase == kRawPhase);
  if (r == StrStep::kFail) return R::kFail;
  // A free key beside declared keys: no escapes, so that its bytes are its
  // value and comparing them with the reserved keys' bytes is exact.
  const std::vector<std::string>* reserved = n.key_of >= 0 ? &nodes_[size_t(n.key_of)].reserved : nullptr;
  if (reserved && b == '\\') return R::kFail;
  if (r == StrStep::kClose) {
    if (f.count < n.min_len) return R::kFail;
    if (n.pattern && !n.pattern->accept[f.bits]) return R::kFail;
    if (reserved)
      for (uint64_t c = f.bits; c; c &= c - 1)
        if ((*reserved)[size_t(std::countr_zero(c))].size() == f.bits2) return R::kFail;  // a declared key
    Pop(s);
    return R::kDone;
  }
  uint32_t count = f.count;
  if (r == StrStep::kNewChar) {
    if (uint64_t(count) + 1 > uint64_t(n.max_len)) return R::kFail;
    if (count != kUnbounded) ++count;
  }
  uint64_t dstate = f.bits, acc = f.bits2;
  if (n.pattern && !PatternByte(*n.pattern, f.lex, ls, b, f.phase == kRawPhase, count, dstate, acc)) return R::kFail;
  Frame& m = Modify(s);
  m.lex = ls.lex;
  m.pos = ls.hex;
  m.count = count;
  if (n.pattern) {
    m.bits = dstate;
    m.bits2 = acc;
  }
  if (reserved && f.bits) {
    uint64_t still = 0;
    for (uint64_t c = f.bits; c; c &= c - 1) {
      const std::string& key = (*reserved)[size_t(std::countr_zero(c))];
      if (f.bits2 < key.size() && uint8_t(key[size_t(f.bits2)]) == b) still |= c & -c;
    }
    m.bits = still;
    m.bits2 = still ? f.bits2 + 1 : 0;  // 0 once no reserved key is left: equal states merge
  }
  return R::kDone;
}

Matcher::R Matcher::StepNumber(State& s, uint8_t b) {
  const Frame f = arena_[size_t(s.top)];
  const SchemaNode& n = nodes_[f.node];
  const bool allow_frac = !n.integer;
  const bool allow_exp = !n.integer && !n.bounded;
  const int total = f.nd_int + f.nd_frac;
  Frame g = f;
  bool consumed = true;
  switch (f.lex) {
    case kN0:
    case kNMinus:
      if (f.lex == kN0 && b == '-') { g.neg = true; g.lex = kNMinus; break; }
      if (b == '0') { g.lex = kNZero; g.nd_int = 1; break; }
      if (IsDigit(b)) { g.lex = kNInt; g.bits2 = uint64_t(b - '0'); g.nd_int = 1; break; }
      return R::kFail;
    case kNZero:
    case kNInt:
      if (IsDigit(b) && f.lex == kNInt) {
        // Integers whose bounds need them may have up to 18 digits (int_digits).
        if (f.nd_int >= n.int_digits || (n.bounded && !n.integer && total >= kMaxBoundedDigits)) return R::kFail;
        g.bits2 = f.bits2 * 10 + uint64_t(b - '0');
        ++g.nd_int;
        break;
      }
      if (b == '.' && allow_frac && (!n.bounded || total < kMaxBoundedDigits)) { g.lex = kNDot; break; }
      if ((b == 'e' || b == 'E') && allow_exp) { g.lex = kNE; break; }
      consumed = false;
      break;
    case kNDot:
      if (!IsDigit(b)) return R::kFail;
      g.lex = kNFrac;
      g.frac = uint64_t(b - '0');
      g.nd_frac = 1;
      break;
    case kNFrac:
      if (IsDigit(b)) {
        if (f.nd_frac >= kMaxFracDigits || (n.bounded && total >= kMaxBoundedDigits)) return R::kFail;
        g.frac = f.frac * 10 + uint64_t(b - '0');
        ++g.nd_frac;
        break;
      }
      if ((b == 'e' || b == 'E') && allow_exp) { g.lex = kNE; break; }
      consumed = false;
      break;
    case kNE:
      if (b == '+' || b == '-') {
        g.lex = kNESign;
        g.pos = b == '-';
        break;
      }
      [[fallthrough]];
    case kNESign:
    case kNExp:
      if (IsDigit(b)) {
        if (f.lex == kNExp && f.nd_exp >= kMaxExpDigits) return R::kFail;
        // Every value stays finite: the mantissa is below 10^nd_int, so a
        // positive exponent e with nd_int + e <= kMaxDecimalExp keeps it below
        // 1e308 < DBL_MAX (a negative one can only underflow, to a finite value).
        g.count = (f.lex == kNExp ? f.count * 10 : 0) + uint32_t(b - '0');
        if (!g.pos && f.nd_int + g.count > kMaxDecimalExp) return R::kFail;
        g.lex = kNExp;
        ++g.nd_exp;
        break;
      }
      if (f.lex != kNExp) return R::kFail;
      consumed = false;
      break;
    default:
      return R::kFail;
  }
  if (!consumed) {
    if (!NumberEndOk(n, f)) return R::kFail;
    Pop(s);
    return R::kReprocess;
  }
  if (n.bounded && !NumberViable(n, g)) return R::kFail;
  Modify(s) = g;
  return R::kDone;
}

bool Matcher::NumberEndOk(const SchemaNode& n, const Frame& f) const {
  if (f.lex != kNZero && f.lex != kNInt && f.lex != kNFrac && f.lex != kNExp) return false;
  if (!n.bounded) return true;
  if (n.integer) {
    int64_t v = int64_t(f.bits2);
    if (f.neg) v = -v;
    return v >= n.ilo && v <= n.ihi && (n.multiple <= 1 || v % n.multiple == 0);
  }
  double v = NumberValue(f);
  return Meets(n, v, true, v, true);
}

bool Matcher::NumberViable(const SchemaNode& n, const Frame& f) const {
  const int cap_int = n.integer ? int(n.int_digits) : std::min(kMaxIntDigits, kMaxBoundedDigits);
  switch (f.lex) {
    case kNMinus:
      if (n.integer) return MeetsInt(n, -kPow10i[cap_int] + 1, 0);
      return Meets(n, -kPow10[cap_int], false, 0.0, true);
    case kNZero:
    case kNInt: {
      // Completions: this integer part followed by j more digits (j = 0 .. the
      // cap), each optionally with a fraction.
      int more = f.lex == kNZero ? 0 : cap_int - f.nd_int;
      double m = double(f.bits2);
      for (int j = 0; j <= more; ++j) {
        double a = m * kPow10[j], b = (m + 1) * kPow10[j];
        bool hit;
        if (n.integer) {
          // Exact: the integer part has at most int_digits <= 18 digits.
          const int64_t ia = int64_t(f.bits2) * kPow10i[j], ib = (int64_t(f.bits2) + 1) * kPow10i[j] - 1;
          hit = f.neg ? MeetsInt(n, -ib, -ia) : MeetsInt(n, ia, ib);
        } else {
          hit = f.neg ? Meets(n, -b, false, -a, true) : Meets(n, a, true, b, false);
        }
        if (hit) return true;
      }
      return false;
    }
    case kNDot: {
      double m = double(f.bits2);
      return f.neg ? Meets(n, -(m + 1), false, -m, true) : Meets(n, m, true, m + 1, false);
    }
    case kNFrac: {
      double v = NumberValue(f);
      bool more = f.nd_frac < kMaxFracDigits && f.nd_int + f.nd_frac < kMaxBoundedDigits;
      double w = more ? 1.0 / kPow10[f.nd_frac] : 0.0;
      if (w == 0) return Meets(n, v, true, v, true);
      return f.neg ? Meets(n, v - w, false, v, true) : Meets(n, v, true, v + w, false);
    }
    default:
      return true;
  }
}

bool Matcher::LiteralEndOk(const SchemaNode& n, const Frame& f) const {
  const std::vector<std::string>& lits = Literals(n, f);
  for (uint64_t c = f.bits; c; c &= c - 1)
    if (lits[size_t(std::countr_zero(c))].size() == f.pos) return true;
  return false;
}

Matcher::R Matcher::StepLiterals(State& s, uint8_t b) {
  const Frame f = arena_[size_t(s.top)];
  const SchemaNode& n = nodes_[f.node];
  const std::vector<std::string>& lits = Literals(n, f);
  uint64_t nb = 0;
  for (uint64_t c = f.bits; c; c &= c - 1) {
    int i = std::countr_zero(c);
    const std::string& lit = lits[size_t(i)];
    if (f.pos < lit.size() && uint8_t(lit[f.pos]) == b) nb |= uint64_t{1} << i;
  }
  if (!nb) {
    // A number literal ends at the first byte that does not continue it (a raw
    // one only where the caller ends it).
    if (f.phase == kRawPhase || !LiteralEndOk(n, f)) return R::kFail;
    uint64_t done = 0;
    for (uint64_t c = f.bits; c; c &= c - 1)
      if (lits[size_t(std::countr_zero(c))].size() == f.pos) done |= c & -c;
    PopLiteral(s, done);
    return R::kReprocess;
  }
  uint16_t pos = uint16_t(f.pos + 1);
  for (uint64_t c = nb; c && f.phase != kRawPhase; c &= c - 1) {
    const std::string& lit = lits[size_t(std::countr_zero(c))];
    // A complete literal that does not end in a digit cannot be extended.
    if (lit.size() == pos && !IsDigit(uint8_t(lit.back()))) {
      PopLiteral(s, c & -c);
      return R::kDone;
    }
  }
  Frame& m = Modify(s);
  m.bits = nb;
  m.pos = pos;
  return R::kDone;
}

// Ends a literal frame; a uniqueItems array above it records the value used.
void Matcher::PopLiteral(State& s, uint64_t used) {
  Pop(s);
  const Frame& parent = arena_[size_t(s.top)];
  if (parent.node != kRootNode && nodes_[parent.node].kind == NodeKind::kArray && nodes_[parent.node].unique)
    Modify(s).bits |= used;
}

bool Matcher::Accepting(const State& s) const {
  const Frame& f = arena_[size_t(s.top)];
  if (f.node == kRootNode && f.phase == 0 && format_.raw_top_string) {
    // The empty raw string.
    const SchemaNode& n = nodes_[root_];
    if (n.kind == NodeKind::kString) return n.min_len == 0 && (!n.pattern || n.pattern->accept[0]);
    for (const std::string& l : n.literals_raw)
      if (l.empty()) return true;
    return false;
  }
  if (f.node == kRootNode) return f.phase == 1;
  if (f.parent < 0 || arena_[size_t(f.parent)].node != kRootNode) return false;
  const SchemaNode& n = nodes_[f.node];
  if (n.kind == NodeKind::kNumber) return NumberEndOk(n, f);
  if (n.kind == NodeKind::kLiterals) return LiteralEndOk(n, f);
  if (n.kind == NodeKind::kString && f.phase == kRawPhase)
    return f.lex == kStrPlain && f.count >= n.min_len && (!n.pattern || n.pattern->accept[f.bits]);
  return false;
}

}  // namespace k3::constrain
