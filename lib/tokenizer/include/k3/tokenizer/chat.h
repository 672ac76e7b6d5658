// XTML chat format of Kimi K3: OpenAI-style messages -> segments -> ids, exactly as
// Moonshot's encoding_k3.py renders them, and a stream parser that splits generated
// ids back into reasoning, content and tool calls.
//
// Rendering is a pure function (thread-safe); it throws k3::Error kInvalidArgument
// for requests the encoder refuses (bad thinking_effort, unknown tool name, bad
// JSON) and kUnsupported for content it cannot carry (images). ChatStreamParser is
// a per-generation object, not thread-safe, and never throws on model output:
// malformed structure is tolerated and noted in warnings().
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "k3/tokenizer/tokenizer.h"

namespace k3::tok {

// One piece of a prompt, tokenized on its own. allow_special segments are exactly
// one structural marker (<|open|>, <|close|>, <|sep|>, <|end_of_msg|>); all others
// are ordinary text, even when they spell a marker.
struct ChatSegment {
  std::string text;
  bool allow_special = false;
  bool operator==(const ChatSegment&) const = default;
};

// The effective settings after the encoder's defaults are applied.
struct ResolvedChatOptions {
  bool thinking = true;
  std::optional<std::string> thinking_effort;  // set only when thinking
};

struct RenderedChat {
  std::vector<ChatSegment> segments;
  ResolvedChatOptions resolved;
};

// Renders {"messages": [...], "options": {"thinking", "thinking_effort", "tools",
// "tool_choice", "response_format", "add_generation_prompt"}} (the shape of
// tests/data/oracle/chat/cases.json). The option keys are also accepted at the
// top level, as in an OpenAI request body.
RenderedChat RenderChatRequestOrThrow(std::string_view request_json);

// A plain message for callers that build conversations in code (k3-run chat).
struct ChatMessage {
  std::string role;  // system, user, assistant, tool
  std::string content;
  std::string reasoning_content;  // assistant history, replayed when thinking
};
struct ChatOptions {
  bool thinking = true;
  std::optional<std::string> thinking_effort;  // default "max" when thinking
  bool add_generation_prompt = true;
};
RenderedChat RenderChatOrThrow(const std::vector<ChatMessage>& messages, const ChatOptions& options);

// Ids of the segments, each encoded separately. Throws kCorrupt when the
// tokenizer lacks a structural marker.
std::vector<TokenId> EncodeChatSegments(const Tokenizer& tok, const std::vector<ChatSegment>& segments);

// The four structural specials, looked up by content.
struct XtmlIds {
  TokenId open, close, sep, end_of_msg;
  static XtmlIds FromTokenizerOrThrow(const Tokenizer& tok);
};

struct ToolCall {
  int index = 0;               // 1-based, from the call's index attribute when present
  std::string name;
  std::string arguments_json;  // a JSON object text (or the raw json block)
};

// A piece of a tool call as it is generated. The first fragment of a call has
// begin = true and its name; later fragments carry pieces of its arguments JSON
// text, in order. A call's pieces concatenated equal its ToolCall::arguments_json.
struct ToolCallFragment {
  int call = 0;  // 0-based position of the call in this output
  bool begin = false;
  std::string name;       // on begin only
  std::string arguments;  // whole UTF-8 characters
  bool operator==(const ToolCallFragment&) const = default;
};

// What a chunk of generated ids adds to the visible text.
struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallFragment> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Splits generated ids into reasoning / content / tool calls. Only the special
// ids are structure: a literal "<|close|>" spelled in ordinary tokens is content.
// Tool-call arguments stream as they are generated: `<argument>` values become
// pieces of a compact JSON object ({"key":value,...}; string values escaped,
// other values whitespace-trimmed, an empty one null), a `<json>` block is
// passed through as it is. A call cut off by the end of output is closed so its
// arguments stay valid JSON as far as they went.
class ChatStreamParser {
 public:
  // Where the prompt left the model: inside <|open|>think<|sep|> (thinking),
  // inside <|open|>response<|sep|> (thinking off), or at the open message.
  enum class Start { kThink, kResponse, kMessage };
  ChatStreamParser(const Tokenizer& tok, Start start);

  ChatDelta Push(TokenId id);
  // End of generation (stop id, length limit or interrupt): flushes held-back
  // bytes and closes whatever is open.
  ChatDelta Finish();

  bool ended() const { return ended_; }  // <|end_of_msg|> was generated
  bool IsEndOfMsg(TokenId id) const { return id == ids_.end_of_msg; }
  // The next ordinary token would land in the think channel (reasoning).
  bool in_reasoning() const { return channel_ == Channel::kThink; }
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  const std::vector<ToolCall>& tool_calls() const { return tool_calls_; }
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  enum class Channel { kNone, kThink, kResponse, kArgument, kJson };
  void OnTag(bool is_open, std::string_view header, ChatDelta& delta);
  void OnText(std::string_view bytes, ChatDelta& delta);
  void OnArgumentText(std::string_view text, ChatDelta& delta);
  void CloseArgument(ChatDelta& delta);
  void EmitArguments(std::string piece, ChatDelta& delta);
  void FinishCall(ChatDelta& delta);

  const Tokenizer& tok_;
  XtmlIds ids_;
  Channel channel_;
  bool ended_ = false;
  enum class TagMode { kNone, kOpen, kClose } tag_mode_ = TagMode::kNone;
  std::string tag_header_;
  Utf8StreamDecoder reasoning_decoder_, content_decoder_;
  std::string reasoning_, content_;
  bool in_call_ = false;
  ToolCall call_;
  int call_pos_ = 0;           // 0-based position of the open call
  std::string call_stream_;    // arguments text emitted so far for the open call
  int call_args_ = 0;          // <argument>s streamed for the open call
  bool call_json_ = false;     // the open call streamed a <json> block
  bool arg_drop_ = false;      // the open argument/json block is ignored (mixed forms)
  bool arg_string_ = false;    // the open argument is a JSON string
  bool arg_started_ = false;   // a non-string value has emitted its first character
  std::string arg_ws_;         // whitespace held back inside a non-string value
  Utf8StreamDecoder arg_decoder_;
  std::vector<ToolCall> tool_calls_;
  std::vector<std::string> warnings_;
};

}  // namespace k3::tok
