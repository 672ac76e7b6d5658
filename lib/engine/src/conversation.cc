#include "k3/engine/conversation.h"

#include "k3/core/error.h"

namespace k3::engine {

Conversation::Conversation(Engine& engine, tok::ChatOptions options, std::string system)
    : engine_(engine), options_(std::move(options)) {
  tok::RenderChatOrThrow({{"user", "x", ""}}, options_);
  if (!system.empty()) history_.push_back({"system", std::move(system), ""});
}

namespace {

tok::RenderedChat RenderWith(std::vector<tok::ChatMessage> messages, const std::string& user_text,
                             const tok::ChatOptions& options) {
  messages.push_back({"user", user_text, ""});
  return tok::RenderChatOrThrow(messages, options);
}

}  // namespace

std::vector<int32_t> Conversation::PromptIds(const std::string& user_text) const {
  return engine_.ChatPromptIds(RenderWith(history_, user_text, options_));
}

GenerateResult Conversation::Turn(const std::string& user_text, const TurnOptions& turn,
                                  const Callbacks& callbacks) {
  const tok::RenderedChat chat = RenderWith(history_, user_text, options_);
  GenerateRequest req;
  req.prompt_ids = engine_.ChatPromptIds(chat);
  // Where the new user message starts: the ids this prompt shares with the
  // same history followed by an empty user message.
  const std::vector<int32_t> empty = PromptIds("");
  size_t at = 0;
  while (at < empty.size() && at < req.prompt_ids.size() && empty[at] == req.prompt_ids[at]) ++at;
  req.checkpoint_at = static_cast<int64_t>(at);
  req.chat_start = ChatStartFor(chat);
  req.max_tokens = turn.max_tokens;
  req.stop = turn.stop;
  req.sampling = turn.sampling;
  const SamplingParams& p = turn.sampling;
  if (!sampler_ || sampler_params_.temperature != p.temperature ||
      sampler_params_.top_p != p.top_p || sampler_params_.seed != p.seed) {
    sampler_.emplace(p.temperature, p.top_p, p.seed);
    sampler_params_ = p;
  }
  req.sampler = &*sampler_;
  GenerateResult r = engine_.Generate(req, callbacks);
  history_.push_back({"user", user_text, ""});
  history_.push_back({"assistant", r.content, r.reasoning});
  return r;
}

bool Conversation::has_exchange() const {
  const size_t n = history_.size();
  return n >= 2 && history_[n - 2].role == "user" && history_[n - 1].role == "assistant";
}

bool Conversation::Undo() {
  if (!has_exchange()) return false;
  history_.resize(history_.size() - 2);
  return true;
}

GenerateResult Conversation::Edit(const std::string& user_text, const TurnOptions& turn,
                                  const Callbacks& callbacks) {
  if (!has_exchange()) throw Error(ErrorCode::kInvalidArgument, "no message to edit or retry yet");
  const std::vector<tok::ChatMessage> before = history_;
  history_.resize(history_.size() - 2);
  try {
    return Turn(user_text, turn, callbacks);
  } catch (...) {
    history_ = before;
    throw;
  }
}

GenerateResult Conversation::Retry(const TurnOptions& turn, const Callbacks& callbacks) {
  if (!has_exchange()) throw Error(ErrorCode::kInvalidArgument, "no message to edit or retry yet");
  const std::string text = history_[history_.size() - 2].content;
  return Edit(text, turn, callbacks);
}

}  // namespace k3::engine
