// Kimi K3 tokenizer: loading, Kimi's input chunking, special-token splitting,
// the pre-tokenizer (PCRE2 JIT) and tiktoken's rank BPE. See docs/tokenizer.md.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/log.h"
#include "k3/tokenizer/tokenizer.h"
#include "bpe_internal.h"
#include "py_json.h"
#include "regex_pattern.h"

namespace k3::tok {
namespace {

constexpr uint32_t kNoRank = UINT32_MAX;
// Kimi's tokenization_kimi.py limits (code points): tiktoken is called on slices
// of at most 400,000 characters, each cut further inside any run of more than
// 25,000 consecutive whitespace or non-whitespace characters.
constexpr size_t kMaxEncodeChars = 400000;
constexpr size_t kMaxRunChars = 25000;
// Files are small (the real tiktoken.model is ~2.5 MB); refuse absurd inputs
// before allocating for them.
constexpr uint64_t kMaxVocabFileBytes = 256ull << 20;
constexpr uint64_t kMaxJsonFileBytes = 64ull << 20;
constexpr uint32_t kMaxRanks = 1u << 24;
// Pieces longer than this use the heap-based merge; shorter ones the simple scan
// (cheaper for the few-byte pieces that make up nearly all text).
constexpr size_t kHeapBpeMinBytes = 128;
// Tests lower this to push every piece through the heap merge (bpe_internal.h).
std::atomic<size_t> g_heap_bpe_min_bytes{kHeapBpeMinBytes};

// ---------------------------------------------------------------------------
// Base64 (standard alphabet, '=' padding) as used by tiktoken.model.

int Base64Value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool DecodeBase64(std::string_view in, std::string& out) {
  out.clear();
  if (in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      unsigned char c = in[i + k];
      if (c == '=') {
        // Padding only in the last quantum, only in its last two places.
        if (i + 4 != in.size() || k < 2) return false;
        v[k] = 0;
        ++pad;
      } else {
        if (pad) return false;
        v[k] = Base64Value(c);
        if (v[k] < 0) return false;
      }
    }
    uint32_t w = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out.push_back(char(w >> 16));
    if (pad < 2) out.push_back(char((w >> 8) & 0xFF));
    if (pad < 1) out.push_back(char(w & 0xFF));
  }
  return true;
}

// ---------------------------------------------------------------------------
// Byte-string -> rank table. Open addressing over an arena of token bytes; every
// BPE step is one lookup of a short substring, so this is the hot path.

inline uint64_t HashBytes(const unsigned char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t(n) * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h;
}

class RankTable {
 public:
  void Build(const std::string& arena, const std::vector<std::pair<uint32_t, uint32_t>>& spans) {
    arena_ = reinterpret_cast<const unsigned char*>(arena.data());
    size_t cap = 16;
    while (cap < spans.size() * 2 + 1) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, Slot{0, 0, kNoRank, 0});
    for (uint32_t rank = 0; rank < spans.size(); ++rank) {
      auto [off, len] = spans[rank];
      uint64_t h = HashBytes(arena_ + off, len);
      size_t i = h & mask_;
      while (slots_[i].rank != kNoRank) i = (i + 1) & mask_;
      slots_[i] = Slot{off, len, rank, uint32_t(h >> 32)};
    }
  }
  // The rank of bytes [p, p+n), or kNoRank.
  uint32_t Find(const unsigned char* p, size_t n) const {
    uint64_t h = HashBytes(p, n);
    uint32_t tag = uint32_t(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.rank == kNoRank) return kNoRank;
      if (s.tag == tag && s.len == n && std::memcmp(arena_ + s.off, p, n) == 0) return s.rank;
    }
  }

 private:
  struct Slot {
    uint32_t off, len, rank, tag;
  };
  const unsigned char* arena_ = nullptr;
  size_t mask_ = 0;
  std::vector<Slot> slots_;
};

// ---------------------------------------------------------------------------
// Per-thread PCRE2 scratch: match data and a JIT stack big enough for the
// longest piece Kimi's chunking lets through.

