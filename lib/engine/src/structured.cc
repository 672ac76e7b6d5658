#include "k3/engine/structured.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "k3/core/error.h"

namespace k3::engine {
namespace {

// Steering starts this many tokens before the budget is exactly the shortest
// completion: one sampled token can lengthen that completion (open a string,
// an object with required keys), and the margin absorbs most of that.
constexpr int64_t kSteerMargin = 4;
// Within this many tokens of steering, each sampled JSON token is checked to
// leave room for the shortest completion after it (Allowed); further out only
// those that may lengthen it (structure, keys) are.
constexpr int64_t kLookAhead = 24;
// Calls one answer may make before the tools section is closed.
constexpr int kMaxCalls = 16;
// The greedy completion is recomputed at least this often (in tokens) while
// the budget is far from it, and at every token once it is near.
constexpr int64_t kGreedyEvery = 32;
// The greedy completion is walked at most this far; a longer one (a string with
// a large minLength) is steered along its first kGreedyCap bytes.
constexpr size_t kGreedyCap = size_t{1} << 16;
// What a state with no completion at all counts as (never seen).
constexpr int64_t kNoCompletion = int64_t{1} << 40;
// Far from steering (see Prepare), a token that may lengthen the shortest
// completion does not trigger a recompute on its own.
constexpr int64_t kFar = 48;
constexpr float kMasked = -std::numeric_limits<float>::infinity();

std::vector<tok::ChatSegment> OpenTag(std::string_view tag,
                                      const std::vector<std::pair<std::string, std::string>>& attrs = {}) {
  // As lib/tokenizer's renderer spells open(tag, attrs): each piece its own segment.
  std::vector<tok::ChatSegment> s;
  s.push_back({"<|open|>", true});
  s.push_back({std::string(tag), false});
  for (const auto& [k, v] : attrs) {
    s.push_back({" " + k, false});
    s.push_back({"=\"", false});
    std::string esc;
    for (char c : v) {
      if (c == '&') esc += "&amp;";
      else if (c == '"') esc += "&quot;";
      else esc += c;
    }
    if (!esc.empty()) s.push_back({esc, false});
    s.push_back({"\"", false});
  }
  s.push_back({"<|sep|>", true});
  return s;
}
std::vector<tok::ChatSegment> CloseTag(std::string_view tag) {
  return {{"<|close|>", true}, {std::string(tag), false}, {"<|sep|>", true}};
}
std::vector<tok::ChatSegment> Join(std::initializer_list<std::vector<tok::ChatSegment>> parts) {
  std::vector<tok::ChatSegment> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string PreferenceOrder(Lex l) {
  std::string head;
  switch (l) {
    case Lex::kString: head = "\"a0"; break;
    case Lex::kEscape: head = "n\"\\u"; break;
    case Lex::kHex: head = "0DdCc"; break;
    case Lex::kNumber: head = "}],10"; break;
    case Lex::kOutside: head = "}]10\"{[tfn,:"; break;
  }
  std::string all = head;
  auto add = [&](int b) {
    if (all.find(char(b)) == std::string::npos) all += char(b);
  };
  for (int b = '0'; b <= '9'; ++b) add(b);
  for (int b = 'a'; b <= 'z'; ++b) add(b);
  for (int b = 'A'; b <= 'Z'; ++b) add(b);
  for (int b = 0x20; b < 0x7F; ++b) add(b);
  for (int b = 0x80; b < 0x100; ++b) add(b);
  for (int b = 1; b < 0x20; ++b) add(b);
  return all;
}

// The bytes the greedy completion tries, in order, per lexical position.
const std::string& Preference(Lex l) {
  static const std::array<std::string, 5> table = {PreferenceOrder(Lex::kOutside), PreferenceOrder(Lex::kString),
                                                   PreferenceOrder(Lex::kEscape), PreferenceOrder(Lex::kHex),
                                                   PreferenceOrder(Lex::kNumber)};
  return table[size_t(l)];
}

}  // namespace

void LexStep(LexState& s, char c) {
  switch (s.l) {
    case Lex::kOutside:
    case Lex::kNumber:
      if (c == '"') s.property_value = s.last == ':';
      s.last = c;
      if (c == '"') s.l = Lex::kString;
      else if ((c >= '0' && c <= '9') || c == '-') s.l = Lex::kNumber;
      else if (s.l == Lex::kNumber && (c == '.' || c == 'e' || c == 'E' || c == '+')) s.l = Lex::kNumber;
      else s.l = Lex::kOutside;
      break;
    case Lex::kString:
      if (c == '"') s.l = Lex::kOutside;
      else if (c == '\\') s.l = Lex::kEscape;
      break;
    case Lex::kEscape:
      if (c == 'u') s.l = Lex::kHex, s.hex = 0;
      else s.l = Lex::kString;
      break;
    case Lex::kHex:
      if (++s.hex == 4) s.l = Lex::kString;
      break;
  }
}

std::optional<std::string> GreedyCompletionInPlace(constrain::TokenConstraint& probe, LexState lex, size_t max_bytes,
                                                   std::string* capped) {
  std::string out;
  while (!probe.Accepting()) {
    if (out.size() >= max_bytes) {
      if (capped) *capped = std::move(out);
      return std::nullopt;
    }
    bool moved = false;
    // Inside a `pattern` string the constraint knows the byte toward acceptance
    // (a fixed order could loop: ^a*b$ would get 'a' forever); try it first.
    if (const int hint = probe.PreferredByte(); hint >= 0) {
      const char h = char(hint);
      if (probe.AdvanceBytes(std::string_view(&h, 1))) {
        out += h;
        LexStep(lex, h);
        continue;
      }
    }
    // Where the constraint knows which bytes can come (a key's next bytes, a
    // ':' or ',', a value's first byte) the others are not tried: the same
    // first byte in preference order is taken, after far fewer refusals.
    uint64_t next[4];
    const bool known = probe.NextBytes(next);
    for (char b : Preference(lex.l)) {
      if (known && !((next[uint8_t(b) / 64] >> (uint8_t(b) % 64)) & 1)) continue;
      // A refused byte leaves the probe as it was (and costs one step).
      if (probe.AdvanceBytes(std::string_view(&b, 1))) {
        out += b;
        LexStep(lex, b);
        moved = true;
        break;
      }
    }
    if (!moved) return std::nullopt;
  }
  return out;
}

std::optional<std::string> GreedyCompletion(const constrain::TokenConstraint& c, size_t max_bytes) {
  constrain::TokenConstraint probe = c.Clone();
  LexState lex;
  for (char ch : probe.text()) LexStep(lex, ch);
  return GreedyCompletionInPlace(probe, lex, max_bytes);
}

StructuredDecoder::StructuredDecoder(const StructuredOutput& spec, const tok::Tokenizer& tok,
                                     const constrain::Vocabulary& vocab, std::span<const int64_t> eos_ids,
                                     tok::ChatStreamParser::Start start, int64_t remaining)
    : spec_(spec), tok_(tok), vocab_(vocab), eos_ids_(eos_ids.begin(), eos_ids.end()),
      x_(tok::XtmlIds::FromTokenizerOrThrow(tok)) {
  if (start == tok::ChatStreamParser::Start::kMessage) {
    throw Error(ErrorCode::kInvalidArgument,
                "structured output needs a prompt that opens the think or response channel");
  }
  for (size_t i = 0; i < spec_.tools.size(); ++i) {
    if (spec_.calls == StructuredOutput::Calls::kNone) break;
    if (!spec_.only_tool.empty() && spec_.tools[i].name != spec_.only_tool) continue;
    callable_.push_back(int(i));
  }
  if (spec_.calls == StructuredOutput::Calls::kRequired && callable_.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                spec_.only_tool.empty() ? "tool calls are required but no tool is declared"
                                        : "tool_choice names '" + spec_.only_tool + "', which is not a declared tool");
  }
  must_close_ = spec_.calls == StructuredOutput::Calls::kRequired || spec_.response.has_value();
  close_think_open_resp_ = Encode(Join({CloseTag("think"), OpenTag("response")}));
  close_resp_ = Encode(CloseTag("response"));
  open_tools_ = Encode(OpenTag("tools"));
  close_call_ = Encode(Join({CloseTag("json"), CloseTag("call")}));
  end_ = Encode(Join({CloseTag("message"), {{"<|end_of_msg|>", true}}}));
  close_tools_end_ = Cat(Encode(CloseTag("tools")), end_);
  for (int32_t& t : byte_token_) t = -1;
  for (uint32_t id = 0; id < tok_.num_ranks(); ++id) {
    std::string_view b = tok_.TokenBytes(id);
    if (b.size() == 1 && byte_token_[uint8_t(b[0])] < 0) byte_token_[uint8_t(b[0])] = int32_t(id);
  }
  auto min_json = [&](const constrain::CompiledSchema& s) {
    constrain::TokenConstraint c(s, vocab_);
    std::string capped;
    auto g = GreedyCompletionInPlace(c, LexState{}, kGreedyCap, &capped);
    if (g) return int64_t(g->size());
    return capped.empty() ? kNoCompletion : int64_t(capped.size()) + 1;
  };
  if (spec_.response) min_json_response_ = min_json(*spec_.response);
  min_json_tool_.assign(spec_.tools.size(), 0);
  header_len_.assign(spec_.tools.size(), 0);
  for (int t : callable_) {
    min_json_tool_[size_t(t)] = min_json(spec_.tools[size_t(t)].parameters);
    header_len_[size_t(t)] = int64_t(CallHeader(t, 1).size());
  }

