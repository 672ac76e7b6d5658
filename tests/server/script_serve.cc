// Test helper: the real HTTP server (lib/server) on a scripted token source.
// A fixed K3 answer (thinking, content, two tool calls with multi-byte
// arguments) is tokenized with the model's tokenizer and fed id by id through
// lib/tokenizer's ChatStreamParser, the parser the engine uses, so the SDK
// tests see tool-call deltas that a random-weight model never samples.
// Everything the real model can show is tested on `k3-run serve` itself.
//
// usage: k3-script-serve MODEL_DIR   (prints "listening on http://127.0.0.1:PORT")
#include <csignal>
#include <cstdio>
#include <string>

#include "k3/server/server.h"
#include "k3/tokenizer/chat.h"
#include "k3/tokenizer/tokenizer.h"
#include "k3/toolenv/toolenv.h"

namespace k3::server {
namespace {

class ScriptBackend : public Backend {
 public:
  explicit ScriptBackend(const std::string& dir) : tok_(tok::Tokenizer::LoadDirOrThrow(dir)) {
    auto T = [&](std::string_view text) {
      for (tok::TokenId id : tok_.EncodeOrdinary(text)) script_.push_back(id);
    };
    auto S = [&](std::string_view special) { script_.push_back(*tok_.SpecialId(special)); };
    auto Open = [&](std::string_view header) { S("<|open|>"), T(header), S("<|sep|>"); };
    auto Close = [&](std::string_view tag) { S("<|close|>"), T(tag), S("<|sep|>"); };
    T("The user wants the weather in 北京 and the time.");
    Close("think");
    Open("response");
    T("Checking both 🙂");
    Close("response");
    Open("tools");
    Open("call tool=\"get_weather\" index=\"1\"");
    Open("argument key=\"city\" type=\"string\"");
    T("北京 (Beijing)");
    Close("argument");
    Close("call");
    Open("call tool=\"get_time\" index=\"2\"");
    Open("argument key=\"tz\" type=\"string\"");
    T("Asia/Shanghai");
    Close("argument");
    Close("call");
    Close("tools");
    Close("message");
    S("<|end_of_msg|>");
  }

  std::vector<int32_t> PromptIds(const tok::RenderedChat& chat) const override {
    std::vector<int32_t> ids;
    if (tok_.bos_id()) ids.push_back(int32_t(*tok_.bos_id()));
    for (tok::TokenId id : tok::EncodeChatSegments(tok_, chat.segments)) ids.push_back(int32_t(id));
    return ids;
  }
  int64_t context_limit() const override { return 1 << 20; }
  engine::SamplingParams default_sampling() const override { return {}; }
  model::ExpertStoreStats expert_stats() const override { return {}; }

  engine::GenerateResult Generate(const engine::GenerateRequest& req, const engine::Callbacks& cb) override {
    engine::GenerateResult r;
    r.usage.prompt_tokens = int64_t(req.prompt_ids.size());
    if (cb.on_prefill_progress && !cb.on_prefill_progress(0, 1)) {
      r.finish = engine::FinishReason::kCancelled;
      return r;
    }
    tok::ChatStreamParser parser(tok_, tok::ChatStreamParser::Start::kThink);
    auto forward = [&](const tok::ChatDelta& d) {
      engine::Delta out;
      out.reasoning = d.reasoning;
      out.content = d.content;
      for (const tok::ToolCallFragment& f : d.tool_calls) {
        engine::ToolCallDelta t;
        t.index = f.call;
        t.begin = f.begin;
        if (f.begin) t.id = "call_script_" + std::to_string(f.call);
        t.name = f.name;
        t.arguments = f.arguments;
        out.tool_calls.push_back(t);
      }
      return out.empty() || cb.on_delta(out);
    };
    r.finish = engine::FinishReason::kToolCalls;
    for (tok::TokenId id : script_) {
      if (req.max_tokens > 0 && r.usage.completion_tokens >= req.max_tokens) {
        r.finish = engine::FinishReason::kLength;
        break;
      }
      ++r.usage.completion_tokens;
      if (parser.in_reasoning()) ++r.usage.reasoning_tokens;
      if (!forward(parser.Push(id))) {
        r.finish = engine::FinishReason::kCancelled;
        return r;
      }
    }
    forward(parser.Finish());
    return r;
  }

 private:
  tok::Tokenizer tok_;
  std::vector<tok::TokenId> script_;
};

}  // namespace
}  // namespace k3::server

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
    return 2;
  }
  if (const int rc = k3::toolenv::ApplyFromEnvOrReport("k3-script-serve")) return rc;
  try {
    k3::server::ServerOptions o;
    o.port = 0;
    o.model_id = "k3-script";
    k3::server::Service service(o);
    k3::server::ScriptBackend backend(argv[1]);
    service.SetBackend(&backend);
    k3::server::HttpServer http(service);
    http.BindOrThrow();
    std::fprintf(stderr, "k3-script-serve: listening on http://127.0.0.1:%d\n", http.port());
    std::fflush(stderr);
    http.Serve();  // stopped by SIGTERM (the test kills it by PID)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3-script-serve: %s\n", e.what());
    return 1;
  }
  return 0;
}
