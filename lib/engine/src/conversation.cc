#include "k3/engine/conversation.h"

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

}  // namespace k3::engine
