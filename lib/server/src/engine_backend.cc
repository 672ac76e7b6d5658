// Backend over engine::Engine: the prompt path is exactly `k3-run render
// --bos`'s (RenderChatRequestOrThrow, then Engine::ChatPromptIds).
#include "k3/server/server.h"

namespace k3::server {
namespace {

class EngineBackend : public Backend {
 public:
  explicit EngineBackend(engine::Engine& engine) : engine_(engine) {}
  std::vector<int32_t> PromptIds(const tok::RenderedChat& chat) const override {
    return engine_.ChatPromptIds(chat);
  }
  int64_t context_limit() const override { return engine_.context_limit(); }
  engine::SamplingParams default_sampling() const override { return engine_.default_sampling(); }
  engine::GenerateResult Generate(const engine::GenerateRequest& request,
                                  const engine::Callbacks& callbacks) override {
    return engine_.Generate(request, callbacks);
  }
  model::ExpertStoreStats expert_stats() const override { return engine_.expert_stats(); }
  engine::CheckpointCacheStats checkpoint_stats() const override {
    return engine_.checkpoint_stats();
  }
  engine::Engine::StepStats step_stats() const override { return engine_.step_stats(); }

 private:
  engine::Engine& engine_;
};

}  // namespace

std::unique_ptr<Backend> MakeEngineBackend(engine::Engine& engine) {
  return std::make_unique<EngineBackend>(engine);
}

}  // namespace k3::server
