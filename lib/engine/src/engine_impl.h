// Engine::Impl: what an Engine holds between requests, shared by the loader
// and accessors (engine.cc) and one request's steps (generate.cc).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "batcher.h"
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
  // A sequence: one request's state while it runs, kept after it for prefix
  // reuse by the next request that extends it.
  struct Sequence {
    std::unique_ptr<model::Session> session;
    std::vector<float> logits;  // at the session's last fed position, when valid
    bool logits_valid = false;
    // The masked copy of the logits a constrained or ignore_eos step samples from.
    std::vector<float> masked;
    bool busy = false;       // a request runs on it (parallel mode)
    uint64_t last_used = 0;  // request counter at its last use (the least recent is reused first)
    uint64_t reserved = 0;   // bytes its running request reserved (admission)
    void Reset() {
      session->Reset();
      logits_valid = false;
    }
  };
  // One sequence with --parallel 1 (requests run one after another, prefill in
  // windows); `options.parallel` of them otherwise, stepped together by the
  // batcher (docs/engine.md "Steps").
  std::vector<Sequence> seqs;
  std::unique_ptr<StepBatcher> batcher;
  std::mutex seq_mu;               // seqs' busy / reserved / last_used, and the counters below
  std::condition_variable seq_cv;  // a sequence or reserved memory was freed
  uint64_t requests = 0;
  uint64_t reserved_total = 0;   // admission: bytes reserved by running requests
  uint64_t sequence_budget = 0;  // admission: what running requests may reserve
  uint64_t admission_waits = 0;  // requests that waited for memory
  // The checkpoint cache is not thread-safe: every call holds this.
  std::mutex ckpt_mu;

  std::unique_ptr<CheckpointCache> checkpoints;
  SamplingParams defaults;
  // Structured output: the vocabulary prepared for masking, built on the
  // first request that needs it (it costs a pass over every rank, too much
  // to pay at load for requests that never constrain).
  std::optional<constrain::Vocabulary> vocab;
  std::mutex vocab_mu;

  // The bytes a request's sequence holds at most: KDA states and conv windows,
  // MLA rows for the prompt and the answer (docs/engine.md "Admission").
  uint64_t SequenceBytes(int64_t positions) const;

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
