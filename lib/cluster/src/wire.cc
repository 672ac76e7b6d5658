#include "wire.h"

#include <algorithm>

#include "k3/core/error.h"

namespace k3::cluster::wire {

void Reader::Need(size_t n, const char* field) const {
  if (n > n_ - at_) {
    Fail(field, "message ends after " + std::to_string(n_) + " bytes (needs " +
                    std::to_string(at_ + n) + ")");
  }
}

void Reader::Fail(const char* field, const std::string& why) const {
  throw Error(ErrorCode::kCorrupt, std::string(what_) + " message, field " + field + ": " + why);
}

std::string Reader::GetString(size_t cap, const char* field) {
  const uint32_t len = Get<uint32_t>(field);
  if (len > cap) Fail(field, "length " + std::to_string(len) + " > " + std::to_string(cap));
  const std::byte* s = Take(len, field);
  return std::string(reinterpret_cast<const char*>(s), len);
}

void Reader::ExpectEnd() const {
  if (at_ != n_) Fail("(end)", std::to_string(n_ - at_) + " trailing bytes");
}

namespace {

void PutMagic(Writer& w) {
  w.Put<uint32_t>(kMagic);
  w.Put<uint32_t>(kVersion);
}
void GetMagic(Reader& r) {
  if (r.Get<uint32_t>("magic") != kMagic) r.Fail("magic", "not a k3 cluster message");
  const uint32_t v = r.Get<uint32_t>("version");
  if (v != kVersion) {
    r.Fail("version",
           "wire version " + std::to_string(v) + ", this build speaks " + std::to_string(kVersion));
  }
}

}  // namespace

std::vector<std::byte> EncodeHello(const Hello& h) {
  Writer w;
  PutMagic(w);
  w.Put<int32_t>(h.rank);
  w.Put<uint64_t>(h.build_id);
  w.Put<uint64_t>(h.model_fp);
  w.Put<uint64_t>(h.capacity.ram_bytes);
  w.Put<uint64_t>(h.capacity.disk_bytes_per_s);
  w.PutString(h.host, 256);
  w.PutString(h.kernels, 64);
  return std::move(w.bytes());
}

Hello DecodeHello(const std::byte* p, size_t n) {
  Reader r(p, n, "hello");
  GetMagic(r);
  Hello h;
  h.rank = r.Get<int32_t>("rank");
  h.build_id = r.Get<uint64_t>("build_id");
  h.model_fp = r.Get<uint64_t>("model_fp");
  h.capacity.ram_bytes = r.Get<uint64_t>("ram_bytes");
  h.capacity.disk_bytes_per_s = r.Get<uint64_t>("disk_bytes_per_s");
  h.host = r.GetString(256, "host");
  h.kernels = r.GetString(64, "kernels");
  r.ExpectEnd();
  return h;
}

std::vector<std::byte> EncodePlan(const Plan& p) {
  Writer w;
  PutMagic(w);
  w.Put<uint32_t>(p.refuse);
  w.Put<uint32_t>(p.flags);
  w.Put<uint64_t>(p.placement_fp);
  w.Put<uint32_t>(static_cast<uint32_t>(p.owners.size()));
  for (size_t i = 0; i < p.owners.size(); ++i) {
    w.Put<int32_t>(p.owners[i]);
    w.Put<uint64_t>(p.capacity[i].ram_bytes);
    w.Put<uint64_t>(p.capacity[i].disk_bytes_per_s);
  }
  return std::move(w.bytes());
}

Plan DecodePlan(const std::byte* p, size_t n) {
  Reader r(p, n, "plan");
  GetMagic(r);
  Plan pl;
  pl.refuse = r.Get<uint32_t>("refuse");
  pl.flags = r.Get<uint32_t>("flags");
  pl.placement_fp = r.Get<uint64_t>("placement_fp");
  const uint32_t count = r.Get<uint32_t>("owners");
  if (count > static_cast<uint32_t>(kMaxRanks)) r.Fail("owners", std::to_string(count) + " ranks");
  for (uint32_t i = 0; i < count; ++i) {
    const int32_t rank = r.Get<int32_t>("owner");
    if (rank < 0 || rank >= kMaxRanks) r.Fail("owner", "rank " + std::to_string(rank));
    pl.owners.push_back(rank);
    Capacity c;
    c.ram_bytes = r.Get<uint64_t>("ram_bytes");
    c.disk_bytes_per_s = r.Get<uint64_t>("disk_bytes_per_s");
    pl.capacity.push_back(c);
  }
  r.ExpectEnd();
  return pl;
}

std::vector<std::byte> EncodeReady(const Ready& rd) {
  Writer w;
  PutMagic(w);
  w.Put<uint32_t>(rd.status);
  w.Put<uint64_t>(rd.placement_fp);
  w.Put<uint64_t>(rd.owned_bytes);
  w.PutString(rd.detail, kMaxDetail);
  return std::move(w.bytes());
}

Ready DecodeReady(const std::byte* p, size_t n) {
  Reader r(p, n, "ready");
  GetMagic(r);
  Ready rd;
  rd.status = r.Get<uint32_t>("status");
  rd.placement_fp = r.Get<uint64_t>("placement_fp");
  rd.owned_bytes = r.Get<uint64_t>("owned_bytes");
  rd.detail = r.GetString(kMaxDetail, "detail");
  r.ExpectEnd();
  return rd;
}

void PutWorkHeader(Writer& w, const WorkHeader& h) {
  w.Put<uint32_t>(kMagic);
  w.Put<uint32_t>(h.seq);
  w.Put<uint32_t>(h.layer);
  w.Put<uint32_t>(h.rows);
  w.Put<uint32_t>(h.top_k);
  w.Put<uint32_t>(h.num_experts);
  w.Put<uint32_t>(h.num_pairs);
  w.Put<uint32_t>(h.flags);
}

WorkView DecodeWork(const std::byte* p, size_t n, uint32_t num_experts, uint32_t latent) {
  Reader r(p, n, "work");
  if (r.Get<uint32_t>("magic") != kMagic) r.Fail("magic", "not a k3 cluster message");
  WorkView v;
  WorkHeader& h = v.h;
  h.seq = r.Get<uint32_t>("seq");
  h.layer = r.Get<uint32_t>("layer");
  h.rows = r.Get<uint32_t>("rows");
  h.top_k = r.Get<uint32_t>("top_k");
  h.num_experts = r.Get<uint32_t>("num_experts");
  h.num_pairs = r.Get<uint32_t>("num_pairs");
  h.flags = r.Get<uint32_t>("flags");
  if (h.rows == 0 || h.rows > kMaxRows) r.Fail("rows", std::to_string(h.rows));
  if (h.top_k == 0 || h.top_k > num_experts) r.Fail("top_k", std::to_string(h.top_k));
  if (h.num_experts == 0 || h.num_experts > num_experts) {
    r.Fail("num_experts", std::to_string(h.num_experts));
  }
  const uint64_t max_pairs = static_cast<uint64_t>(h.rows) * h.top_k;
  if (h.num_pairs == 0 || h.num_pairs > max_pairs) r.Fail("num_pairs", std::to_string(h.num_pairs));
  std::vector<char> seen_e(num_experts, 0);
  uint64_t total = 0;
  v.expert_ids.resize(h.num_experts);
  v.counts.resize(h.num_experts);
  for (uint32_t i = 0; i < h.num_experts; ++i) {
    const uint32_t e = r.Get<uint32_t>("expert");
    const uint32_t c = r.Get<uint32_t>("count");
    if (e >= num_experts)
      r.Fail("expert", "id " + std::to_string(e) + " >= " + std::to_string(num_experts));
    if (seen_e[e]) r.Fail("expert", "id " + std::to_string(e) + " listed twice");
    if (c == 0 || c > h.rows) r.Fail("count", std::to_string(c));
    seen_e[e] = 1;
    v.expert_ids[i] = e;
    v.counts[i] = c;
    total += c;
  }
  if (total != h.num_pairs) r.Fail("count", "counts sum to " + std::to_string(total));
  v.pairs.resize(h.num_pairs);
  const std::byte* pp = r.Take(static_cast<size_t>(h.num_pairs) * 4, "pairs");
  std::memcpy(v.pairs.data(), pp, v.pairs.size() * 4);
  // Pairs unique overall (an expert's pair is one (token, rank)); each row used.
  std::vector<char> seen_p(max_pairs, 0), used_row(h.rows, 0);
  for (uint32_t q : v.pairs) {
    if (q >= max_pairs) r.Fail("pairs", "pair " + std::to_string(q) + " >= rows x top_k");
    if (seen_p[q]) r.Fail("pairs", "pair " + std::to_string(q) + " twice");
    seen_p[q] = 1;
    used_row[q / h.top_k] = 1;
  }
  if (std::find(used_row.begin(), used_row.end(), 0) != used_row.end()) {
    r.Fail("rows", "a latent row no pair uses");
  }
  v.rows = r.Take(static_cast<size_t>(h.rows) * latent * 4, "rows");
  r.ExpectEnd();
  return v;
}

void PutReplyHeader(Writer& w, const ReplyHeader& h, const std::string& detail) {
  w.Put<uint32_t>(kMagic);
  w.Put<uint32_t>(h.seq);
  w.Put<uint32_t>(h.status);
  w.Put<uint32_t>(h.num_pairs);
  w.Put<uint32_t>(h.flags);
  w.Put<uint64_t>(h.bytes_read);
  w.Put<uint64_t>(h.hits);
  w.Put<uint64_t>(h.misses);
  w.Put<double>(h.compute_s);
  w.PutString(detail, kMaxDetail);
}

ReplyView DecodeReply(const std::byte* p, size_t n, uint32_t latent) {
  Reader r(p, n, "reply");
  if (r.Get<uint32_t>("magic") != kMagic) r.Fail("magic", "not a k3 cluster message");
  ReplyView v;
  v.h.seq = r.Get<uint32_t>("seq");
  v.h.status = r.Get<uint32_t>("status");
  v.h.num_pairs = r.Get<uint32_t>("num_pairs");
  v.h.flags = r.Get<uint32_t>("flags");
  v.h.bytes_read = r.Get<uint64_t>("bytes_read");
  v.h.hits = r.Get<uint64_t>("hits");
  v.h.misses = r.Get<uint64_t>("misses");
  v.h.compute_s = r.Get<double>("compute_s");
  v.detail = r.GetString(kMaxDetail, "detail");
  const size_t elem = (v.h.flags & kBf16Reply) ? 2 : 4;
  if (v.h.status == 0) {
    v.payload = r.Take(static_cast<size_t>(v.h.num_pairs) * latent * elem, "payload");
  }
  r.ExpectEnd();
  return v;
}

size_t ReplyCapacity(uint32_t num_pairs, uint32_t latent) {
  return kReplyHeaderBytes + 4 + kMaxDetail + static_cast<size_t>(num_pairs) * latent * 4;
}

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float FromBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace k3::cluster::wire
