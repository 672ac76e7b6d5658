#include "k3/model/info.h"

#include <simdjson.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <set>
#include <utility>

#include "k3/container/snapshot.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"

namespace k3 {
namespace {

constexpr const char* kFingerprint = "k3-repack.fingerprint.json";  // docs/container.md

// "int8 (bits 8, mla-bits 8, head-bits 8)": bits <= 4 is int4-g64 where the row allows.
std::string BitsText(int64_t bits, int64_t mla, int64_t head) {
  auto layout = [](int64_t b) { return b <= 4 ? std::string("int4-g64") : std::string("int8"); };
  std::string kinds = layout(bits);
  if (layout(mla) != kinds || layout(head) != kinds) kinds += " / " + layout(mla) + " / " + layout(head);
  return kinds + " (bits " + std::to_string(bits) + ", mla-bits " + std::to_string(mla) + ", head-bits " +
         std::to_string(head) + ")";
}

void ReadFingerprint(const std::string& path, ModelInfo& info) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  const std::string text = ReadFileOrThrow(path, 64ull << 20);
  int64_t bits = 0, mla = 0, head = 0, shards = 0;
  simdjson::dom::array sources;
  if (parser.parse(text).get(doc) || doc["params"]["bits"].get_int64().get(bits) ||
      doc["params"]["mla_bits"].get_int64().get(mla) || doc["params"]["head_bits"].get_int64().get(head) ||
      doc["output_shards"].get_int64().get(shards) || doc["source"]["shards"].get_array().get(sources)) {
    info.status = "fingerprint unreadable (" + path + "); rerun k3-repack with --force";
    return;
  }
  info.weights = BitsText(bits, mla, head);
  info.output_shards = shards;
  info.fingerprint_source_shards = static_cast<int64_t>(sources.size());
}

void CountTokenizer(const std::string& dir, ModelInfo& info) {
  const std::string tik = JoinPath(dir, "tiktoken.model");
  info.has_tokenizer_config = PathExists(JoinPath(dir, "tokenizer_config.json"));
  if (!PathExists(tik)) return;
  const std::string text = ReadFileOrThrow(tik, 64ull << 20);
  int64_t lines = 0;
  for (size_t at = 0; at < text.size();) {
    size_t eol = text.find('\n', at);
    if (eol == std::string::npos) eol = text.size();
    if (eol > at) ++lines;
    at = eol + 1;
  }
  info.tokenizer_ranks = lines;
}

void DescribeTensors(const Snapshot& snap, ModelInfo& info) {
  info.shards = snap.shards().size();
  info.prefix = snap.prefix();
  std::set<std::pair<std::string, std::string>> experts;  // (layer prefix, expert id)
  bool any_float_matrix = false, any_u8_matrix = false;
  for (const auto& f : snap.shards()) {
    info.file_bytes += f.file_size();
    for (const auto& t : f.tensors()) {
      ++info.tensors;
      info.tensor_bytes += t.nbytes();
      const size_t at = t.name.find(".block_sparse_moe.experts.");
      if (at != std::string::npos) {
        const size_t id_at = at + 26, dot = t.name.find('.', id_at);
        experts.emplace(t.name.substr(0, at), t.name.substr(id_at, dot - id_at));
        info.expert_bytes += t.nbytes();
        continue;
      }
      if (t.name.starts_with("vision_tower.") || t.name.starts_with("mm_projector.")) continue;
      info.resident_bytes += t.nbytes();
      if (t.shape.size() == 2 && t.name.ends_with("_proj.weight")) {
        (t.dtype == DType::kU8 ? any_u8_matrix : any_float_matrix) = true;
      }
    }
  }
  info.experts = static_cast<int64_t>(experts.size());
  if (info.weights.empty()) {
    info.weights = any_u8_matrix ? "quantized (no fingerprint)" : any_float_matrix ? "bf16 (not quantized)" : "?";
  }
}

}  // namespace

uint64_t ModelInfo::projected_bytes() const { return resident_bytes + std::min(expert_cache_bytes, expert_bytes); }

