// k3-repack's command-line helpers: the --shards and --worker values, and the
// terminal's progress line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "k3/repack/repack.h"

namespace k3::repack_cli {

// Parses "1,2,5-9" into shard numbers; throws kInvalidArgument.
std::vector<int64_t> ParseShardList(const std::string& list);
// Parses "I/N" (0 <= I < N); throws kInvalidArgument.
void ParseWorker(const std::string& spec, int* index, int* count);

// The TTY progress line for a kProgress event: starts with "\r\033[K" (back to
// column 0, erase the line) so nothing of a longer previous line remains. The
// ETA comes from the conversion's own rate (pre-flight hashing excluded) and is
// "--" until a second of converting has passed.
std::string ProgressLine(const repack::RepackEvent& e);

}  // namespace k3::repack_cli
