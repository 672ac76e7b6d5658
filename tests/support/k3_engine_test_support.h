// Request helpers shared by the suites that drive k3::engine::Engine on the
// oracle's tiny model (engine_test, ckpt_engine_test, engine_parallel_test).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "k3/engine/engine.h"
#include "k3/tokenizer/chat.h"

namespace k3::test {

// A greedy (temperature 0) request for `n` tokens after `prompt`.
inline engine::GenerateRequest Greedy(std::vector<int32_t> prompt, int64_t n) {
  engine::GenerateRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = n;
  r.sampling.temperature = 0;
  return r;
}

// A chat request with one user message (plain text, no quotes to escape),
// thinking on or off; top_p 0.9 when sampling.
inline engine::GenerateRequest ChatRequest(engine::Engine& e, const std::string& user,
                                           bool thinking, int64_t max_tokens, float temperature,
                                           uint64_t seed) {
  const std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\"" + user +
                           "\"}],\"options\":{\"thinking\":" + (thinking ? "true" : "false") + "}}";
  const tok::RenderedChat chat = tok::RenderChatRequestOrThrow(body);
  engine::GenerateRequest r;
  r.prompt_ids = e.ChatPromptIds(chat);
  r.chat_start = engine::ChatStartFor(chat);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.top_p = temperature > 0 ? 0.9f : 1.0f;
  r.sampling.seed = seed;
  return r;
}

}  // namespace k3::test
