// The cluster's messages, byte by byte (docs/cluster.md "Wire format"). Every
// message starts with kMagic and is parsed by a bounds-checked reader that
// throws kCorrupt naming the field: a rank trusts nothing it receives.
// Little-endian hosts only (x86-64, aarch64), like the rest of k3.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "k3/cluster/placement.h"

namespace k3::cluster::wire {

inline constexpr uint32_t kMagic = 0x4c43334bu;  // "K3CL"
inline constexpr uint32_t kVersion = 1;
inline constexpr int kMaxRanks = 4096;
inline constexpr uint32_t kMaxRows = 1 << 16;  // latent rows in one work message
inline constexpr uint32_t kMaxDetail = 4096;   // error text in a reply

enum Tag : int { kHello = 11, kPlan = 12, kReady = 13, kWork = 14, kReply = 15, kBye = 16 };

enum Flags : uint32_t { kInt8Acts = 1u << 0, kBf16Reply = 1u << 1 };

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    PutBytes(&v, sizeof v);
  }
  void PutBytes(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    if (n) bytes_.insert(bytes_.end(), b, b + n);
  }
  void PutString(const std::string& s, size_t cap) {
    const uint32_t n = static_cast<uint32_t>(std::min(s.size(), cap));
    Put<uint32_t>(n);
    PutBytes(s.data(), n);
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  Reader(const std::byte* p, size_t n, const char* what) : p_(p), n_(n), what_(what) {}
  template <typename T>
  T Get(const char* field) {
    Need(sizeof(T), field);
    T v;
    std::memcpy(&v, p_ + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  const std::byte* Take(size_t n, const char* field) {
    Need(n, field);
    const std::byte* q = p_ + at_;
    at_ += n;
    return q;
  }
  std::string GetString(size_t cap, const char* field);
  size_t left() const { return n_ - at_; }
  void ExpectEnd() const;
  [[noreturn]] void Fail(const char* field, const std::string& why) const;

 private:
  void Need(size_t n, const char* field) const;
  const std::byte* p_;
  size_t n_;
  size_t at_ = 0;
  const char* what_;
};

// Worker -> coordinator, once at start.
struct Hello {
  int32_t rank = 0;
  uint64_t build_id = 0;
  uint64_t model_fp = 0;
  Capacity capacity;
  std::string host;
  std::string kernels;  // the active kernel ISA: bits differ between ISAs
};
std::vector<std::byte> EncodeHello(const Hello& h);
Hello DecodeHello(const std::byte* p, size_t n);

// Coordinator -> worker: go (with every owner's capacity, to compute the
// placement from) or refuse (startup failed elsewhere; the worker exits).
struct Plan {
  uint32_t refuse = 0;
  uint32_t flags = 0;  // kBf16Reply: the reduced mode
  std::vector<int> owners;
  std::vector<Capacity> capacity;
  uint64_t placement_fp = 0;
};
std::vector<std::byte> EncodePlan(const Plan& p);
Plan DecodePlan(const std::byte* p, size_t n);

// Worker -> coordinator after checking its share: ok (0) or an ErrorCode.
struct Ready {
  uint32_t status = 0;
  uint64_t placement_fp = 0;
  uint64_t owned_bytes = 0;
  std::string detail;
};
std::vector<std::byte> EncodeReady(const Ready& r);
Ready DecodeReady(const std::byte* p, size_t n);

// Coordinator -> worker, one per MoE layer pass that routes pairs to it.
// pairs are local (row * top_k + rank) indices, grouped per expert in the
// experts' order; rows are the f32 latent inputs [rows][latent].
struct WorkHeader {
  uint32_t seq = 0;
  uint32_t layer = 0;
  uint32_t rows = 0;
  uint32_t top_k = 0;
  uint32_t num_experts = 0;
  uint32_t num_pairs = 0;
  uint32_t flags = 0;
};
inline constexpr size_t kWorkHeaderBytes = 4 + 7 * 4;
struct WorkView {
  WorkHeader h;
  std::vector<uint32_t> expert_ids, counts, pairs;
  const std::byte* rows = nullptr;  // [rows][latent] f32
};
// Appends the header; the caller appends experts, pairs and rows (Writer).
void PutWorkHeader(Writer& w, const WorkHeader& h);
// Validates everything against the model's shape: expert ids < num_experts and
// unique, counts summing to num_pairs, pairs < rows * top_k and unique, sizes.
WorkView DecodeWork(const std::byte* p, size_t n, uint32_t num_experts, uint32_t latent);

struct ReplyHeader {
  uint32_t seq = 0;
  uint32_t status = 0;  // 0 ok, else the worker's ErrorCode
  uint32_t num_pairs = 0;
  uint32_t flags = 0;                             // kBf16Reply
  uint64_t bytes_read = 0, hits = 0, misses = 0;  // the worker's store, cumulative
  double compute_s = 0;                           // this pass
};
inline constexpr size_t kReplyHeaderBytes = 4 + 4 * 4 + 3 * 8 + 8;
void PutReplyHeader(Writer& w, const ReplyHeader& h, const std::string& detail);
struct ReplyView {
  ReplyHeader h;
  std::string detail;
  const std::byte* payload = nullptr;  // [num_pairs][latent] f32 or bf16
};
ReplyView DecodeReply(const std::byte* p, size_t n, uint32_t latent);
size_t ReplyCapacity(uint32_t num_pairs, uint32_t latent);

// bf16 round-to-nearest-even (the reduced mode) and back.
uint16_t ToBf16(float f);
float FromBf16(uint16_t h);

}  // namespace k3::cluster::wire
