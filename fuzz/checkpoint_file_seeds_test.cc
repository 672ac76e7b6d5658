// The checkpoint file harness (checkpoint_file_fuzz.cc) on files made by the
// real writer: valid ones are accepted whole, each kind of damage is refused
// with its own status, so the harness can tell the reader's refusals from its
// acceptances. The files are also written to
// ${build}/test-output/ckpt_fuzz_seeds/ (the seed corpus is a copy of them).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_file_fuzz.h"
#include "k3/core/file.h"

using namespace k3;
using engine::CheckpointFileStatus;

namespace {

model::SessionCheckpoint Make(int64_t position, const model::StateFingerprint& fp) {
  const model::StateLayout& l = fuzz::CheckpointFuzzLayout();
  model::SessionCheckpoint ck;
  ck.fingerprint = fp;
  ck.layout = l;
  ck.position = position;
  for (int64_t i = 0; i < position; ++i) ck.ids.push_back(static_cast<int32_t>(7 * i + 1));
  ck.kda.resize(l.kda_layer_floats() * static_cast<uint64_t>(l.kda_layers));
  for (size_t i = 0; i < ck.kda.size(); ++i) ck.kda[i] = 0.25f * static_cast<float>(i) - 1.0f;
  auto seg = std::make_shared<model::MlaSegment>();
  seg->end = position;
  seg->ids = ck.ids;
  seg->rows.resize(static_cast<uint64_t>(position) * l.mla_row_floats() * static_cast<uint64_t>(l.mla_layers));
  for (size_t i = 0; i < seg->rows.size(); ++i) seg->rows[i] = 0.5f * static_cast<float>(i);
  ck.mla.push_back(std::move(seg));
  return ck;
}

CheckpointFileStatus Replay(const std::string& bytes) {
  return fuzz::ReadCheckpointBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

TEST_CASE("checkpoint file harness: written files accepted, each damage refused with its status") {
  const std::filesystem::path dir = std::filesystem::path(K3_BINARY_DIR) / "test-output" / "ckpt_fuzz_seeds";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const model::SessionCheckpoint& ck) {
    const std::string path = (dir / name).string();
    engine::WriteCheckpointFileOrThrow(path, ck);
    return ReadFileOrThrow(path, 1 << 20);
  };
  auto keep = [&](const std::string& name, const std::string& bytes) {
    WriteFileAtomic((dir / name).string(), bytes);
  };
  for (int64_t position : {1, 3, 17}) {
    INFO("position " << position);
    const std::string ok =
        write("valid-" + std::to_string(position), Make(position, fuzz::CheckpointFuzzFingerprint()));
    CHECK(Replay(ok) == CheckpointFileStatus::kOk);
    std::string flipped = ok;
    flipped[flipped.size() - 3] ^= 0x40;  // a byte of the last MLA row
    keep("data-byte-" + std::to_string(position), flipped);
    CHECK(Replay(flipped) == CheckpointFileStatus::kChecksumMismatch);
    const std::string cut = ok.substr(0, ok.size() - 1);
    keep("cut-" + std::to_string(position), cut);
    CHECK(Replay(cut) == CheckpointFileStatus::kTruncated);
  }
  model::StateFingerprint other = fuzz::CheckpointFuzzFingerprint();
  other.model[0] = 'f';
  CHECK(Replay(write("foreign-model", Make(2, other))) == CheckpointFileStatus::kForeignModel);
  other = fuzz::CheckpointFuzzFingerprint();
  other.options = "idot=1 chunk=8 topp=1 isa=scalar";
  CHECK(Replay(write("foreign-options", Make(2, other))) == CheckpointFileStatus::kForeignOptions);
  // Another layout under the right fingerprint: the tensor table differs.
  model::SessionCheckpoint wide = Make(2, fuzz::CheckpointFuzzFingerprint());
  wide.layout.kda_layers = 3;
  wide.kda.resize(wide.layout.kda_layer_floats() * 3);
  CHECK(Replay(write("other-layout", wide)) == CheckpointFileStatus::kCorrupt);
  CHECK(Replay(std::string()) == CheckpointFileStatus::kTruncated);
  CHECK(Replay(std::string(64, '\xff')) != CheckpointFileStatus::kOk);
}
