// Whether a shard may be kept, published or trusted: the resume check of an
// existing output, --recheck against the manifests, the source-change check
// before publishing, and --verify-full's byte comparison.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "k3/repack/checksums.h"
#include "k3/repack/verify.h"
#include "shard_plan.h"

namespace k3::repack {

// Why an existing output file cannot be kept, or nullopt when it is exactly
// what this plan would write (same header bytes, same size). Data bytes are
// covered by checksums.xxh128 and k3-verify; a final name only ever receives a
// complete, fsynced file (tmp -> rename), so a crash cannot leave a short one
// behind. kNotFound (and only then): nothing could be opened at `path`.
std::optional<Problem> ExistingShardProblem(const std::string& path, const ShardPlan& p);

// Why a kept shard fails --recheck, or nullopt when it hashes to the digest
// `recorded` (checksums.xxh128) holds for `name`.
std::optional<Problem> RecheckProblem(const std::string& path, const std::string& name,
                                      const ChecksumManifest& recorded);

// What changed about the source since its header was read (p.src_stat), or
// nullopt: size, mtime, ctime of the open file, and whether its name still
// leads to it. Free (two stats), so every shard gets it before it is
// published. A write within the filesystem's timestamp tick of the previous one
// can leave both times equal (ext4 stamps with a clock of a few ms), hence the
// content digest too (k3-repack.sources, --recheck; with --verify-full also at once).
std::optional<Problem> SourceChange(const ShardPlan& p);

// The digest k3-repack.sources records for `p`, from the source as it is now.
std::string HashShardSource(const ShardPlan& p, uint64_t block_bytes);

// Why a kept shard's source no longer matches what it was converted from
// (`sources`: k3-repack.sources), or nullopt when it does (--recheck: one read
// of the source shard's kept bytes).
std::optional<Problem> SourceRecheckProblem(const ShardPlan& p, const ChecksumManifest& sources,
                                            uint64_t block_bytes);

// Header fields of a freshly written temp file against the plan; throws
// kInternal when they differ.
void CheckWrittenShard(const std::string& tmp_path, const ShardPlan& p);

// --verify-full: every expert byte of the shard, source vs destination file;
// the source is re-read whole, and its digest must equal `read_digest` (what
// the pipeline converted): a source that changed while the shard was read
// differs here even when its timestamps did not move. Returns the expert bytes
// compared; throws kChecksumMismatch.
uint64_t CompareExperts(const ShardPlan& p, const std::string& dst_path, uint64_t block_bytes,
                        const std::string& read_digest);

}  // namespace k3::repack
