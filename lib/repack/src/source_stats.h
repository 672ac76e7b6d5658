// k3-repack.source-stats: what each output shard's source file was (size,
// times, inode) when the shard was converted, so a plain rerun notices a
// source replaced or edited since then with a stat instead of a read.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "shard_plan.h"

namespace k3::repack {

inline constexpr std::string_view kSourceStatsName = "k3-repack.source-stats";

// Output shard name -> its source's stat at conversion (dev is not recorded:
// another host mounts the same file under another device number).
using SourceStatManifest = std::map<std::string, SourceStat>;

// An absent file reads as empty; a malformed line throws kCorrupt naming the
// file, the line and its offset.
SourceStatManifest ReadSourceStats(const std::string& path);
std::string RenderSourceStats(const SourceStatManifest& m);

// How `now` differs from `recorded` ("size 5 -> 6 bytes, inode 12 -> 13"), or
// nullopt when size, mtime, ctime and inode are all the same.
std::optional<std::string> DescribeSourceChange(const SourceStat& recorded, const SourceStat& now);

}  // namespace k3::repack