struct RegexScratch {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* match_context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  RegexScratch() {
    match_data = pcre2_match_data_create(1, nullptr);
    match_context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 32 * 1024 * 1024, nullptr);
    if (!match_data || !match_context || !jit_stack) {
      K3_CHECK(false && "PCRE2 scratch allocation failed");
    }
    pcre2_jit_stack_assign(match_context, nullptr, jit_stack);
  }
  ~RegexScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(match_context);
    pcre2_match_data_free(match_data);
  }
};

RegexScratch& ThreadScratch() {
  thread_local RegexScratch scratch;
  return scratch;
}

// Decodes one code point of valid UTF-8 at s[i]; advances i.
inline uint32_t NextCodePoint(const unsigned char* s, size_t& i) {
  unsigned char b = s[i];
  if (b < 0x80) { ++i; return b; }
  if (b < 0xE0) { uint32_t c = ((b & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu); i += 2; return c; }
  if (b < 0xF0) {
    uint32_t c = ((b & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu);
    i += 3;
    return c;
  }
  uint32_t c = ((b & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) |
               (s[i + 3] & 0x3Fu);
  i += 4;
  return c;
}

// An id, or the first of a list of ids (configs may list several EOS ids; the
// first is the one the model was trained to stop with).
std::optional<TokenId> IdFromJson(simdjson::dom::element el) {
  simdjson::dom::array list;
  if (el.get_array().get(list) == simdjson::SUCCESS) {
    if (list.size() == 0) return std::nullopt;
    el = list.at(0).value_unsafe();
  }
  int64_t v;
  if (el.get_int64().get(v) == simdjson::SUCCESS && v >= 0 && v <= INT32_MAX) return TokenId(v);
  return std::nullopt;
}

}  // namespace

namespace internal {
void SetHeapBpeThresholdForTest(size_t max_small_piece_bytes) {
  g_heap_bpe_min_bytes.store(std::min(max_small_piece_bytes, kHeapBpeMinBytes));
}
}  // namespace internal

// ---------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string arena;                                    // all token bytes
  std::vector<std::pair<uint32_t, uint32_t>> spans;     // id -> (offset, len)
  uint32_t num_ranks = 0;
  RankTable ranks;
  uint32_t byte_rank[256];
  // Rank of every two-byte string (kNoRank if none): the first round of merges
  // looks up every adjacent byte pair, so this skips hashing for all of them.
  std::vector<uint32_t> pair_rank;
  std::unordered_map<std::string, TokenId> special_ids;  // content -> id
  // Specials grouped by first byte, longest first, for the allow_special scan.
  std::vector<TokenId> specials_by_byte[256];
  bool special_first_byte[256] = {};
  std::optional<TokenId> bos, eos;
  // [0]: Unicode 14 classes (fast); [1]: plus the Unicode 15-16 additions.
  pcre2_code* regex[2] = {nullptr, nullptr};
  bool jit[2] = {false, false};

  ~Impl() {
    pcre2_code_free(regex[0]);
    pcre2_code_free(regex[1]);
  }

  std::string_view Bytes(TokenId id) const {
    auto [off, len] = spans[id];
    return std::string_view(arena.data() + off, len);
  }

  void CompileRegex() {
    for (int k = 0; k < 2; ++k) {
      std::string pattern = KimiPcre2Pattern(k == 1);
      int err = 0;
      PCRE2_SIZE err_off = 0;
      regex[k] = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF,
                               &err, &err_off, nullptr);
      if (!regex[k]) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        throw Error(ErrorCode::kInternal, "pre-tokenizer regex does not compile at " +
                                              std::to_string(err_off) + ": " +
                                              reinterpret_cast<char*>(msg));
      }
      jit[k] = pcre2_jit_compile(regex[k], PCRE2_JIT_COMPLETE) == 0;
      if (!jit[k]) {
        static const char kKey = 0;
        LogOnce(&kKey, LogLevel::kWarn,
                "tokenizer: PCRE2 JIT unavailable, using the interpreter (slower)");
      }
    }
  }

  // ---- BPE --------------------------------------------------------------

  void BpeSmall(const unsigned char* p, size_t n, std::vector<TokenId>& out) const {
    // tiktoken's scheme: part starts plus the rank of merging each part with
    // its right neighbour; merge the lowest (leftmost on ties) until none.
    uint32_t start[kHeapBpeMinBytes + 1];
    uint32_t rank[kHeapBpeMinBytes + 1];
    size_t m = n;  // number of parts
    for (size_t i = 0; i <= n; ++i) start[i] = uint32_t(i);
    for (size_t i = 0; i + 1 < n; ++i) rank[i] = pair_rank[(uint32_t(p[i]) << 8) | p[i + 1]];
    rank[n - 1] = kNoRank;
    for (;;) {
      uint32_t best = kNoRank;
      size_t bi = 0;
      for (size_t i = 0; i + 1 < m; ++i) {
        if (rank[i] < best) { best = rank[i]; bi = i; }
      }
      if (best == kNoRank) break;
      // Merge part bi with bi+1.
      for (size_t k = bi + 1; k < m; ++k) start[k] = start[k + 1];
      for (size_t k = bi + 1; k + 1 < m; ++k) rank[k] = rank[k + 1];
      --m;
      start[m] = uint32_t(n);
      auto merged_rank = [&](size_t i) -> uint32_t {
        if (i + 1 >= m) return kNoRank;
        return ranks.Find(p + start[i], start[i + 2] - start[i]);
      };
      rank[bi] = merged_rank(bi);
      if (bi > 0) rank[bi - 1] = merged_rank(bi - 1);
    }
    for (size_t i = 0; i < m; ++i) {
      uint32_t r = ranks.Find(p + start[i], start[i + 1] - start[i]);
      K3_CHECK(r != kNoRank);
      out.push_back(r);
    }
  }

  void BpeLarge(const unsigned char* p, size_t n, std::vector<TokenId>& out) const {
    // Same merge order as BpeSmall, in O(n log n): parts form a linked list
    // indexed by their first byte; a min-heap holds (pair rank, first byte)
    // entries, stale ones are skipped when popped.
    std::vector<uint32_t> next(n), prev(n), pair(n);
    for (size_t i = 0; i < n; ++i) {
      next[i] = uint32_t(i + 1);
      prev[i] = i == 0 ? kNoRank : uint32_t(i - 1);
    }
    auto end_of = [&](uint32_t i) { return next[i]; };  // one past the part's bytes
    auto compute = [&](uint32_t i) -> uint32_t {
      uint32_t j = next[i];
      if (j >= n) return kNoRank;
      return ranks.Find(p + i, end_of(j) - i);
    };
    using Entry = std::pair<uint32_t, uint32_t>;  // (rank, first byte)
    std::vector<Entry> heap;
    heap.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      pair[i] = i + 1 < n ? pair_rank[(uint32_t(p[i]) << 8) | p[i + 1]] : kNoRank;
      if (pair[i] != kNoRank) heap.push_back({pair[i], i});
    }
    std::greater<Entry> cmp;
    std::make_heap(heap.begin(), heap.end(), cmp);
    std::vector<bool> alive(n, true);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), cmp);
      auto [r, i] = heap.back();
      heap.pop_back();
      if (!alive[i] || pair[i] != r) continue;  // stale
      uint32_t j = next[i];
      alive[j] = false;
      next[i] = next[j];
      if (next[j] < n) prev[next[j]] = i;
      pair[i] = compute(i);
      if (pair[i] != kNoRank) {
        heap.push_back({pair[i], i});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
      if (prev[i] != kNoRank) {
        uint32_t h = prev[i];
        pair[h] = compute(h);
        if (pair[h] != kNoRank) {
          heap.push_back({pair[h], h});
          std::push_heap(heap.begin(), heap.end(), cmp);
        }
      }
    }
    for (uint32_t i = 0; i < n; i = next[i]) {
      uint32_t r = ranks.Find(p + i, next[i] - i);
      K3_CHECK(r != kNoRank);
      out.push_back(r);
    }
  }

  void EncodePiece(const unsigned char* p, size_t n, std::vector<TokenId>& out) const {
    if (n == 1) {
      out.push_back(byte_rank[p[0]]);
      return;
    }
    // tiktoken's shortcut: a piece that is itself a token is emitted whole,
    // even where merging would have split it differently.
    uint32_t whole = ranks.Find(p, n);
    if (whole != kNoRank) {
      out.push_back(whole);
      return;
    }
    if (n <= g_heap_bpe_min_bytes.load(std::memory_order_relaxed)) {
      BpeSmall(p, n, out);
    } else {
      BpeLarge(p, n, out);
    }
  }

  // ---- pre-tokenizer ------------------------------------------------------

  // Calls fn(begin, end) for every regex match in valid UTF-8 text.
  template <typename Fn>
  void ForEachPiece(std::string_view text, Fn&& fn) const {
    RegexScratch& scratch = ThreadScratch();
    const int k = NeedsUnicode16Pattern(text) ? 1 : 0;
    pcre2_code* regex = this->regex[k];
    const bool jit = this->jit[k];
    auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t len = text.size(), offset = 0;
    while (offset < len) {
      int rc = jit ? pcre2_jit_match(regex, subject, len, offset, 0, scratch.match_data,
                                     scratch.match_context)
                   : pcre2_match(regex, subject, len, offset, PCRE2_NO_UTF_CHECK,
                                 scratch.match_data, scratch.match_context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw Error(ErrorCode::kInternal, std::string("pre-tokenizer match failed: ") +
                                              reinterpret_cast<char*>(msg));
      }
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.match_data);
      size_t b = ov[0], e = ov[1];
      if (e <= b) {  // no alternative matches empty; guard against looping anyway
        ++offset;
        while (offset < len && (text[offset] & 0xC0) == 0x80) ++offset;
        continue;
      }
      fn(b, e);
      offset = e;
    }
  }

  void EncodeOrdinaryChunk(std::string_view text, std::vector<TokenId>& out) const {
    auto* s = reinterpret_cast<const unsigned char*>(text.data());
    ForEachPiece(text, [&](size_t b, size_t e) { EncodePiece(s + b, e - b, out); });
  }

  void EncodeChunk(std::string_view text, bool allow_special, std::vector<TokenId>& out) const {
    if (!allow_special) {
      EncodeOrdinaryChunk(text, out);
      return;
    }
    auto* s = reinterpret_cast<const unsigned char*>(text.data());
    size_t n = text.size(), plain_start = 0, i = 0;
    while (i < n) {
      if (!special_first_byte[s[i]]) {
        ++i;
        continue;
      }
      // Longest special starting here (lists are sorted longest first).
      TokenId hit = kNoRank;
      size_t hit_len = 0;
      for (TokenId id : specials_by_byte[s[i]]) {
        std::string_view c = Bytes(id);
        if (c.size() <= n - i && std::memcmp(s + i, c.data(), c.size()) == 0) {
          hit = id;
          hit_len = c.size();
          break;
        }
      }
      if (hit == kNoRank) {
        ++i;
        continue;
      }
      EncodeOrdinaryChunk(text.substr(plain_start, i - plain_start), out);
      out.push_back(hit);
      i += hit_len;
      plain_start = i;
    }
    EncodeOrdinaryChunk(text.substr(plain_start), out);
  }

  // Kimi's wrapper: 400,000-character slices, each cut inside long runs.
  void EncodeKimi(std::string_view text, bool allow_special, std::vector<TokenId>& out) const {
    auto* s = reinterpret_cast<const unsigned char*>(text.data());
    size_t n = text.size(), i = 0;
    size_t slice_chars = 0;  // code points in the current 400K slice
    size_t piece_start = 0;  // start of the piece not yet encoded
    size_t run_len = 0;      // length of the current whitespace / non-whitespace run
    bool run_is_space = false;
    while (i < n) {
      if (slice_chars == kMaxEncodeChars) {
        EncodeChunk(text.substr(piece_start, i - piece_start), allow_special, out);
        piece_start = i;
        slice_chars = 0;
      }
      size_t at = i;
      bool space = py::IsSpace(NextCodePoint(s, i));  // str.isspace(): U+001C..U+001F too
      if (slice_chars == 0 || space != run_is_space) {
        run_is_space = space;  // a slice starts a fresh run, as in Kimi's code
        run_len = 1;
      } else if (++run_len > kMaxRunChars) {
        EncodeChunk(text.substr(piece_start, at - piece_start), allow_special, out);
        piece_start = at;
        run_len = 1;
      }
      ++slice_chars;
    }
    EncodeChunk(text.substr(piece_start), allow_special, out);
  }

  // The loading steps of FromStringsOrThrow, in order (each throws kCorrupt or
  // kUnsupported naming the file in `object`).
  // tiktoken.model: arena, spans, rank table and single-byte ranks.
  void LoadRanksOrThrow(std::string_view tiktoken_model);
  // tokenizer_config.json: the names of the specials and of BOS/EOS.
  std::vector<std::string> SpecialNamesOrThrow(std::string_view tokenizer_config_json,
                                               std::optional<std::string>* bos_name,
                                               std::optional<std::string>* eos_name) const;
  // Appends the specials after the ranks and builds the lookup tables over both.
  void AddSpecialsOrThrow(const std::vector<std::string>& names);
  // config.json's bos_token_id / eos_token_id override the names' ids.
  void ApplyModelConfigOrThrow(std::string_view model_config_json);
};

