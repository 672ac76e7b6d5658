// SSE chunks and the whole response from engine::Delta events.
#include "k3/server/stream.h"

#include <cstdio>

#include "k3/core/json_writer.h"
#include "segmenter.h"
#include "sse.h"

namespace k3::server {
namespace {

// The fields every response object starts with.
JsonWriter& Envelope(JsonWriter& j, const ResponseMeta& meta, const char* object) {
  return j.BeginObject()
      .Field("id", meta.id)
      .Field("object", object)
      .Field("created", meta.created)
      .Field("model", meta.model);
}

// usage and the k3 stats close both the usage chunk and the whole response.
JsonWriter& UsageAndStats(JsonWriter& j, const engine::Usage& usage, const ResponseStats& stats) {
  return j.Key("usage").Raw(UsageJson(usage)).Key("k3").Raw(StatsJson(stats)).EndObject();
}

}  // namespace

std::string FinishName(engine::FinishReason reason, bool had_tool_calls) {
  switch (reason) {
    case engine::FinishReason::kLength: return "length";
    case engine::FinishReason::kToolCalls: return "tool_calls";
    case engine::FinishReason::kStop:
    case engine::FinishReason::kCancelled: break;
  }
  return had_tool_calls ? "tool_calls" : "stop";
}

std::string UsageJson(const engine::Usage& usage) {
  JsonWriter j;
  j.BeginObject()
      .Field("prompt_tokens", usage.prompt_tokens)
      .Field("completion_tokens", usage.completion_tokens)
      .Field("total_tokens", usage.prompt_tokens + usage.completion_tokens)
      .Key("prompt_tokens_details")
      .BeginObject()
      .Field("cached_tokens", usage.cached_tokens)
      .EndObject()
      .Key("completion_tokens_details")
      .BeginObject()
      .Field("reasoning_tokens", usage.reasoning_tokens)
      .EndObject()
      .EndObject();
  return j.Take();
}

std::string StatsJson(const ResponseStats& s) {
  JsonWriter j;
  j.BeginObject()
      .Field("ttft_s", s.timings.ttft_s)
      .Field("prefill_s", s.timings.prefill_s)
      .Field("prefill_tok_per_s", s.timings.prefill_tok_per_s)
      .Field("decode_s", s.timings.decode_s)
      .Field("decode_tok_per_s", s.timings.decode_tok_per_s)
      .Field("queue_wait_s", s.queue_wait_s)
      .Field("queue_ticket", s.queue_ticket)
      .Field("start_index", s.start_index)
      .Field("expert_hit_rate", s.expert_hit_rate)
      .Field("expert_bytes_read", s.expert_bytes_read)
      .EndObject();
  return j.Take();
}

ChatStream::ChatStream(ResponseMeta meta, bool include_usage)
    : meta_(std::move(meta)),
      include_usage_(include_usage),
      segments_(std::make_unique<Segmenter>(Runs::kPerChannel)) {}

ChatStream::~ChatStream() = default;

std::string ChatStream::CallId(int ordinal, const std::string& engine_id) const {
  return engine_id.empty() ? meta_.id + "-call-" + std::to_string(ordinal) : engine_id;
}

AnswerState ChatStream::answer() const {
  AnswerState a;
  for (const Segment& seg : segments_->segments()) {
    switch (seg.channel) {
      case Channel::kReasoning: a.reasoning = seg.text; break;
      case Channel::kText: a.content = seg.text; break;
      case Channel::kToolCall: a.calls.push_back({CallId(seg.call_ordinal, seg.call_id), seg.name, seg.text}); break;
    }
  }
  return a;
}

std::string ChatStream::Chunk(const std::string& delta_json, const char* finish_reason,
                              const std::string& progress_json) {
  JsonWriter j;
  Envelope(j, meta_, "chat.completion.chunk")
      .Key("choices")
      .BeginArray()
      .BeginObject()
      .Field("index", 0)
      .Key("delta")
      .Raw(delta_json)
      .Key("logprobs")
      .Null()
      .Key("finish_reason");
  if (finish_reason) j.String(finish_reason);
  else j.Null();
  j.EndObject().EndArray();
  if (!progress_json.empty()) j.Key("prompt_progress").Raw(progress_json);
  j.EndObject();
  return SseData(j.str());
}

std::string ChatStream::TextChunk(const char* field, const std::string& piece) {
  JsonWriter d;
  d.BeginObject();
  if (!role_sent_) d.Field("role", "assistant");
  role_sent_ = true;
  d.Field(field, piece).EndObject();
  return Chunk(d.str(), nullptr);
}

// Segment events as chat.completion.chunk deltas: reasoning_content and
// content by field, a call's opening fragment, then its argument pieces.
std::string ChatStream::Opened(size_t index) {
  const Segment& seg = segments_->segments()[index];
  if (seg.channel != Channel::kToolCall) return {};
  // A call opens: id, type and name once, arguments "" (OpenAI's shape).
  JsonWriter d;
  d.BeginObject();
  if (!role_sent_) d.Field("role", "assistant");
  role_sent_ = true;
  d.Key("tool_calls").BeginArray().BeginObject().Field("index", seg.call_ordinal);
  d.Field("id", CallId(seg.call_ordinal, seg.call_id)).Field("type", "function");
  d.Key("function").BeginObject().Field("name", seg.name);
  d.Field("arguments", "").EndObject().EndObject().EndArray().EndObject();
  return Chunk(d.str(), nullptr);
}

std::string ChatStream::Piece(size_t index, const std::string& piece) {
  const Segment& seg = segments_->segments()[index];
  switch (seg.channel) {
    case Channel::kReasoning: return TextChunk("reasoning_content", piece);
    case Channel::kText: return TextChunk("content", piece);
    case Channel::kToolCall: break;
  }
  JsonWriter d;
  d.BeginObject().Key("tool_calls").BeginArray().BeginObject().Field("index", seg.call_ordinal);
  d.Key("function").BeginObject().Field("arguments", piece).EndObject().EndObject().EndArray().EndObject();
  return Chunk(d.str(), nullptr);
}

std::string ChatStream::Closed(size_t) { return {}; }  // kPerChannel: nothing closes

std::string ChatStream::OnDelta(const engine::Delta& delta) {
  if (finished_) return {};
  WriterEvents events(*this);
  return segments_->Fold(delta, events);
}

std::string ChatStream::Finish(engine::FinishReason reason, const engine::Usage& usage,
                               const ResponseStats& stats) {
  if (finished_) return {};
  // Whatever UTF-8 was held back is flushed as it is: reasoning, content,
  // then each call's arguments in call order.
  WriterEvents events(*this);
  std::string out;
  const std::vector<Segment>& segs = segments_->segments();
  for (Channel channel : {Channel::kReasoning, Channel::kText, Channel::kToolCall}) {
    for (size_t i = 0; i < segs.size(); ++i) {
      if (segs[i].channel == channel) out += segments_->Flush(i, events);
    }
  }
  std::string finish = FinishName(reason, segments_->has_calls());
  // The last choice chunk: role here when nothing was generated, so the first
  // chunk always carries role.
  std::string last_delta = role_sent_ ? "{}" : "{\"role\":\"assistant\",\"content\":\"\"}";
  role_sent_ = true;
  out += Chunk(last_delta, finish.c_str());
  if (include_usage_) {
    JsonWriter j;
    Envelope(j, meta_, "chat.completion.chunk").Key("choices").BeginArray().EndArray();
    UsageAndStats(j, usage, stats);
    out += SseData(j.str());
  }
  out += "data: [DONE]\n\n";
  finished_ = true;
  return out;
}

std::string ChatStream::Error(const ApiError& error) {
  if (finished_) return {};
  finished_ = true;
  return SseData(error.Json()) + "data: [DONE]\n\n";
}

std::string ChatStream::Opening() {
  if (finished_ || role_sent_) return {};
  role_sent_ = true;
  return Chunk("{\"role\":\"assistant\",\"content\":\"\"}", nullptr);
}

std::string ChatStream::KeepAlive() {
  if (finished_) return {};
  if (!role_sent_) return Opening();
  return Chunk("{}", nullptr);
}

std::string ChatStream::ProgressChunk(const engine::PrefillProgress& progress) {
  if (finished_) return {};
  std::string out = Opening();
  return out + Chunk("{}", nullptr, PromptProgressJson(progress));
}

std::string PromptProgressJson(const engine::PrefillProgress& p) {
  JsonWriter j;
  j.BeginObject()
      .Field("total", p.prompt_tokens)
      .Field("cache", p.cached_tokens)
      .Field("processed", p.cached_tokens + p.done)
      .Field("time_ms", int64_t(p.elapsed_s * 1000.0 + 0.5))
      .Key("eta_ms");
  if (p.eta_s >= 0)
    j.Int(int64_t(p.eta_s * 1000.0 + 0.5));
  else
    j.Null();
  j.Field("layers", p.layers)
      .Field("units_done", p.units_done)
      .Field("units_total", p.units_total)
      .Field("window_tokens", p.window_tokens)
      .Field("expert_bytes_read", p.expert_bytes_read)
      .EndObject();
  return j.Take();
}

std::string ProgressText(const engine::PrefillProgress& p) {
  char buf[192];
  int n = std::snprintf(buf, sizeof buf, "prefill %lld/%lld tokens (%d%%)",
                        static_cast<long long>(p.done), static_cast<long long>(p.total),
                        p.units_total > 0 ? int(100 * p.units_done / p.units_total)
                        : p.total > 0     ? int(100 * p.done / p.total)
                                          : 0);
  auto more = [&](const char* fmt, auto... args) {
    if (n > 0 && size_t(n) < sizeof buf)
      n += std::snprintf(buf + n, sizeof buf - size_t(n), fmt, args...);
  };
  if (p.cached_tokens > 0) more(", %lld cached", static_cast<long long>(p.cached_tokens));
  if (p.layers > 0) more(", %lld layers", static_cast<long long>(p.layers));
  if (p.expert_bytes_read > 0) more(", %.1f MB read", double(p.expert_bytes_read) / 1e6);
  more(", %.1f s", p.elapsed_s);
  if (p.eta_s >= 0) more(", eta %.0f s", p.eta_s);
  return buf;
}

ChatAccumulator::ChatAccumulator(ResponseMeta meta) : stream_(meta, false), meta_(std::move(meta)) {}

std::string ChatAccumulator::Finish(engine::FinishReason reason, const engine::Usage& usage,
                                    const ResponseStats& stats) {
  stream_.Finish(reason, usage, stats);
  const AnswerState a = stream_.answer();
  JsonWriter j;
  Envelope(j, meta_, "chat.completion")
      .Key("choices")
      .BeginArray()
      .BeginObject()
      .Field("index", 0)
      .Key("message")
      .BeginObject()
      .Field("role", "assistant")
      .Key("content");
  // content is always a string, "" when empty; null only beside tool calls.
  if (a.content.empty() && !a.calls.empty()) j.Null();
  else j.String(a.content);
  if (meta_.thinking || !a.reasoning.empty()) j.Field("reasoning_content", a.reasoning);
  if (!a.calls.empty()) {
    j.Key("tool_calls").BeginArray();
    for (const AnswerState::Call& c : a.calls) {
      j.BeginObject().Field("id", c.id).Field("type", "function").Key("function").BeginObject();
      j.Field("name", c.name).Field("arguments", c.arguments).EndObject().EndObject();
    }
    j.EndArray();
  }
  j.EndObject()
      .Key("logprobs")
      .Null()
      .Field("finish_reason", FinishName(reason, !a.calls.empty()))
      .EndObject()
      .EndArray();
  UsageAndStats(j, usage, stats);
  return j.Take();
}

}  // namespace k3::server
