// k3::engine::Conversation — the multi-turn chat logic of `k3-run chat` over an
// Engine: keeps the message history, renders it (XTML) for each turn, lets the
// engine reuse the state of the turns before (prefix reuse), and appends the
// answer to the history.
//
// Borrows the Engine (which must outlive it); not thread-safe. Turn() throws
// what Engine::Generate throws, with the history left as it was before the turn.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "k3/engine/engine.h"
#include "k3/tokenizer/chat.h"

namespace k3::engine {

class Conversation {
 public:
  // Refuses bad options (e.g. an unknown thinking effort) at once.
  Conversation(Engine& engine, tok::ChatOptions options, std::string system = {});

  struct TurnOptions {
    int64_t max_tokens = 2048;
    SamplingParams sampling;
    std::vector<std::string> stop;
  };
  // One user turn. A cancelled turn keeps what was generated as the answer.
  // The sampler is made at the first turn from `turn.sampling` and its random
  // stream continues over the turns (as k3-run chat always did); different
  // sampling values start a new one.
  GenerateResult Turn(const std::string& user_text, const TurnOptions& turn,
                      const Callbacks& callbacks = {});

  // k3-run chat's /retry, /edit and /undo. Each goes back to the history
  // before the last exchange (a user message and its answer); the engine then
  // restores the checkpoint taken where that user message started (each
  // Turn asks for one, GenerateRequest::checkpoint_at) or the one before its
  // last id, instead of prefilling the conversation again. The sampler's
  // stream continues (a retry draws a new answer unless sampling is greedy).
  // Retry and Edit throw kInvalidArgument when there is no exchange, and leave
  // the history as it was when the turn throws.
  bool has_exchange() const;
  // Regenerates the last answer to the same user message.
  GenerateResult Retry(const TurnOptions& turn, const Callbacks& callbacks = {});
  // Replaces the last user message by `user_text` and answers it.
  GenerateResult Edit(const std::string& user_text, const TurnOptions& turn,
                      const Callbacks& callbacks = {});
  // Drops the last exchange; false when there is none.
  bool Undo();

  const std::vector<tok::ChatMessage>& history() const { return history_; }
  // The prompt ids the next turn with `user_text` would send.
  std::vector<int32_t> PromptIds(const std::string& user_text) const;

 private:
  Engine& engine_;
  tok::ChatOptions options_;
  std::vector<tok::ChatMessage> history_;
  std::optional<model::Sampler> sampler_;
  SamplingParams sampler_params_;
};

}  // namespace k3::engine