// ---------------------------------------------------------------------------
// Loading

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::LoadDirOrThrow(const std::string& model_dir) {
  TokenizerFiles f;
  f.tiktoken_model = JoinPath(model_dir, "tiktoken.model");
  f.tokenizer_config = JoinPath(model_dir, "tokenizer_config.json");
  std::string cfg = JoinPath(model_dir, "config.json");
  if (PathExists(cfg)) f.model_config = cfg;
  return LoadOrThrow(f);
}

Tokenizer Tokenizer::LoadOrThrow(const TokenizerFiles& files) {
  std::string vocab = ReadFileOrThrow(files.tiktoken_model, kMaxVocabFileBytes);
  std::string tcfg = ReadFileOrThrow(files.tokenizer_config, kMaxJsonFileBytes);
  std::string mcfg;
  if (!files.model_config.empty()) mcfg = ReadFileOrThrow(files.model_config, kMaxJsonFileBytes);
  try {
    return FromStringsOrThrow(vocab, tcfg, mcfg);
  } catch (const Error& e) {
    if (!e.path().empty()) throw;
    // Name the file the problem came from.
    std::string path = e.object() == "config.json"           ? files.model_config
                       : e.object() == "tokenizer_config.json" ? files.tokenizer_config
                                                                : files.tiktoken_model;
    throw e.WithPath(path);
  }
}

