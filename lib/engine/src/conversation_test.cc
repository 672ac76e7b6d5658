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

TEST_CASE("retry, edit and undo go back to the history before the last exchange") {
  EngineOptions o;
  o.model_dir = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";
  o.progress = false;
  o.load.expert_cache_bytes = 0;
  o.threads = 1;
  o.checkpoints.ram_slots = 4;
  auto e = Engine::LoadOrThrow(o);
  tok::ChatOptions co;
  co.thinking = false;
  Conversation chat(*e, co);
  Conversation::TurnOptions t;
  t.max_tokens = 2;
  t.sampling.temperature = 0;
  CHECK(!chat.has_exchange());
  CHECK(!chat.Undo());
  CHECK_THROWS_AS(chat.Retry(t), Error);
  CHECK_THROWS_AS(chat.Edit("x", t), Error);
  GenerateResult a1 = chat.Turn("Hi", t);
  const std::vector<int32_t> p2 = chat.PromptIds("Second");
  GenerateResult a2 = chat.Turn("Second", t);
  const std::vector<tok::ChatMessage> after2 = chat.history();
  // Retry: the same prompt again, restored up to its last id; greedy, the same answer.
  GenerateResult r = chat.Retry(t);
  CHECK(r.usage.prompt_tokens == static_cast<int64_t>(p2.size()));
  CHECK(r.usage.cached_tokens == static_cast<int64_t>(p2.size()) - 1);
  CHECK(r.ids == a2.ids);
  CHECK(chat.history().size() == after2.size());
  // Undo, then another message: the history before "Second" is restored, not prefilled.
  CHECK(chat.Undo());
  CHECK(chat.history().size() == 2);  // Hi + its answer
  CHECK(chat.history()[1].content == a1.content);
  const std::vector<int32_t> p3 = chat.PromptIds("Third");
  GenerateResult a3 = chat.Turn("Third", t);
  size_t common = 0;
  while (common < p2.size() && common < p3.size() && p2[common] == p3[common]) ++common;
  CHECK(a3.usage.cached_tokens >= static_cast<int64_t>(common) - 1);
  CHECK(a3.usage.cached_tokens > 0);
  // Edit: "Third" replaced by "Fourth".
  GenerateResult ed = chat.Edit("Fourth", t);
  CHECK(chat.history().size() == 4);
  CHECK(chat.history()[2].content == "Fourth");
  CHECK(ed.usage.cached_tokens > 0);
  // The edited answer equals a fresh engine's answer to the edited conversation.
  auto fresh = Engine::LoadOrThrow([&] {
    EngineOptions f = o;
    f.checkpoints.ram_slots = 0;
    return f;
  }());
  Conversation ref(*fresh, co);
  ref.Turn("Hi", t);
  CHECK(ref.Turn("Fourth", t).ids == ed.ids);
}
