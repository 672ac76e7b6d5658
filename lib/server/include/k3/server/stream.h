// The chat-completions response, streamed (SSE chunks) and whole (one JSON
// object), built from the same engine::Delta events so both forms carry the
// same answer. See docs/server.md "Responses" for the contract.
//
// ChatStream is a per-request state machine, not thread-safe, and never
// throws on model output: the answer's segments (segmenter.h) hold back
// incomplete UTF-8 so no chunk ever splits a character; it sends role once,
// tool calls as one opening fragment then argument pieces, finish_reason
// exactly once, the usage chunk last.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "k3/engine/engine.h"
#include "k3/server/api.h"

namespace k3::server {

class Segmenter;  // segmenter.h (private)

struct ResponseMeta {
  std::string id;       // "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  bool thinking = true;  // reasoning_content is part of the message
};

// What the server adds beside OpenAI's usage: the engine's timings, the expert
// cache and the request's place in the queue ("k3" object; clients ignore it).
struct ResponseStats {
  engine::Timings timings;
  double queue_wait_s = 0;
  int64_t queue_ticket = 0;    // arrival order among admitted requests
  int64_t start_index = 0;     // order in which requests reached the model
  double expert_hit_rate = 0;
  uint64_t expert_bytes_read = 0;
};

// The answer as the deltas built it (also the non-streamed message).
struct AnswerState {
  std::string reasoning, content;
  struct Call {
    std::string id, name, arguments;
  };
  std::vector<Call> calls;  // by index
};

std::string FinishName(engine::FinishReason reason, bool had_tool_calls);

class ChatStream {
 public:
  ChatStream(ResponseMeta meta, bool include_usage);
  ~ChatStream();

  // SSE bytes for one delta (possibly empty when everything is held back).
  std::string OnDelta(const engine::Delta& delta);
  // The final chunk (finish_reason), the usage chunk when asked, [DONE].
  std::string Finish(engine::FinishReason reason, const engine::Usage& usage, const ResponseStats& stats);
  // After the stream started: one error event, then [DONE].
  std::string Error(const ApiError& error);
  // The first chunk, sent as soon as the request is admitted: delta
  // {"role":"assistant","content":""}. Later chunks carry no role.
  std::string Opening();
  // A data event the SDKs and agents' idle timers count (an SSE comment is
  // dropped by their parsers): an empty delta, or the opening when none went
  // out yet. Sent while queued, prefilling or holding back bytes.
  std::string KeepAlive();
  // llama-server's progress chunk (return_progress): an empty delta plus
  // "prompt_progress" (PromptProgressJson).
  std::string ProgressChunk(const engine::PrefillProgress& progress);

  // The answer the deltas built so far.
  AnswerState answer() const;
  bool finished() const { return finished_; }

 private:
  template <class>
  friend class WriterEvents;  // segmenter.h: the segment events as chunks
  std::string Opened(size_t index);
  std::string Piece(size_t index, const std::string& piece);
  std::string Closed(size_t index);
  // progress_json: llama-server's top-level prompt_progress, when not empty.
  std::string Chunk(const std::string& delta_json, const char* finish_reason,
                    const std::string& progress_json = {});
  std::string TextChunk(const char* field, const std::string& piece);  // role on the first
  std::string CallId(int ordinal, const std::string& engine_id) const;
  ResponseMeta meta_;
  bool include_usage_;
  bool role_sent_ = false;
  bool finished_ = false;
  std::unique_ptr<Segmenter> segments_;
};

// The non-streamed response: folds deltas exactly as ChatStream does.
class ChatAccumulator {
 public:
  explicit ChatAccumulator(ResponseMeta meta);
  void OnDelta(const engine::Delta& delta) { stream_.OnDelta(delta); }
  std::string Finish(engine::FinishReason reason, const engine::Usage& usage, const ResponseStats& stats);

 private:
  ChatStream stream_;
  ResponseMeta meta_;
};

// llama-server's prompt_progress object {total, cache, processed, time_ms}
// (prompt tokens, of them cached, cached + prefilled so far, ms since the
// prefill began) plus k3's extras: eta_ms (null while unknown), layers,
// units_done / units_total (token x layer steps), window_tokens,
// expert_bytes_read. docs/server.md "Prefill progress".
std::string PromptProgressJson(const engine::PrefillProgress& progress);
// The same as one line of text, for SSE comment heartbeats:
// "prefill 1200/4096 tokens (29%), 3 layers, 1.2 GB read, eta 41 s".
std::string ProgressText(const engine::PrefillProgress& progress);

// JSON pieces shared by both forms.
std::string UsageJson(const engine::Usage& usage);
std::string StatsJson(const ResponseStats& stats);

}  // namespace k3::server
