// The checkpoint file reader's fuzz harness (checkpoint_file_fuzz.cc), shared
// with its replay test so that both use one layout and fingerprint.
#pragma once

#include <cstddef>
#include <cstdint>

#include "k3/engine/checkpoint_cache.h"

namespace k3::fuzz {

// The small state the harness reads checkpoints of (2 KDA layers, 1 MLA layer).
const model::StateLayout& CheckpointFuzzLayout();
const model::StateFingerprint& CheckpointFuzzFingerprint();
// Reads `data` as a checkpoint file (header-only and whole), checks the
// invariants (K3_CHECK aborts on a broken one) and returns the whole read's status.
engine::CheckpointFileStatus ReadCheckpointBytes(const uint8_t* data, size_t size);

}  // namespace k3::fuzz
