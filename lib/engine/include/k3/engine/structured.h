// k3::engine::StructuredDecoder — structured output in the sampling loop.
// (docs/server.md "Constrained decoding"): a per-generation state
// machine over K3's XTML answer structure that says, before each sampling
// step, which ids may come next — forcing the structural markers, masking JSON
// with a constrain::TokenConstraint — and steers to the shortest completion
// when max_tokens runs out. Engine::Generate drives it; k3-bench times it.
//
// Not thread-safe (one per generation). The constructor throws k3::Error
// kInvalidArgument for a spec it cannot serve (required calls with no tool);
// the per-step calls never throw.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "k3/constrain/constrain.h"
#include "k3/engine/engine.h"
#include "k3/tokenizer/chat.h"
#include "k3/tokenizer/tokenizer.h"

namespace k3::engine {

// Where a compact JSON prefix stands lexically: enough to order the greedy
// completion's byte preferences and to know when a token stays inside a
// string (it then cannot lengthen the shortest completion).
enum class Lex : uint8_t { kOutside, kString, kEscape, kHex, kNumber };
struct LexState {
  Lex l = Lex::kOutside;
  int hex = 0;                  // \u digits seen
  char last = 0;                // the last byte outside strings
  bool property_value = false;  // the open string follows ':' (a value, not a key)
};
void LexStep(LexState& s, char c);

// A short completion of `c`: at every byte the first byte of a fixed
// preference order (closers, then short values, then the rest) that the
// constraint takes, until it accepts. The decoder steers along it. nullopt
// past `max_bytes` (a schema whose shortest answer is longer: a string with a
// large minLength) or at a state that cannot finish (never seen).
// Deterministic: the completion after any prefix of it is the rest of it, so
// the `max_bytes` walked before the cap (kept in `*capped` when given) are a
// prefix of the whole completion that can be steered along.
std::optional<std::string> GreedyCompletion(const constrain::TokenConstraint& c, size_t max_bytes);
// The same without a copy: `probe` (a Clone the caller gives up) moves on to
// the end of the completion; `lex` is where its text stands (LexStep over it).
std::optional<std::string> GreedyCompletionInPlace(constrain::TokenConstraint& probe, LexState lex, size_t max_bytes,
                                                   std::string* capped = nullptr);

class StructuredDecoder {
 public:
  // `remaining` = the most tokens the generation may still produce.
  StructuredDecoder(const StructuredOutput& spec, const tok::Tokenizer& tok, const constrain::Vocabulary& vocab,
                    std::span<const int64_t> eos_ids, tok::ChatStreamParser::Start start, int64_t remaining);

  // Before a sampling step with `remaining` tokens left (this one included):
  // returns the id that must come next, or -1 after setting the logits of
  // every id that may not come next to -inf in `logits`.
  int32_t Prepare(std::span<float> logits, int64_t remaining);
  // Whether `id` may come next (after Prepare). Near the end of the budget
  // this also checks that the answer can still close after `id`, so a caller
  // whose sampled id is refused masks it and samples again, and after a few
  // refusals takes Fallback().
  bool Allowed(int32_t id);
  // An id that is always allowed (the steered one), or -1.
  int32_t Fallback();
  // The id chosen for this step (forced or sampled among the allowed).
  void Accept(int32_t id);

  // The tokens the shortest completion from here needs (0 when the answer may
  // end now or nothing is forced).
  int64_t MinRemaining();

  // For tests: inside the JSON, the greedy completion the decoder holds for
  // the current state (nullopt when it has none it knows to be exact). It must
  // equal GreedyCompletion of the constraint's current state.
  std::optional<std::string> CachedCompletion() const;
  std::optional<std::string> FreshCompletion() const;  // that, computed now (nullopt outside the JSON)

 private:
  enum class Phase { kThink, kFree, kJson, kSeq, kDone };
  // What follows a forced / chosen sequence.
  enum class Next { kBody, kCallChoice, kCallArgs, kDone };
  struct Cand {
    std::vector<int32_t> ids;
    Next next = Next::kDone;
    int tool = -1;  // kCallArgs: index into spec_.tools
  };

  std::vector<int32_t> Encode(const std::vector<tok::ChatSegment>& segments) const;
  void EnterBody();
  void EnterCallChoice();
  void EnterSeq(std::vector<Cand> cands, size_t pos);
  void EnterJson(const constrain::CompiledSchema& schema, bool for_call, int tool);
  std::vector<int32_t> CallHeader(int tool, int index) const;
  void After(const Cand& c);
  int64_t MinAfter(Next next, int tool) const;
  int64_t JsonTail() const;
  void MaskSpecials(std::span<float> logits, std::initializer_list<int32_t> keep) const;
  int64_t GreedyLen();
  void RefreshGreedy();
  int32_t SteerToken();
  bool StaysInString(int32_t id) const;

  const StructuredOutput& spec_;
  const tok::Tokenizer& tok_;
  const constrain::Vocabulary& vocab_;
  std::vector<int64_t> eos_ids_;
  tok::XtmlIds x_;
  bool must_close_ = false;  // json content or required calls: a structure must be completed
  std::vector<int> callable_;  // tools a call may name

  // Pre-encoded structure.
  std::vector<int32_t> close_think_open_resp_, close_resp_, open_tools_, close_call_, end_, close_tools_end_;
  std::vector<int64_t> header_len_;  // per tool: its call header's ids (index 1)
  int64_t min_json_response_ = 0;
  std::vector<int64_t> min_json_tool_;

  Phase phase_ = Phase::kFree;
  int64_t think_tokens_ = 0, think_budget_ = 0;
  // kSeq
  std::vector<Cand> cands_;
  size_t pos_ = 0;
  std::vector<int32_t> next_ids_;  // kSeq: the ids consistent with some candidate
  // kJson
  std::optional<constrain::TokenConstraint> json_;
  bool json_for_call_ = false;
  int json_tool_ = -1;
  std::vector<uint64_t> bits_;
  int64_t greedy_len_ = -1, greedy_age_ = 0;
  bool greedy_dirty_ = true;  // a token since the last greedy completion may have lengthened it
  // The greedy completion of the current state, valid while greedy_fresh_: kept
  // across a token that is its prefix (the rest is the new one, exactly) and
  // taken from Allowed's probe of the token accepted, so that steering and the
  // look-ahead window mostly need no recompute. greedy_len_ above keeps its own
  // refresh rules (Prepare); this only makes a refresh free when it is known.
  std::string greedy_;
  bool greedy_ok_ = false;     // greedy_ is the whole completion
  // greedy_ is only its first kGreedyCap bytes (the shortest answer is longer):
  // enough to steer along, and its length + 1 is a lower bound on the whole.
  bool greedy_capped_ = false;
  bool HasGreedy() const { return greedy_ok_ || greedy_capped_; }  // greedy_ can be steered along
  bool greedy_fresh_ = false;
  int32_t probe_id_ = -1;      // this step's last token probed by Allowed, or -1
  std::string probe_greedy_;   // the greedy completion after it
  bool probe_ok_ = false;
  LexState lex_;              // of json_->text()
  bool steering_ = false;
  bool near_ = false;        // kJson: within kLookAhead of steering
  int64_t remaining_ = 0;    // as passed to the last Prepare
  int calls_ = 0;  // calls opened so far
  int32_t forced_ = -1;
  int32_t byte_token_[256];
};

}  // namespace k3::engine
