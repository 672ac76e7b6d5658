// Safetensors files: a reader that trusts nothing and a streaming, atomic writer.
// Format (docs/formats.md): u64 LE header length N, N bytes of JSON, then the data
// section; every tensor's [begin, end) is relative to the data section.
//
// Reader rules: N <= kMaxHeaderBytes and within the file; JSON object whose keys are
// tensors ({dtype, shape, data_offsets}) plus an optional "__metadata__" of
// string->string; dtype known; shape product x dtype size == end - begin, overflow
// checked; names unique; offsets contiguous from 0 with no holes or overlaps, ending
// exactly at the end of the file. Every violation throws k3::Error naming the file,
// the byte offset and the tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "k3/container/dtype.h"
#include "k3/core/file.h"

namespace k3 {
class DirectWriter;
}

namespace k3 {

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// A shape as reports and error messages print it: "[a,b,c]" ("[]" for a scalar).
std::string ShapeString(std::span<const int64_t> shape);

// Product of the dims, wrapping on overflow: for shapes already validated.
uint64_t ShapeNumel(std::span<const int64_t> shape);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // relative to the data section
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
  uint64_t numel() const;
};

// A validated header. Tensors are kept in data-offset order.
class SafetensorsHeader {
 public:
  // Parses `json` (the N header bytes) for a data section of `data_bytes` bytes.
  // `path` is only used in error messages; byte offsets in errors are absolute.
  static SafetensorsHeader ParseOrThrow(std::string_view json, uint64_t data_bytes,
                                        const std::string& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }
  uint64_t header_bytes() const { return header_bytes_; }
  uint64_t data_offset() const { return 8 + header_bytes_; }
  uint64_t data_bytes() const { return data_bytes_; }
  // nullptr if absent.
  const TensorInfo* Find(std::string_view name) const;

  SafetensorsHeader() = default;
  // by_name_ views the names in tensors_, so copies rebuild it; moves keep the buffer.
  SafetensorsHeader(const SafetensorsHeader& o);
  SafetensorsHeader& operator=(const SafetensorsHeader& o);
  SafetensorsHeader(SafetensorsHeader&&) noexcept = default;
  SafetensorsHeader& operator=(SafetensorsHeader&&) noexcept = default;

 private:
  void IndexNames();
  std::vector<TensorInfo> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::unordered_map<std::string_view, size_t> by_name_;
  uint64_t header_bytes_ = 0;
  uint64_t data_bytes_ = 0;
};

// An open, validated safetensors file. Owns the fd; reads are thread-safe (pread).
class SafetensorsFile {
 public:
  static SafetensorsFile OpenOrThrow(const std::string& path);
  // The same checks on a descriptor the caller opened for reading (e.g. with
  // OpenRegularFileOrThrow, for files that may have been replaced by a FIFO or
  // a link); the file owns it from here. `path` names it in errors.
  static SafetensorsFile FromFdOrThrow(UniqueFd fd, const std::string& path);
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }
  uint64_t file_size() const { return file_size_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors(); }
  const TensorInfo* Find(std::string_view name) const { return header_.Find(name); }
  uint64_t AbsoluteOffset(const TensorInfo& t) const { return header_.data_offset() + t.begin; }

  // Reads the tensor's bytes (out.size() must equal t.nbytes()).
  void ReadOrThrow(const TensorInfo& t, std::span<std::byte> out) const;
  // Reads the tensor and converts BF16/F16/F32 to f32 (kUnsupported otherwise).
  std::vector<float> ReadF32OrThrow(const TensorInfo& t) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  UniqueFd fd_;
  uint64_t file_size_ = 0;
  SafetensorsHeader header_;
};

// Converts raw BF16/F16/F32 bytes to f32.
void ConvertToF32(DType dtype, std::span<const std::byte> src, std::span<float> dst);

// One tensor of a file to be written.
struct PlannedTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

// The compact JSON header for `tensors` laid out back to back in the given order,
// padded with spaces so that 8 + size is a multiple of 8.
std::string BuildSafetensorsHeader(
    const std::vector<PlannedTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata = {});

// Streams a safetensors file: the header is computed from the plan up front, the
// data is then written in plan order, and Commit() checks that exactly the planned
// number of bytes arrived before publishing atomically (tmp -> fsync -> rename ->
// fsync dir). Destroying an uncommitted writer removes the temp file. `direct`:
// the bytes go through a DirectWriter (O_DIRECT where the filesystem allows it,
// for a file written once and not read soon); the file is the same either way.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<PlannedTensor> plan,
                    const std::vector<std::pair<std::string, std::string>>& metadata = {},
                    bool direct = false);
  ~SafetensorsWriter();

  void Write(std::span<const std::byte> bytes);
  uint64_t data_bytes_planned() const { return data_bytes_planned_; }
  uint64_t data_bytes_written() const { return data_bytes_written_; }
  const std::vector<PlannedTensor>& plan() const { return plan_; }
  const std::string& temp_path() const { return file_.temp_path(); }
  void Commit();
  void Abort() noexcept;

 private:
  void Put(std::span<const std::byte> bytes);
  std::vector<PlannedTensor> plan_;
  AtomicFileWriter file_;
  std::unique_ptr<DirectWriter> direct_;  // null: buffered writes through file_
  uint64_t data_bytes_planned_ = 0;
  uint64_t data_bytes_written_ = 0;
};

}  // namespace k3