void Tokenizer::Impl::LoadRanksOrThrow(std::string_view tiktoken_model) {
  // tiktoken.model: "<base64> <rank>" per line; ranks must be exactly 0..n-1.
  std::vector<std::pair<uint32_t, uint32_t>> by_rank;
  std::vector<bool> seen;
  std::string bytes;
  size_t pos = 0, line_no = 0;
  while (pos < tiktoken_model.size()) {
    size_t eol = tiktoken_model.find('\n', pos);
    if (eol == std::string_view::npos) eol = tiktoken_model.size();
    std::string_view line = tiktoken_model.substr(pos, eol - pos);
    size_t line_offset = pos;
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    auto bad = [&](const std::string& why) {
      return Error(ErrorCode::kCorrupt, "line " + std::to_string(line_no) + ": " + why, "",
                   int64_t(line_offset), "tiktoken.model");
    };
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos) throw bad("expected '<base64> <rank>'");
    std::string_view b64 = line.substr(0, sp), rank_text = line.substr(sp + 1);
    if (!DecodeBase64(b64, bytes) || bytes.empty()) throw bad("invalid base64 token");
    if (rank_text.empty() || rank_text.size() > 9) throw bad("invalid rank");
    uint32_t rank = 0;
    for (char c : rank_text) {
      if (c < '0' || c > '9') throw bad("invalid rank");
      rank = rank * 10 + uint32_t(c - '0');
    }
    if (rank >= kMaxRanks) throw bad("rank too large");
    if (rank >= by_rank.size()) {
      by_rank.resize(rank + 1, {0, 0});
      seen.resize(rank + 1, false);
    }
    if (seen[rank]) throw bad("duplicate rank " + std::to_string(rank));
    seen[rank] = true;
    if (arena.size() + bytes.size() > UINT32_MAX / 2) throw bad("vocabulary too large");
    by_rank[rank] = {uint32_t(arena.size()), uint32_t(bytes.size())};
    arena += bytes;
  }
  if (by_rank.empty()) throw Error(ErrorCode::kCorrupt, "no tokens", "", -1, "tiktoken.model");
  for (size_t r = 0; r < seen.size(); ++r) {
    if (!seen[r]) {
      throw Error(ErrorCode::kCorrupt, "ranks are not dense: rank " + std::to_string(r) + " missing",
                  "", -1, "tiktoken.model");
    }
  }
  num_ranks = uint32_t(by_rank.size());
  spans = by_rank;
  ranks.Build(arena, spans);
  // Duplicated byte strings would make ranks ambiguous.
  for (uint32_t r = 0; r < num_ranks; ++r) {
    auto [off, len] = spans[r];
    if (ranks.Find(reinterpret_cast<const unsigned char*>(arena.data()) + off, len) != r) {
      throw Error(ErrorCode::kCorrupt, "token bytes of rank " + std::to_string(r) + " repeat an earlier rank",
                  "", -1, "tiktoken.model");
    }
  }
  // Byte-level BPE needs every single byte as a token, or some text is unencodable.
  for (int b = 0; b < 256; ++b) {
    unsigned char c = static_cast<unsigned char>(b);
    byte_rank[b] = ranks.Find(&c, 1);
    if (byte_rank[b] == kNoRank) {
      throw Error(ErrorCode::kUnsupported, "byte " + std::to_string(b) + " has no rank", "", -1,
                  "tiktoken.model");
    }
  }
}

