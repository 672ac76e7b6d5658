#include "k3/repack/verify.h"

#include <fcntl.h>
#include <omp.h>
#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "k3/core/direct_io.h"
#include "k3/container/safetensors.h"
#include "k3/container/snapshot.h"
#include "k3/core/file.h"
#include "k3/core/sys.h"
#include "k3/model/config.h"
#include "k3/quant/quant.h"
#include "k3/repack/checksums.h"
#include "k3/repack/classify.h"
#include "k3/repack/container.h"
#include "model_check.h"
#include "transform.h"

namespace k3::repack {

std::string Problem::ToString() const {
  std::string s = file.empty() ? std::string("(container)") : file;
  if (offset >= 0) s += ": offset " + std::to_string(offset);
  if (!tensor.empty()) s += ": '" + tensor + "'";
  s += ": " + detail + " [" + std::string(ErrorCodeName(code)) + "]";
  return s;
}

int VerifyReport::ExitCode() const { return ok() ? 0 : ExitCodeFor(problems.front().code); }

namespace {

struct Located {
  size_t shard;
  const TensorInfo* info;
};

class Verifier {
 public:
  explicit Verifier(const VerifyOptions& o) : opt_(o) {}
  VerifyReport Run();

 private:
  void Add(ErrorCode code, std::string file, std::string tensor, int64_t offset,
           std::string detail) {
    std::lock_guard<std::mutex> lock(mu_);
    report_.problems.push_back(
        {code, std::move(file), std::move(tensor), offset, std::move(detail)});
  }
  void CheckIndex();
  void CheckModel();
  void CheckChecksums();
  void CheckCopiedFiles();
  void FoldConsequences();
  // Streams one shard: hash, and with a source compare every byte it can.
  std::string StreamShard(size_t s);
  std::string Path(const std::string& name) const { return JoinPath(opt_.dst, name); }

