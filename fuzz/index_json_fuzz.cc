// libFuzzer target: model.safetensors.index.json, read when a snapshot or
// container is opened. The input is written as the index of a directory with a
// valid config.json and one small valid shard; any k3::Error is a correct
// refusal; an accepted index must name exactly the shard's tensors.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "k3/container/safetensors.h"
#include "k3/container/snapshot.h"
#include "k3/core/error.h"
#include "k3/core/file.h"

namespace {

const std::string& Dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/k3_index_fuzz.XXXXXX";
    std::string d = ::mkdtemp(tmpl);
    k3::WriteFileAtomic(d + "/config.json", "{}");
    k3::SafetensorsWriter w(d + "/model-00001-of-00001.safetensors",
                            {{"a.weight", k3::DType::kF32, {2}}, {"b.weight", k3::DType::kU8, {4}}}, {});
    const std::byte zeros[12] = {};
    w.Write(std::span(zeros, 12));
    w.Commit();
    return d;
  }();
  // Removed at exit; registered after `dir` is built, so before its destructor runs.
  static const bool remove_at_exit = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
    return true;
  }();
  (void)remove_at_exit;
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = Dir() + "/model.safetensors.index.json";
  {
    k3::UniqueFd fd = k3::OpenOrThrow(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    k3::WriteFull(fd.get(), std::as_bytes(std::span(reinterpret_cast<const char*>(data), size)), path);
  }
  try {
    k3::Snapshot s = k3::Snapshot::OpenOrThrow(Dir());
    K3_CHECK(s.num_tensors() == 2);
    K3_CHECK(s.FindExact("a.weight").has_value() && s.FindExact("b.weight").has_value());
  } catch (const k3::Error& e) {
    K3_CHECK(e.code() != k3::ErrorCode::kOk && e.code() != k3::ErrorCode::kInternal);
  }
  return 0;
}
