// k3::engine::OutputStream — the post-sampling half of a generation: generated
// ids in, visible deltas (reasoning / content / tool-call fragments) and the
// stop decision out. Engine::Generate feeds it the sampled ids; tests and the
// server's serializer tests feed it scripted ids through the same code.
//
// Stop rules, in order, for each id: an EOS id of the model ends the output
// (kStop); in chat mode the end-of-message marker ends it (kStop, or
// kToolCalls when the answer made tool calls); a stop string completed in the
// content ends it (kStop, `stop_matched`). Content that could still become a
// stop string is held back, so no part of a stop string is ever emitted; it
// is released when it can no longer match, or by Finish().
// Not thread-safe (one per generation); never throws on model output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "k3/engine/engine.h"
#include "k3/tokenizer/chat.h"
#include "k3/tokenizer/tokenizer.h"

namespace k3::engine {

class OutputStream {
 public:
  struct Options {
    // Chat mode (the stream parser splits channels) or nullopt: raw mode, every
    // token's bytes are content (EOS included, as k3-run generate prints them).
    std::optional<tok::ChatStreamParser::Start> chat_start;
    std::vector<std::string> stop;      // non-empty strings
    std::vector<int64_t> eos_ids;       // the model's EOS ids
    std::string call_id_tag = "0";      // tool-call ids: "call_<tag>_<index>"
  };
  // `tokenizer` may be null in raw mode only: no text then, ids only.
  OutputStream(const tok::Tokenizer* tokenizer, Options options);

  // One generated id; returns what became visible. Ids after done() are ignored.
  Delta Push(int32_t id);
  // End of generation for any reason: releases held-back text, closes open
  // structure. Idempotent.
  Delta Finish();

  bool done() const { return done_; }
  FinishReason finish() const { return finish_; }  // meaningful once done()
  const std::string& stop_matched() const { return stop_matched_; }
  // What was emitted so far (content stops before a matched stop string).
  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  std::vector<tok::ToolCall> tool_calls() const;
  std::vector<std::string> warnings() const;
  int64_t reasoning_tokens() const { return reasoning_tokens_; }

 private:
  void AddContent(const std::string& text, Delta& out);
  void Absorb(const tok::ChatDelta& d, Delta& out);
  std::string ReleaseHeld();

  const tok::Tokenizer* tok_;
  Options options_;
  std::optional<tok::ChatStreamParser> parser_;
  tok::Utf8StreamDecoder raw_utf8_;
  std::string held_;  // content that may still start a stop string
  std::string content_, reasoning_;
  int64_t reasoning_tokens_ = 0;
  bool done_ = false, finished_ = false;
  FinishReason finish_ = FinishReason::kStop;
  std::string stop_matched_;
};

}  // namespace k3::engine