  const VerifyOptions& opt_;
  VerifyReport report_;
  std::mutex mu_;
  std::vector<std::string> shard_names_;
  std::vector<std::optional<SafetensorsFile>> shards_;
  std::unordered_map<std::string, Located> by_name_;
  std::map<std::string, std::string> index_shard_of_;  // tensor -> shard, as the index says
  std::optional<Fingerprint> fingerprint_;
  std::optional<Snapshot> source_;
  std::string prefix_;
  int inner_threads_ = 1;  // quantization threads inside one file's stream
};

void Verifier::CheckIndex() {
  const std::string path = Path(std::string(kIndexName));
  if (!PathExists(path)) {
    Add(ErrorCode::kNotFound, path, {}, -1, "index missing");
    return;
  }
  std::string text;
  try {
    text = ReadFileOrThrow(path, 512u << 20);
  } catch (const Error& e) {
    Add(e.code(), path, {}, -1, e.detail());
    return;
  }
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::object wm;
  if (parser.parse(text).get(doc) || doc["weight_map"].get_object().get(wm)) {
    Add(ErrorCode::kCorrupt, path, {}, -1, "not JSON with a weight_map object");
    return;
  }
  uint64_t total_in_index = 0;
  if (doc["metadata"]["total_size"].get_uint64().get(total_in_index)) {
    Add(ErrorCode::kCorrupt, path, {}, -1, "metadata.total_size missing or not an integer");
  }
  std::set<std::string> seen;
  for (auto kv : wm) {
    std::string name(kv.key);
    std::string_view shard;
    if (kv.value.get_string().get(shard)) {
      Add(ErrorCode::kCorrupt, path, name, -1, "weight_map value is not a string");
      continue;
    }
    if (!seen.insert(name).second) {
      Add(ErrorCode::kCorrupt, path, name, -1, "tensor listed twice in the index");
      continue;
    }
    index_shard_of_[name] = std::string(shard);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      Add(ErrorCode::kNotFound, path, name, -1,
          "index maps it to " + std::string(shard) + " but no shard holds it");
    } else if (shard_names_[it->second.shard] != shard) {
      Add(ErrorCode::kCorrupt, path, name, -1,
          "index maps it to " + std::string(shard) + " but it is in " +
              shard_names_[it->second.shard]);
    }
  }
  uint64_t total = 0;
  for (const auto& [name, loc] : by_name_) {
    total += loc.info->nbytes();
    if (!seen.count(name)) {
      Add(ErrorCode::kCorrupt, Path(shard_names_[loc.shard]), name,
          static_cast<int64_t>(shards_[loc.shard]->AbsoluteOffset(*loc.info)),
          "tensor is not in the index");
    }
  }
  if (total_in_index != total) {
    Add(ErrorCode::kCorrupt, path, {}, -1,
        "metadata.total_size is " + std::to_string(total_in_index) + " but the shards hold " +
            std::to_string(total) + " tensor bytes");
  }
}

void Verifier::CheckModel() {
  ModelConfig config;
  try {
    config = ModelConfig::LoadOrThrow(opt_.dst);
  } catch (const Error& e) {
    Add(e.code(), e.path().empty() ? Path("config.json") : e.path(), e.object(), -1, e.detail());
    return;
  }
  auto where = [&](const Located& l) {
    return std::pair(Path(shard_names_[l.shard]),
                     static_cast<int64_t>(shards_[l.shard]->AbsoluteOffset(*l.info)));
  };
  auto find = [&](const std::string& full) -> std::optional<FoundTensor> {
    auto it = by_name_.find(full);
    if (it == by_name_.end()) return std::nullopt;
    auto [file, off] = where(it->second);
    return FoundTensor{file, off, it->second.info};
  };
  for (Problem& p : CheckModelTensors(config, TensorForm::kContainer, find, opt_.dst, prefix_,
                                      fingerprint_ ? &fingerprint_->bits : nullptr)) {
    Add(p.code, std::move(p.file), std::move(p.tensor), p.offset, std::move(p.detail));
  }
  // Every .qs belongs to a U8 tensor; experts are contiguous and id-ordered.
  for (const auto& [name, loc] : by_name_) {
    if (name.ends_with(".qs")) {
      auto base = by_name_.find(name.substr(0, name.size() - 3));
      if (base == by_name_.end() || base->second.info->dtype != DType::kU8 ||
          base->second.shard != loc.shard) {
        auto [file, off] = where(loc);
        Add(ErrorCode::kCorrupt, file, name, off,
            "scale sidecar without its U8 tensor in the same shard");
      }
    }
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (!shards_[s]) continue;
    std::optional<ExpertKey> prev;
    uint64_t prev_end = 0;
    bool in_experts = false;
    for (const auto& t : shards_[s]->tensors()) {
      auto key = ParseExpertName(t.name);
      if (!key) {
        if (in_experts) {
          Add(ErrorCode::kCorrupt, Path(shard_names_[s]), t.name,
              static_cast<int64_t>(shards_[s]->AbsoluteOffset(t)),
              "non-expert tensor after the experts (the container puts experts last)");
        }
        continue;
      }
      if (in_experts && (!(*prev < *key) || t.begin != prev_end)) {
        Add(ErrorCode::kCorrupt, Path(shard_names_[s]), t.name,
            static_cast<int64_t>(shards_[s]->AbsoluteOffset(t)),
            "expert tensors are not in (id, w1<w2<w3, packed<scale) order");
      }
      in_experts = true;
      prev = key;
      prev_end = t.end;
    }
  }
}

std::string Verifier::StreamShard(size_t s) {
  const SafetensorsFile& f = *shards_[s];
  const std::string path = f.path();
  const uint64_t block = opt_.block_bytes;
  Xxh128 h;
  // Both trees are read once, bypassing the page cache where the filesystem allows.
  DirectReader dst_reader(path, f.fd(), opt_.direct);
  std::map<std::string, std::unique_ptr<DirectReader>> src_readers;
  auto src_read = [&](const TensorRef& r, uint64_t off, size_t n) {
    auto& rd = src_readers[r.file->path()];
    if (!rd) rd = std::make_unique<DirectReader>(r.file->path(), r.file->fd(), opt_.direct);
    return rd->Read(off, n);
  };
  const std::byte* buf = nullptr;  // the block last read from the container file
  std::vector<std::byte> expect_q;
  std::vector<float> scratch;
  // Re-derived scales of quantized tensors, waiting for their .qs entry.
  std::unordered_map<std::string, std::vector<float>> pending_scales;
  auto read = [&](uint64_t off, size_t n) {
    buf = dst_reader.Read(off, n);
    h.Update(std::span(buf, n));
    std::lock_guard<std::mutex> lock(mu_);
    report_.bytes_hashed += n;
  };
  uint64_t src_read_bytes = 0, expert_cmp = 0;
  size_t rederived = 0, passthrough = 0;
  read(0, f.header().data_offset());
  for (const TensorInfo& t : f.tensors()) {
    const uint64_t at = f.AbsoluteOffset(t);
    std::optional<TensorRef> src;
    if (source_) src = source_->FindExact(t.name);
    const TensorInfo* qs = t.dtype == DType::kU8 ? f.Find(t.name + ".qs") : nullptr;
    const bool sidecar = t.name.ends_with(".qs") && pending_scales.count(t.name);
    // Quantized payload with a float source matrix: re-derive row block by row block.
    if (source_ && qs && src && IsFloatReadable(src->info->dtype) && src->info->shape.size() == 2) {
      const uint64_t rows = static_cast<uint64_t>(src->info->shape[0]);
      const uint64_t cols = static_cast<uint64_t>(src->info->shape[1]);
      QuantShape qshape;
      qshape.int4 = t.nbytes() == rows * cols / 2 && cols % 64 == 0 && cols != 0;
      if (t.nbytes() != rows * qshape.q_row_bytes(cols) ||
          qs->numel() != rows * qshape.scales_per_row(cols)) {
        Add(ErrorCode::kCorrupt, path, t.name, static_cast<int64_t>(at),
            "byte counts do not fit the source matrix " + ShapeString(src->info->shape));
        for (uint64_t off = 0; off < t.nbytes(); off += block)
          read(at + off, std::min(block, t.nbytes() - off));
        continue;
      }
      const uint64_t src_row = cols * DTypeSize(src->info->dtype);
      const uint64_t q_row = qshape.q_row_bytes(cols);
      const uint64_t rows_per = std::max<uint64_t>(1, block / std::max(src_row, q_row));
      std::vector<float> scales(rows * qshape.scales_per_row(cols));
      uint64_t bad = 0, first_bad = 0;
      for (uint64_t r = 0; r < rows; r += rows_per) {
        const uint64_t n = std::min(rows_per, rows - r);
        read(at + r * q_row, n * q_row);
        const std::byte* src_bytes = src_read(*src, src->offset + r * src_row, n * src_row);
        src_read_bytes += n * src_row;
        expect_q.resize(n * q_row);
        scratch.resize(QuantizeScratchFloats(cols, inner_threads_));
        QuantizeBlock(src->info->dtype, src_bytes, n, cols, qshape, expect_q.data(),
                      scales.data() + r * qshape.scales_per_row(cols), scratch.data(),
                      inner_threads_);
        if (std::memcmp(expect_q.data(), buf, n * q_row) != 0) {
          for (uint64_t k = 0; k < n * q_row; ++k) {
            if (expect_q[k] != buf[k]) {
              if (bad++ == 0) first_bad = at + r * q_row + k;
            }
          }
        }
      }
      if (bad) {
        Add(ErrorCode::kChecksumMismatch, path, t.name, static_cast<int64_t>(first_bad),
            std::to_string(bad) +
                " quantized byte(s) differ from the source re-quantized (§6.2); first shown");
      }
      pending_scales[t.name + ".qs"] = std::move(scales);
      ++rederived;
      continue;
    }
    if (sidecar) {
      std::vector<float> want = std::move(pending_scales[t.name]);
      pending_scales.erase(t.name);
      auto want_bytes = std::as_bytes(std::span(want));
      uint64_t bad = 0, first_bad = 0;
      for (uint64_t off = 0; off < t.nbytes(); off += block) {
        const size_t n = static_cast<size_t>(std::min(block, t.nbytes() - off));
        read(at + off, n);
        if (want_bytes.size() == t.nbytes() && std::memcmp(want_bytes.data() + off, buf, n) != 0) {
          for (size_t k = 0; k < n; ++k) {
            if (want_bytes[off + k] != buf[k] && bad++ == 0) first_bad = at + off + k;
          }
        }
      }
      if (bad) {
        Add(ErrorCode::kChecksumMismatch, path, t.name, static_cast<int64_t>(first_bad),
            std::to_string(bad) +
                " scale byte(s) differ from the source re-quantized; first shown");
      }
      continue;
    }
    // Everything else is copied: compare with the source bytes when there are any.
    const bool compare = source_ && !t.name.ends_with(".qs");
    if (compare && !src) {
      Add(ErrorCode::kNotFound, path, t.name, static_cast<int64_t>(at),
          "not in the source snapshot");
    }
    if (compare && src && src->info->nbytes() != t.nbytes()) {
      Add(ErrorCode::kCorrupt, path, t.name, static_cast<int64_t>(at),
          "size " + std::to_string(t.nbytes()) + " but the source tensor has " +
              std::to_string(src->info->nbytes()) + " bytes");
    }
    const bool cmp_bytes = compare && src && src->info->nbytes() == t.nbytes();
    const bool expert = ParseExpertName(t.name).has_value() ||
                        t.name.find(".block_sparse_moe.experts.") != std::string::npos;
    uint64_t bad = 0, first_bad = 0;
    for (uint64_t off = 0; off < t.nbytes(); off += block) {
      const size_t n = static_cast<size_t>(std::min(block, t.nbytes() - off));
      read(at + off, n);
      if (!cmp_bytes) continue;
      const std::byte* src_bytes = src_read(*src, src->offset + off, n);
      src_read_bytes += n;
      if (std::memcmp(src_bytes, buf, n) != 0) {
        for (size_t k = 0; k < n; ++k) {
          if (src_bytes[k] != buf[k] && bad++ == 0) first_bad = at + off + k;
        }
      }
    }
    if (cmp_bytes) {
      if (expert)
        expert_cmp += t.nbytes();
      else
        ++passthrough;
    }
    if (bad) {
      Add(ErrorCode::kChecksumMismatch, path, t.name, static_cast<int64_t>(first_bad),
          std::to_string(bad) + " byte(s) differ from the source (" + src->file->path() +
              "); first shown");
    }
  }
  for (const auto& [name, v] : pending_scales) {
    Add(ErrorCode::kNotFound, path, name, -1, "scale sidecar not found after its tensor");
  }
  std::lock_guard<std::mutex> lock(mu_);
  report_.source_bytes_read += src_read_bytes;
  report_.expert_bytes_compared += expert_cmp;
  report_.quantized_tensors_rederived += rederived;
  report_.passthrough_tensors_compared += passthrough;
  return h.HexDigest();
}

// With a source: the files k3-repack copies verbatim (config, tokenizer, ...)
// must equal the source's, byte for byte; a checksum only proves they are what
// was written, not what the snapshot holds.
void Verifier::CheckCopiedFiles() {
  constexpr uint64_t kMaxCopiedFileBytes = 512ull << 20;
  for (auto name : kMetadataFiles) {
    const std::string from = JoinPath(opt_.source, std::string(name)), to = Path(std::string(name));
    const bool in_src = PathExists(from), in_dst = PathExists(to);
    if (!in_src && !in_dst) continue;
    if (!in_dst) {
      Add(ErrorCode::kNotFound, to, {}, -1, "missing; the source has " + from);
      continue;
    }
    if (!in_src) {
      Add(ErrorCode::kCorrupt, to, {}, -1, "not in the source snapshot (" + opt_.source + ")");
      continue;
    }
    try {
      const std::string a = ReadFileOrThrow(from, kMaxCopiedFileBytes), b = ReadFileOrThrow(to, kMaxCopiedFileBytes);
      report_.source_bytes_read += a.size();
      if (a == b) continue;
      size_t k = 0;
      while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
      Add(ErrorCode::kChecksumMismatch, to, {}, static_cast<int64_t>(k),
          "differs from the source's " + from + " (" + std::to_string(b.size()) + " vs " + std::to_string(a.size()) +
              " bytes; first difference shown)");
    } catch (const Error& e) {
      Add(e.code(), e.path().empty() ? to : e.path(), {}, -1, e.detail());
    }
  }
}

void Verifier::CheckChecksums() {
  const std::string mpath = Path(std::string(kChecksumsName));
  ChecksumManifest manifest;
  bool have_manifest = PathExists(mpath);
  if (!have_manifest) {
    Add(ErrorCode::kNotFound, mpath, {}, -1, "checksum manifest missing");
  } else {
    try {
      manifest = ReadChecksumManifest(mpath);
    } catch (const Error& e) {
      Add(e.code(), mpath, e.object(), e.offset(), e.detail());
      have_manifest = false;
    }
  }
  // Files that must be listed.
  std::vector<std::string> files = shard_names_;
  for (auto n : {kIndexName, kFingerprintName}) files.emplace_back(n);
  for (auto n : kMetadataFiles) {
    if (PathExists(Path(std::string(n)))) files.emplace_back(n);
  }
  std::set<std::string> listed;
  for (const auto& [name, hex] : manifest) {
    listed.insert(name);
    // Whatever else the manifest lists is checked too.
    if (std::find(files.begin(), files.end(), name) == files.end()) files.push_back(name);
  }
  for (const auto& f : files) {
    if (have_manifest && !listed.count(f) && PathExists(Path(f))) {
      Add(ErrorCode::kNotFound, mpath, f, -1, "file is not in the checksum manifest");
    }
  }
  for (const auto& [name, hex] : manifest) {
    if (!PathExists(Path(name))) {
      Add(ErrorCode::kNotFound, Path(name), {}, -1,
          "listed in " + std::string(kChecksumsName) + " but missing");
    }
  }
  // Hash (and, with a source, compare) every file; shards in parallel.
  std::vector<std::string> to_hash;
  for (const auto& f : files) {
    if (PathExists(Path(f))) to_hash.push_back(f);
  }
  std::vector<std::string> digests(to_hash.size());
  std::map<std::string, size_t> shard_pos;
  for (size_t s = 0; s < shard_names_.size(); ++s) shard_pos[shard_names_[s]] = s;
  const int threads = opt_.threads > 0 ? opt_.threads : std::max(1, NumOnlineCpus());
  size_t files_done = 0;
  // Files stream in parallel; re-quantization inside each may use every core too
  // (one big dense shard would otherwise run on a single thread at the end).
  inner_threads_ = threads;
  omp_set_max_active_levels(2);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t k = 0; k < static_cast<int64_t>(to_hash.size()); ++k) {
    const std::string& name = to_hash[static_cast<size_t>(k)];
    try {
      auto sp = shard_pos.find(name);
      if (sp != shard_pos.end() && shards_[sp->second]) {
        digests[static_cast<size_t>(k)] = StreamShard(sp->second);
      } else {
        digests[static_cast<size_t>(k)] = HashFileXxh128(Path(name));
        std::lock_guard<std::mutex> lock(mu_);
        report_.bytes_hashed += FileSizeOrThrow(Path(name));
      }
    } catch (const Error& e) {
      Add(e.code(), e.path().empty() ? Path(name) : e.path(), e.object(), e.offset(), e.detail());
    }
    if (opt_.progress) {
      std::lock_guard<std::mutex> lock(mu_);
      opt_.progress(++files_done, to_hash.size(), report_.bytes_hashed);
    }
  }
  report_.files_hashed = to_hash.size();
  for (size_t k = 0; k < to_hash.size(); ++k) {
    auto it = manifest.find(to_hash[k]);
    if (it == manifest.end() || digests[k].empty()) continue;
    if (it->second != digests[k]) {
      Add(ErrorCode::kChecksumMismatch, Path(to_hash[k]), {}, -1,
          "XXH3-128 is " + digests[k] + " but " + std::string(kChecksumsName) + " says " +
              it->second);
    }
  }
}

