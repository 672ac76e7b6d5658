#include "k3/container/snapshot.h"

#include <dirent.h>

#include <algorithm>
#include <unordered_set>

#include <simdjson.h>

#include "k3/core/error.h"
#include "k3/core/file.h"

namespace k3 {
namespace {

constexpr uint64_t kMaxConfigBytes = 64ull << 20;
constexpr uint64_t kMaxIndexBytes = 512ull << 20;

bool SafeShardName(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  if (name.find('/') != std::string_view::npos) return false;
  if (name.find('\\') != std::string_view::npos) return false;
  if (name.find('\0') != std::string_view::npos) return false;
  return true;
}

std::vector<std::string> ListSafetensors(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > 12 && name.ends_with(".safetensors")) out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// A container k3-repack has not finished (a pass interrupted, or some --worker
// passes not run yet) holds fewer shards than its fingerprint promises. Said
// first, so the user reads "rerun k3-repack", not the missing tensor that follows.
// The fingerprint's layout: docs/container.md.
void ThrowIfIncompleteContainer(const std::string& dir) {
  const std::string fp_path = JoinPath(dir, "k3-repack.fingerprint.json");
  if (!PathExists(fp_path)) return;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  int64_t want = 0;
  std::string text = ReadFileOrThrow(fp_path, 64ull << 20);
  if (parser.parse(text).get(doc) || doc["output_shards"].get_int64().get(want) || want <= 0) {
    throw Error(ErrorCode::kCorrupt, "fingerprint without a valid output_shards; rerun k3-repack with --force",
                fp_path);
  }
  int64_t have = 0;
  for (const auto& name : ListSafetensors(dir)) {
    if (name.starts_with("model-") && name.find("-of-") != std::string::npos) ++have;
  }
  if (have < want) {
    throw Error(ErrorCode::kNotFound,
                "incomplete container: " + std::to_string(have) + " of " + std::to_string(want) +
                    " shards; rerun k3-repack SRC " + dir + " with the same flags to finish it (k3-verify " + dir +
                    " lists what is missing)",
                dir);
  }
}

}  // namespace

std::vector<std::string> SplitDirList(std::string_view list) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= list.size()) {
    size_t j = list.find_first_of(";,", i);
    if (j == std::string_view::npos) j = list.size();
    std::string_view part = list.substr(i, j - i);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    if (!part.empty()) out.emplace_back(part);
    i = j + 1;
  }
  return out;
}

std::string FindShardPath(const std::string& dir, const std::vector<std::string>& extra_dirs,
                          const std::string& basename) {
  std::string p = JoinPath(dir, basename);
  if (PathExists(p)) return p;
  for (const auto& d : extra_dirs) {
    p = JoinPath(d, basename);
    if (PathExists(p)) return p;
  }
  return {};
}

