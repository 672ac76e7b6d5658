// Checkpoint files: a safetensors file (lib/container's header, published
// atomically) whose data is written with O_DIRECT where the filesystem allows it
// (a parked checkpoint is written once: through the page cache every byte would
// be copied into freshly allocated cache pages, 3-4x slower on VMs) and read
// back with buffered reads dropped from the cache behind them, plus the checks
// that make it ours (docs/checkpoints.md, version 1).
#include <fcntl.h>
#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "k3/container/safetensors.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/engine/checkpoint_cache.h"

namespace k3::engine {
namespace {

using model::SessionCheckpoint;
using model::StateFingerprint;
using model::StateLayout;

constexpr const char* kFormat = "k3-checkpoint";
constexpr const char* kVersion = "1";
// Bytes per read of a load (each hashed while it is in cache).
constexpr size_t kIoBlock = size_t{8} << 20;
// A checkpoint longer than this many tokens is not one we wrote (the real
// model's context is 1,048,576; the cap only bounds what a header can make us
// allocate before the checksum is known).
constexpr int64_t kMaxPositions = int64_t{1} << 24;

std::string KdaName(int64_t k, const char* part) {
  return "kda." + std::to_string(k) + "." + part;
}
std::string MlaName(int64_t m) { return "mla." + std::to_string(m) + ".rows"; }

// The tensors of a checkpoint at `position`, in file order.
std::vector<PlannedTensor> Plan(const StateLayout& l, int64_t position) {
  std::vector<PlannedTensor> plan;
  plan.push_back({"ids", DType::kI32, {position}});
  for (int64_t k = 0; k < l.kda_layers; ++k) {
    plan.push_back({KdaName(k, "state"), DType::kF32, {l.kda_heads, l.kda_head_dim, l.kda_head_dim}});
    for (const char* c : {"conv_q", "conv_k", "conv_v"}) {
      plan.push_back({KdaName(k, c), DType::kF32, {l.kda_proj, l.conv_kernel}});
    }
  }
  for (int64_t m = 0; m < l.mla_layers; ++m) {
    plan.push_back({MlaName(m), DType::kF32, {position, l.kv_lora + l.qk_rope}});
  }
  return plan;
}

// Visits the data section's bytes in file order.
template <class Fn>
void ForEachDataPiece(const SessionCheckpoint& ck, Fn&& fn) {
  fn(ck.ids.data(), ck.ids.size() * sizeof(int32_t));
  fn(ck.kda.data(), ck.kda.size() * sizeof(float));
  const uint64_t rf = ck.layout.mla_row_floats();
  for (int64_t m = 0; m < ck.layout.mla_layers; ++m) {
    for (const auto& seg : ck.mla) {
      const uint64_t n = static_cast<uint64_t>(seg->end - seg->begin);
      fn(seg->rows.data() + static_cast<uint64_t>(m) * n * rf, n * rf * sizeof(float));
    }
  }
}

std::string Hex128(XXH128_hash_t h) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 "%016" PRIx64, static_cast<uint64_t>(h.high64),
                static_cast<uint64_t>(h.low64));
  return buf;
}

CheckpointFileResult Refuse(CheckpointFileStatus s, std::string detail) {
  CheckpointFileResult r;
  r.status = s;
  r.detail = std::move(detail);
  return r;
}

const std::string* Meta(const SafetensorsHeader& h, const char* key) {
  for (const auto& [k, v] : h.metadata()) {
    if (k == key) return &v;
  }
  return nullptr;
}

}  // namespace

const char* CheckpointFileStatusName(CheckpointFileStatus s) {
  switch (s) {
    case CheckpointFileStatus::kOk: return "ok";
    case CheckpointFileStatus::kNotFound: return "not-found";
    case CheckpointFileStatus::kTruncated: return "truncated";
    case CheckpointFileStatus::kCorrupt: return "corrupt";
    case CheckpointFileStatus::kChecksumMismatch: return "checksum-mismatch";
    case CheckpointFileStatus::kForeignModel: return "foreign-model";
    case CheckpointFileStatus::kForeignOptions: return "foreign-options";
    case CheckpointFileStatus::kIo: return "io-error";
  }
  return "unknown";
}

