// k3-run chat: XTML chat with the model, one-shot (PROMPT given) or an
// interactive multi-turn session. Reasoning is shown apart from the answer and
// control tokens are never printed (the stream parser turns structure into
// channels). Ctrl-C stops the current generation, not the session.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/engine/conversation.h"
#include "k3/engine/engine.h"
#include "k3/tokenizer/chat.h"

namespace k3::run {
namespace {

// The engine polls this between layers and tokens; a lock-free atomic store is
// async-signal-safe.
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);
void OnSigint(int) { g_interrupted.store(true, std::memory_order_relaxed); }

// SIGINT sets a flag while a generation runs; the previous disposition is
// restored afterwards so Ctrl-C at the input prompt still ends the session.
class InterruptScope {
 public:
  InterruptScope() {
    g_interrupted = false;
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

constexpr const char* kChatCommands =
    "Commands (each alone on its line):\n"
    "  /retry       regenerate the last answer\n"
    "  /edit TEXT   replace the last user message by TEXT and answer it\n"
    "  /undo        drop the last exchange (your message and its answer)\n"
    "  /help        this list\n"
    "  /exit        end the session (also /quit, or end of input)\n"
    "With checkpoints on (--ckpt-slots), /retry, /edit and /undo restore the state where the\n"
    "last message started instead of prefilling the conversation again.\n";

struct ChatArgs {
  std::string model_dir, prompt, system, effort;
  bool no_think = false;
  int max_tokens = 2048;
  RuntimeFlags flags;
  bool temp_given = false, top_p_given = false;
  ClusterFlags cluster;
};

// Shows one turn as it streams: reasoning dimmed on a colour terminal (or
// behind "[think] "), the answer after it, tool calls at the end.
class TurnPrinter {
 public:
  TurnPrinter(bool tty, bool color) : tty_(tty), color_(color) {}

  void Show(const engine::Delta& d) {
    if (!d.reasoning.empty()) {
      if (!in_reasoning_) {
        std::fputs(color_ ? "\x1b[2m" : "[think] ", stdout);
        in_reasoning_ = true;
      }
      Write(d.reasoning);
    }
    if (!d.content.empty()) {
      if (in_reasoning_) {
        std::fputs(color_ ? "\x1b[0m\n" : "\n", stdout);
        in_reasoning_ = false;
      }
      if (!printed_answer_ && !color_) std::fputs("[response] ", stdout);
      printed_answer_ = true;
      Write(d.content);
    }
    std::fflush(stdout);
  }

  void End(const engine::GenerateResult& r) {
    if (in_reasoning_ && color_) std::fputs("\x1b[0m", stdout);
    for (const tok::ToolCall& call : r.tool_calls) {
      std::printf("\n[tool call %d] %s %s", call.index, call.name.c_str(),
                  Safe(call.arguments_json).c_str());
    }
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (r.finish == engine::FinishReason::kCancelled) std::fputs("[interrupted]\n", stderr);
  }

 private:
  std::string Safe(std::string_view text) const { return tty_ ? TerminalSafe(text) : std::string(text); }
  void Write(std::string_view text) {
    const std::string safe = Safe(text);
    std::fwrite(safe.data(), 1, safe.size(), stdout);
  }

  bool tty_, color_;
  bool in_reasoning_ = false, printed_answer_ = false;
};

void RunChat(const ChatArgs& args) {
  tok::ChatOptions options;
  options.thinking = !args.no_think;
  if (!args.effort.empty()) options.thinking_effort = args.effort;
  // Refuse a bad effort before the (slow) model load.
  tok::RenderChatOrThrow({{"user", "x", ""}}, options);
  engine::EngineOptions eo = EngineOptionsFor(args.model_dir, args.flags);
  if (RunClusterRole(args.cluster, eo, /*stop_handler=*/true)) return;  // a worker rank
  std::unique_ptr<engine::Engine> eng = engine::Engine::LoadOrThrow(eo);
  if (!eng->model().weights().has_head) {
    throw Error(ErrorCode::kUnsupported, "model has no head (model.norm.weight missing): cannot chat");
  }
  engine::Conversation chat(*eng, options, args.system);
  engine::Conversation::TurnOptions turn;
  turn.max_tokens = args.max_tokens;
  // The model's own sampling defaults (generation_config.json) unless overridden.
  turn.sampling = eng->default_sampling();
  if (args.temp_given) turn.sampling.temperature = args.flags.temperature;
  if (args.top_p_given) turn.sampling.top_p = args.flags.top_p;
  const bool tty = isatty(STDOUT_FILENO);
  // https://no-color.org: NO_COLOR set and not empty turns colour off.
  const char* no_color = std::getenv("NO_COLOR");
  const bool color = tty && !(no_color && *no_color);

  turn.sampling.seed = args.flags.seed;
  // After each turn, unless --quiet: how much of the prompt was restored
  // (prefix reuse or a checkpoint) rather than prefilled.
  auto show_usage = [&](const engine::GenerateResult& r) {
    if (args.flags.quiet) return;
    std::fprintf(stderr,
                 "[usage] prompt_tokens=%lld cached_tokens=%lld prefilled=%lld "
                 "completion_tokens=%lld\n",
                 static_cast<long long>(r.usage.prompt_tokens),
                 static_cast<long long>(r.usage.cached_tokens),
                 static_cast<long long>(r.usage.prompt_tokens - r.usage.cached_tokens),
                 static_cast<long long>(r.usage.completion_tokens));
  };
  // One generation (a new turn, /retry or /edit), streamed; Ctrl-C stops it.
  auto generate = [&](const std::function<engine::GenerateResult(const engine::Callbacks&)>& run) {
    TurnPrinter printer(tty, color);
    engine::Callbacks cb;
    PrefillProgressLine progress(args.flags);
    cb.on_prefill = [&](const engine::PrefillProgress& p) { return progress.Update(p); };
    cb.on_delta = [&](const engine::Delta& d) {
      progress.Clear();
      printer.Show(d);
      return true;
    };
    cb.cancel = &g_interrupted;  // Ctrl-C, during prefill too
    InterruptScope interrupt;
    engine::GenerateResult r = [&] {
      try {
        return run(cb);
      } catch (const Error& e) {
        OnClusterLoss(*eng, e);
        throw;
      }
    }();
    progress.Clear();
    printer.End(r);
    show_usage(r);
  };
  auto one_turn = [&](const std::string& text) {
    generate([&](const engine::Callbacks& cb) { return chat.Turn(text, turn, cb); });
  };
  // A clean end (one-shot prompt, /exit, EOF): the RAM checkpoints go to
  // --ckpt-dir so that the next session resumes them.
  auto park = [&] {
    const int64_t n = eng->ParkCheckpoints();
    if (n > 0 && !args.flags.quiet) {
      std::fprintf(stderr, "[parked %lld checkpoints in %s]\n", static_cast<long long>(n),
                   args.flags.ckpt_dir.c_str());
    }
  };

  if (!args.prompt.empty()) {
    one_turn(args.prompt);
    park();
    return;
  }
  const bool tty_in = isatty(STDIN_FILENO);
  if (tty_in) std::fputs("Type a message, or /help for the commands.\n", stdout);
  std::string line;
  for (;;) {
    if (tty_in) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    // The commands are recognised on a terminal and over a pipe alike; any
    // other line (also one starting with another "/word") is a user message.
    if (line == "/exit" || line == "/quit") break;
    if (line == "/help") {
      std::fputs(kChatCommands, stdout);
      std::fflush(stdout);
      continue;
    }
    if (line == "/undo") {
      std::fputs(chat.Undo() ? "[undone: the last exchange is dropped]\n" : "[nothing to undo]\n",
                 stdout);
      std::fflush(stdout);
      continue;
    }
    const bool retry = line == "/retry";
    const bool edit = line == "/edit" || line.rfind("/edit ", 0) == 0;
    if (retry || edit) {
      if (!chat.has_exchange()) {
        std::fputs("[nothing to retry or edit yet]\n", stdout);
        std::fflush(stdout);
        continue;
      }
      if (retry) {
        generate([&](const engine::Callbacks& cb) { return chat.Retry(turn, cb); });
        continue;
      }
      const std::string text = line.size() > 6 ? line.substr(6) : std::string();
      if (text.empty()) {
        std::fputs("[/edit needs the new message: /edit TEXT]\n", stdout);
        std::fflush(stdout);
        continue;
      }
      generate([&](const engine::Callbacks& cb) { return chat.Edit(text, turn, cb); });
      continue;
    }
    one_turn(line);
  }
  park();
}

void SetupChat(CLI::App& root) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* cmd = root.add_subcommand("chat", "Chat with the model (XTML format, thinking on by default)");
  cmd->add_option("MODEL", args->model_dir, "HF snapshot or k3 container directory")->required();
  cmd->add_option("PROMPT", args->prompt, "one-shot prompt; without it, an interactive session");
  cmd->footer(std::string("Interactive session (also over a pipe, one message per line):\n") +
              kChatCommands);
  cmd->add_option("--system", args->system, "system message");
  cmd->add_flag("--no-think", args->no_think, "thinking off: the response channel opens directly");
  cmd->add_option("--effort", args->effort, "thinking effort: low, high or max (default max)");
  cmd->add_option("--max-tokens", args->max_tokens, "generation limit per turn (default 2048)")
      ->check(CLI::PositiveNumber);
  AddRuntimeFlags(cmd, args->flags, "the model's generation_config.json", "generation_config.json");
  AddClusterFlags(cmd, args->cluster);
  cmd->callback([args, cmd] {
    args->temp_given = cmd->count("--temp") > 0;
    args->top_p_given = cmd->count("--top-p") > 0;
    RunChat(*args);
  });
}

K3_REGISTER_COMMAND(SetupChat);

}  // namespace
}  // namespace k3::run
