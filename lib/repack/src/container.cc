#include "k3/repack/container.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <map>

#include "k3/container/safetensors.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"

namespace k3::repack {
namespace {

bool ParseDigits(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 12) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc();
}

}  // namespace

std::optional<ShardName> ParseShardName(std::string_view f) {
  constexpr std::string_view kPre = "model-", kMid = "-of-", kSuf = ".safetensors";
  if (!f.starts_with(kPre) || !f.ends_with(kSuf)) return std::nullopt;
  f.remove_prefix(kPre.size());
  f.remove_suffix(kSuf.size());
  size_t mid = f.find(kMid);
  if (mid == std::string_view::npos) return std::nullopt;
  ShardName s;
  if (!ParseDigits(f.substr(0, mid), &s.number) ||
      !ParseDigits(f.substr(mid + kMid.size()), &s.total)) {
    return std::nullopt;
  }
  if (s.number < 1 || s.total < 1) return std::nullopt;
  return s;
}

std::string FormatShardName(int64_t number, int64_t total) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05lld-of-%06lld.safetensors",
                static_cast<long long>(number), static_cast<long long>(total));
  return buf;
}

std::vector<std::string> ListShardFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (std::string& name : ListDirectory(dir)) {
    if (ParseShardName(name)) out.push_back(std::move(name));
  }
  return out;
}

std::string BuildIndexJson(const std::string& dir, IndexSummary* summary) {
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0;
  int64_t of_total = -1;
  std::string of_total_from;
  auto shards = ListShardFiles(dir);
  for (const auto& name : shards) {
    auto parsed = ParseShardName(name);
    if (of_total >= 0 && parsed->total != of_total) {
      throw Error(ErrorCode::kCorrupt,
                  "shard totals disagree: " + name + " vs " + of_total_from +
                      " (files from two different conversions in one directory)",
                  JoinPath(dir, name));
    }
    of_total = parsed->total;
    of_total_from = name;
    SafetensorsFile f = SafetensorsFile::OpenOrThrow(JoinPath(dir, name));
    for (const auto& t : f.tensors()) {
      auto [it, inserted] = weight_map.emplace(t.name, name);
      if (!inserted) {
        throw Error(
            ErrorCode::kCorrupt,
            "duplicate tensor in " + it->second + " and " + name + "; the index was left unchanged",
            JoinPath(dir, name), static_cast<int64_t>(f.AbsoluteOffset(t)), t.name);
      }
      total += t.nbytes();
    }
  }
  std::string out = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total) +
                    "\n  },\n  \"weight_map\": {";
  bool first = true;
  for (const auto& [tensor, shard] : weight_map) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    AppendJsonString(out, tensor);
    out += ": ";
    AppendJsonString(out, shard);
  }
  out += first ? "}\n}\n" : "\n  }\n}\n";
  if (summary) {
    summary->num_shards = shards.size();
    summary->num_tensors = weight_map.size();
    summary->total_size = total;
  }
  return out;
}

IndexSummary RebuildIndex(const std::string& dir) {
  IndexSummary s;
  std::string json = BuildIndexJson(dir, &s);
  CrashPoint("repack-index-built");
  AtomicFileWriter w(JoinPath(dir, kIndexName));
  w.Write(json);
  CrashPoint("repack-index-written");
  w.Commit();
  return s;
}

struct ContainerLock::Impl {
  explicit Impl(const std::string& path) : lock(path) {}
  FileLock lock;
};

ContainerLock::ContainerLock(const std::string& dst_dir)
    : impl_(new Impl(JoinPath(dst_dir, kLockName))) {}
ContainerLock::~ContainerLock() { delete impl_; }

std::string Fingerprint::Render() const {
  JsonWriter w;
  w.BeginObject();
  w.Field("k3_container", int64_t{1});
  w.Key("params").BeginObject();
  w.Field("bits", int64_t{bits.bits});
  w.Field("mla_bits", int64_t{bits.mla_bits});
  w.Field("head_bits", int64_t{bits.head_bits});
  w.EndObject();
  w.Field("output_shards", output_shards);
  w.Key("source").BeginObject();
  w.Field("index_xxh128", source_index_xxh128);
  w.Key("shards").BeginArray();
  for (const auto& s : source_shards) {
    w.BeginArray().String(s.name).Uint(s.size).String(s.header_xxh128).EndArray();
  }
  w.EndArray();
  w.EndObject();
  w.EndObject();
  return w.Take() + "\n";
}

Fingerprint Fingerprint::ParseOrThrow(std::string_view text, const std::string& path) {
  auto bad = [&](const std::string& what) -> Error {
    return Error(ErrorCode::kCorrupt, "fingerprint: " + what, path);
  };
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text.data(), text.size());
  simdjson::dom::element doc;
  if (parser.parse(padded).get(doc)) throw bad("not valid JSON");
  Fingerprint f;
  int64_t v;
  if (doc["k3_container"].get_int64().get(v) || v != 1) throw bad("unknown k3_container version");
  if (doc["params"]["bits"].get_int64().get(v)) throw bad("params.bits missing");
  f.bits.bits = static_cast<int>(v);
  if (doc["params"]["mla_bits"].get_int64().get(v)) throw bad("params.mla_bits missing");
  f.bits.mla_bits = static_cast<int>(v);
  if (doc["params"]["head_bits"].get_int64().get(v)) throw bad("params.head_bits missing");
  f.bits.head_bits = static_cast<int>(v);
  if (doc["output_shards"].get_int64().get(f.output_shards)) throw bad("output_shards missing");
  std::string_view s;
  if (doc["source"]["index_xxh128"].get_string().get(s)) throw bad("source.index_xxh128 missing");
  f.source_index_xxh128 = s;
  simdjson::dom::array arr;
  if (doc["source"]["shards"].get_array().get(arr)) throw bad("source.shards missing");
  for (auto e : arr) {
    simdjson::dom::array t;
    SourceShard sh;
    std::string_view n, h;
    if (e.get_array().get(t) || t.size() != 3 || t.at(0).get_string().get(n) ||
        t.at(1).get_uint64().get(sh.size) || t.at(2).get_string().get(h)) {
      throw bad("source.shards entries must be [name, size, hash]");
    }
    sh.name = n;
    sh.header_xxh128 = h;
    f.source_shards.push_back(std::move(sh));
  }
  return f;
}

std::string Fingerprint::Difference(const Fingerprint& w) const {
  auto flags = [](const QuantBits& b) {
    return "--bits " + std::to_string(b.bits) + " --mla-bits " + std::to_string(b.mla_bits) +
           " --head-bits " + std::to_string(b.head_bits);
  };
  if (bits.bits != w.bits.bits || bits.mla_bits != w.bits.mla_bits ||
      bits.head_bits != w.bits.head_bits) {
    return "the destination was converted with " + flags(bits) + " but this run asks for " +
           flags(w.bits);
  }
  if (source_index_xxh128 != w.source_index_xxh128 || output_shards != w.output_shards ||
      source_shards.size() != w.source_shards.size()) {
    return "the destination was converted from a different source snapshot (index or shard list "
           "differs)";
  }
  for (size_t i = 0; i < source_shards.size(); ++i) {
    const auto& a = source_shards[i];
    const auto& b = w.source_shards[i];
    if (a.name != b.name || a.size != b.size || a.header_xxh128 != b.header_xxh128) {
      return "the destination was converted from a different source snapshot (" + b.name +
             " differs)";
    }
  }
  return {};
}

}  // namespace k3::repack