std::vector<std::string> Tokenizer::Impl::SpecialNamesOrThrow(std::string_view tokenizer_config_json,
                                                            std::optional<std::string>* bos_name,
                                                            std::optional<std::string>* eos_name) const {
  // tokenizer_config.json: names of the 256 special ids after the last rank.
  // Read with simdjson's On-Demand API: the real file holds model_max_length
  // = 1e30 as an integer literal, which the DOM parser refuses as a big integer;
  // On-Demand only parses the values we visit.
  std::vector<std::string> names(kNumSpecialTokens);
  for (uint32_t k = 0; k < kNumSpecialTokens; ++k) {
    names[k] = "<|reserved_token_" + std::to_string(num_ranks + k) + "|>";
  }
  {
    auto bad = [](const std::string& why) {
      return Error(ErrorCode::kCorrupt, why, "", -1, "tokenizer_config.json");
    };
    simdjson::ondemand::parser parser;
    simdjson::padded_string tcfg(tokenizer_config_json);
    simdjson::ondemand::document doc;
    simdjson::ondemand::object root;
    if (parser.iterate(tcfg).get(doc) != simdjson::SUCCESS || doc.get_object().get(root) != simdjson::SUCCESS) {
      throw bad("not a JSON object");
    }
    // A name given as "..." or as {"content": "..."}.
    auto token_name = [&](simdjson::ondemand::value v) -> std::optional<std::string> {
      std::string_view sv;
      simdjson::ondemand::json_type type;
      if (v.type().get(type) != simdjson::SUCCESS) throw bad("malformed JSON");
      if (type == simdjson::ondemand::json_type::string) {
        if (v.get_string().get(sv) != simdjson::SUCCESS) throw bad("malformed string");
        return std::string(sv);
      }
      if (type == simdjson::ondemand::json_type::object) {
        simdjson::ondemand::object o;
        if (v.get_object().get(o) != simdjson::SUCCESS) throw bad("malformed object");
        if (o.find_field_unordered("content").get_string().get(sv) == simdjson::SUCCESS) return std::string(sv);
      }
      return std::nullopt;
    };
    try {
      for (auto field : root) {
        std::string_view key;
        if (field.unescaped_key().get(key) != simdjson::SUCCESS) throw bad("malformed key");
        if (key == "bos_token") {
          *bos_name = token_name(field.value());
        } else if (key == "eos_token") {
          *eos_name = token_name(field.value());
        } else if (key == "added_tokens_decoder") {
          simdjson::ondemand::object added;
          if (field.value().get_object().get(added) != simdjson::SUCCESS) {
            throw bad("added_tokens_decoder is not an object");
          }
          for (auto entry : added) {
            std::string_view id_text;
            if (entry.unescaped_key().get(id_text) != simdjson::SUCCESS) throw bad("malformed key");
            uint64_t id = 0;
            bool ok = !id_text.empty() && id_text.size() <= 9;
            for (char c : id_text) {
              ok = ok && c >= '0' && c <= '9';
              id = id * 10 + uint64_t(c - '0');
            }
            if (!ok) throw bad("added_tokens_decoder key '" + std::string(id_text) + "' is not an id");
            std::string id_str(id_text);
            auto content = token_name(entry.value());
            if (!content || content->empty()) throw bad("added token " + id_str + " has no content");
            // Kimi's loader only names ids in the special range; others are ignored.
            if (id < num_ranks || id >= uint64_t(num_ranks) + kNumSpecialTokens) continue;
            names[id - num_ranks] = std::move(*content);
          }
        }
      }
    } catch (const simdjson::simdjson_error& e) {
      throw bad(std::string("malformed JSON: ") + e.what());
    }
  }
  return names;
}

