// The chat.completions writer: ChatStream's SSE chunks, or ChatAccumulator's
// whole object with JSON whitespace as the heartbeat (docs/server.md).
#include "k3/server/response_writer.h"

namespace k3::server {
namespace {

class ChatWriter : public ResponseWriter {
 public:
  ChatWriter(const ResponseMeta& meta, bool stream, bool include_usage)
      : stream_(stream), sse_(meta, include_usage), whole_(meta) {}

  std::string Begin() override { return {}; }
  std::string OnDelta(const engine::Delta& delta) override {
    if (stream_) return sse_.OnDelta(delta);
    whole_.OnDelta(delta);
    return {};
  }
  std::string Heartbeat(std::string_view what) override { return stream_ ? ChatStream::Heartbeat(what) : " "; }
  std::string Finish(const engine::GenerateResult& result, const ResponseStats& stats) override {
    return stream_ ? sse_.Finish(result.finish, result.usage, stats) : whole_.Finish(result.finish, result.usage, stats);
  }
  std::string Error(const ApiError& error) override { return stream_ ? sse_.Error(error) : error.Json(); }

 private:
  bool stream_;
  ChatStream sse_;
  ChatAccumulator whole_;
};

}  // namespace

std::unique_ptr<ResponseWriter> MakeChatWriter(const ResponseMeta& meta, bool stream, bool include_usage) {
  return std::make_unique<ChatWriter>(meta, stream, include_usage);
}

}  // namespace k3::server
