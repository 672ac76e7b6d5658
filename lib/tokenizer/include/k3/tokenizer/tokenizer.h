// Kimi K3 tokenizer: tiktoken rank BPE with Kimi's pre-tokenizer, read straight from
// a checkpoint's tiktoken.model + tokenizer_config.json (no conversion step).
//
// Ownership and threads: a Tokenizer owns its vocabulary and compiled regex and is
// immutable after loading, so one instance may be shared by any number of threads
// (per-call scratch lives on the calling thread). Loading throws k3::Error
// (kNotFound, kCorrupt, kUnsupported); encoding never throws on text content
// (invalid UTF-8 bytes are encoded as U+FFFD, as a JS string would carry them);
// Decode throws kInvalidArgument for an id outside the vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace k3::tok {

using TokenId = uint32_t;

// Kimi's tokenizer reserves exactly this many special ids after the last rank.
inline constexpr uint32_t kNumSpecialTokens = 256;

// Paths of the files one tokenizer is built from. model_config may be empty.
struct TokenizerFiles {
  std::string tiktoken_model;    // "<base64 bytes> <rank>" per line
  std::string tokenizer_config;  // added_tokens_decoder, bos_token, eos_token
  std::string model_config;      // config.json: bos_token_id / eos_token_id (optional)
};

class Tokenizer {
 public:
  // Loads MODEL_DIR/tiktoken.model, MODEL_DIR/tokenizer_config.json and, when
  // present, MODEL_DIR/config.json.
  static Tokenizer LoadDirOrThrow(const std::string& model_dir);
  static Tokenizer LoadOrThrow(const TokenizerFiles& files);
  // From in-memory file contents (tests, fuzzers). model_config_json may be empty.
  static Tokenizer FromStringsOrThrow(std::string_view tiktoken_model,
                                      std::string_view tokenizer_config_json,
                                      std::string_view model_config_json = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // tiktoken's encode_ordinary: special-token text is encoded as plain bytes.
  std::vector<TokenId> EncodeOrdinary(std::string_view text) const;
  // tiktoken's encode(text, allowed_special="all") when allow_special, else as
  // EncodeOrdinary. Both apply Kimi's wrapper (400,000-code-point chunks, then cuts
  // inside runs of more than 25,000 whitespace or non-whitespace code points).
  std::vector<TokenId> Encode(std::string_view text, bool allow_special) const;
  // Appending forms, for building prompts segment by segment.
  void EncodeAppend(std::string_view text, bool allow_special, std::vector<TokenId>& out) const;

  // The bytes of the ids concatenated (specials as their content). The result may
  // be invalid UTF-8 when a character is split across ids; see Utf8StreamDecoder.
  std::string Decode(std::span<const TokenId> ids) const;
  // The bytes of one id; throws kInvalidArgument when out of range.
  std::string_view TokenBytes(TokenId id) const;

  // Special ids by content ("<|open|>"); nullopt when the name is unknown.
  std::optional<TokenId> SpecialId(std::string_view content) const;
  // Like SpecialId but throws kCorrupt naming the tokenizer_config when missing.
  TokenId SpecialIdOrThrow(std::string_view content) const;
  bool IsSpecial(TokenId id) const { return id >= num_ranks() && id < vocab_size(); }

  uint32_t num_ranks() const;   // ids below this are BPE ranks
  uint32_t vocab_size() const;  // num_ranks() + kNumSpecialTokens
  // From config.json bos_token_id / eos_token_id when present (top level or
  // text_config), else tokenizer_config.json's bos_token / eos_token names.
  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;

  // Pre-tokenizer only (Kimi's regex): the pieces of `text`, for tests and tools.
  std::vector<std::string> PreTokenize(std::string_view text) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token bytes into valid UTF-8 text: bytes of a character that
// is split across tokens are held back until the character completes; bytes that
// can never form a valid character become U+FFFD. Not thread-safe.
class Utf8StreamDecoder {
 public:
  // Returns the text that is complete after adding `bytes`.
  std::string Push(std::string_view bytes);
  // End of stream: any held-back incomplete sequence becomes U+FFFD.
  std::string Flush();
  bool has_pending() const { return !pending_.empty(); }

 private:
  std::string pending_;
};

// Replaces every ill-formed UTF-8 sequence by U+FFFD (WHATWG "maximal subpart"
// rule, like TextDecoder). Returns the input unchanged when it is already valid.
std::string SanitizeUtf8(std::string_view bytes);
bool IsValidUtf8(std::string_view bytes);

}  // namespace k3::tok
