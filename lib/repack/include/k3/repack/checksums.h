// checksums.xxh128: one XXH3-128 per container file, in the format that
// `xxhsum -H2 -c checksums.xxh128` verifies ("<32 hex>  <name>\n", sorted by name;
// docs/container.md). Streaming hasher plus manifest read/merge/write.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace k3::repack {

inline constexpr std::string_view kChecksumsName = "checksums.xxh128";

// Streaming XXH3-128. Not thread-safe; one per stream.
class Xxh128 {
 public:
  Xxh128();
  ~Xxh128();
  Xxh128(const Xxh128&) = delete;
  Xxh128& operator=(const Xxh128&) = delete;
  void Update(std::span<const std::byte> bytes);
  // 32 lowercase hex digits, canonical (big-endian high then low half) as xxhsum prints.
  std::string HexDigest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string Xxh128Hex(std::span<const std::byte> bytes);
// Streams the whole file through XXH3-128 in blocks (bounded memory).
std::string HashFileXxh128(const std::string& path);

// name -> hex digest. std::map keeps the file sorted and deterministic.
using ChecksumManifest = std::map<std::string, std::string>;

// Parses a manifest; a missing file gives an empty manifest. Lines that are not
// "<32 hex>  <plain name>" throw kCorrupt naming the line.
ChecksumManifest ReadChecksumManifest(const std::string& path);
std::string RenderChecksumManifest(const ChecksumManifest& manifest);

}  // namespace k3::repack
