// k3-run render: an OpenAI-style chat request -> XTML segments and ids, exactly
// as Moonshot's encoder builds the prompt (docs/tokenizer.md "Chat format").
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/tokenizer/chat.h"
#include "k3/tokenizer/tokenizer.h"

namespace k3::run {
namespace {

constexpr uint64_t kMaxRequestBytes = 256ull << 20;

struct RenderArgs {
  std::string model_dir, request_path;
  bool json = false;
  bool bos = false;
};

void RunRender(const RenderArgs& args) {
  tok::Tokenizer tokenizer = tok::Tokenizer::LoadDirOrThrow(args.model_dir);
  std::string request = ReadFileOrThrow(args.request_path, kMaxRequestBytes);
  tok::RenderedChat chat;
  try {
    chat = tok::RenderChatRequestOrThrow(request);
  } catch (const Error& e) {
    throw e.path().empty() ? e.WithPath(args.request_path) : e;
  }
  std::vector<tok::TokenId> ids;
  if (args.bos) {
    if (!tokenizer.bos_id()) throw Error(ErrorCode::kNotFound, "--bos: the model defines no BOS id");
    ids.push_back(*tokenizer.bos_id());
  }
  std::vector<tok::TokenId> body = tok::EncodeChatSegments(tokenizer, chat.segments);
  ids.insert(ids.end(), body.begin(), body.end());
  if (args.json) {
    JsonWriter j;
    j.BeginObject().Key("segments").BeginArray();
    for (const tok::ChatSegment& s : chat.segments) {
      j.BeginObject().Field("text", s.text).Field("allow_special", s.allow_special).EndObject();
    }
    j.EndArray().Key("ids").BeginArray();
    for (tok::TokenId id : ids) j.Uint(id);
    j.EndArray();
    j.Key("resolved").BeginObject().Field("thinking", chat.resolved.thinking).Key("thinking_effort");
    if (chat.resolved.thinking_effort) j.String(*chat.resolved.thinking_effort);
    else j.Null();
    j.EndObject().EndObject();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::string text;
    for (const tok::ChatSegment& s : chat.segments) text += s.text;
    std::printf("%s\n", text.c_str());
    std::string line;
    for (tok::TokenId id : ids) line += (line.empty() ? "" : ",") + std::to_string(id);
    std::printf("%s\n", line.c_str());
  }
}

void SetupRender(CLI::App& root) {
  auto args = std::make_shared<RenderArgs>();
  CLI::App* cmd = root.add_subcommand("render", "Render a chat request to XTML segments and ids");
  cmd->add_option("MODEL", args->model_dir, "directory with tiktoken.model and tokenizer_config.json")
      ->required();
  cmd->add_option("--request", args->request_path,
                  "JSON file: {\"messages\":[...], \"options\":{\"thinking\", \"thinking_effort\", \"tools\", "
                  "\"tool_choice\", \"response_format\", \"add_generation_prompt\"}}")
      ->required();
  cmd->add_flag("--json", args->json, "print {\"segments\":[{\"text\",\"allow_special\"}],\"ids\":[...]}");
  cmd->add_flag("--bos", args->bos, "prepend the model's BOS id (the encoder itself adds none)");
  cmd->callback([args] { RunRender(*args); });
}

K3_REGISTER_COMMAND(SetupRender);

}  // namespace
}  // namespace k3::run