Snapshot Snapshot::OpenOrThrow(const std::string& dir, const Options& options) {
  if (!IsDirectory(dir)) {
    throw Error(ErrorCode::kNotFound, "model directory does not exist", dir);
  }
  Snapshot s;
  s.dir_ = dir;
  s.config_json_ = ReadFileOrThrow(JoinPath(dir, "config.json"), kMaxConfigBytes);
  ThrowIfIncompleteContainer(dir);

  // The index is validated against the shard headers while its parsed document is
  // alive, so its ~500k names (real model) are views, not copies: opening the
  // real snapshot costs two hash maps of views instead of a million allocations.
  std::vector<std::string> shard_names;
  std::string index_path = JoinPath(dir, "model.safetensors.index.json");
  simdjson::dom::parser parser;
  std::unordered_map<std::string_view, std::string_view> index_map;  // tensor -> shard
  if (PathExists(index_path)) {
    s.has_index_ = true;
    std::string text = ReadFileOrThrow(index_path, kMaxIndexBytes);
    simdjson::dom::element doc;
    if (auto err = parser.parse(text).get(doc); err) {
      throw Error(ErrorCode::kCorrupt,
                  std::string("index is not valid JSON: ") + simdjson::error_message(err),
                  index_path);
    }
    simdjson::dom::object wm;
    if (doc["weight_map"].get_object().get(wm)) {
      throw Error(ErrorCode::kCorrupt, "index has no weight_map object", index_path);
    }
    uint64_t total;
    if (!doc["metadata"]["total_size"].get_uint64().get(total)) s.index_total_size_ = total;
    index_map.reserve(wm.size());
    std::unordered_set<std::string_view> distinct_shards;
    for (auto kv : wm) {
      std::string_view shard;
      if (kv.value.get_string().get(shard)) {
        throw Error(ErrorCode::kCorrupt, "weight_map value is not a string", index_path,
                    Error::kNoOffset, std::string(kv.key));
      }
      if (!SafeShardName(shard)) {
        throw Error(ErrorCode::kCorrupt,
                    "shard name '" + std::string(shard) + "' is not a plain file name in the model directory",
                    index_path, Error::kNoOffset, std::string(kv.key));
      }
      if (!index_map.emplace(kv.key, shard).second) {
        throw Error(ErrorCode::kCorrupt, "tensor listed twice in weight_map", index_path,
                    Error::kNoOffset, std::string(kv.key));
      }
      if (distinct_shards.insert(shard).second) shard_names.emplace_back(shard);
    }
    if (index_map.empty()) {
      // Almost certainly a broken download or writer; refusing beats a model with no weights.
      throw Error(ErrorCode::kCorrupt, "index weight_map maps no tensors", index_path);
    }
    std::sort(shard_names.begin(), shard_names.end());
  } else {
    shard_names = ListSafetensors(dir);
    if (shard_names.empty()) {
      throw Error(ErrorCode::kNotFound, "no model.safetensors.index.json and no *.safetensors files",
                  dir);
    }
  }

  s.shards_.reserve(shard_names.size());
  for (const auto& name : shard_names) {
    std::string path = FindShardPath(dir, options.extra_dirs, name);
    if (path.empty()) {
      throw Error(ErrorCode::kNotFound, "shard named by the index is missing", JoinPath(dir, name));
    }
    s.shards_.push_back(SafetensorsFile::OpenOrThrow(path));
  }

  size_t total = 0;
  for (const auto& f : s.shards_) total += f.tensors().size();
  s.by_name_.reserve(total);
  for (size_t i = 0; i < s.shards_.size(); ++i) {
    const SafetensorsFile& f = s.shards_[i];
    // shards_[i] was opened for shard_names[i] (possibly found in an extra dir).
    const std::string_view base = shard_names[i];
    for (const auto& t : f.tensors()) {
      if (s.has_index_) {
        auto it = index_map.find(t.name);
        if (it == index_map.end()) {
          throw Error(ErrorCode::kCorrupt, "tensor is in the shard but not in the index", f.path(),
                      static_cast<int64_t>(f.AbsoluteOffset(t)), t.name);
        }
        if (it->second != base) {
          throw Error(ErrorCode::kCorrupt, "index maps this tensor to " + std::string(it->second),
                      f.path(), static_cast<int64_t>(f.AbsoluteOffset(t)), t.name);
        }
      }
      // Keys view t.name, which lives as long as shards_ (never reallocated after this).
      TensorRef ref{&f, &t, i, f.AbsoluteOffset(t)};
      if (!s.by_name_.emplace(std::string_view(t.name), ref).second) {
        throw Error(ErrorCode::kCorrupt, "tensor name appears in two shards", f.path(),
                    static_cast<int64_t>(ref.offset), t.name);
      }
    }
  }
  // Every shard tensor is in the index (checked above), so equal sizes mean equal sets.
  if (s.has_index_ && index_map.size() != s.by_name_.size()) {
    for (const auto& [name, shard] : index_map) {
      if (!s.by_name_.count(name)) {
        throw Error(ErrorCode::kCorrupt,
                    "index maps this tensor to " + std::string(shard) + " but it is not there",
                    JoinPath(dir, std::string(shard)), Error::kNoOffset, std::string(name));
      }
    }
  }

  const std::string probe = "model.layers.0.input_layernorm.weight";
  if (!s.by_name_.count(probe) && s.by_name_.count("language_model." + probe)) {
    s.prefix_ = "language_model.";
  } else if (!s.by_name_.count(probe) && s.by_name_.count("language_model.model.embed_tokens.weight")) {
    s.prefix_ = "language_model.";
  }
  return s;
}

std::optional<TensorRef> Snapshot::FindExact(std::string_view full_name) const {
  auto it = by_name_.find(full_name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::optional<TensorRef> Snapshot::Find(std::string_view name) const {
  return FindExact(prefix_ + std::string(name));
}

TensorRef Snapshot::FindOrThrow(std::string_view name) const {
  if (auto r = Find(name)) return *r;
  // No need to consult the index here: opening proved it maps exactly these tensors.
  std::string full = prefix_ + std::string(name);
  throw Error(ErrorCode::kNotFound,
              has_index_ ? "tensor missing from the model (and from its index)"
                         : "tensor missing from the model",
              dir_, Error::kNoOffset, full);
}

TensorRef Snapshot::FindCheckedOrThrow(std::string_view name, const std::vector<DType>& dtypes,
                                       const std::vector<int64_t>& shape) const {
  TensorRef r = FindOrThrow(name);
  auto shape_str = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
    return out + "]";
  };
  if (std::find(dtypes.begin(), dtypes.end(), r.info->dtype) == dtypes.end()) {
    std::string want;
    for (auto d : dtypes) want += (want.empty() ? "" : "|") + std::string(DTypeName(d));
    throw Error(ErrorCode::kUnsupported,
                "dtype " + std::string(DTypeName(r.info->dtype)) + ", expected " + want,
                r.file->path(), static_cast<int64_t>(r.offset), r.info->name);
  }
  if (r.info->shape != shape) {
    // Accept equal element counts (e.g. [1,D] vs [D]) only when the caller passes a 1-D shape.
    bool same_numel = shape.size() == 1 && static_cast<uint64_t>(shape[0]) == r.info->numel();
    if (!same_numel) {
      throw Error(ErrorCode::kCorrupt,
                  "shape " + shape_str(r.info->shape) + ", expected " + shape_str(shape),
                  r.file->path(), static_cast<int64_t>(r.offset), r.info->name);
    }
  }
  return r;
}

std::vector<float> Snapshot::ReadF32OrThrow(std::string_view name) const {
  TensorRef r = FindOrThrow(name);
  return r.file->ReadF32OrThrow(*r.info);
}

}  // namespace k3