void Tokenizer::Impl::AddSpecialsOrThrow(const std::vector<std::string>& names) {
  for (uint32_t k = 0; k < kNumSpecialTokens; ++k) {
    TokenId id = num_ranks + k;
    if (!special_ids.emplace(names[k], id).second) {
      throw Error(ErrorCode::kCorrupt, "special token '" + names[k] + "' is named twice", "", -1,
                  "tokenizer_config.json");
    }
    spans.push_back({uint32_t(arena.size()), uint32_t(names[k].size())});
    arena += names[k];
  }
  // The arena grew: rebuild the table's view of it (same offsets).
  ranks.Build(arena, std::vector<std::pair<uint32_t, uint32_t>>(spans.begin(),
                                                                    spans.begin() + num_ranks));
  pair_rank.assign(65536, kNoRank);
  for (uint32_t pair = 0; pair < 65536; ++pair) {
    unsigned char two[2] = {static_cast<unsigned char>(pair >> 8), static_cast<unsigned char>(pair & 0xFF)};
    pair_rank[pair] = ranks.Find(two, 2);
  }
  for (uint32_t k = 0; k < kNumSpecialTokens; ++k) {
    unsigned char first = static_cast<unsigned char>(names[k][0]);
    specials_by_byte[first].push_back(num_ranks + k);
    special_first_byte[first] = true;
  }
  for (auto& list : specials_by_byte) {
    std::stable_sort(list.begin(), list.end(), [&](TokenId a, TokenId b) {
      return Bytes(a).size() > Bytes(b).size();
    });
  }
}

