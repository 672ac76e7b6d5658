#include "k3/engine/output.h"

#include <algorithm>

namespace k3::engine {

OutputStream::OutputStream(const tok::Tokenizer* tokenizer, Options options)
    : tok_(tokenizer), options_(std::move(options)) {
  if (options_.chat_start && tok_) parser_.emplace(*tok_, *options_.chat_start);
}

void OutputStream::AddContent(const std::string& text, Delta& out) {
  if (!stop_matched_.empty() || text.empty()) return;
  if (options_.stop.empty()) {
    content_ += text;
    out.content += text;
    return;
  }
  held_ += text;
  // The earliest complete stop string ends the output; what precedes it is content.
  size_t first = std::string::npos;
  const std::string* hit = nullptr;
  for (const std::string& s : options_.stop) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (at < first || (at == first && s.size() > hit->size()))) {
      first = at;
      hit = &s;
    }
  }
  if (hit) {
    const std::string before = held_.substr(0, first);
    content_ += before;
    out.content += before;
    held_.clear();
    stop_matched_ = *hit;
    done_ = true;
    finish_ = FinishReason::kStop;
    return;
  }
  // Keep the longest suffix that is a proper prefix of some stop string: it may
  // still complete. Stop strings are valid UTF-8, so the cut is on a character.
  size_t keep = 0;
  for (const std::string& s : options_.stop) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  const std::string release = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  content_ += release;
  out.content += release;
}

std::string OutputStream::ReleaseHeld() {
  std::string h = std::move(held_);
  held_.clear();
  return h;
}

void OutputStream::Absorb(const tok::ChatDelta& d, Delta& out) {
  if (!d.reasoning.empty() && stop_matched_.empty()) {
    reasoning_ += d.reasoning;
    out.reasoning += d.reasoning;
  }
  AddContent(d.content, out);
  for (const tok::ToolCallFragment& f : d.tool_calls) {
    ToolCallDelta t;
    t.index = f.call;
    t.begin = f.begin;
    if (f.begin) {
      t.id = "call_" + options_.call_id_tag + "_" + std::to_string(f.call);
      t.name = f.name;
    }
    t.arguments = f.arguments;
    out.tool_calls.push_back(std::move(t));
  }
}

Delta OutputStream::Push(int32_t id) {
  Delta out;
  if (done_) return out;
  const bool eos = std::find(options_.eos_ids.begin(), options_.eos_ids.end(), int64_t{id}) !=
                   options_.eos_ids.end();
  if (parser_) {
    if (eos) {
      // K3's stop token is <|end_of_msg|>: the parser must see it, or it notes
      // an answer that never ended (a warning on every normal ending).
      if (parser_->IsEndOfMsg(static_cast<tok::TokenId>(id))) {
        Absorb(parser_->Push(static_cast<tok::TokenId>(id)), out);
      }
      done_ = true;
      finish_ = parser_->tool_calls().empty() ? FinishReason::kStop : FinishReason::kToolCalls;
      return out;
    }
    if (parser_->in_reasoning()) ++reasoning_tokens_;
    Absorb(parser_->Push(static_cast<tok::TokenId>(id)), out);
    if (!done_ && parser_->ended()) {
      done_ = true;
      finish_ = parser_->tool_calls().empty() ? FinishReason::kStop : FinishReason::kToolCalls;
    }
    return out;
  }
  if (tok_ && id >= 0 && static_cast<uint32_t>(id) < tok_->vocab_size()) {
    AddContent(raw_utf8_.Push(tok_->TokenBytes(static_cast<tok::TokenId>(id))), out);
  }
  if (eos && !done_) {
    done_ = true;
    finish_ = FinishReason::kStop;
  }
  return out;
}

Delta OutputStream::Finish() {
  Delta out;
  if (finished_) return out;
  finished_ = true;
  const bool stopped_by_string = !stop_matched_.empty();
  if (parser_) {
    tok::ChatDelta d = parser_->Finish();
    if (stopped_by_string) d.content.clear(), d.reasoning.clear();
    Absorb(d, out);
  } else if (!stopped_by_string) {
    AddContent(raw_utf8_.Flush(), out);
  }
  // What is still held never completed a stop string: it is content.
  const std::string rest = ReleaseHeld();
  content_ += rest;
  out.content += rest;
  return out;
}

std::vector<tok::ToolCall> OutputStream::tool_calls() const {
  return parser_ ? parser_->tool_calls() : std::vector<tok::ToolCall>{};
}

std::vector<std::string> OutputStream::warnings() const {
  return parser_ ? parser_->warnings() : std::vector<std::string>{};
}

}  // namespace k3::engine
