// k3-run chat: XTML chat with the model, one-shot (PROMPT given) or an
// interactive multi-turn session. Reasoning is shown apart from the answer and
// control tokens are never printed (the stream parser turns structure into
// channels). Ctrl-C stops the current generation, not the session.
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "command.h"
#include "k3/container/snapshot.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/sys.h"
#include "k3/model/model.h"
#include "k3/tokenizer/chat.h"
#include "k3/tokenizer/tokenizer.h"

namespace k3::run {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void OnSigint(int) { g_interrupted = 1; }

// SIGINT sets a flag while a generation runs; the previous disposition is
// restored afterwards so Ctrl-C at the input prompt still ends the session.
class InterruptScope {
 public:
  InterruptScope() {
    g_interrupted = 0;
    struct sigaction sa = {};
    sa.sa_handler = OnSigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_);
  }
  ~InterruptScope() { sigaction(SIGINT, &old_, nullptr); }

 private:
  struct sigaction old_ = {};
};

// Model text may contain raw control bytes (ESC sequences could restyle or
// rewrite the user's terminal); on a TTY keep only newline and tab of C0 and DEL.
std::string TerminalSafe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7F) continue;
    out += c;
  }
  return out;
}

struct ChatArgs {
  std::string model_dir, prompt, system, effort;
  bool no_think = false;
  int max_tokens = 2048;
  float temperature = 0.6f;
  float top_p = 0.95f;
  uint64_t seed = 1;
};

class ChatSession {
 public:
  explicit ChatSession(const ChatArgs& args)
      : args_(args),
        tokenizer_(tok::Tokenizer::LoadDirOrThrow(args.model_dir)),
        sampler_(args.temperature, args.top_p, args.seed) {
    options_.thinking = !args.no_think;
    if (!args.effort.empty()) options_.thinking_effort = args.effort;
    // Refuse a bad effort before the (slow) model load.
    tok::RenderChatOrThrow({{"user", "x", ""}}, options_);
    Snapshot::Options so;
    if (auto dirs = GetEnv("K3_DIRS")) so.extra_dirs = SplitDirList(*dirs);
    model_ = model::Model::LoadOrThrow(args.model_dir, model::LoadOptions::FromEnv(), so);
    if (!model_->weights().has_head) {
      throw Error(ErrorCode::kUnsupported, "model has no head (model.norm.weight missing): cannot chat");
    }
    session_ = std::make_unique<model::Session>(*model_, model::RunOptions::FromEnv());
    if (!args.system.empty()) history_.push_back({"system", args.system, ""});
    color_ = isatty(STDOUT_FILENO);
  }

  // One user turn: render, prefill what the model has not seen, generate.
  void Turn(const std::string& user_text) {
    history_.push_back({"user", user_text, ""});
    tok::RenderedChat chat = tok::RenderChatOrThrow(history_, options_);
    std::vector<int32_t> ids;
    if (model_->config().bos_token_id >= 0) ids.push_back(int32_t(model_->config().bos_token_id));
    for (tok::TokenId id : tok::EncodeChatSegments(tokenizer_, chat.segments)) ids.push_back(int32_t(id));

    // Reuse the state when the new prompt extends what was fed; a replayed
    // assistant turn can tokenize differently from how it was generated, in
    // which case the session restarts from scratch.
    size_t common = 0;
    while (common < fed_.size() && common < ids.size() && fed_[common] == ids[common]) ++common;
    if (common < fed_.size() || common == ids.size()) {
      session_->Reset();
      fed_.clear();
      common = 0;
    }
    std::vector<float> logits(size_t(model_->config().vocab_size));
    model::ForwardOutputs out;
    out.logits_last = logits.data();
    InterruptScope interrupt;
    session_->Forward(std::span<const int32_t>(ids.data() + common, ids.size() - common), out);
    fed_ = ids;

    tok::ChatStreamParser parser(tokenizer_, options_.thinking ? tok::ChatStreamParser::Start::kThink
                                                               : tok::ChatStreamParser::Start::kResponse);
    bool in_reasoning = false, printed_answer = false;
    auto write = [&](const std::string& text) {
      std::string safe = color_ ? TerminalSafe(text) : text;
      std::fwrite(safe.data(), 1, safe.size(), stdout);
    };
    auto show = [&](const tok::ChatDelta& d) {
      if (!d.reasoning.empty()) {
        if (!in_reasoning) {
          std::fputs(color_ ? "\x1b[2m" : "[think] ", stdout);
          in_reasoning = true;
        }
        write(d.reasoning);
      }
      if (!d.content.empty()) {
        if (in_reasoning) {
          std::fputs(color_ ? "\x1b[0m\n" : "\n", stdout);
          in_reasoning = false;
        }
        if (!printed_answer && !color_) std::fputs("[response] ", stdout);
        printed_answer = true;
        write(d.content);
      }
      std::fflush(stdout);
    };
    const auto& eos = model_->config().eos_token_ids;
    for (int i = 0; i < args_.max_tokens && !g_interrupted; ++i) {
      int32_t id = sampler_.Sample(logits);
      show(parser.Push(tok::TokenId(id)));
      bool stop = parser.ended();
      for (int64_t e : eos) stop |= e == id;
      if (stop) break;
      session_->Forward(std::span<const int32_t>(&id, 1), out);
      fed_.push_back(id);
    }
    show(parser.Finish());
    if (in_reasoning && color_) std::fputs("\x1b[0m", stdout);
    for (const tok::ToolCall& call : parser.tool_calls()) {
      std::printf("\n[tool call %d] %s %s", call.index, call.name.c_str(), call.arguments_json.c_str());
    }
    std::fputc('\n', stdout);
    if (g_interrupted) std::fputs("[interrupted]\n", stderr);
    history_.push_back({"assistant", parser.content(), parser.reasoning()});
  }

 private:
  const ChatArgs& args_;
  tok::Tokenizer tokenizer_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::Session> session_;
  model::Sampler sampler_;
  tok::ChatOptions options_;
  std::vector<tok::ChatMessage> history_;
  std::vector<int32_t> fed_;
  bool color_ = false;
};

void RunChat(const ChatArgs& args) {
  ChatSession chat(args);
  if (!args.prompt.empty()) {
    chat.Turn(args.prompt);
    return;
  }
  const bool tty = isatty(STDIN_FILENO);
  std::string line;
  for (;;) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (tty && (line == "/exit" || line == "/quit")) break;
    chat.Turn(line);  // off a TTY every input line is one user turn
  }
}

void SetupChat(CLI::App& root) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* cmd = root.add_subcommand("chat", "Chat with the model (XTML format, thinking on by default)");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container directory")->required();
  cmd->add_option("PROMPT", args->prompt, "one-shot prompt; without it, an interactive session");
  cmd->add_option("--system", args->system, "system message");
  cmd->add_flag("--no-think", args->no_think, "thinking off: the response channel opens directly");
  cmd->add_option("--effort", args->effort, "thinking effort: low, high or max (default max)");
  cmd->add_option("--max-tokens", args->max_tokens, "generation limit per turn (default 2048)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temp", args->temperature, "temperature; <= 0 is greedy (default 0.6)");
  cmd->add_option("--top-p", args->top_p, "nucleus mass in (0, 1] (default 0.95)");
  cmd->add_option("--seed", args->seed, "sampling seed (default 1)");
  cmd->callback([args] { RunChat(*args); });
}

K3_REGISTER_COMMAND(SetupChat);

}  // namespace
}  // namespace k3::run