// A missing or unreadable shard explains every tensor, index entry, size total
// and checksum that depends on it: those are counted, not listed, and the shard
// itself is reported first (so the exit code is its cause: 3 missing, 4 truncated).
void Verifier::FoldConsequences() {
  std::map<std::string, size_t> mapped;  // shard -> tensors the index maps to it
  for (const auto& [tensor, shard] : index_shard_of_) ++mapped[shard];
  std::set<std::string> present(shard_names_.begin(), shard_names_.end()), lost, broken;
  for (const auto& [shard, n] : mapped) {
    if (!present.count(shard)) lost.insert(shard);
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (!shards_[s]) broken.insert(shard_names_[s]);
  }
  if (lost.empty() && broken.empty()) return;
  auto gone = [&](const std::string& shard) { return lost.count(shard) > 0 || broken.count(shard) > 0; };
  auto in_gone_shard = [&](const std::string& tensor) {
    auto it = index_shard_of_.find(tensor);
    return it != index_shard_of_.end() && gone(it->second);
  };
  std::string incomplete;
  std::vector<Problem> roots, rest;
  for (Problem& p : report_.problems) {
    const std::string file = BaseName(p.file);
    if (p.detail.starts_with("container incomplete: ")) {
      incomplete = p.detail;
      ++report_.consequences_folded;
      continue;
    }
    const bool consequence =
        ((p.detail == "tensor the model needs is missing" || p.detail == "scale sidecar missing" ||
          p.detail.find("but no shard holds it") != std::string::npos) &&
         in_gone_shard(p.tensor)) ||
        p.detail.starts_with("metadata.total_size is ") ||
        (gone(file) && (p.detail.starts_with("XXH3-128 is ") || p.detail.starts_with("listed in ")));
    if (consequence) {
      ++report_.consequences_folded;
      continue;
    }
    if (broken.count(file) && p.tensor.empty() && !p.detail.starts_with("XXH3-128 is ")) {
      p.detail += "; the index maps " + std::to_string(mapped[file]) + " tensors to it";
      roots.push_back(std::move(p));
      continue;
    }
    rest.push_back(std::move(p));
  }
  for (const std::string& shard : lost) {
    roots.push_back({ErrorCode::kNotFound, Path(shard), {}, -1,
                     "shard missing" + (incomplete.empty() ? std::string() : " (" + incomplete + ")") +
                         "; the index maps " + std::to_string(mapped[shard]) + " tensors to it"});
  }
  if (roots.empty() && !incomplete.empty()) {
    roots.push_back({ErrorCode::kNotFound, opt_.dst, {}, -1, incomplete});
    --report_.consequences_folded;
  }
  report_.problems = std::move(roots);
  for (Problem& p : rest) report_.problems.push_back(std::move(p));
}

