#include "k3/container/safetensors.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include <simdjson.h>

#include "k3/core/direct_io.h"
#include "k3/core/error.h"
#include "k3/core/numeric.h"

namespace k3 {
namespace {
// Staging block of a direct writer.
constexpr size_t kDirectStageBytes = size_t{8} << 20;
}  // namespace
namespace {

constexpr size_t kMaxDims = 16;

[[noreturn]] void Corrupt(const std::string& path, int64_t offset, std::string object,
                          std::string detail, ErrorCode code = ErrorCode::kCorrupt) {
  throw Error(code, std::move(detail), path, offset, std::move(object));
}

uint64_t NumelOf(const std::vector<int64_t>& shape, bool* overflow) {
  uint64_t n = 1;
  *overflow = false;
  for (int64_t d : shape) {
    auto m = CheckedMul(n, static_cast<uint64_t>(d));
    if (!m) {
      *overflow = true;
      return 0;
    }
    n = *m;
  }
  return n;
}

}  // namespace

std::string ShapeString(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

uint64_t ShapeNumel(std::span<const int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t TensorInfo::numel() const {
  bool overflow;
  return NumelOf(shape, &overflow);
}

uint64_t PlannedTensor::nbytes() const {
  bool overflow;
  uint64_t n = NumelOf(shape, &overflow);
  K3_CHECK(!overflow);
  return n * DTypeSize(dtype);
}

SafetensorsHeader SafetensorsHeader::ParseOrThrow(std::string_view json, uint64_t data_bytes,
                                                  const std::string& path) {
  SafetensorsHeader h;
  h.header_bytes_ = json.size();
  h.data_bytes_ = data_bytes;
  const int64_t header_at = 8;
  const uint64_t data_at = 8 + json.size();

  simdjson::dom::parser parser;
  simdjson::padded_string padded(json.data(), json.size());
  simdjson::dom::element doc;
  if (auto err = parser.parse(padded).get(doc); err) {
    Corrupt(path, header_at, {}, std::string("header is not valid JSON: ") +
                                     simdjson::error_message(err));
  }
  simdjson::dom::object root;
  if (doc.get_object().get(root)) Corrupt(path, header_at, {}, "header JSON is not an object");

  // Names are checked for uniqueness as they are read, before offsets, so that a
  // repeated name is reported as such and not as the overlap it usually causes.
  std::unordered_set<std::string_view> seen;
  for (auto field : root) {
    std::string name(field.key);
    if (!seen.insert(field.key).second) {
      Corrupt(path, header_at, name, "duplicate tensor name");
    }
    if (name == "__metadata__") {
      simdjson::dom::object meta;
      if (field.value.get_object().get(meta)) {
        Corrupt(path, header_at, name, "__metadata__ must be an object of strings");
      }
      for (auto m : meta) {
        std::string_view v;
        if (m.value.get_string().get(v)) {
          Corrupt(path, header_at, name,
                  "__metadata__ value for '" + std::string(m.key) + "' is not a string");
        }
        h.metadata_.emplace_back(std::string(m.key), std::string(v));
      }
      continue;
    }
    simdjson::dom::object t;
    if (field.value.get_object().get(t)) Corrupt(path, header_at, name, "entry is not an object");

    TensorInfo info;
    info.name = name;
    std::string_view dtype_name;
    if (t["dtype"].get_string().get(dtype_name)) {
      Corrupt(path, header_at, name, "missing or non-string dtype");
    }
    auto dtype = ParseDType(dtype_name);
    if (!dtype) {
      Corrupt(path, header_at, name, "unknown dtype '" + std::string(dtype_name) + "'",
              ErrorCode::kUnsupported);
    }
    info.dtype = *dtype;

    simdjson::dom::array shape;
    if (t["shape"].get_array().get(shape)) Corrupt(path, header_at, name, "missing shape array");
    for (auto d : shape) {
      int64_t v;
      if (d.get_int64().get(v) || v < 0) {
        Corrupt(path, header_at, name, "shape entries must be non-negative integers");
      }
      if (info.shape.size() == kMaxDims) {
        Corrupt(path, header_at, name, "more than 16 dimensions");
      }
      info.shape.push_back(v);
    }

    simdjson::dom::array offsets;
    if (t["data_offsets"].get_array().get(offsets) || offsets.size() != 2) {
      Corrupt(path, header_at, name, "data_offsets must be an array of two integers");
    }
    uint64_t b, e;
    if (offsets.at(0).get_uint64().get(b) || offsets.at(1).get_uint64().get(e)) {
      Corrupt(path, header_at, name, "data_offsets must be non-negative integers");
    }
    if (b > e) {
      Corrupt(path, static_cast<int64_t>(data_at + b), name,
              "data_offsets begin " + std::to_string(b) + " > end " + std::to_string(e));
    }
    if (e > data_bytes) {
      Corrupt(path, static_cast<int64_t>(data_at + b), name,
              "data ends at " + std::to_string(e) + " but the data section holds only " +
                  std::to_string(data_bytes) + " bytes",
              ErrorCode::kTruncated);
    }
    info.begin = b;
    info.end = e;

    bool overflow;
    uint64_t numel = NumelOf(info.shape, &overflow);
    auto want = overflow ? std::nullopt : CheckedMul(numel, DTypeSize(info.dtype));
    if (!want) Corrupt(path, header_at, name, "shape element count overflows");
    if (*want != e - b) {
      Corrupt(path, static_cast<int64_t>(data_at + b), name,
              "shape x dtype size is " + std::to_string(*want) + " bytes but data_offsets span " +
                  std::to_string(e - b));
    }
    h.tensors_.push_back(std::move(info));
  }

  std::sort(h.tensors_.begin(), h.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  for (const auto& t : h.tensors_) {
    if (t.begin < expect) {
      Corrupt(path, static_cast<int64_t>(data_at + t.begin), t.name,
              "overlaps the previous tensor (which ends at data offset " + std::to_string(expect) +
                  ")");
    }
    if (t.begin > expect) {
      Corrupt(path, static_cast<int64_t>(data_at + expect), t.name,
              "hole of " + std::to_string(t.begin - expect) + " bytes before this tensor");
    }
    expect = t.end;
  }
  if (expect != data_bytes) {
    Corrupt(path, static_cast<int64_t>(data_at + expect), {},
            std::to_string(data_bytes - expect) + " bytes of trailing data after the last tensor");
  }

  h.IndexNames();
  return h;
}

void SafetensorsHeader::IndexNames() {
  by_name_.clear();
  by_name_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    K3_CHECK(by_name_.emplace(tensors_[i].name, i).second);  // unique by construction
  }
}

SafetensorsHeader::SafetensorsHeader(const SafetensorsHeader& o)
    : tensors_(o.tensors_),
      metadata_(o.metadata_),
      header_bytes_(o.header_bytes_),
      data_bytes_(o.data_bytes_) {
  IndexNames();
}

SafetensorsHeader& SafetensorsHeader::operator=(const SafetensorsHeader& o) {
  if (this != &o) {
    tensors_ = o.tensors_;
    metadata_ = o.metadata_;
    header_bytes_ = o.header_bytes_;
    data_bytes_ = o.data_bytes_;
    IndexNames();
  }
  return *this;
}

const TensorInfo* SafetensorsHeader::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

SafetensorsFile SafetensorsFile::OpenOrThrow(const std::string& path) {
  return FromFdOrThrow(k3::OpenOrThrow(path, O_RDONLY), path);
}

SafetensorsFile SafetensorsFile::FromFdOrThrow(UniqueFd fd, const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.fd_ = std::move(fd);
  f.file_size_ = FileSizeOrThrow(f.fd_.get(), path);
  if (f.file_size_ < 8) {
    Corrupt(path, 0, {}, "file is " + std::to_string(f.file_size_) +
                             " bytes, too short for the 8-byte header length",
            ErrorCode::kTruncated);
  }
  uint8_t len_bytes[8];
  PreadFull(f.fd_.get(), std::as_writable_bytes(std::span(len_bytes)), 0, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeaderBytes) {
    Corrupt(path, 0, {}, "header length " + std::to_string(n) + " exceeds the " +
                             std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  if (n > f.file_size_ - 8) {
    Corrupt(path, 0, {}, "header length " + std::to_string(n) + " runs past the end of the " +
                             std::to_string(f.file_size_) + "-byte file",
            ErrorCode::kTruncated);
  }
  std::string json(n, '\0');
  PreadFull(f.fd_.get(), std::as_writable_bytes(std::span(json.data(), json.size())), 8, path);
  f.header_ = SafetensorsHeader::ParseOrThrow(json, f.file_size_ - 8 - n, path);
  return f;
}

void SafetensorsFile::ReadOrThrow(const TensorInfo& t, std::span<std::byte> out) const {
  K3_CHECK(out.size() == t.nbytes());
  try {
    PreadFull(fd_.get(), out, AbsoluteOffset(t), path_);
  } catch (const Error& e) {
    throw e.WithObject(t.name);
  }
}

void ConvertToF32(DType dtype, std::span<const std::byte> src, std::span<float> dst) {
  const size_t n = dst.size();
  switch (dtype) {
    case DType::kF32:
      K3_CHECK(src.size() == n * 4);
      std::memcpy(dst.data(), src.data(), n * 4);
      return;
    case DType::kBF16:
      K3_CHECK(src.size() == n * 2);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src.data() + 2 * i, 2);
        dst[i] = Bf16ToF32(h);
      }
      return;
    case DType::kF16:
      K3_CHECK(src.size() == n * 2);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src.data() + 2 * i, 2);
        dst[i] = F16ToF32(h);
      }
      return;
    default:
      K3_CHECK(false && "ConvertToF32 on a non-float dtype");
  }
}

std::vector<float> SafetensorsFile::ReadF32OrThrow(const TensorInfo& t) const {
  if (!IsFloatReadable(t.dtype)) {
    throw Error(ErrorCode::kUnsupported,
                "dtype " + std::string(DTypeName(t.dtype)) + " cannot be read as float", path_,
                static_cast<int64_t>(AbsoluteOffset(t)), t.name);
  }
  std::vector<std::byte> raw(t.nbytes());
  ReadOrThrow(t, raw);
  std::vector<float> out(t.numel());
  ConvertToF32(t.dtype, raw, out);
  return out;
}

std::string BuildSafetensorsHeader(
    const std::vector<PlannedTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string out = "{";
  bool first = true;
  auto append_string = [&](std::string_view s) {
    out += '"';
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  };
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      if (i) out += ',';
      append_string(metadata[i].first);
      out += ':';
      append_string(metadata[i].second);
    }
    out += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (!first) out += ',';
    first = false;
    append_string(t.name);
    out += ":{\"dtype\":\"";
    out += DTypeName(t.dtype);
    out += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(t.shape[i]);
    }
    uint64_t end = offset + t.nbytes();
    out += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  out += '}';
  while ((8 + out.size()) % 8 != 0) out += ' ';
  return out;
}

