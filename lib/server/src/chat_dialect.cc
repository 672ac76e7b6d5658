// The chat.completions dialect: ParseChatRequestOrThrow, OpenAI's error
// object, and the writer: ChatStream's SSE chunks, or ChatAccumulator's whole
// object with JSON whitespace as the heartbeat (docs/server.md).
#include "k3/server/dialect.h"
#include "k3/server/response_writer.h"
#include "sse.h"

namespace k3::server {
namespace {

class ChatWriter : public ResponseWriter {
 public:
  ChatWriter(const ResponseMeta& meta, bool stream, bool include_usage, bool return_progress)
      : stream_(stream),
        return_progress_(return_progress),
        sse_(meta, include_usage),
        whole_(meta) {}

  // The role chunk goes out at admission: OpenAI-SDK clients (Qwen Code's
  // idle timer) see data at once, whatever the queue and the prefill take.
  std::string Begin() override { return stream_ ? sse_.Opening() : std::string(); }
  std::string OnDelta(const engine::Delta& delta) override {
    if (stream_) return sse_.OnDelta(delta);
    whole_.OnDelta(delta);
    return {};
  }
  std::string Heartbeat(std::string_view what) override {
    return stream_ ? SseComment(what) + sse_.KeepAlive() : " ";
  }
  std::string Progress(const engine::PrefillProgress& p) override {
    if (!stream_) return " ";
    return SseComment(ProgressText(p)) +
           (return_progress_ ? sse_.ProgressChunk(p) : sse_.KeepAlive());
  }
  std::string Finish(const engine::GenerateResult& result, const ResponseStats& stats) override {
    return stream_ ? sse_.Finish(result.finish, result.usage, stats) : whole_.Finish(result.finish, result.usage, stats);
  }
  std::string Error(const ApiError& error) override { return stream_ ? sse_.Error(error) : error.Json(); }

 private:
  bool stream_;
  bool return_progress_;
  ChatStream sse_;
  ChatAccumulator whole_;
};

ParsedRequest ParseChat(std::string_view body, const ApiPolicy& policy) {
  ParsedRequest p;
  p.request = ParseChatRequestOrThrow(body, policy);
  p.writer = [](const Service::Job& job) {
    const ChatRequest& r = job.request;
    return MakeChatWriter(job.meta, r.stream, r.include_usage, r.return_progress);
  };
  return p;
}

}  // namespace

std::unique_ptr<ResponseWriter> MakeChatWriter(const ResponseMeta& meta, bool stream,
                                               bool include_usage, bool return_progress) {
  return std::make_unique<ChatWriter>(meta, stream, include_usage, return_progress);
}

HttpReply OpenAiErrorReply(const ApiError& e, int retry_after_s) {
  HttpReply r;
  r.status = e.status;
  r.body = e.Json();
  if (e.status == 429 && retry_after_s >= 0) r.headers.push_back({"Retry-After", std::to_string(retry_after_s)});
  if (e.status == 401) r.headers.push_back({"WWW-Authenticate", "Bearer"});
  return r;
}

constinit const Dialect kChatCompletionsDialect{.name = "chat.completions", .path = "/v1/chat/completions",
                                                .id_prefix = "chatcmpl-k3", .parse = &ParseChat,
                                                .error = &OpenAiErrorReply};

}  // namespace k3::server