// A path as a POSIX shell word (single-quoted when it needs to be).
std::string ShellWord(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@") ==
                        std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A rerun converts what is missing, --recheck also what hashes wrong, and the
// shared files are rebuilt at the end; the fingerprint's bits make it a resume.
// Without a usable fingerprint only --force can rebuild the container.
std::string RepairCommand(const VerifyOptions& o, const std::optional<Fingerprint>& fp) {
  std::string cmd = "k3-repack " + (o.source.empty() ? std::string("SRC") : ShellWord(o.source)) + " " +
                    ShellWord(o.dst);
  if (!fp) return cmd + " --force";
  const QuantBits& b = fp->bits;
  cmd += " --recheck";
  if (b.bits != 8) cmd += " --bits " + std::to_string(b.bits);
  const int dflt = std::max(b.bits, 8);
  if (b.mla_bits != dflt) cmd += " --mla-bits " + std::to_string(b.mla_bits);
  if (b.head_bits != dflt) cmd += " --head-bits " + std::to_string(b.head_bits);
  return cmd;
}

VerifyReport Verifier::Run() {
  const double t0 = NowSeconds();
  if (!IsDirectory(opt_.dst)) throw Error(ErrorCode::kNotFound, "not a directory", opt_.dst);
  if (opt_.full) {
    if (opt_.source.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "--full needs --source SRC (the HF snapshot)");
    }
    source_.emplace(Snapshot::OpenOrThrow(opt_.source));
  }
  const std::string fp_path = Path(std::string(kFingerprintName));
  if (!PathExists(fp_path)) {
    Add(ErrorCode::kNotFound, fp_path, {}, -1, "fingerprint missing (not written by k3-repack?)");
  } else {
    try {
      fingerprint_ = Fingerprint::ParseOrThrow(ReadFileOrThrow(fp_path, 64u << 20), fp_path);
    } catch (const Error& e) {
      Add(e.code(), fp_path, {}, -1, e.detail());
    }
  }

  shard_names_ = ListShardFiles(opt_.dst);
  shards_.resize(shard_names_.size());
  report_.shards = shard_names_.size();
  if (shard_names_.empty())
    Add(ErrorCode::kNotFound, opt_.dst, {}, -1, "no model-*-of-*.safetensors shards");
  int64_t of_total = -1;
  for (size_t s = 0; s < shard_names_.size(); ++s) {
    auto sn = ParseShardName(shard_names_[s]);
    if (of_total < 0) of_total = sn->total;
    if (sn->total != of_total) {
      Add(ErrorCode::kCorrupt, Path(shard_names_[s]), {}, -1,
          "'-of-" + std::to_string(sn->total) + "' differs from the other shards' " +
              std::to_string(of_total));
    }
    try {
      shards_[s].emplace(SafetensorsFile::OpenOrThrow(Path(shard_names_[s])));
    } catch (const Error& e) {
      Add(e.code(), Path(shard_names_[s]), e.object(), e.offset(), e.detail());
      continue;
    }
    for (const auto& t : shards_[s]->tensors()) {
      ++report_.tensors;
      auto [it, inserted] = by_name_.emplace(t.name, Located{s, &t});
      if (!inserted) {
        Add(ErrorCode::kCorrupt, Path(shard_names_[s]), t.name,
            static_cast<int64_t>(shards_[s]->AbsoluteOffset(t)),
            "tensor also in " + shard_names_[it->second.shard]);
      }
    }
  }
  const int64_t want_shards = fingerprint_ ? fingerprint_->output_shards : of_total;
  if (want_shards > 0 && static_cast<int64_t>(shard_names_.size()) != want_shards) {
    Add(ErrorCode::kNotFound, opt_.dst, {}, -1,
        "container incomplete: " + std::to_string(shard_names_.size()) + " of " +
            std::to_string(want_shards) + " shards present");
  }
  prefix_ = ModelPrefix([&](const std::string& n) { return by_name_.count(n) > 0; });
  CheckIndex();
  CheckModel();
  if (source_) CheckCopiedFiles();
  CheckChecksums();
  std::stable_sort(report_.problems.begin(), report_.problems.end(),
                   [](const Problem& a, const Problem& b) {
                     return a.file != b.file ? a.file < b.file : a.offset < b.offset;
                   });
  FoldConsequences();
  if (!report_.ok()) report_.repair_command = RepairCommand(opt_, fingerprint_);
  report_.seconds = NowSeconds() - t0;
  return std::move(report_);
}

}  // namespace

VerifyReport VerifyContainer(const VerifyOptions& options) {
  Verifier v(options);
  return v.Run();
}

}  // namespace k3::repack
