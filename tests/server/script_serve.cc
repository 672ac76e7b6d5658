// Test helper: the real HTTP server (lib/server) on a scripted token source.
// A fixed K3 answer (thinking, content, two tool calls with multi-byte
// arguments) is tokenized with the model's tokenizer and fed id by id through
// lib/tokenizer's ChatStreamParser, the parser the engine uses, so the SDK
// tests see tool-call deltas that a random-weight model never samples.
// Everything the real model can show is tested on `k3-run serve` itself.
//
// usage: k3-script-serve MODEL_DIR [--script FILE] [--prefill-s S] [--model-id ID] [--transcript
// FILE]
//   (prints "listening on http://127.0.0.1:PORT")
//
// --script FILE: the agent-CLI tests' turns instead of the fixed answer, as
//   JSON {"tool_turn": T, "final_turn": T, "plain_turn": T} with
//   T = {"reasoning"?, "content"?, "calls"?: [{"name", "arguments": {...}}]}.
//   A prompt that carries a tool result gets final_turn; one that declares
//   one of tool_turn's call names gets tool_turn with the first declared
//   name's call (an agent's tool set differs by version); any other prompt
//   (titles, summaries) gets plain_turn.
// --prefill-s S: every request spends S seconds in "prefill", reporting
//   engine::PrefillProgress every 100 ms (the liveness and progress tests).
// --transcript FILE: per request, the turn chosen and the prompt's last 3000
//   bytes as text (the tests check that a tool's real output reached the
//   prompt of the turn after it).
#include <simdjson.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "k3/core/json_writer.h"
#include "k3/server/server.h"
#include "k3/tokenizer/chat.h"
#include "k3/tokenizer/tokenizer.h"
#include "k3/toolenv/toolenv.h"