void Tokenizer::Impl::ApplyModelConfigOrThrow(std::string_view model_config_json) {
  if (model_config_json.empty()) return;
  {
    simdjson::dom::parser mparser;
    simdjson::padded_string mcfg(model_config_json);
    simdjson::dom::element mroot;
    if (mparser.parse(mcfg).get(mroot) != simdjson::SUCCESS || !mroot.is_object()) {
      throw Error(ErrorCode::kCorrupt, "not a JSON object", "", -1, "config.json");
    }
    auto id_of = [&](const char* key) -> std::optional<TokenId> {
      simdjson::dom::element el;
      if (mroot[key].get(el) == simdjson::SUCCESS) return IdFromJson(el);
      if (mroot["text_config"][key].get(el) == simdjson::SUCCESS) return IdFromJson(el);
      return std::nullopt;
    };
    auto check = [&](std::optional<TokenId> id, const char* key) {
      if (id && *id >= num_ranks + kNumSpecialTokens) {
        throw Error(ErrorCode::kCorrupt, std::string(key) + " " + std::to_string(*id) +
                                             " is outside the vocabulary",
                    "", -1, "config.json");
      }
      return id;
    };
    if (auto b = check(id_of("bos_token_id"), "bos_token_id")) bos = b;
    if (auto e = check(id_of("eos_token_id"), "eos_token_id")) eos = e;
  }
}