void WriteCheckpointFileOrThrow(const std::string& path, const SessionCheckpoint& ck, bool direct) {
  K3_CHECK(ck.ids.size() == static_cast<size_t>(ck.position));
  XXH3_state_t* st = XXH3_createState();
  K3_CHECK(st != nullptr);
  XXH3_128bits_reset(st);
  ForEachDataPiece(ck, [&](const void* p, size_t n) {
    if (n) XXH3_128bits_update(st, p, n);
  });
  const std::string sum = Hex128(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  std::vector<std::pair<std::string, std::string>> meta = {
      {"format", kFormat},
      {"version", kVersion},
      {"model", ck.fingerprint.model},
      {"options", ck.fingerprint.options},
      {"position", std::to_string(ck.position)},
      {"data_xxh3_128", sum},
  };
  SafetensorsWriter w(path, Plan(ck.layout, ck.position), meta, direct);
  ForEachDataPiece(ck, [&](const void* p, size_t n) {
    w.Write(std::span(static_cast<const std::byte*>(p), n));
    // kill -9 tests: the N-th piece leaves a temp file that far written.
    CrashPoint("ckpt-piece-written");
  });
  CrashPoint("ckpt-before-commit");
  w.Commit();
}

CheckpointFileResult ReadCheckpointFile(const std::string& path, const StateFingerprint& fp,
                                        const StateLayout& layout, bool header_only, bool direct) {
  std::optional<SafetensorsFile> file;
  try {
    // Only a regular file, opened without following a link and without
    // blocking: a FIFO planted under a parked file's name would otherwise hold
    // the request in open() until someone writes to it.
    file.emplace(SafetensorsFile::FromFdOrThrow(OpenRegularFileOrThrow(path), path));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kTruncated) return Refuse(CheckpointFileStatus::kTruncated, e.what());
    if (e.code() == ErrorCode::kIo) return Refuse(CheckpointFileStatus::kIo, e.what());
    if (e.code() == ErrorCode::kNotFound)
      return Refuse(CheckpointFileStatus::kNotFound, "no such file");
    return Refuse(CheckpointFileStatus::kCorrupt, e.what());
  }
  const SafetensorsHeader& h = file->header();
  const std::string* format = Meta(h, "format");
  const std::string* version = Meta(h, "version");
  if (format == nullptr || *format != kFormat) {
    return Refuse(CheckpointFileStatus::kCorrupt, "not a k3 checkpoint (metadata format)");
  }
  if (version == nullptr || *version != kVersion) {
    CheckpointFileResult r =
        Refuse(CheckpointFileStatus::kCorrupt, "checkpoint format version " +
                                                   (version ? *version : std::string("(none)")) +
                                                   ", this build reads " + kVersion);
    r.foreign = version != nullptr;  // another build's file, well-formed as far as we can tell
    return r;
  }
  const std::string* model = Meta(h, "model");
  const std::string* options = Meta(h, "options");
  const std::string* position_text = Meta(h, "position");
  const std::string* sum = Meta(h, "data_xxh3_128");
  if (!model || !options || !position_text || !sum) {
    return Refuse(CheckpointFileStatus::kCorrupt, "metadata lacks model/options/position/checksum");
  }
  if (*model != fp.model) {
    CheckpointFileResult r = Refuse(CheckpointFileStatus::kForeignModel,
                                    "made by model " + *model + ", this model is " + fp.model);
    r.foreign = true;
    return r;
  }
  if (*options != fp.options) {
    CheckpointFileResult r =
        Refuse(CheckpointFileStatus::kForeignOptions,
               "made with '" + *options + "', this process runs '" + fp.options + "'");
    r.foreign = true;
    return r;
  }
  int64_t position = -1;
  {
    const char* b = position_text->c_str();
    char* e = nullptr;
    errno = 0;
    const long long v = std::strtoll(b, &e, 10);
    if (errno == 0 && e != b && *e == '\0' && v > 0 && v <= kMaxPositions) position = v;
  }
  if (position < 0) {
    return Refuse(CheckpointFileStatus::kCorrupt, "bad position '" + *position_text + "'");
  }
  // The tensor table must be exactly the plan, in order (the reader already
  // proved the offsets contiguous and dtype x shape == bytes).
  const std::vector<PlannedTensor> plan = Plan(layout, position);
  const auto& ts = h.tensors();
  if (ts.size() != plan.size()) {
    return Refuse(CheckpointFileStatus::kCorrupt,
                  std::to_string(ts.size()) + " tensors, a checkpoint of this model has " +
                      std::to_string(plan.size()));
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    if (ts[i].name != plan[i].name || ts[i].dtype != plan[i].dtype ||
        ts[i].shape != plan[i].shape) {
      return Refuse(CheckpointFileStatus::kCorrupt,
                    "tensor " + std::to_string(i) + " is '" + ts[i].name + "' " +
                        std::string(DTypeName(ts[i].dtype)) + ShapeString(ts[i].shape) +
                        ", expected '" + plan[i].name + "' " +
                        std::string(DTypeName(plan[i].dtype)) + ShapeString(plan[i].shape));
    }
  }
  CheckpointFileResult r;
  r.file_bytes = file->file_size();
  try {
    r.ids.resize(static_cast<size_t>(position));
    file->ReadOrThrow(ts[0], std::as_writable_bytes(std::span(r.ids)));
    if (header_only) return r;
    auto ck = std::make_shared<SessionCheckpoint>();
    ck->fingerprint = fp;
    ck->layout = layout;
    ck->position = position;
    ck->ids = r.ids;
    ck->kda.resize(layout.kda_layer_floats() * static_cast<uint64_t>(layout.kda_layers));
    auto seg = std::make_shared<model::MlaSegment>();
    seg->begin = 0;
    seg->end = position;
    seg->ids = r.ids;
    seg->rows.resize(static_cast<uint64_t>(position) * layout.mla_row_floats() *
                     static_cast<uint64_t>(layout.mla_layers));
    // The data section in file order: the ids (read above), then the KDA
    // tensors (contiguous from tensor 1), then the MLA ones, read block by block
    // straight into the checkpoint's memory and hashed while the block is in
    // cache. Buffered reads, not O_DIRECT: readahead keeps several requests in
    // flight where one direct stream keeps one (the rates are in
    // docs/checkpoints.md, "Measured"); with `direct` each block is dropped from
    // the page cache once read, so a load leaves the cache as it found it.
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
    XXH3_state_t* st = state.get();
    K3_CHECK(st != nullptr);
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, r.ids.data(), r.ids.size() * sizeof(int32_t));
    const int fd = file->fd();
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint64_t off = h.data_offset() + ts[0].end;
    for (std::span<std::byte> dst : {std::as_writable_bytes(std::span(ck->kda)),
                                     std::as_writable_bytes(std::span(seg->rows))}) {
      for (size_t done = 0; done < dst.size();) {
        const size_t n = std::min(kIoBlock, dst.size() - done);
        PreadFull(fd, dst.subspan(done, n), off, path);
        XXH3_128bits_update(st, dst.data() + done, n);
        if (direct) ::posix_fadvise(fd, static_cast<off_t>(off), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
        done += n;
        off += n;
      }
    }
    if (direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // and what readahead fetched past the end
    ck->mla.push_back(std::move(seg));
    const std::string got = Hex128(XXH3_128bits_digest(st));
    if (got != *sum) {
      return Refuse(CheckpointFileStatus::kChecksumMismatch,
                    "data XXH3-128 " + got + ", recorded " + *sum);
    }
    r.checkpoint = std::move(ck);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kTruncated) return Refuse(CheckpointFileStatus::kTruncated, e.what());
    return Refuse(CheckpointFileStatus::kIo, e.what());
  }
  return r;
}

}  // namespace k3::engine