namespace k3::server {
namespace {

// Appends K3 chat-stream ids: text, specials, <|open|>HEADER<|sep|>, <|close|>TAG<|sep|>.
struct IdWriter {
  const tok::Tokenizer& tok;
  std::vector<tok::TokenId> ids;
  void T(std::string_view text) {
    for (tok::TokenId id : tok.EncodeOrdinary(text)) ids.push_back(id);
  }
  void S(std::string_view special) { ids.push_back(*tok.SpecialId(special)); }
  void Open(std::string_view header) { S("<|open|>"), T(header), S("<|sep|>"); }
  void Close(std::string_view tag) { S("<|close|>"), T(tag), S("<|sep|>"); }
};

// One scripted turn: text for the think and response channels, then calls.
struct Turn {
  std::string reasoning, content;
  struct Call {
    std::string name, arguments;  // arguments: compact JSON object text
  };
  std::vector<Call> calls;
};

Turn ParseTurn(simdjson::dom::element e) {
  Turn t;
  std::string_view v;
  if (e["reasoning"].get(v) == simdjson::SUCCESS) t.reasoning = v;
  if (e["content"].get(v) == simdjson::SUCCESS) t.content = v;
  simdjson::dom::array calls;
  if (e["calls"].get(calls) == simdjson::SUCCESS) {
    for (simdjson::dom::element c : calls) {
      Turn::Call call;
      call.name = std::string(c["name"].get_string().value());
      call.arguments = simdjson::minify(c["arguments"]);
      t.calls.push_back(std::move(call));
    }
  }
  return t;
}

class ScriptBackend : public Backend {
 public:
  ScriptBackend(const std::string& dir, const std::string& script_path, double prefill_s,
                const std::string& transcript)
      : tok_(tok::Tokenizer::LoadDirOrThrow(dir)), prefill_s_(prefill_s), transcript_(transcript) {
    if (script_path.empty()) {
      script_ = FixedAnswer();
      return;
    }
    simdjson::dom::parser parser;
    simdjson::dom::element doc = parser.load(script_path);
    tool_turn_ = ParseTurn(doc["tool_turn"]);
    final_turn_ = ParseTurn(doc["final_turn"]);
    plain_turn_ = ParseTurn(doc["plain_turn"]);
    scripted_turns_ = true;
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
    if (!Prefill(req, cb)) {
      r.finish = engine::FinishReason::kCancelled;
      return r;
    }
    const auto start = scripted_turns_
                           ? req.chat_start.value_or(tok::ChatStreamParser::Start::kThink)
                           : tok::ChatStreamParser::Start::kThink;
    std::vector<tok::TokenId> script = scripted_turns_ ? TurnIds(PickTurn(req), start) : script_;
    tok::ChatStreamParser parser(tok_, start);
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
        if (f.begin) r.finish = engine::FinishReason::kToolCalls;
      }
      return out.empty() || cb.on_delta(out);
    };
    r.finish = scripted_turns_ ? engine::FinishReason::kStop : engine::FinishReason::kToolCalls;
    for (tok::TokenId id : script) {
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
  // A slow prefill: --prefill-s seconds of progress reports, 100 ms apart.
  bool Prefill(const engine::GenerateRequest& req, const engine::Callbacks& cb) {
    const auto start = std::chrono::steady_clock::now();
    const int64_t total = int64_t(req.prompt_ids.size());
    const int steps = std::max(1, int(prefill_s_ * 10));
    for (int i = 0; i <= steps; ++i) {
      if (prefill_s_ <= 0 && i > 0) break;
      engine::PrefillProgress p{};
      p.prompt_tokens = total;
      p.total = total;
      p.done = total * i / steps;
      p.layers = 4;
      p.units_done = p.done * 4;
      p.units_total = total * 4;
      p.window_tokens = total;
      p.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      p.eta_s = i == 0 ? -1 : p.elapsed_s * double(steps - i) / double(i);
      bool go = cb.on_prefill ? cb.on_prefill(p)
                              : (!cb.on_prefill_progress || cb.on_prefill_progress(p.done, total));
      if (!go) return false;
      if (prefill_s_ > 0 && i < steps) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return true;
  }

  // tool_turn when the prompt declares one of its calls (the first declared
  // one is made), final_turn after a tool result, else plain_turn.
  Turn PickTurn(const engine::GenerateRequest& req) const {
    std::vector<tok::TokenId> ids(req.prompt_ids.begin(), req.prompt_ids.end());
    std::string text = tok_.Decode(ids);
    std::string what = "plain_turn";
    Turn t = plain_turn_;
    if (text.find("<|open|>message role=\"tool\"") != std::string::npos) {
      what = "final_turn";
      t = final_turn_;
    } else if (text.find("type=\"tool-declare\"") != std::string::npos) {
      for (const Turn::Call& c : tool_turn_.calls) {
        if (text.find("\"name\":\"" + c.name + "\"") == std::string::npos) continue;
        what = "tool_turn " + c.name;
        t = tool_turn_;
        t.calls = {c};
        break;
      }
    }
    if (!transcript_.empty()) {
      if (FILE* f = std::fopen(transcript_.c_str(), "a")) {
        std::string tail = text.size() > 3000 ? text.substr(text.size() - 3000) : text;
        std::fprintf(f, "=== request: %zu prompt tokens -> %s\n", ids.size(), what.c_str());
        std::fwrite(tail.data(), 1, tail.size(), f);  // may hold NUL bytes: not through %s
        std::fputs("\n=== end\n", f);
        std::fclose(f);
      }
    }
    return t;
  }

  std::vector<tok::TokenId> TurnIds(const Turn& turn, tok::ChatStreamParser::Start start) const {
    IdWriter w{tok_, {}};
    if (start == tok::ChatStreamParser::Start::kThink) {
      w.T(turn.reasoning);
      w.Close("think");
      w.Open("response");
    }
    w.T(turn.content);
    w.Close("response");
    if (!turn.calls.empty()) {
      w.Open("tools");
      for (size_t i = 0; i < turn.calls.size(); ++i) {
        w.Open("call tool=\"" + turn.calls[i].name + "\" index=\"" + std::to_string(i + 1) + "\"");
        w.Open("json type=\"object\"");
        w.T(turn.calls[i].arguments);
        w.Close("json");
        w.Close("call");
      }
      w.Close("tools");
    }
    w.Close("message");
    w.S("<|end_of_msg|>");
    return std::move(w.ids);
  }

  std::vector<tok::TokenId> FixedAnswer() const {
    IdWriter w{tok_, {}};
    w.T("The user wants the weather in 北京 and the time.");
    w.Close("think");
    w.Open("response");
    w.T("Checking both 🙂");
    w.Close("response");
    w.Open("tools");
    w.Open("call tool=\"get_weather\" index=\"1\"");
    w.Open("argument key=\"city\" type=\"string\"");
    w.T("北京 (Beijing)");
    w.Close("argument");
    w.Close("call");
    w.Open("call tool=\"get_time\" index=\"2\"");
    w.Open("argument key=\"tz\" type=\"string\"");
    w.T("Asia/Shanghai");
    w.Close("argument");
    w.Close("call");
    w.Close("tools");
    w.Close("message");
    w.S("<|end_of_msg|>");
    return std::move(w.ids);
  }

  tok::Tokenizer tok_;
  double prefill_s_ = 0;
  std::string transcript_;
  std::vector<tok::TokenId> script_;  // the fixed answer (no --script)
  bool scripted_turns_ = false;
  Turn tool_turn_, final_turn_, plain_turn_;
};

}  // namespace
}  // namespace k3::server

int main(int argc, char** argv) {
  std::string dir, script, transcript, model_id = "k3-script";
  double prefill_s = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--script" && i + 1 < argc)
      script = argv[++i];
    else if (a == "--prefill-s" && i + 1 < argc)
      prefill_s = std::atof(argv[++i]);
    else if (a == "--model-id" && i + 1 < argc)
      model_id = argv[++i];
    else if (a == "--transcript" && i + 1 < argc)
      transcript = argv[++i];
    else if (dir.empty() && a.rfind("--", 0) != 0)
      dir = a;
    else
      dir.clear(), argc = 0;
  }
  if (dir.empty()) {
    std::fprintf(stderr,
                 "usage: k3-script-serve MODEL_DIR [--script FILE] [--prefill-s S] [--model-id ID] "
                 "[--transcript FILE]\n");
    return 2;
  }
  if (const int rc = k3::toolenv::ApplyFromEnvOrReport("k3-script-serve")) return rc;
  try {
    k3::server::ServerOptions o;
    o.port = 0;
    o.model_id = model_id;
    k3::server::Service service(o);
    k3::server::ScriptBackend backend(dir, script, prefill_s, transcript);
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
