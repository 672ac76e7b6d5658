// Test hooks into the BPE merge (private to lib/tokenizer and its tests).
#pragma once

#include <cstddef>

namespace k3::tok::internal {

// Pieces longer than this many bytes take the heap-based merge instead of the
// scan (default 128, also the maximum). Tests set 1 to run every piece through
// the heap path against tiktoken's ids. Process-wide; not for production use.
void SetHeapBpeThresholdForTest(size_t max_small_piece_bytes);

}  // namespace k3::tok::internal