Tokenizer Tokenizer::FromStringsOrThrow(std::string_view tiktoken_model,
                                        std::string_view tokenizer_config_json,
                                        std::string_view model_config_json) {
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.LoadRanksOrThrow(tiktoken_model);
  std::optional<std::string> bos_name, eos_name;
  t.AddSpecialsOrThrow(t.SpecialNamesOrThrow(tokenizer_config_json, &bos_name, &eos_name));
  // BOS / EOS: config.json ids win (the EOS that stops generation is
  // <|end_of_msg|> there, while tokenizer_config.json names [EOS]).
  auto by_name = [&](const std::optional<std::string>& name) -> std::optional<TokenId> {
    if (!name) return std::nullopt;
    auto it = t.special_ids.find(*name);
    if (it == t.special_ids.end()) return std::nullopt;
    return it->second;
  };
  t.bos = by_name(bos_name);
  t.eos = by_name(eos_name);
  t.ApplyModelConfigOrThrow(model_config_json);
  t.CompileRegex();
  return Tokenizer(std::move(impl));
}

// ---------------------------------------------------------------------------

std::vector<TokenId> Tokenizer::EncodeOrdinary(std::string_view text) const {
  return Encode(text, false);
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool allow_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  EncodeAppend(text, allow_special, out);
  return out;
}

void Tokenizer::EncodeAppend(std::string_view text, bool allow_special,
                             std::vector<TokenId>& out) const {
  if (IsValidUtf8(text)) {
    impl_->EncodeKimi(text, allow_special, out);
  } else {
    std::string clean = SanitizeUtf8(text);
    impl_->EncodeKimi(clean, allow_special, out);
  }
}

std::string Tokenizer::Decode(std::span<const TokenId> ids) const {
  std::string out;
  for (TokenId id : ids) out.append(TokenBytes(id));
  return out;
}

std::string_view Tokenizer::TokenBytes(TokenId id) const {
  if (id >= impl_->spans.size()) {
    throw Error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                 " is outside the vocabulary (size " +
                                                 std::to_string(impl_->spans.size()) + ")");
  }
  return impl_->Bytes(id);
}

std::optional<TokenId> Tokenizer::SpecialId(std::string_view content) const {
  auto it = impl_->special_ids.find(std::string(content));
  if (it == impl_->special_ids.end()) return std::nullopt;
  return it->second;
}

TokenId Tokenizer::SpecialIdOrThrow(std::string_view content) const {
  auto id = SpecialId(content);
  if (!id) {
    throw Error(ErrorCode::kCorrupt, "the tokenizer has no special token '" + std::string(content) + "'",
                "", -1, "tokenizer_config.json");
  }
  return *id;
}

uint32_t Tokenizer::num_ranks() const { return impl_->num_ranks; }
uint32_t Tokenizer::vocab_size() const { return impl_->num_ranks + kNumSpecialTokens; }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos; }

std::vector<std::string> Tokenizer::PreTokenize(std::string_view text) const {
  std::string clean = SanitizeUtf8(text);
  std::vector<std::string> pieces;
  impl_->ForEachPiece(clean, [&](size_t b, size_t e) { pieces.emplace_back(clean.substr(b, e - b)); });
  return pieces;
}

}  // namespace k3::tok
