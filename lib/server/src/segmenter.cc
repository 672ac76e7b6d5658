// Segments from engine::Delta events, and the UTF-8 hold-back they share.
#include "segmenter.h"

namespace k3::server {
namespace {

// Length of the UTF-8 sequence a lead byte opens (0 for a continuation or an
// invalid lead, which is passed on and replaced by the JSON writer).
int SequenceLength(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

}  // namespace

std::string Utf8Holder::Push(std::string_view bytes) {
  held_.append(bytes);
  // Look back at most 3 bytes for the lead of an unfinished sequence.
  size_t n = held_.size();
  size_t keep_from = n;
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(held_[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for its lead
    int len = SequenceLength(c);
    if (len > int(back)) keep_from = n - back;  // the sequence is not complete yet
    break;
  }
  std::string out = held_.substr(0, keep_from);
  held_.erase(0, keep_from);
  return out;
}

std::string Utf8Holder::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

std::string Segmenter::Fold(const engine::Delta& delta, SegmentEvents& events) {
  std::string out = Text(Channel::kReasoning, delta.reasoning, events);
  out += Text(Channel::kText, delta.content, events);
  for (const engine::ToolCallDelta& tc : delta.tool_calls) {
    auto it = call_segment_.find(tc.index);
    if (it == call_segment_.end()) {
      Segment s;
      s.channel = Channel::kToolCall;
      s.call_index = tc.index;
      s.call_ordinal = int(call_segment_.size());
      s.call_id = tc.id;
      s.name = tc.name;
      out += Open(std::move(s), events);
      it = call_segment_.emplace(tc.index, segments_.size() - 1).first;
    }
    if (!tc.arguments.empty()) out += Release(it->second, holds_[it->second].Push(tc.arguments), events);
  }
  return out;
}

std::string Segmenter::Text(Channel channel, const std::string& bytes, SegmentEvents& events) {
  if (bytes.empty()) return {};
  std::string out;
  int at = -1;
  if (runs_ == Runs::kPerChange) {
    if (open_ >= 0 && segments_[size_t(open_)].channel == channel) at = open_;
  } else {
    for (size_t i = 0; i < segments_.size() && at < 0; ++i) {
      if (segments_[i].channel == channel) at = int(i);
    }
  }
  if (at < 0) {
    Segment s;
    s.channel = channel;
    out += Open(std::move(s), events);
    at = int(segments_.size()) - 1;
  }
  return out + Release(size_t(at), holds_[size_t(at)].Push(bytes), events);
}

std::string Segmenter::Open(Segment segment, SegmentEvents& events) {
  std::string out;
  if (runs_ == Runs::kPerChange) out = CloseOpen(events);
  segments_.push_back(std::move(segment));
  holds_.emplace_back();
  const size_t index = segments_.size() - 1;
  if (runs_ == Runs::kPerChange) open_ = int(index);
  return out + events.Opened(index);
}

std::string Segmenter::CloseOpen(SegmentEvents& events) {
  if (open_ < 0) return {};
  const size_t index = size_t(open_);
  std::string out = Flush(index, events);
  open_ = -1;
  return out + events.Closed(index);
}

std::string Segmenter::Flush(size_t index, SegmentEvents& events) {
  return Release(index, holds_[index].Flush(), events);
}

std::string Segmenter::Release(size_t index, const std::string& bytes, SegmentEvents& events) {
  if (bytes.empty()) return {};
  segments_[index].text += bytes;
  return events.Piece(index, bytes);
}

}  // namespace k3::server
