// Conversation: the chat turn logic of k3-run chat — history, rendering,
// prefix reuse between turns, the answer appended.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "k3/core/error.h"
#include "k3/engine/conversation.h"
#include "k3/tokenizer/chat.h"

using namespace k3;
using namespace k3::engine;

TEST_CASE("chat turns reuse the state of the turns before and keep the history") {
  EngineOptions o;
  o.model_dir = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";
  o.progress = false;
  o.load.expert_cache_bytes = 0;
  o.threads = 1;  // see engine_test.cc
  auto e = Engine::LoadOrThrow(o);
  tok::ChatOptions co;
  co.thinking = false;
  Conversation chat(*e, co, "Be brief.");
  Conversation::TurnOptions t;
  t.max_tokens = 1;  // one token: the session then ends at the generation prompt
  t.sampling.temperature = 0;
  const std::vector<int32_t> p1 = chat.PromptIds("Hi");
  // The prompt is what k3-run render gives: BOS + the rendered conversation.
  tok::RenderedChat r1 =
      tok::RenderChatOrThrow({{"system", "Be brief.", ""}, {"user", "Hi", ""}}, co);
  CHECK(p1 == e->ChatPromptIds(r1));
  GenerateResult a1 = chat.Turn("Hi", t);
  CHECK(a1.usage.cached_tokens == 0);
  CHECK(a1.usage.prompt_tokens == static_cast<int64_t>(p1.size()));
  REQUIRE(chat.history().size() == 3);  // system, user, assistant
  CHECK(chat.history()[2].role == "assistant");
  CHECK(chat.history()[2].content == a1.content);
  // Turn 2's prompt starts with all of turn 1's: only the tail is prefilled.
  const std::vector<int32_t> p2 = chat.PromptIds("More");
  REQUIRE(p2.size() > p1.size());
  CHECK(std::equal(p1.begin(), p1.end(), p2.begin()));
  GenerateResult a2 = chat.Turn("More", t);
  CHECK(a2.usage.cached_tokens == static_cast<int64_t>(p1.size()));
  // The same answer as a fresh engine given the whole conversation.
  e->ResetSession();
  GenerateRequest fresh;
  fresh.prompt_ids = p2;
  fresh.chat_start = tok::ChatStreamParser::Start::kResponse;
  fresh.max_tokens = 1;
  fresh.sampling.temperature = 0;
  CHECK(e->Generate(fresh).ids == a2.ids);
  // A bad option is refused at once.
  tok::ChatOptions bad;
  bad.thinking_effort = "extreme";
  CHECK_THROWS_AS(Conversation(*e, bad), Error);
}
