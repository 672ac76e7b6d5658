// One answer's engine::Delta events folded into segments (a run of
// reasoning, a run of text, one tool call each), the part every API writer
// shares: when a segment opens and closes, which bytes it may release (never
// half a UTF-8 character), and which segment an engine tool-call index feeds.
// The writers turn segment events into their own bytes (stream.cc,
// messages_stream.cc, responses_stream.cc); the segmenter only orders them.
//
// Per answer, not thread-safe, never throws on model output.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "k3/engine/engine.h"

namespace k3::server {

// Splits off a trailing incomplete UTF-8 sequence (kept for the next piece).
class Utf8Holder {
 public:
  std::string Push(std::string_view bytes);
  std::string Flush();  // whatever is held (invalid bytes are replaced later)

 private:
  std::string held_;
};

// In this order: writers index their name tables by it.
enum class Channel { kReasoning, kText, kToolCall };

struct Segment {
  Channel channel = Channel::kText;
  std::string text;        // released so far: reasoning, text, or the call's arguments
  int call_index = -1;     // kToolCall: the engine's index of the call
  int call_ordinal = -1;   // kToolCall: its place among this answer's calls
  std::string call_id;     // kToolCall: the engine's id ("" when it gave none)
  std::string name;        // kToolCall: the function's name
};

// What a writer makes of segment changes: the bytes for each, called in
// output order on the thread that folds.
class SegmentEvents {
 public:
  // Segment `index` now exists (the previously open one was closed first).
  virtual std::string Opened(size_t index) = 0;
  // Bytes released for `index`, already appended to its text; never empty.
  virtual std::string Piece(size_t index, const std::string& piece) = 0;
  // The open segment `index` ends: its held bytes went out just before.
  virtual std::string Closed(size_t index) = 0;

 protected:
  ~SegmentEvents() = default;
};

// SegmentEvents over a writer's private Opened / Piece / Closed members (the
// writer befriends it: its public header cannot name this private interface).
template <class Writer>
class WriterEvents final : public SegmentEvents {
 public:
  explicit WriterEvents(Writer& writer) : w_(writer) {}
  std::string Opened(size_t index) override { return w_.Opened(index); }
  std::string Piece(size_t index, const std::string& piece) override { return w_.Piece(index, piece); }
  std::string Closed(size_t index) override { return w_.Closed(index); }

 private:
  Writer& w_;
};

// How text runs map to segments.
enum class Runs {
  // A new segment whenever the output's channel changes (thinking -> text ->
  // tool call): Anthropic's content blocks, the Responses API's output items.
  kPerChange,
  // One reasoning and one text segment for the whole answer, never closed:
  // chat.completions, whose deltas name their field instead of a block.
  kPerChannel,
};

class Segmenter {
 public:
  explicit Segmenter(Runs runs) : runs_(runs) {}

  // Folds one delta: reasoning, then content, then each tool-call piece; the
  // events' bytes in order. A call's first piece opens its segment; later
  // pieces land in it, even when another segment opened in between.
  std::string Fold(const engine::Delta& delta, SegmentEvents& events);
  // Releases what the open segment holds back and closes it (kPerChange).
  std::string CloseOpen(SegmentEvents& events);
  // Releases whatever segment `index` holds back (an incomplete sequence at
  // the very end becomes U+FFFD in the JSON writer).
  std::string Flush(size_t index, SegmentEvents& events);

  const std::vector<Segment>& segments() const { return segments_; }
  bool has_calls() const { return !call_segment_.empty(); }

 private:
  std::string Text(Channel channel, const std::string& bytes, SegmentEvents& events);
  std::string Open(Segment segment, SegmentEvents& events);  // the new one is segments_.back()
  std::string Release(size_t index, const std::string& bytes, SegmentEvents& events);

  Runs runs_;
  int open_ = -1;  // kPerChange: the open segment
  std::vector<Segment> segments_;
  std::vector<Utf8Holder> holds_;       // per segment
  std::map<int, size_t> call_segment_;  // engine call index -> segment
};

}  // namespace k3::server
