// Installing the streaming store in a model, and its stats as JSON.
#include "k3/core/json_writer.h"
#include "k3/core/log.h"
#include "k3/model/model.h"
#include "k3/stream/streaming_store.h"

namespace k3::stream {

StreamingExpertStore& InstallStreamingStore(model::Model& model, const StreamOptions& options) {
  auto store = std::make_unique<StreamingExpertStore>(model.snapshot(), model.config(), options);
  StreamingExpertStore& ref = *store;
  K3_LOG_INFO("expert streaming: %s, %s reads, pipe %s, window %d", ref.backend(),
              ref.direct() ? "O_DIRECT" : "buffered", ref.options().pipe ? "on" : "off",
              ref.options().window);
  model.SetExpertStore(std::move(store));
  return ref;
}

namespace {

void StepFields(const StepStats& s, JsonWriter& j) {
  j.Field("bytes_read", s.bytes_read);
  j.Field("hits", s.hits);
  j.Field("misses", s.misses);
  j.Field("unique_experts", s.unique_experts);
  j.Field("ahead_used", s.ahead_used);
  j.Field("ahead_unused", s.ahead_unused);
  j.Field("io_wait_s", s.io_wait_s);
  j.Field("compute_s", s.compute_s);
  j.Field("io_busy_s", s.io_busy_s);
  j.Field("read_gbps", s.io_busy_s > 0 ? static_cast<double>(s.bytes_read) / s.io_busy_s / 1e9 : 0.0);
}

}  // namespace

void WriteStreamStatsJson(const StreamingExpertStore& store, uint64_t prefill_selections,
                          size_t prefill_steps, JsonWriter& j) {
  const StreamStats& st = store.stream_stats();
  const CachePlan& p = store.plan();
  j.Key("stream").BeginObject();
  j.Field("backend", std::string(store.backend()));
  j.Field("direct", store.direct());
  j.Field("pipe", store.options().pipe);
  j.Field("slots_per_layer", p.slots_per_layer);
  j.Field("cache_bytes", p.cache_bytes);
  j.Field("budget_from_env", p.from_env);
  StepFields(st.total, j);
  const uint64_t n = st.total.hits + st.total.misses;
  j.Field("hit_rate", n ? static_cast<double>(st.total.hits) / static_cast<double>(n) : 0.0);
  j.Field("read_ops", st.read_ops);
  j.Field("retries", st.retries);
  j.Field("short_reads", st.short_reads);
  // Prefill dedup: expert reads a token-at-a-time prefill would issue over
  // the loads of the chunks' unions (each unique expert of a chunk once).
  uint64_t prefill_unique = 0;
  for (size_t i = 0; i < prefill_steps && i < st.steps.size(); ++i) {
    prefill_unique += st.steps[i].unique_experts;
  }
  j.Field("prefill_selections", prefill_selections);
  j.Field("prefill_unique_experts", prefill_unique);
  j.Field("prefill_dedup_ratio", prefill_unique ? static_cast<double>(prefill_selections) /
                                                      static_cast<double>(prefill_unique)
                                                : 0.0);
  j.Key("steps").BeginArray();
  for (size_t i = 0; i < st.steps.size(); ++i) {
    j.BeginObject();
    j.Field("prefill", i < prefill_steps);
    StepFields(st.steps[i], j);
    j.EndObject();
  }
  j.EndArray();
  j.EndObject();
}

}  // namespace k3::stream
