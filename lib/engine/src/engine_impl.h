// Engine::Impl: what an Engine holds between requests, shared by the loader
// and accessors (engine.cc) and one request's steps (generate.cc).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "k3/constrain/constrain.h"
#include "k3/engine/checkpoint_cache.h"
#include "k3/engine/engine.h"
#include "k3/model/model.h"
#include "k3/stream/streaming_store.h"
#include "k3/tokenizer/tokenizer.h"

namespace k3::engine {

struct Engine::Impl {
  EngineOptions options;
  std::unique_ptr<model::Model> model;
  std::optional<tok::Tokenizer> tokenizer;
  stream::StreamingExpertStore* streaming = nullptr;  // owned by model
  std::unique_ptr<model::Session> session;
  std::unique_ptr<CheckpointCache> checkpoints;
  SamplingParams defaults;
  std::vector<float> logits;  // at the session's last fed position, when valid
  bool logits_valid = false;
  // Structured output: the vocabulary prepared for masking, built on the
  // first request that needs it (it costs a pass over every rank, too much
  // to pay at load for requests that never constrain), and the masked copy of
  // the logits a constrained or ignore_eos step samples from.
  std::optional<constrain::Vocabulary> vocab;
  std::vector<float> masked;

  void Reset() {
    session->Reset();
    logits_valid = false;
  }

  // expert_stats() may be called from another thread (a server's /metrics)
  // while Generate runs: it reads this copy, refreshed after every step.
  mutable std::mutex stats_mu;
  model::ExpertStoreStats stats_published;
  void PublishStats() {
    const model::ExpertStoreStats s = model->experts().stats();
    std::lock_guard<std::mutex> lock(stats_mu);
    stats_published = s;
  }

  // One Generate call, step by step (generate.cc).
  class GenerateRun;
};

}  // namespace k3::engine