ModelInfo DescribeModelOrThrow(const std::string& dir, uint64_t expert_cache_bytes) {
  if (!IsDirectory(dir)) throw Error(ErrorCode::kNotFound, "not a directory", dir);
  ModelInfo info;
  info.dir = dir;
  info.expert_cache_bytes = expert_cache_bytes;
  const std::string fp = JoinPath(dir, kFingerprint);
  info.kind = PathExists(fp) ? "container" : "snapshot";
  if (info.kind == "container") ReadFingerprint(fp, info);
  CountTokenizer(dir, info);
  try {
    Snapshot snap = Snapshot::OpenOrThrow(dir);
    info.config = ModelConfig::ParseOrThrow(snap.config_json(), JoinPath(dir, "config.json"));
    DescribeTensors(snap, info);
    if (info.status.empty()) info.status = "complete";
  } catch (const Error& e) {
    // Incomplete or damaged: still say what it is (the message says what to do).
    info.status = e.detail();
    try {
      info.config = ModelConfig::LoadOrThrow(dir);
    } catch (const Error&) {
    }
  }
  return info;
}

std::string RenderModelInfo(const ModelInfo& i, bool json) {
  const ModelConfig* c = i.config ? &*i.config : nullptr;
  if (json) {
    JsonWriter w;
    w.BeginObject();
    w.Field("dir", i.dir).Field("kind", i.kind).Field("status", i.status);
    w.Field("shards", i.shards).Field("tensors", i.tensors).Field("file_bytes", i.file_bytes);
    w.Field("tensor_bytes", i.tensor_bytes).Field("weights", i.weights);
    if (c) {
      w.Field("layers", c->num_hidden_layers).Field("hidden_size", c->hidden_size).Field("vocab_size", c->vocab_size);
      w.Field("moe_layers", c->num_moe_layers()).Field("experts_per_layer", c->num_experts);
    }
    w.Field("experts", i.experts).Field("expert_bytes", i.expert_bytes).Field("resident_bytes", i.resident_bytes);
    w.Field("expert_cache_bytes", i.expert_cache_bytes).Field("projected_bytes", i.projected_bytes());
    w.Field("tokenizer_ranks", i.tokenizer_ranks).Field("tokenizer_config", i.has_tokenizer_config);
    if (i.output_shards >= 0) {
      w.Key("fingerprint").BeginObject();
      w.Field("output_shards", i.output_shards).Field("source_shards", i.fingerprint_source_shards);
      w.EndObject();
    }
    w.EndObject();
    return w.Take() + "\n";
  }
  std::string out;
  auto line = [&](const char* key, const std::string& value) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%-12s", key);
    out += buf + value + "\n";
  };
  line("model", i.dir);
  line("kind", i.kind == "container" ? "k3 container (k3-repack output)" : "HF snapshot");
  line("status", i.status);
  line("shards", std::to_string(i.shards) + " files, " + FormatBytes(i.file_bytes) + ", " +
                     std::to_string(i.tensors) + " tensors");
  line("weights", i.weights);
  if (c) {
    line("layers", std::to_string(c->num_hidden_layers) + " (" + std::to_string(c->num_moe_layers()) + " MoE, " +
                       std::to_string(c->num_mla_layers()) + " MLA), hidden " + std::to_string(c->hidden_size) +
                       ", vocab " + std::to_string(c->vocab_size));
  }
  line("experts", std::to_string(i.experts) + " stored" +
                      (c ? " (" + std::to_string(c->num_experts) + " per MoE layer)" : std::string()) + ", " +
                      FormatBytes(i.expert_bytes) +
                      (i.experts > 0 ? ", " + FormatBytes(i.expert_bytes / static_cast<uint64_t>(i.experts)) + " each"
                                     : std::string()));
  line("tokenizer", i.tokenizer_ranks >= 0 ? std::to_string(i.tokenizer_ranks) + " ranks + 256 specials" +
                                                 (i.has_tokenizer_config ? "" : " (no tokenizer_config.json)")
                                           : std::string("none (no tiktoken.model)"));
  if (i.output_shards >= 0) {
    line("fingerprint", std::to_string(i.output_shards) + " output shards from " +
                            std::to_string(i.fingerprint_source_shards) + " source shards");
  }
  line("memory", FormatBytes(i.resident_bytes) + " resident weights + expert cache " +
                     FormatBytes(std::min(i.expert_cache_bytes, i.expert_bytes)) + " (budget " +
                     FormatBytes(i.expert_cache_bytes) + ") = " + FormatBytes(i.projected_bytes()));
  return out;
}

}  // namespace k3
