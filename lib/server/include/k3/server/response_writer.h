// The bytes one API writes for one request, whatever API it is: Service runs
// every request the same way (queue turn, heartbeats, generation, cancel on a
// failed write) and asks the request's writer what to send; each dialect
// (dialect.h) makes its own. The chat.completions writer wraps ChatStream /
// ChatAccumulator (stream.h), the Anthropic one is MessageEvents
// (messages_stream.h), the Responses one ResponseEvents (responses.h); all
// three fold deltas with the private segmenter. Per request, not thread-safe,
// never throws on model output.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "k3/engine/engine.h"
#include "k3/server/api.h"
#include "k3/server/stream.h"

namespace k3::server {

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Sent before the request waits for its turn (may be empty).
  virtual std::string Begin() = 0;
  // Bytes for one delta; empty while everything is held back or the answer
  // is sent whole at the end.
  virtual std::string OnDelta(const engine::Delta& delta) = 0;
  // Traffic that keeps the client's idle timers alive while the request waits,
  // prefills or holds bytes back: an SSE comment plus a data event the API's
  // SDKs count (an empty-delta chunk, a ping, response.in_progress), or JSON
  // whitespace for a whole answer.
  virtual std::string Heartbeat(std::string_view what) = 0;
  // During prefill, at most once per heartbeat period: the heartbeat with the
  // progress as its text, and the API's progress event when the request asked
  // for it (return_progress).
  virtual std::string Progress(const engine::PrefillProgress& progress) {
    return Heartbeat(ProgressText(progress));
  }
  virtual std::string Finish(const engine::GenerateResult& result, const ResponseStats& stats) = 0;
  // After the 200 status went out: the error in the body.
  virtual std::string Error(const ApiError& error) = 0;
};

// chat.completions: SSE chunks when `stream`, else one JSON object.
std::unique_ptr<ResponseWriter> MakeChatWriter(const ResponseMeta& meta, bool stream,
                                               bool include_usage, bool return_progress = false);

}  // namespace k3::server
