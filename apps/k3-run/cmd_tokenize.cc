// k3-run tokenize / detokenize: the checkpoint's own tokenizer from the command
// line (text -> ids, ids -> text), for checking prompts and outputs by hand.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/tokenizer/tokenizer.h"

namespace k3::run {
namespace {

constexpr uint64_t kMaxTextFileBytes = 1ull << 30;

struct TokenizeArgs {
  std::string model_dir, text, text_file;
  bool has_text = false;
  bool allow_special = false;
  bool json = false;
};

struct DetokenizeArgs {
  std::string model_dir, ids_csv;
  bool json = false;
};

void RunTokenize(const TokenizeArgs& args) {
  if (args.has_text == !args.text_file.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "give exactly one of --text and --text-file");
  }
  tok::Tokenizer tokenizer = tok::Tokenizer::LoadDirOrThrow(args.model_dir);
  std::string text;
  if (args.has_text) {
    text = args.text;
  } else if (args.text_file == "-") {
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) {
      text.append(buf, n);
      if (text.size() > kMaxTextFileBytes) throw Error(ErrorCode::kInvalidArgument, "stdin text over 1 GiB");
    }
    if (std::ferror(stdin)) ThrowErrno(errno, "reading stdin");
  } else {
    text = ReadFileOrThrow(args.text_file, kMaxTextFileBytes);
  }
  std::vector<tok::TokenId> ids = tokenizer.Encode(text, args.allow_special);
  if (args.json) {
    JsonWriter j;
    j.BeginObject().Key("ids").BeginArray();
    for (tok::TokenId id : ids) j.Uint(id);
    j.EndArray().EndObject();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::string line;
    for (tok::TokenId id : ids) {
      if (!line.empty()) line += ',';
      line += std::to_string(id);
    }
    std::printf("%s\n", line.c_str());
  }
}

void RunDetokenize(const DetokenizeArgs& args) {
  tok::Tokenizer tokenizer = tok::Tokenizer::LoadDirOrThrow(args.model_dir);
  std::vector<int32_t> parsed = ParseIdList(args.ids_csv);
  std::vector<tok::TokenId> ids(parsed.begin(), parsed.end());
  std::string bytes = tokenizer.Decode(ids);
  if (args.json) {
    JsonWriter j;
    j.BeginObject().Field("text", tok::SanitizeUtf8(bytes));
    j.Field("valid_utf8", tok::IsValidUtf8(bytes));
    j.EndObject();
    std::printf("%s\n", j.str().c_str());
  } else {
    // The exact bytes: a caller piping ids of a split character gets them as is.
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fputc('\n', stdout);
  }
}

void SetupTokenize(CLI::App& root) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = root.add_subcommand("tokenize", "Encode text with the model's tokenizer");
  cmd->add_option("MODEL", args->model_dir, "directory with tiktoken.model and tokenizer_config.json")
      ->required();
  cmd->add_option_function<std::string>(
      "--text", [args](const std::string& t) { args->text = t; args->has_text = true; }, "text to encode");
  cmd->add_option("--text-file", args->text_file, "file whose bytes are encoded ('-': stdin)");
  cmd->add_flag("--allow-special", args->allow_special,
                "special-token text (<|open|>, [BOS], ...) becomes its id; default: plain text");
  cmd->add_flag("--json", args->json, "print {\"ids\":[...]}");
  cmd->callback([args] { RunTokenize(*args); });

  auto dargs = std::make_shared<DetokenizeArgs>();
  CLI::App* dcmd = root.add_subcommand("detokenize", "Decode token ids to text");
  dcmd->add_option("MODEL", dargs->model_dir, "directory with tiktoken.model and tokenizer_config.json")
      ->required();
  dcmd->add_option("--ids", dargs->ids_csv, "ids, e.g. 1,2,3")->required();
  dcmd->add_flag("--json", dargs->json, "print {\"text\":...} (invalid UTF-8 shown as U+FFFD)");
  dcmd->callback([dargs] { RunDetokenize(*dargs); });
}

K3_REGISTER_COMMAND(SetupTokenize);

}  // namespace
}  // namespace k3::run