  if (start == tok::ChatStreamParser::Start::kThink) {
    phase_ = Phase::kThink;
    if (spec_.think_budget >= 0) {
      think_budget_ = spec_.think_budget;
    } else {
      think_budget_ = std::max<int64_t>(0, (remaining - MinRemaining()) / 2);
    }
  } else {
    EnterBody();
  }
}

std::vector<int32_t> StructuredDecoder::Encode(const std::vector<tok::ChatSegment>& segments) const {
  std::vector<int32_t> out;
  for (tok::TokenId id : tok::EncodeChatSegments(tok_, segments)) out.push_back(int32_t(id));
  return out;
}

std::vector<int32_t> StructuredDecoder::CallHeader(int tool, int index) const {
  return Encode(Join({OpenTag("call", {{"tool", spec_.tools[size_t(tool)].name}, {"index", std::to_string(index)}}),
                      OpenTag("json", {{"type", "object"}})}));
}

void StructuredDecoder::EnterBody() {
  if (spec_.calls == StructuredOutput::Calls::kRequired) {
    EnterSeq({Cand{Cat(close_resp_, open_tools_), Next::kCallChoice}}, 0);
  } else if (spec_.response) {
    EnterJson(*spec_.response, false, -1);
  } else {
    phase_ = Phase::kFree;
  }
}

void StructuredDecoder::EnterCallChoice() {
  std::vector<Cand> c;
  if (calls_ < kMaxCalls) {
    for (int t : callable_) c.push_back(Cand{CallHeader(t, calls_ + 1), Next::kCallArgs, t});
  }
  if (calls_ > 0 || c.empty()) c.push_back(Cand{close_tools_end_, Next::kDone});
  EnterSeq(std::move(c), 0);
}

void StructuredDecoder::EnterSeq(std::vector<Cand> cands, size_t pos) {
  phase_ = Phase::kSeq;
  cands_ = std::move(cands);
  pos_ = pos;
}

void StructuredDecoder::EnterJson(const constrain::CompiledSchema& schema, bool for_call, int tool) {
  phase_ = Phase::kJson;
  json_.emplace(schema, vocab_);
  json_for_call_ = for_call;
  json_tool_ = tool;
  greedy_len_ = -1;
  greedy_dirty_ = true;
  greedy_fresh_ = false;
  probe_id_ = -1;
  lex_ = LexState{};
}

bool StructuredDecoder::StaysInString(int32_t id) const {
  // Only inside a property's string value: more characters of a key may commit
  // to another key (and its required value), which can lengthen the completion.
  if (lex_.l != Lex::kString || !lex_.property_value) return false;
  const std::string_view b = tok_.TokenBytes(tok::TokenId(id));
  if (b.find_first_of("\"\\") != std::string_view::npos) return false;
  // In a `pattern` string a character can lengthen the shortest match
  // (^(a|b{20})$ after 'b'): those tokens are probed like any other.
  return json_->PreferredByte() < 0;
}

void StructuredDecoder::After(const Cand& c) {
  switch (c.next) {
    case Next::kBody: EnterBody(); break;
    case Next::kCallChoice: EnterCallChoice(); break;
    case Next::kCallArgs:
      ++calls_;
      EnterJson(spec_.tools[size_t(c.tool)].parameters, true, c.tool);
      break;
    case Next::kDone: phase_ = Phase::kDone; break;
  }
}

int64_t StructuredDecoder::JsonTail() const {
  return json_for_call_ ? int64_t(close_call_.size() + close_tools_end_.size())
                        : int64_t(close_resp_.size() + end_.size());
}

int64_t StructuredDecoder::MinAfter(Next next, int tool) const {
  switch (next) {
    case Next::kDone: return 0;
    case Next::kBody:
      if (spec_.calls == StructuredOutput::Calls::kRequired) {
        return int64_t(close_resp_.size() + open_tools_.size()) + MinAfter(Next::kCallChoice, -1);
      }
      if (spec_.response) return min_json_response_ + int64_t(close_resp_.size() + end_.size());
      return 0;
    case Next::kCallChoice: {
      if (calls_ > 0 || callable_.empty()) return int64_t(close_tools_end_.size());
      int64_t best = std::numeric_limits<int64_t>::max();
      for (int t : callable_) best = std::min(best, header_len_[size_t(t)] + MinAfter(Next::kCallArgs, t));
      return best;
    }
    case Next::kCallArgs:
      return min_json_tool_[size_t(tool)] + int64_t(close_call_.size() + close_tools_end_.size());
  }
  return 0;
}

void StructuredDecoder::RefreshGreedy() {
  constrain::TokenConstraint probe = json_->Clone();
  std::string capped;
  std::optional<std::string> g = GreedyCompletionInPlace(probe, lex_, kGreedyCap, &capped);
  greedy_ok_ = g.has_value();
  greedy_capped_ = !g && !capped.empty();
  greedy_ = g ? std::move(*g) : std::move(capped);
  greedy_fresh_ = true;
}

int64_t StructuredDecoder::GreedyLen() {
  if (!greedy_fresh_) RefreshGreedy();
  greedy_len_ = greedy_ok_ ? int64_t(greedy_.size()) : greedy_capped_ ? int64_t(greedy_.size()) + 1 : kNoCompletion;
  greedy_age_ = 0;
  greedy_dirty_ = false;
  return greedy_len_;
}

std::optional<std::string> StructuredDecoder::CachedCompletion() const {
  if (phase_ != Phase::kJson || !greedy_fresh_ || !greedy_ok_) return std::nullopt;
  return greedy_;
}

std::optional<std::string> StructuredDecoder::FreshCompletion() const {
  if (phase_ != Phase::kJson) return std::nullopt;
  return GreedyCompletion(*json_, kGreedyCap);
}

int64_t StructuredDecoder::MinRemaining() {
  switch (phase_) {
    case Phase::kThink:
      return must_close_ ? int64_t(close_think_open_resp_.size()) + MinAfter(Next::kBody, -1) : 0;
    case Phase::kFree:
    case Phase::kDone: return 0;
    case Phase::kJson: return (greedy_len_ >= 0 ? greedy_len_ : GreedyLen()) + JsonTail();
    case Phase::kSeq: {
      int64_t best = std::numeric_limits<int64_t>::max();
      for (const Cand& c : cands_) {
        best = std::min(best, int64_t(c.ids.size() - pos_) + MinAfter(c.next, c.tool));
      }
      return best == std::numeric_limits<int64_t>::max() ? 0 : best;
    }
  }
  return 0;
}

void StructuredDecoder::MaskSpecials(std::span<float> logits, std::initializer_list<int32_t> keep) const {
  // Ordinary ids stay; every special (and any id past the tokenizer) goes but `keep`.
  std::vector<std::pair<int32_t, float>> saved;
  for (int32_t k : keep) {
    if (k >= 0 && size_t(k) < logits.size()) saved.push_back({k, logits[size_t(k)]});
  }
  for (size_t i = tok_.num_ranks(); i < logits.size(); ++i) logits[i] = kMasked;
  for (const auto& [k, v] : saved) logits[size_t(k)] = v;
}

int32_t StructuredDecoder::SteerToken() {
  if (json_->Accepting()) return x_.close;
  if (!greedy_fresh_) RefreshGreedy();
  if (!HasGreedy() || greedy_.empty()) return -1;
  const std::string* g = &greedy_;
  try {
    std::vector<tok::TokenId> ids = tok_.EncodeOrdinary(*g);
    if (!ids.empty() && json_->Allowed(ids[0]) && g->starts_with(tok_.TokenBytes(ids[0]))) return int32_t(ids[0]);
  } catch (const Error&) {
    // Not encodable as text (a character split across tokens): go byte by byte.
  }
  const int32_t b = byte_token_[uint8_t((*g)[0])];
  return b >= 0 && json_->Allowed(uint32_t(b)) ? b : -1;
}

int32_t StructuredDecoder::Fallback() {
  if (phase_ == Phase::kJson) {
    if (int32_t t = SteerToken(); t >= 0) return t;
  }
  if (!next_ids_.empty() && phase_ == Phase::kSeq) return next_ids_[0];
  return -1;
}

int32_t StructuredDecoder::Prepare(std::span<float> logits, int64_t remaining) {
  forced_ = -1;
  probe_id_ = -1;
  steering_ = false;
  if (phase_ == Phase::kThink) {
    const bool capped = spec_.think_budget >= 0 && think_tokens_ >= think_budget_;
    if (capped || (must_close_ && (think_tokens_ >= think_budget_ || remaining <= MinRemaining() + kSteerMargin))) {
      EnterSeq({Cand{close_think_open_resp_, Next::kBody}}, 0);
    } else {
      MaskSpecials(logits, {x_.close});
      return -1;
    }
  }
  switch (phase_) {
    case Phase::kThink:
    case Phase::kDone: return -1;
    case Phase::kFree: {
      std::vector<std::pair<int32_t, float>> keep;
      for (int64_t e : eos_ids_) {
        if (e >= 0 && size_t(e) < logits.size()) keep.push_back({int32_t(e), logits[size_t(e)]});
      }
      MaskSpecials(logits, {x_.close, x_.end_of_msg});
      for (const auto& [k, v] : keep) logits[size_t(k)] = v;
      return -1;
    }
    case Phase::kSeq: {
      next_ids_.clear();
      for (const Cand& c : cands_) {
        if (std::find(next_ids_.begin(), next_ids_.end(), c.ids[pos_]) == next_ids_.end()) {
          next_ids_.push_back(c.ids[pos_]);
        }
      }
      if (next_ids_.size() > 1) {
        // A branch is offered only while the budget still holds its shortest
        // completion (a second call opened with too little room would be cut);
        // when none fits, the shortest one is taken.
        std::vector<int64_t> need(next_ids_.size(), std::numeric_limits<int64_t>::max());
        for (const Cand& c : cands_) {
          const size_t k = size_t(std::find(next_ids_.begin(), next_ids_.end(), c.ids[pos_]) - next_ids_.begin());
          need[k] = std::min(need[k], int64_t(c.ids.size() - pos_) + MinAfter(c.next, c.tool));
        }
        const size_t shortest = size_t(std::min_element(need.begin(), need.end()) - need.begin());
        std::vector<int32_t> fit;
        for (size_t k = 0; k < next_ids_.size(); ++k) {
          if (need[k] + kSteerMargin <= remaining) fit.push_back(next_ids_[k]);
        }
        if (fit.empty()) fit.push_back(next_ids_[shortest]);
        steering_ = fit.size() < next_ids_.size();
        next_ids_ = std::move(fit);
      }
      if (next_ids_.size() == 1) return forced_ = next_ids_[0];
      std::vector<std::pair<int32_t, float>> keep;
      for (int32_t id : next_ids_) keep.push_back({id, logits[size_t(id)]});
      std::fill(logits.begin(), logits.end(), kMasked);
      for (const auto& [k, v] : keep) logits[size_t(k)] = v;
      return -1;
    }
    case Phase::kJson: {
      const int64_t tail = JsonTail();
      // Tokens that stay inside a string leave the shortest completion as it
      // was (but for finishing a split character, which the margin covers):
      // it is recomputed after any other token.
      // Far from the end of the budget (more than twice the shortest completion
      // plus kFar left) an estimate refreshed every kGreedyEvery tokens is enough.
      const bool far = greedy_len_ >= 0 && remaining > 2 * (greedy_len_ + tail) + kFar;
      if (greedy_len_ < 0 || ++greedy_age_ >= kGreedyEvery || (greedy_dirty_ && !far)) GreedyLen();
      remaining_ = remaining;
      near_ = remaining <= greedy_len_ + tail + kSteerMargin + kLookAhead;
      if (remaining <= greedy_len_ + tail + kSteerMargin) {
        steering_ = true;
        const int32_t pick = SteerToken();
        if (pick >= 0) return forced_ = pick;
        steering_ = false;  // no byte path: fall back to the mask
      }
      json_->AllowedMask(bits_);
      const bool accepting = json_->Accepting();
      const float close_logit = logits[size_t(x_.close)];
      // Word by word: inside a string nearly every word is all ones, outside
      // one nearly all zeros.
      const size_t n = std::min(logits.size(), bits_.size() * 64);
      for (size_t w = 0; w * 64 < n; ++w) {
        const uint64_t word = bits_[w];
        if (word == ~uint64_t{0}) continue;
        const size_t base = w * 64, end = std::min(n, base + 64);
        if (word == 0) {
          std::fill(logits.begin() + std::ptrdiff_t(base), logits.begin() + std::ptrdiff_t(end), kMasked);
          continue;
        }
        for (uint64_t off = ~word; off; off &= off - 1) {
          const size_t i = base + size_t(std::countr_zero(off));
          if (i < end) logits[i] = kMasked;
        }
      }
      for (size_t i = n; i < logits.size(); ++i) logits[i] = kMasked;
      if (accepting) logits[size_t(x_.close)] = close_logit;
      return -1;
    }
  }
  return -1;
}

bool StructuredDecoder::Allowed(int32_t id) {
  if (forced_ >= 0) return id == forced_;
  switch (phase_) {
    case Phase::kThink: return (id >= 0 && uint32_t(id) < tok_.num_ranks()) || id == x_.close;
    case Phase::kFree:
      return (id >= 0 && uint32_t(id) < tok_.num_ranks()) || id == x_.close || id == x_.end_of_msg ||
             std::find(eos_ids_.begin(), eos_ids_.end(), int64_t{id}) != eos_ids_.end();
    case Phase::kSeq: return std::find(next_ids_.begin(), next_ids_.end(), id) != next_ids_.end();
    case Phase::kJson: {
      if (id == x_.close) return json_->Accepting();
      if (!(id >= 0 && size_t(id) < bits_.size() * 64 && ((bits_[size_t(id) / 64] >> (id % 64)) & 1))) return false;
      if (StaysInString(id)) return true;
      // A token is taken only if the answer can still close after it. One
      // token can lengthen the shortest completion by more than any fixed
      // look-ahead (`{"` in an array whose items have required keys: 2 -> 62
      // bytes), so far from the budget a token that may do so is probed too:
      // one that opens, separates or quotes, or any byte of a key. Digits,
      // literals and value-string bytes far from the budget are not.
      const std::string_view bytes = tok_.TokenBytes(tok::TokenId(id));
      const bool may_lengthen = (lex_.l != Lex::kOutside && lex_.l != Lex::kNumber) ||
                                bytes.find_first_of("{[,:\"") != std::string_view::npos;
      if (!near_ && !may_lengthen) return true;
      // A prefix of the known completion leaves its rest; any other token is
      // probed, and the probe's completion serves the next step if it is taken.
      int64_t after_len;
      if (greedy_fresh_ && HasGreedy() && std::string_view(greedy_).starts_with(bytes)) {
        after_len = int64_t(greedy_.size() - bytes.size()) + (greedy_capped_ ? 1 : 0);
      } else {
        constrain::TokenConstraint after = json_->Clone();
        after.Advance(uint32_t(id));
        LexState lex = lex_;
        for (char c : bytes) LexStep(lex, c);
        std::optional<std::string> g = GreedyCompletionInPlace(after, lex, kGreedyCap);
        probe_id_ = id;
        probe_ok_ = g.has_value();
        probe_greedy_ = g ? std::move(*g) : std::string();
        if (!probe_ok_) return false;
        after_len = int64_t(probe_greedy_.size());
      }
      return after_len + JsonTail() <= remaining_ - 1;
    }
    case Phase::kDone: return true;
  }
  return true;
}

void StructuredDecoder::Accept(int32_t id) {
  switch (phase_) {
    case Phase::kDone: return;
    case Phase::kThink:
      if (id == x_.close) EnterSeq({Cand{close_think_open_resp_, Next::kBody}}, 1);
      else ++think_tokens_;
      return;
    case Phase::kFree: {
      if (id == x_.close) {
        std::vector<Cand> c;
        if (!callable_.empty()) c.push_back(Cand{Cat(close_resp_, open_tools_), Next::kCallChoice});
        c.push_back(Cand{Cat(close_resp_, end_), Next::kDone});
        EnterSeq(std::move(c), 1);
      } else if (id == x_.end_of_msg ||
                 std::find(eos_ids_.begin(), eos_ids_.end(), int64_t{id}) != eos_ids_.end()) {
        phase_ = Phase::kDone;
      }
      return;
    }
    case Phase::kSeq: {
      std::vector<Cand> keep;
      for (Cand& c : cands_) {
        if (c.ids[pos_] == id) keep.push_back(std::move(c));
      }
      cands_ = std::move(keep);
      ++pos_;
      if (cands_.empty()) {  // cannot happen: only consistent ids are allowed
        phase_ = Phase::kDone;
        return;
      }
      for (const Cand& c : cands_) {
        if (c.ids.size() == pos_) {
          const Cand done = c;
          After(done);
          return;
        }
      }
      return;
    }
    case Phase::kJson: {
      std::vector<int32_t> tail = json_for_call_ ? close_call_ : Cat(close_resp_, end_);
      const Next next = json_for_call_ ? Next::kCallChoice : Next::kDone;
      if (id == x_.close) {
        EnterSeq({Cand{std::move(tail), next}}, 1);
        return;
      }
      try {
        json_->Advance(uint32_t(id));
      } catch (const Error&) {
        // Only allowed ids are chosen; if one were not, the JSON could not be
        // trusted any more: close the structure now.
        EnterSeq({Cand{std::move(tail), next}}, 0);
        return;
      }
      if (!StaysInString(id)) greedy_dirty_ = true;
      const std::string_view bytes = tok_.TokenBytes(tok::TokenId(id));
      if (greedy_fresh_ && HasGreedy() && std::string_view(greedy_).starts_with(bytes)) {
        greedy_.erase(0, bytes.size());  // still exact: the rest of a greedy completion is the next one
        // A capped prefix steered to its end says nothing more: walk again.
        if (greedy_capped_ && greedy_.empty()) greedy_fresh_ = false;
      } else if (probe_id_ == id) {
        greedy_.swap(probe_greedy_);
        greedy_ok_ = probe_ok_;
        greedy_fresh_ = true;
      } else {
        greedy_fresh_ = false;
      }
      probe_id_ = -1;
      for (char c : bytes) LexStep(lex_, c);
      if (json_->Complete()) EnterSeq({Cand{std::move(tail), next}}, 0);
      return;
    }
  }
}

}  // namespace k3::engine
