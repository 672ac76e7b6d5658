// The cluster's messages: round trips, and every truncation and named
// corruption of a work message refused with kCorrupt naming the field.
#include "wire.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "k3/core/error.h"

using namespace k3;
using namespace k3::cluster;

namespace {

// A work message: 2 rows, top_k 2, experts 5 (pairs 0, 3) and 1 (pair 2), latent 4.
std::vector<std::byte> Work(uint32_t e0 = 5, uint32_t pair1 = 3, uint32_t count0 = 2) {
  wire::Writer w;
  wire::WorkHeader h{7, 3, 2, 2, 2, 3, wire::kInt8Acts};
  wire::PutWorkHeader(w, h);
  for (uint32_t v : {e0, count0, 1u, 1u}) w.Put<uint32_t>(v);
  for (uint32_t v : {0u, pair1, 2u}) w.Put<uint32_t>(v);
  for (int i = 0; i < 8; ++i) w.Put<float>(static_cast<float>(i));
  return std::move(w.bytes());
}

void ExpectCorrupt(const std::vector<std::byte>& m, const char* field) {
  try {
    wire::DecodeWork(m.data(), m.size(), 16, 4);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCorrupt);
    CHECK(std::string(e.what()).find(field) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("wire: hello, plan, ready round trip") {
  wire::Hello h{3, 0x1234, 0x5678, {7'000'000'000, 2'000'000'000}, "host-a", "avx512"};
  auto m = wire::EncodeHello(h);
  wire::Hello g = wire::DecodeHello(m.data(), m.size());
  CHECK(g.rank == 3);
  CHECK(g.build_id == 0x1234);
  CHECK(g.model_fp == 0x5678);
  CHECK(g.capacity.ram_bytes == 7'000'000'000);
  CHECK(g.host == "host-a");
  CHECK(g.kernels == "avx512");
  for (size_t cut = 0; cut < m.size(); ++cut)
    CHECK_THROWS_AS(wire::DecodeHello(m.data(), cut), Error);

  wire::Plan p;
  p.owners = {1, 2};
  p.capacity = {{1, 2}, {3, 4}};
  p.placement_fp = 99;
  m = wire::EncodePlan(p);
  wire::Plan q = wire::DecodePlan(m.data(), m.size());
  CHECK(q.owners == p.owners);
  CHECK(q.capacity[1].disk_bytes_per_s == 4);
  CHECK(q.placement_fp == 99);
  m[0] = std::byte{0};
  CHECK_THROWS_AS(wire::DecodePlan(m.data(), m.size()), Error);

  wire::Ready r{2, 42, 1000, "lacks bytes"};
  m = wire::EncodeReady(r);
  wire::Ready s = wire::DecodeReady(m.data(), m.size());
  CHECK(s.status == 2);
  CHECK(s.detail == "lacks bytes");
}

TEST_CASE("wire: work messages are validated field by field") {
  auto m = Work();
  wire::WorkView v = wire::DecodeWork(m.data(), m.size(), 16, 4);
  CHECK(v.h.seq == 7);
  CHECK(v.expert_ids == std::vector<uint32_t>{5, 1});
  CHECK(v.pairs == std::vector<uint32_t>{0, 3, 2});
  float f;
  std::memcpy(&f, v.rows + 4 * 5, 4);
  CHECK(f == 5.0f);
  for (size_t cut = 0; cut < m.size(); ++cut)
    CHECK_THROWS_AS(wire::DecodeWork(m.data(), cut, 16, 4), Error);
  ExpectCorrupt(Work(16), "expert");      // id past the model
  ExpectCorrupt(Work(1), "expert");       // listed twice
  ExpectCorrupt(Work(5, 0), "pairs");     // pair twice
  ExpectCorrupt(Work(5, 4), "pairs");     // pair >= rows x top_k
  ExpectCorrupt(Work(5, 3, 3), "count");  // counts do not sum to num_pairs
  auto extra = Work();
  extra.push_back(std::byte{0});
  ExpectCorrupt(extra, "trailing");
  // An unused row (a latent row no pair reads) is refused.
  wire::Writer w;
  wire::PutWorkHeader(w, {1, 3, 2, 2, 1, 1, 0});
  for (uint32_t x : {5u, 1u, 0u}) w.Put<uint32_t>(x);
  for (int i = 0; i < 8; ++i) w.Put<float>(0.0f);
  ExpectCorrupt(w.bytes(), "rows");
}

TEST_CASE("wire: replies and bf16") {
  wire::Writer w;
  wire::ReplyHeader h;
  h.seq = 4;
  h.num_pairs = 1;
  h.bytes_read = 10;
  wire::PutReplyHeader(w, h, "");
  for (int i = 0; i < 4; ++i) w.Put<float>(1.5f);
  auto& m = w.bytes();
  CHECK(m.size() <= wire::ReplyCapacity(1, 4));
  wire::ReplyView v = wire::DecodeReply(m.data(), m.size(), 4);
  CHECK(v.h.seq == 4);
  CHECK(v.h.bytes_read == 10);
  CHECK_THROWS_AS(wire::DecodeReply(m.data(), m.size() - 1, 4), Error);
  // bf16: exact for bf16 values, round to nearest even, NaN kept.
  for (float x : {0.0f, 1.0f, -2.5f, 3.140625f}) CHECK(wire::FromBf16(wire::ToBf16(x)) == x);
  CHECK(wire::FromBf16(wire::ToBf16(1.0f + 1.0f / 256)) == 1.0f);  // tie to even
  CHECK(std::isnan(wire::FromBf16(wire::ToBf16(std::nanf("")))));
  for (float x : {0.1f, 123.456f, -7e-5f}) {
    CHECK(std::fabs(wire::FromBf16(wire::ToBf16(x)) - x) <= std::fabs(x) / 256);
  }
}