SafetensorsWriter::SafetensorsWriter(
    std::string path, std::vector<PlannedTensor> plan,
    const std::vector<std::pair<std::string, std::string>>& metadata, bool direct)
    : plan_(std::move(plan)), file_(std::move(path)) {
  if (direct) direct_ = std::make_unique<DirectWriter>(file_.temp_path(), file_.fd(), kDirectStageBytes, true);
  for (const auto& t : plan_) data_bytes_planned_ += t.nbytes();
  std::string header = BuildSafetensorsHeader(plan_, metadata);
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  Put(std::as_bytes(std::span(len)));
  Put(std::as_bytes(std::span(header.data(), header.size())));
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::Put(std::span<const std::byte> bytes) {
  if (direct_) {
    direct_->Append(bytes.data(), bytes.size());
  } else {
    file_.Write(bytes);
  }
}

void SafetensorsWriter::Abort() noexcept {
  direct_.reset();  // stops its I/O threads before the temp file goes
  file_.Abort();
}

void SafetensorsWriter::Write(std::span<const std::byte> bytes) {
  if (data_bytes_written_ + bytes.size() > data_bytes_planned_) {
    throw Error(ErrorCode::kInternal,
                "more data than planned (" + std::to_string(data_bytes_planned_) + " bytes)",
                file_.temp_path(), static_cast<int64_t>(data_bytes_written_));
  }
  Put(bytes);
  data_bytes_written_ += bytes.size();
}

void SafetensorsWriter::Commit() {
  if (data_bytes_written_ != data_bytes_planned_) {
    throw Error(ErrorCode::kInternal,
                "wrote " + std::to_string(data_bytes_written_) + " data bytes, planned " +
                    std::to_string(data_bytes_planned_),
                file_.temp_path());
  }
  if (direct_) direct_->Finish();
  file_.Commit();
}

}  // namespace k3
