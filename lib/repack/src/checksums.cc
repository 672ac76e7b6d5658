#include "k3/repack/checksums.h"

#include <fcntl.h>
#include <xxhash.h>

#include <vector>

#include "k3/core/error.h"
#include "k3/core/file.h"

namespace k3::repack {

struct Xxh128::State {
  XXH3_state_t* s = nullptr;
};

Xxh128::Xxh128() : state_(std::make_unique<State>()) {
  state_->s = XXH3_createState();
  K3_CHECK(state_->s != nullptr);
  XXH3_128bits_reset(state_->s);
}

Xxh128::~Xxh128() { XXH3_freeState(state_->s); }

void Xxh128::Update(std::span<const std::byte> bytes) {
  XXH3_128bits_update(state_->s, bytes.data(), bytes.size());
}

namespace {
std::string CanonicalHex(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  static const char* kHex = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = kHex[c.digest[i] >> 4];
    out[2 * i + 1] = kHex[c.digest[i] & 15];
  }
  return out;
}

bool IsHex32(std::string_view s) {
  if (s.size() != 32) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}
}  // namespace

std::string Xxh128::HexDigest() const { return CanonicalHex(XXH3_128bits_digest(state_->s)); }

std::string Xxh128Hex(std::span<const std::byte> bytes) {
  return CanonicalHex(XXH3_128bits(bytes.data(), bytes.size()));
}

std::string HashFileXxh128(const std::string& path) {
  UniqueFd fd = OpenOrThrow(path, O_RDONLY);
  constexpr size_t kBlock = 8u << 20;
  std::vector<std::byte> buf(kBlock);
  Xxh128 h;
  uint64_t off = 0;
  while (true) {
    size_t n = PreadUpTo(fd.get(), buf, off, path);
    if (n == 0) break;
    h.Update(std::span(buf.data(), n));
    off += n;
  }
  return h.HexDigest();
}

ChecksumManifest ReadChecksumManifest(const std::string& path) {
  ChecksumManifest m;
  if (!PathExists(path)) return m;
  std::string text = ReadFileOrThrow(path, 64u << 20);
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    ++line_no;
    int64_t line_at = static_cast<int64_t>(pos);
    pos = eol + 1;
    if (line.empty()) continue;
    if (line.size() < 35 || !IsHex32(line.substr(0, 32)) || line.substr(32, 2) != "  " ||
        line.substr(34).find('/') != std::string_view::npos) {
      throw Error(ErrorCode::kCorrupt,
                  "line " + std::to_string(line_no) + " is not '<32 hex>  <file name>'", path,
                  line_at);
    }
    std::string name(line.substr(34));
    if (!m.emplace(name, std::string(line.substr(0, 32))).second) {
      throw Error(ErrorCode::kCorrupt, "file listed twice", path, line_at, name);
    }
  }
  return m;
}

std::string RenderChecksumManifest(const ChecksumManifest& manifest) {
  std::string out;
  for (const auto& [name, hex] : manifest) out += hex + "  " + name + "\n";
  return out;
}

}  // namespace k3::repack
