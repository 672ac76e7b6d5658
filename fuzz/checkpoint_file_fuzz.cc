// libFuzzer target for the checkpoint file reader (lib/engine checkpoint_file.cc,
// docs/checkpoints.md): a parked checkpoint is read back from a directory that
// other processes (or a full disk, or a crash) may have written into. Input: the
// whole file. It is read twice, header-only (the start-up scan) and whole (a
// restore), against one small fixed layout and fingerprint. Every outcome must
// be a status; a crash, a sanitizer report, an exception or a broken invariant
// on an accepted file is a bug.
//
// Seeds (fuzz/corpus/checkpoint_file): valid checkpoints of that layout written
// by WriteCheckpointFileOrThrow, plus damaged copies; ckpt_fuzz_replay_test
// writes a fresh set to build/test-output/ckpt_fuzz_seeds to refresh them.
#include "checkpoint_file_fuzz.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "k3/core/error.h"

namespace k3::fuzz {

const model::StateLayout& CheckpointFuzzLayout() {
  static const model::StateLayout layout = [] {
    model::StateLayout l;
    l.kda_layers = 2;
    l.mla_layers = 1;
    l.kda_heads = 1;
    l.kda_head_dim = 2;
    l.kda_proj = 2;
    l.conv_kernel = 2;
    l.kv_lora = 2;
    l.qk_rope = 1;
    return l;
  }();
  return layout;
}

const model::StateFingerprint& CheckpointFuzzFingerprint() {
  static const model::StateFingerprint fp{"0123456789abcdef0123456789abcdef",
                                          "idot=0 chunk=8 topp=1 isa=scalar"};
  return fp;
}

engine::CheckpointFileStatus ReadCheckpointBytes(const uint8_t* data, size_t size) {
  // One file for the process, rewritten for every input; on tmpfs where there
  // is one (no disk I/O). A real path, not /proc/self/fd/N of a memfd: the
  // reader opens only regular files without following links (docs/checkpoints.md).
  static const std::string path =
      std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + "/k3-ckpt-fuzz." +
      std::to_string(getpid());
  // Registered once `path` is built, so it runs before path's destructor (a
  // handler registered inside the initializer ran after it and unlinked an
  // empty name: every replay left its file in /dev/shm).
  static const bool unlink_at_exit = [] {
    std::atexit([] { unlink(path.c_str()); });
    return true;
  }();
  (void)unlink_at_exit;
  static const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  K3_CHECK(fd >= 0);
  K3_CHECK(ftruncate(fd, 0) == 0);
  for (size_t done = 0; done < size;) {
    const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    K3_CHECK(n > 0);
    done += static_cast<size_t>(n);
  }
  const model::StateLayout& l = CheckpointFuzzLayout();
  const engine::CheckpointFileResult head =
      engine::ReadCheckpointFile(path, CheckpointFuzzFingerprint(), l, true);
  const engine::CheckpointFileResult full =
      engine::ReadCheckpointFile(path, CheckpointFuzzFingerprint(), l, false);
  for (const engine::CheckpointFileResult* r : {&head, &full}) {
    if (r->status != engine::CheckpointFileStatus::kOk) {
      K3_CHECK(r->checkpoint == nullptr);
      K3_CHECK(!r->detail.empty());  // the warning names why
    } else {
      K3_CHECK(!r->ids.empty());
      K3_CHECK(r->file_bytes == size);
    }
  }
  // A file the whole read accepts passes the header-only check with the same ids.
  if (full.status == engine::CheckpointFileStatus::kOk) {
    K3_CHECK(head.status == engine::CheckpointFileStatus::kOk && head.ids == full.ids);
    const model::SessionCheckpoint& ck = *full.checkpoint;
    K3_CHECK(ck.position == static_cast<int64_t>(ck.ids.size()) && ck.ids == full.ids);
    K3_CHECK(ck.kda.size() == l.kda_layer_floats() * static_cast<uint64_t>(l.kda_layers));
    K3_CHECK(ck.mla.size() == 1 && ck.mla[0]->begin == 0 && ck.mla[0]->end == ck.position);
    K3_CHECK(ck.mla[0]->rows.size() ==
             static_cast<uint64_t>(ck.position) * l.mla_row_floats() *
                 static_cast<uint64_t>(l.mla_layers));
    K3_CHECK(ck.fingerprint == CheckpointFuzzFingerprint() && ck.layout == l);
  }
  return full.status;
}

}  // namespace k3::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  k3::fuzz::ReadCheckpointBytes(data, size);
  return 0;
}
