// Integration tests of the real k3-repack / k3-verify binaries on the oracle
// k3-tiny snapshot: the container bytes against an independent plain-loop §6.2
// implementation, resume, crash safety (named crash points and random kill -9),
// concurrent disjoint passes, disk full, corrupt sources, bounded memory.
#include <doctest/doctest.h>
#include <sys/mount.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "helpers.h"
#include "k3/container/safetensors.h"
#include "k3/repack/checksums.h"
#include "k3/container/snapshot.h"
#include "k3/core/error.h"
#include "k3/core/sys.h"

using namespace k3test;

namespace {

// ---- An independent implementation of spec §6.2, written from the text only. ----
float Bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void RefInt8(const std::vector<float>& x, size_t rows, size_t cols, std::vector<uint8_t>* q,
             std::vector<float>* s) {
  q->assign(rows * cols, 0);
  s->assign(rows, 0);
  for (size_t r = 0; r < rows; ++r) {
    float am = 0;
    for (size_t i = 0; i < cols; ++i) am = std::max(am, std::fabs(x[r * cols + i]));
    float sc = am / 127.0f;
    if (sc < 1e-20f) sc = 1e-20f;
    float inv = 1.0f / sc;
    for (size_t i = 0; i < cols; ++i) {
      long v = std::lrintf(x[r * cols + i] * inv);  // default rounding: half to even
      v = std::clamp(v, -127L, 127L);
      (*q)[r * cols + i] = static_cast<uint8_t>(static_cast<int8_t>(v));
    }
    (*s)[r] = sc;
  }
}

void RefInt4(const std::vector<float>& x, size_t rows, size_t cols, std::vector<uint8_t>* q,
             std::vector<float>* s) {
  q->assign(rows * cols / 2, 0);
  s->assign(rows * cols / 64, 0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < cols / 64; ++g) {
      const float* v = &x[r * cols + g * 64];
      float am = 0;
      for (int i = 0; i < 64; ++i) am = std::max(am, std::fabs(v[i]));
      float sc = am / 7.0f;
      if (sc < 1e-20f) sc = 1e-20f;
      float inv = 1.0f / sc;
      for (int j = 0; j < 32; ++j) {
        long lo = std::clamp(std::lrintf(v[2 * j] * inv), -8L, 7L) + 8;
        long hi = std::clamp(std::lrintf(v[2 * j + 1] * inv), -8L, 7L) + 8;
        (*q)[r * cols / 2 + g * 32 + j] = static_cast<uint8_t>(lo | (hi << 4));
      }
      (*s)[r * (cols / 64) + g] = sc;
    }
  }
}

std::string Bytes(const k3::SafetensorsFile& f, const k3::TensorInfo& t) {
  std::string b(t.nbytes(), '\0');
  f.ReadOrThrow(t, std::as_writable_bytes(std::span(b.data(), b.size())));
  return b;
}

bool IsExpert(const std::string& n) {
  return n.find(".block_sparse_moe.experts.") != std::string::npos;
}

// The source shard with the same number as output shard `out_name`.
std::string SourceShardFor(const std::string& src_dir, const std::string& out_name) {
  const std::string prefix = out_name.substr(0, 11);  // "model-XXXXX"
  for (const auto& n : ListDir(src_dir)) {
    if (n.starts_with(prefix + "-of-") && n.ends_with(".safetensors")) return src_dir + "/" + n;
  }
  return {};
}

struct ContainerCounts {
  size_t quantized = 0, experts = 0, passthrough = 0;
};

// Checks a finished container made with `bits` from `src_dir`, byte for byte, against
// the source and the independent quantizer. With bits == 8 every quantized class is
// int8; with 4 the MLA/head classes are recognised by name (tiny's MLA layers 3, 6, 7).
ContainerCounts CheckContainer(const std::string& dst, int bits,
                               const std::string& src_dir = TinySnapshot()) {
  std::vector<std::string> shards;
  for (const auto& n : ListDir(dst)) {
    if (n.starts_with("model-") && n.ends_with(".safetensors")) shards.push_back(n);
  }
  REQUIRE(!shards.empty());
  size_t quantized = 0, experts = 0, passthrough = 0;
  uint64_t total = 0;
  for (const auto& name : shards) {
    k3::SafetensorsFile out = k3::SafetensorsFile::OpenOrThrow(dst + "/" + name);
    CHECK(out.header().metadata().empty());
    CHECK((8 + out.header().header_bytes()) % 8 == 0);
    // Source shard with the same number; expected order.
    const std::string src_path = SourceShardFor(src_dir, name);
    REQUIRE(!src_path.empty());
    k3::SafetensorsFile in = k3::SafetensorsFile::OpenOrThrow(src_path);
    std::vector<std::string> want_order;
    std::vector<std::pair<std::tuple<long, int, int>, std::string>> ex;
    for (const auto& t : in.tensors()) {
      if (IsExpert(t.name)) {
        // "...experts.E.wM.weight_packed|scale"
        size_t at = t.name.find(".experts.") + 9;
        long e = std::stol(t.name.substr(at));
        size_t w = t.name.find(".w", at);
        int m = t.name[w + 2] - '0';
        int sc = t.name.ends_with("weight_scale") ? 1 : 0;
        ex.push_back({{e, m, sc}, t.name});
        continue;
      }
      want_order.push_back(t.name);
      if (out.Find(t.name + ".qs")) want_order.push_back(t.name + ".qs");
    }
    std::sort(ex.begin(), ex.end());
    for (auto& e : ex) want_order.push_back(e.second);
    std::vector<std::string> got_order;
    for (const auto& t : out.tensors()) got_order.push_back(t.name);
    CHECK(got_order == want_order);

    for (const auto& t : out.tensors()) {
      total += t.nbytes();
      if (t.name.ends_with(".qs")) continue;
      const k3::TensorInfo* s = in.Find(t.name);
      REQUIRE(s != nullptr);
      const k3::TensorInfo* qs = out.Find(t.name + ".qs");
      if (!qs) {
        CHECK_MESSAGE(Bytes(out, t) == Bytes(in, *s), t.name);
        if (IsExpert(t.name))
          ++experts;
        else
          ++passthrough;
        continue;
      }
      ++quantized;
      REQUIRE(s->dtype == k3::DType::kBF16);
      const size_t rows = s->shape[0], cols = s->shape[1];
      std::string raw = Bytes(in, *s);
      std::vector<float> x(rows * cols);
      for (size_t i = 0; i < x.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, raw.data() + 2 * i, 2);
        x[i] = Bf16(h);
      }
      std::vector<uint8_t> q;
      std::vector<float> sc;
      // lm_head is 'head', MLA projections 'mla': both default to max(bits, 8) = 8.
      const bool mla_or_head = t.name.find("lm_head") != std::string::npos ||
                               t.name.find("q_a_proj") != std::string::npos ||
                               t.name.find("q_b_proj") != std::string::npos ||
                               t.name.find("kv_a_proj") != std::string::npos ||
                               t.name.find("kv_b_proj") != std::string::npos ||
                               ((t.name.find("layers.3.self_attn.") != std::string::npos ||
                                 t.name.find("layers.6.self_attn.") != std::string::npos ||
                                 t.name.find("layers.7.self_attn.") != std::string::npos) &&
                                (t.name.find("o_proj") != std::string::npos ||
                                 t.name.find("g_proj") != std::string::npos));
      const int b = mla_or_head ? 8 : bits;
      if (b <= 4 && cols % 64 == 0) {
        RefInt4(x, rows, cols, &q, &sc);
        CHECK(t.shape == std::vector<int64_t>{int64_t(rows), int64_t(cols / 2)});
      } else {
        RefInt8(x, rows, cols, &q, &sc);
        CHECK(t.shape == std::vector<int64_t>{int64_t(rows), int64_t(cols)});
      }
      CHECK(t.dtype == k3::DType::kU8);
      CHECK(qs->dtype == k3::DType::kF32);
      CHECK(qs->begin == t.end);  // sidecar right after its matrix
      std::string want_q(reinterpret_cast<const char*>(q.data()), q.size());
      std::string want_s(reinterpret_cast<const char*>(sc.data()), sc.size() * 4);
      CHECK_MESSAGE(Bytes(out, t) == want_q, t.name);
      CHECK_MESSAGE(Bytes(out, *qs) == want_s, t.name);
    }
  }
  CHECK(passthrough > 0);
  // The index: every tensor, total_size = sum of tensor bytes.
  std::string index = ReadAll(dst + "/model.safetensors.index.json");
  CHECK(index.find("\"total_size\": " + std::to_string(total) + "\n") != std::string::npos);
  return {quantized, experts, passthrough};
}

void CheckTinyContainer(const std::string& dst, int bits) {
  std::vector<std::string> shards;
  for (const auto& n : ListDir(dst)) {
    if (n.starts_with("model-") && n.ends_with(".safetensors")) shards.push_back(n);
  }
  // Shards 1..9 of 9 (10 and 11 are vision-only and dropped).
  REQUIRE(shards.size() == 9);
  for (int i = 1; i <= 9; ++i)
    CHECK(shards[i - 1] == "model-0000" + std::to_string(i) + "-of-000009.safetensors");
  ContainerCounts c = CheckContainer(dst, bits);
  CHECK(c.quantized == 82);
  CHECK(c.experts == 7 * 16 * 6);
}

// The reference: one uninterrupted run (made once per process).
const std::string& ReferenceDir() {
  static TempDir dir("k3ref");
  static bool made = false;
  if (!made) {
    REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), dir / "out"}) == 0);
    made = true;
  }
  static std::string p = dir / "out";
  return p;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string l;
  while (std::getline(ss, l)) out.push_back(l);
  return out;
}

// What may exist in DST at any moment: final names hold complete files only.
void CheckNoPartial(const std::string& dst, const std::map<std::string, std::string>& ref) {
  for (const auto& n : ListDir(dst)) {
    if (n.find(".tmp.") != std::string::npos || n == ".k3-repack.lock") continue;
    std::string c = ReadAll(dst + "/" + n);
    auto it = ref.find(n);
    REQUIRE_MESSAGE(it != ref.end(), ("unexpected file " + n));
    if (n == "model.safetensors.index.json") {
      // An index of the shards complete at its rebuild: entries a subset of the final one.
      auto want = Lines(it->second);
      std::set<std::string> wl;
      for (auto l : want) {
        if (!l.empty() && l.back() == ',') l.pop_back();
        wl.insert(l);
      }
      CHECK_MESSAGE(c.ends_with("}\n}\n"), "index incomplete");
      for (auto l : Lines(c)) {
        if (l.find("\": \"model-") == std::string::npos) continue;
        if (!l.empty() && l.back() == ',') l.pop_back();
        CHECK_MESSAGE(wl.count(l), ("index line not in the final index: " + l));
      }
    } else if (n == "checksums.xxh128" || n == "k3-repack.sources" ||
               n == "k3-repack.source-stats") {
      // Per-shard manifests: lines of the shards recorded so far.
      auto want = Lines(it->second);
      std::set<std::string> wl(want.begin(), want.end());
      for (const auto& l : Lines(c)) {
        if (l.ends_with("  model.safetensors.index.json")) continue;
        CHECK_MESSAGE(wl.count(l), ("checksum line not in the final manifest: " + l));
      }
    } else {
      CHECK_MESSAGE(c == it->second, ("final name holds different bytes: " + n));
    }
  }
}

std::string Copy(const std::string& from, const std::string& to) {
  std::string cmd = "cp -r '" + from + "' '" + to + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::string chmod = "chmod -R u+w '" + to + "'";
  REQUIRE(std::system(chmod.c_str()) == 0);
  return to;
}

// k3-tiny plus one more shard, model-00012-of-000012, holding a rows x cols BF16
// matrix (a bits-class name the model does not read, so it is quantized) and an
// ex_rows x ex_cols U8 expert (copied), both pseudo-random. Without an index the
// shards are found by name, the extra one included.
std::string TinyPlusBigShard(const std::string& src, int64_t rows, int64_t cols, int64_t ex_rows,
                             int64_t ex_cols) {
  REQUIRE(std::system(("cp -r '" + TinySnapshot() + "' '" + src + "'").c_str()) == 0);
  REQUIRE(::unlink((src + "/model.safetensors.index.json").c_str()) == 0);
  std::vector<k3::PlannedTensor> plan = {
      {"language_model.model.extra.mlp.up_proj.weight", k3::DType::kBF16, {rows, cols}},
      {"language_model.model.layers.1.block_sparse_moe.experts.99.w1.weight_packed",
       k3::DType::kU8,
       {ex_rows, ex_cols}},
  };
  k3::SafetensorsWriter w(src + "/model-00012-of-000012.safetensors", plan);
  std::vector<uint16_t> buf(1 << 20);
  uint32_t state = 1;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state;
  };
  for (int64_t n = rows * cols; n > 0;) {
    int64_t k = std::min<int64_t>(n, buf.size());
    for (int64_t i = 0; i < k; ++i) {
      uint32_t r = next();
      buf[i] = static_cast<uint16_t>(((r >> 16) & 0x8000u) | ((118u + (r >> 28)) << 7) | (r & 0x7fu));
    }
    w.Write(std::as_bytes(std::span(buf.data(), k)));
    n -= k;
  }
  for (int64_t n = ex_rows * ex_cols; n > 0;) {
    int64_t k = std::min<int64_t>(n, buf.size() * 2);
    for (int64_t i = 0; i < k / 2; ++i) buf[i] = static_cast<uint16_t>(next());
    w.Write(std::as_bytes(std::span(buf.data(), static_cast<size_t>(k / 2))));
    n -= k / 2 * 2;
  }
  w.Commit();
  return src;
}

// Sum of "streams_lent" over a --json log's shard_done events.
size_t StreamsLent(const std::string& log) {
  size_t n = 0;
  const std::string key = "\"streams_lent\":";
  for (size_t at = 0; (at = log.find(key, at)) != std::string::npos; at += key.size())
    n += std::stoull(log.substr(at + key.size()));
  return n;
}

}  // namespace

TEST_CASE("repack k3-tiny --bits 8: layout and bytes match an independent §6.2 implementation") {
  const std::string& ref = ReferenceDir();
  CheckTinyContainer(ref, 8);
  CHECK(Run({Bin("k3-verify"), ref}) == 0);
  CHECK(Run({Bin("k3-verify"), ref, "--full", "--source", TinySnapshot()}) == 0);
  if (Exists("/usr/bin/xxhsum")) {
    std::string cmd = "cd '" + ref + "' && /usr/bin/xxhsum -H2 -c --quiet checksums.xxh128";
    CHECK_MESSAGE(std::system(cmd.c_str()) == 0, "xxhsum -H2 -c failed");
  }
  auto t = ReadTree(ref);
  for (const char* f :
       {"config.json", "generation_config.json", "tokenizer_config.json", "tiktoken.model"}) {
    CHECK_MESSAGE(t[f] == ReadAll(TinySnapshot() + "/" + f), std::string(f));
  }
}

TEST_CASE("repack k3-tiny --bits 4: int4-g64 where the row length allows, MLA and head stay int8") {
  TempDir d;
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), d / "out", "--bits", "4", "--threads", "2"}) == 0);
  CheckTinyContainer(d / "out", 4);
  CHECK(Run({Bin("k3-verify"), d / "out", "--full", "--source", TinySnapshot()}) == 0);
}

TEST_CASE("same output whatever the block size, thread, stream and read counts") {
  TempDir d;
  std::string log = d / "log";
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), d / "out", "--threads", "1", "--block-mib", "1",
               "--verify-full", "--json", "--streams", "1"},
              {.log = log}) == 0);
  // Layer shards hold 16 experts x 6528 bytes, all re-read and compared.
  CHECK(ReadAll(log).find("\"expert_bytes_verified\":104448,") != std::string::npos);
  CHECK(TreeDiff(ReadTree(ReferenceDir()), ReadTree(d / "out")) == "");
  // Several shards converted at once: the same bytes, every shard reported
  // started and done once, and the summary counts them all.
  for (auto [streams, reads] : {std::pair{"3", "4"}, std::pair{"16", "1"}}) {
    const std::string out = d / (std::string("out-s") + streams);
    const std::string slog = d / (std::string("log-s") + streams);
    REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), out, "--json", "--streams", streams, "--reads",
                 reads, "--block-mib", "1"},
                {.log = slog}) == 0);
    CHECK(TreeDiff(ReadTree(ReferenceDir()), ReadTree(out)) == "");
    const std::string l = ReadAll(slog);
    size_t starts = 0, dones = 0;
    for (size_t at = 0; (at = l.find("\"event\":\"shard_start\"", at)) != std::string::npos; ++at)
      ++starts;
    for (size_t at = 0; (at = l.find("\"event\":\"shard_done\"", at)) != std::string::npos; ++at)
      ++dones;
    CHECK(starts == 9);  // 11 source shards, 2 without text-model tensors
    CHECK(dones == 9);
  }
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), d / "out-bad", "--streams", "17"},
            {.log = d / "log-bad"}) != 0);
  CHECK(ReadAll(d / "log-bad").find("--streams 17") != std::string::npos);
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), d / "out-bad", "--reads", "17"},
            {.log = d / "log-bad"}) != 0);
  CHECK(ReadAll(d / "log-bad").find("--reads 17") != std::string::npos);
}

TEST_CASE("--mem-mb and --block-mib: bad values and flags that cannot fit are refused, naming the flag") {
  TempDir d;
  const int bad = k3::ExitCodeFor(k3::ErrorCode::kInvalidArgument);
  struct Case {
    std::vector<std::string> flags;
    std::string want;  // in the error
  };
  for (const Case& c : std::vector<Case>{
           {{"--mem-mb", "8"}, "--mem-mb 8: must be 16 .."},
           {{"--mem-mb", "0"}, "--mem-mb 0: must be 16 .."},
           {{"--block-mib", "0"}, "--block-mib 0: must be 1 .. 256"},
           {{"--block-mib", "300"}, "--block-mib 300: must be 1 .. 256"},
           // 4 x (9 + 1 + 9) blocks of 4 MiB = 304 MiB: the given flags do not fit.
           {{"--mem-mb", "100", "--streams", "4", "--reads", "8", "--writes", "8", "--block-mib", "4"},
            "--mem-mb 100: --streams 4 --reads 8 --writes 8 with 4 MiB blocks need 304 MiB"},
       }) {
    std::vector<std::string> argv = {Bin("k3-repack"), TinySnapshot(), d / "out-bad"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const std::string log = d / "log-bad";
    CHECK(Run(argv, {.log = log}) == bad);
    const std::string l = ReadAll(log);
    CHECK_MESSAGE(l.find(c.want) != std::string::npos, l);
    CHECK(!Exists(d / "out-bad"));  // refused before anything is written
  }
  // What fits is used as given and said so at the start (JSON and the human line).
  const std::string log = d / "log-ok";
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), d / "out", "--json", "--mem-mb", "100", "--streams",
               "2", "--block-mib", "2"},
              {.log = log}) == 0);
  const std::string l = ReadAll(log);
  // 2 streams x (12 + 1 + 12) blocks x 2 MiB = 100 MiB: 11 reads and writes in flight fit.
  CHECK(l.find("\"streams\":2,\"reads_in_flight\":11,\"writes_in_flight\":11,\"block_bytes\":2097152,"
               "\"mem_budget_bytes\":104857600,\"buffer_bytes\":104857600") != std::string::npos);
  CHECK(TreeDiff(ReadTree(ReferenceDir()), ReadTree(d / "out")) == "");
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), d / "out2", "--mem-mb", "100"}, {.log = log}) == 0);
  // 8 and 4 MiB blocks leave fewer than 4 in flight; 2 MiB: 4 x (2 x 4 + 3) x 2 MiB.
  CHECK(ReadAll(log).find("k3-repack: pipeline: 4 stream(s) x 4 read(s) and 4 write(s) in flight, 2 MiB "
                          "blocks: buffers <= 88 MiB of a 100 MiB budget (--mem-mb)") != std::string::npos);
}

TEST_CASE("one big shard and many small ones: idle streams read it too, bytes unchanged") {
  // The big shard (32 MiB BF16 quantized, 16 MiB expert copied; 48 1 MiB
  // segments) is the last one taken, so with 2 streams the other runs out of
  // shards while it is read and lends its reads to it. One stream with one read
  // and one write in flight (nothing lent, nothing overlapped) is the reference;
  // k3-verify --full re-derives every byte of it independently.
  TempDir d;
  const std::string src = TinyPlusBigShard(d / "src", 4096, 4096, 2048, 8192);
  const std::string ref = d / "ref";
  REQUIRE(Run({Bin("k3-repack"), src, ref, "--json", "--streams", "1", "--reads", "1", "--writes",
               "1", "--block-mib", "1", "--threads", "1"},
              {.log = d / "log-ref"}) == 0);
  CHECK(StreamsLent(ReadAll(d / "log-ref")) == 0);
  CHECK(Run({Bin("k3-verify"), ref, "--full", "--source", src}) == 0);
  const auto want = ReadTree(ref);
  size_t lent = 0;
  for (auto [streams, reads, writes] :
       {std::tuple{"2", "2", "3"}, std::tuple{"2", "1", "1"}, std::tuple{"16", "4", "2"}}) {
    const std::string out = d / (std::string("out-") + streams + "-" + reads);
    const std::string log = out + ".log";
    REQUIRE(Run({Bin("k3-repack"), src, out, "--json", "--streams", streams, "--reads", reads,
                 "--writes", writes, "--block-mib", "1", "--threads", "1"},
                {.log = log}) == 0);
    CHECK(TreeDiff(want, ReadTree(out)) == "");
    const size_t n = StreamsLent(ReadAll(log));
    MESSAGE("--streams " << std::string(streams) << " --reads " << std::string(reads) << ": " << n << " stream(s) lent");
    lent += n;
  }
  // Lending is timing-dependent per run, but over these three (the big shard
  // takes ~10x longer than the other stream's remaining tiny shards) it happens.
  CHECK(lent > 0);
  // The defaults (block size chosen from the budget) and a budget so small that
  // the automatic reads and writes shrink: the same bytes.
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{}, std::vector<std::string>{"--mem-mb", "20"}}) {
    const std::string out = d / ("out-auto" + std::to_string(flags.size()));
    std::vector<std::string> argv = {Bin("k3-repack"), src, out, "--threads", "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    REQUIRE(Run(argv) == 0);
    CHECK(TreeDiff(want, ReadTree(out)) == "");
  }
  CHECK(Run({Bin("k3-repack"), src, d / "out-bad", "--writes", "17"}, {.log = d / "log-bad"}) != 0);
  CHECK(ReadAll(d / "log-bad").find("--writes 17") != std::string::npos);
}

TEST_CASE("resume validates outputs; other parameters are refused; --force starts over") {
  TempDir d;
  const std::string out = d / "out";
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), out}) == 0);
  // A shard cut short and one with a flipped header byte are redone; the rest kept.
  REQUIRE(::truncate((out + "/model-00003-of-000009.safetensors").c_str(), 1000) == 0);
  {
    std::string p = out + "/model-00005-of-000009.safetensors";
    std::string c = ReadAll(p);
    c[20] = c[20] == 'x' ? 'y' : 'x';
    std::ofstream(p, std::ios::binary) << c;
  }
  std::string log = d / "log";
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), out, "--json"}, {.log = log}) == 0);
  std::string l = ReadAll(log);
  CHECK(l.find("\"event\":\"shard_done\",\"shard\":\"model-00003-of-000009.safetensors\"") !=
        std::string::npos);
  CHECK(l.find("\"event\":\"shard_done\",\"shard\":\"model-00005-of-000009.safetensors\"") !=
        std::string::npos);
  CHECK(l.find("\"event\":\"shard_skipped\",\"shard\":\"model-00001-of-000009.safetensors\"") !=
        std::string::npos);
  CHECK(TreeDiff(ReadTree(ReferenceDir()), ReadTree(out)) == "");
  // Other parameters: refused (exit 7), nothing touched.
  auto before = ReadTree(out);
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), out, "--bits", "4"}, {.log = log}) == 7);
  CHECK(ReadAll(log).find("--force") != std::string::npos);
  CHECK(TreeDiff(before, ReadTree(out)) == "");
  {
    // While another pass converts (it holds a shard lock), the refusal names it,
    // and --force is refused too: it would delete what that pass writes.
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const std::string lock_path = out + "/.k3-repack.shards.lock";
    const pid_t holder = ::fork();
    REQUIRE(holder >= 0);
    if (holder == 0) {
      const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
      struct flock fl {};
      fl.l_type = F_WRLCK;
      fl.l_whence = SEEK_SET;
      fl.l_start = 3;
      fl.l_len = 1;
      const char ok = (fd >= 0 && ::fcntl(fd, F_SETLK, &fl) == 0) ? '1' : '0';
      if (::write(ready[1], &ok, 1) != 1) ::_exit(1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char ok = 0;
    REQUIRE(::read(ready[0], &ok, 1) == 1);
    ::close(ready[0]);
    REQUIRE(ok == '1');
    const std::string who = "process " + std::to_string(holder) + " (another k3-repack) is converting";
    const auto locked = ReadTree(out);
    CHECK(Run({Bin("k3-repack"), TinySnapshot(), out, "--bits", "4"}, {.log = log}) == 7);
    CHECK(ReadAll(log).find(who) != std::string::npos);
    CHECK(ReadAll(log).find("rerun with its parameters") != std::string::npos);
    CHECK(Run({Bin("k3-repack"), TinySnapshot(), out, "--bits", "4", "--force"}, {.log = log}) == 7);
    CHECK(ReadAll(log).find(who) != std::string::npos);
    CHECK(ReadAll(log).find("--force would delete") != std::string::npos);
    CHECK(TreeDiff(locked, ReadTree(out)) == "");
    ::kill(holder, SIGKILL);
    CHECK(Wait(holder) != 0);
  }
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), out, "--bits", "4", "--force"}) == 0);
  CHECK(Run({Bin("k3-verify"), out, "--full", "--source", TinySnapshot()}) == 0);
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), out, "--force"}) == 0);
  CHECK(TreeDiff(ReadTree(ReferenceDir()), ReadTree(out)) == "");
}

TEST_CASE("a tensor in two shards aborts the index rebuild and leaves the old index") {
  TempDir d;
  const std::string out = Copy(ReferenceDir(), d / "out");
  const std::string index = ReadAll(out + "/model.safetensors.index.json");
  // A second copy of shard 1 under another valid name (as if two conversions mixed).
  REQUIRE(std::system(("cp '" + out + "/model-00001-of-000009.safetensors' '" + out +
                       "/model-00010-of-000009.safetensors'")
                          .c_str()) == 0);
  std::string log = d / "log";
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), out}, {.log = log}) == 4);
  CHECK(
      ReadAll(log).find("duplicate tensor in model-00001-of-000009.safetensors and model-00010") !=
      std::string::npos);
  CHECK(ReadAll(out + "/model.safetensors.index.json") == index);
  CHECK(Run({Bin("k3-verify"), out}) != 0);
}

TEST_CASE("truncated or corrupt source: clear error, non-zero exit, DST untouched") {
  TempDir d;
  const std::string ref = ReferenceDir();
  struct Case {
    std::string what;
    int exit_code;  // docs/errors.md
    std::function<void(const std::string&)> damage;
  };
  const std::string shard = "/model-00004-of-000011.safetensors";
  std::vector<Case> cases = {
      {"truncated shard", 4,
       [&](const std::string& s) { REQUIRE(::truncate((s + shard).c_str(), 300000) == 0); }},
      {"shard missing", 3, [&](const std::string& s) { REQUIRE(::unlink((s + shard).c_str()) == 0); }},
      {"header not JSON", 4,
       [&](const std::string& s) {
         std::string c = ReadAll(s + shard);
         c[9] = '!';
         std::ofstream(s + shard, std::ios::binary) << c;
       }},
      {"header length past the end", 4,
       [&](const std::string& s) {
         std::string c = ReadAll(s + shard);
         c[5] = '\x7f';
         std::ofstream(s + shard, std::ios::binary) << c;
       }},
      {"trailing garbage", 4,
       [&](const std::string& s) { std::ofstream(s + shard, std::ios::app) << "xx"; }},
      {"index names a tensor the shard lacks", 4,
       [&](const std::string& s) {
         std::string p = s + "/model.safetensors.index.json";
         std::string c = ReadAll(p);
         c.insert(c.find("\"weight_map\": {") + 15,
                  "\"ghost\": \"model-00001-of-000011.safetensors\",");
         std::ofstream(p, std::ios::binary) << c;
       }},
  };
  int i = 0;
  for (const auto& c : cases) {
    CAPTURE(c.what);
    std::string src = Copy(TinySnapshot(), d / ("src" + std::to_string(i)));
    c.damage(src);
    // Into a fresh DST: it must not even be created.
    std::string fresh = d / ("fresh" + std::to_string(i));
    std::string log = d / ("log" + std::to_string(i));
    CHECK(Run({Bin("k3-repack"), src, fresh}, {.log = log}) == c.exit_code);
    CHECK(!Exists(fresh));
    CHECK(ReadAll(log).find("error: ") != std::string::npos);
    // Into a complete container: the same refusal, left exactly as it was.
    std::string full = Copy(ref, d / ("full" + std::to_string(i)));
    auto before = ReadTree(full);
    CHECK(Run({Bin("k3-repack"), src, full}) == c.exit_code);
    CHECK(TreeDiff(before, ReadTree(full)) == "");
    ++i;
  }
}

TEST_CASE("named crash points: nothing partial under a final name; rerun is byte-identical") {
  const auto ref = ReadTree(ReferenceDir());
  // before/after-rename count every atomic publish (fingerprint, metadata, shards,
  // manifest, index); the repack-* points sit inside the shard and index paths.
  const std::vector<std::string> points = {
      "before-rename:1",        "before-rename:6",          "after-rename:6",
      "before-rename:12",       "after-rename:9",           "repack-block-written:3",
      "repack-shard-written:4", "repack-shard-committed:2", "repack-checksums-update:5",
      "repack-index-built:1",   "repack-index-written:1",   "repack-checksums-update:10",
      "after-rename:24"};
  for (const auto& p : points) {
    CAPTURE(p);
    TempDir d;
    const std::string out = d / "out";
    int rc = Run({Bin("k3-repack"), TinySnapshot(), out}, {.env = {"K3_CRASH_AT=" + p}});
    CHECK(rc == 128 + SIGKILL);
    CheckNoPartial(out, ref);
    REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), out}) == 0);
    CHECK(TreeDiff(ref, ReadTree(out)) == "");
  }
}

TEST_CASE("kill -9 at random moments (two kills per trial until >= 12 real kills): rerun is byte-identical") {
  const auto ref = ReadTree(ReferenceDir());
  TempDir timing;
  double t0 = k3::NowSeconds();
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), timing / "out"}) == 0);
  const double full_s = k3::NowSeconds() - t0;
  std::mt19937 rng(12345);
  // A run that resumes after a kill has less left to do, so the second kill of a
  // trial aims earlier. Under a loaded machine timings drift, so trials continue
  // until enough processes really died mid-way (bounded, so the test still ends).
  // The timing run may have been slower than the trials (a cold cache, a busy
  // ctest -j2 neighbour): each run that finishes before its kill shrinks the
  // time scale, so the kills keep landing mid-way.
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  double scale = full_s;
  int killed = 0;
  int trials = 0;
  for (; trials < 48 && (killed < 12 || trials < 10); ++trials) {
    CAPTURE(trials);
    TempDir d;
    const std::string out = d / "out";
    for (int k = 0; k < 2; ++k) {
      // The clock starts at exec: a kill of the forked test before exec is no kill.
      pid_t pid = SpawnExeced({Bin("k3-repack"), TinySnapshot(), out});
      REQUIRE(pid > 0);
      std::this_thread::sleep_for(
          std::chrono::duration<double>(unit(rng) * scale * (k == 0 ? 0.9 : 0.5)));
      ::kill(pid, SIGKILL);
      // SIGKILL as the status: it was still running; an exit 0 means it finished first.
      const int st = Wait(pid);
      if (st == 128 + SIGKILL) {
        ++killed;
      } else {
        CHECK(st == 0);
        scale *= 0.7;
      }
      CheckNoPartial(out, ref);
    }
    REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), out}) == 0);
    CHECK(TreeDiff(ref, ReadTree(out)) == "");
  }
  MESSAGE("runs actually killed mid-way: " << killed << " of " << 2 * trials);
  CHECK(killed >= 12);
}

TEST_CASE("four concurrent disjoint passes into one DST: complete, valid, identical") {
  const auto ref = ReadTree(ReferenceDir());
  for (int round = 0; round < 3; ++round) {
    TempDir d;
    const std::string out = d / "out";
    std::vector<pid_t> pids;
    if (round < 2) {
      for (int w = 0; w < 4; ++w) {
        pids.push_back(Spawn({Bin("k3-repack"), TinySnapshot(), out, "--worker",
                              std::to_string(w) + "/4", "--threads", "1"}));
      }
    } else {
      for (const char* s : {"1,5,9", "2,6", "3,7,10,11", "4,8"}) {
        pids.push_back(Spawn({Bin("k3-repack"), TinySnapshot(), out, "--shards", s}));
      }
    }
    for (pid_t p : pids) CHECK(Wait(p) == 0);
    CHECK(TreeDiff(ref, ReadTree(out)) == "");
    CHECK(Run({Bin("k3-verify"), out}) == 0);
  }
}

TEST_CASE(
    "disk full: clean error, nothing partial published, rerun after freeing space completes") {
  const auto ref = ReadTree(ReferenceDir());
  TempDir d;
  const std::string mnt = d / "mnt";
  ::mkdir(mnt.c_str(), 0755);
  // K3_TEST_NO_MOUNT=1 exercises the fallback used where mounting is not allowed.
  const char* no_mount = std::getenv("K3_TEST_NO_MOUNT");
  const bool mounted = !(no_mount && std::string(no_mount) == "1") &&
                       ::mount("k3test", mnt.c_str(), "tmpfs", 0, "size=1500k") == 0;
  const std::string out = mnt + "/out";
  const std::string log = d / "log";
  if (mounted) {
    // Pre-flight: refused with the amount missing, DST not created.
    CHECK(Run({Bin("k3-repack"), TinySnapshot(), out}, {.log = log}) == 6);
    CHECK(ReadAll(log).find("missing") != std::string::npos);
    CHECK(!Exists(out));
    // Past the pre-flight: ENOSPC in the middle of the shards, found when a
    // shard's file is allocated (before it is read), naming it.
    CHECK(Run({Bin("k3-repack"), TinySnapshot(), out, "--no-space-check"}, {.log = log}) == 6);
    CHECK(ReadAll(log).find("bytes: No space left on device [no-space]") != std::string::npos);
    CheckNoPartial(out, ref);
    for (const auto& n : ListDir(out)) CHECK_MESSAGE(n.find(".tmp.") == std::string::npos, n);
    REQUIRE(::mount("k3test", mnt.c_str(), "tmpfs", MS_REMOUNT, "size=20m") == 0);
    CHECK(Run({Bin("k3-repack"), TinySnapshot(), out}) == 0);
    CHECK(TreeDiff(ref, ReadTree(out)) == "");
    ::umount(mnt.c_str());
  } else {
    // No mount permission: RLIMIT_FSIZE makes writes past 200 kB fail (EFBIG).
    MESSAGE("tmpfs mount not permitted; using RLIMIT_FSIZE instead");
    SpawnOptions o;
    o.log = log;
    o.pre_exec = [] {
      ::signal(SIGXFSZ, SIG_IGN);
      struct rlimit rl = {250000, 250000};
      ::setrlimit(RLIMIT_FSIZE, &rl);
    };
    // EFBIG is a failed system call: io, exit 10 (docs/errors.md), named in the message.
    CHECK(Run({Bin("k3-repack"), TinySnapshot(), out}, o) == 10);
    CHECK(ReadAll(log).find("File too large [io]") != std::string::npos);
    CheckNoPartial(out, ref);
    CHECK(Run({Bin("k3-repack"), TinySnapshot(), out}) == 0);
    CHECK(TreeDiff(ref, ReadTree(out)) == "");
  }
}

TEST_CASE("k3-verify reports every problem with file, tensor and offset") {
  TempDir d;
  const std::string out = Copy(ReferenceDir(), d / "out");
  // Three independent faults.
  std::string p2 = out + "/model-00002-of-000009.safetensors";
  std::string c = ReadAll(p2);
  size_t flip = c.size() - 100;  // inside the last expert
  c[flip] = static_cast<char>(c[flip] ^ 0x10);
  std::ofstream(p2, std::ios::binary) << c;
  REQUIRE(::unlink((out + "/model-00007-of-000009.safetensors").c_str()) == 0);
  std::ofstream(out + "/config.json", std::ios::app) << " ";
  std::string log = d / "log";
  int rc =
      Run({Bin("k3-verify"), out, "--full", "--source", TinySnapshot(), "--json"}, {.log = log});
  CHECK(rc != 0);
  std::string l = ReadAll(log);
  CHECK(l.find("\"offset\":" + std::to_string(flip)) != std::string::npos);
  CHECK(l.find("experts.") != std::string::npos);
  CHECK(l.find("container incomplete: 8 of 9") != std::string::npos);
  CHECK(l.find("config.json\",\"tensor\":\"\",\"offset\":-1,\"detail\":\"XXH3-128") !=
        std::string::npos);
  CHECK(l.find("\"ok\":false") != std::string::npos);
  // Without a source the flipped expert byte is still caught by its checksum.
  std::string log2 = d / "log2";
  CHECK(Run({Bin("k3-verify"), out}, {.log = log2}) != 0);
  std::string l2 = ReadAll(log2);
  CHECK(l2.find("model-00002-of-000009.safetensors: XXH3-128 is") != std::string::npos);
}

TEST_CASE("memory bounded: a matrix larger than the address-space limit streams through [slow]") {
  // The whole k3-tiny model plus one more shard holding a 1.2 GB BF16 matrix
  // (a bits-class name the model does not read) and a 300 MB expert, converted
  // and verified under RLIMIT_AS = 1 GiB: holding the matrix whole (or its f32
  // copy) would fail. The model is complete, so k3-verify has nothing to report
  // and must say ok.
  TempDir d("k3mem");
  const int64_t rows = 36864, cols = 16384;
  const int64_t ex_rows = 19200, ex_cols = 16384;  // ~315 MB U8
  const std::string src = TinyPlusBigShard(d / "src", rows, cols, ex_rows, ex_cols);
  const std::string out = d / "out";
  const std::string log = d / "log";
  // Measured peaks with 2 threads (pinned, so the bound does not scale with the
  // CPU count): k3-repack 226 MiB with its defaults, which under this limit
  // are a 384 MiB budget (3/8 of RLIMIT_AS; without it 768 MiB, whose buffers,
  // thread stacks and arenas do not fit 1 GiB of address space): 4 streams, 4
  // reads and 4 writes in flight each, 8 MiB blocks, at most 352 MiB of
  // buffers; idle streams' blocks lent to the big shard. k3-verify --full
  // 57 MiB (its f32 scratch is a few rows per thread; 88 MiB when it was a
  // whole block). The bound is a third of one whole-matrix buffer and below
  // its int8 output (576 MiB). A run also stays within its --mem-mb budget
  // plus what any run needs besides the pipeline's buffers (binary,
  // libraries, headers, thread stacks touched: k3-tiny converts in ~19 MB).
  constexpr uint64_t kStreamingRssBytes = 384ull << 20;
  constexpr uint64_t kBesidesBuffersBytes = 48ull << 20;
  auto field = [](const std::string& log, const std::string& key) -> uint64_t {
    const size_t at = log.find("\"" + key + "\":");
    REQUIRE_MESSAGE(at != std::string::npos, key);
    return std::stoull(log.substr(at + key.size() + 3));
  };
  SpawnOptions o;
  o.log = log;
  o.pre_exec = [] {
    struct rlimit rl = {1ull << 30, 1ull << 30};
    ::setrlimit(RLIMIT_AS, &rl);
  };
  int rc = Run({Bin("k3-repack"), src, out, "--json", "--verify-full", "--threads", "2"}, o);
  std::string l = ReadAll(log);
  INFO(l);
  REQUIRE(rc == 0);
  size_t at = l.find("\"peak_rss_bytes\":");
  REQUIRE(at != std::string::npos);
  uint64_t rss = std::stoull(l.substr(at + 17));
  MESSAGE("k3-repack peak RSS " << rss / (1 << 20) << " MiB for a "
                                << (rows * cols * 2) / (1 << 20) << " MiB matrix");
  // RLIMIT_AS already caps RSS at 1 GiB, so "under the limit" proves nothing:
  // streaming must stay well below it (a whole-matrix buffer is 1152 MiB).
  CHECK(rss < kStreamingRssBytes);
  CHECK(field(l, "mem_budget_bytes") == 384ull << 20);  // sized to the address space
  CHECK(l.find("3/8 of the address-space limit, RLIMIT_AS") != std::string::npos);
  CHECK(field(l, "buffer_bytes") <= field(l, "mem_budget_bytes"));
  CHECK(rss <= field(l, "mem_budget_bytes") + kBesidesBuffersBytes);
  // A budget below what the defaults use really bounds the run: 64 MiB leaves
  // 4 streams x 6 reads and 6 writes of 1 MiB blocks (60 MiB), and the peak stays
  // within it (the defaults above peak well over 64 + 48 MiB). Same bytes.
  {
    const std::string out64 = d / "out64";
    o.log = d / "log64";
    REQUIRE(Run({Bin("k3-repack"), src, out64, "--json", "--threads", "2", "--mem-mb", "64"}, o) == 0);
    const std::string l64 = ReadAll(o.log);
    INFO(l64);
    CHECK(field(l64, "mem_budget_bytes") == 64ull << 20);
    CHECK(field(l64, "buffer_bytes") <= 64ull << 20);
    CHECK(field(l64, "block_bytes") == 1ull << 20);
    const uint64_t rss64 = field(l64, "peak_rss_bytes");
    MESSAGE("k3-repack --mem-mb 64: peak RSS " << rss64 / (1 << 20) << " MiB");
    CHECK(rss64 <= (64ull << 20) + kBesidesBuffersBytes);
    // checksums.xxh128 holds every file's XXH3-128: equal manifests, equal bytes.
    CHECK(ReadAll(out64 + "/checksums.xxh128") == ReadAll(out + "/checksums.xxh128"));
    std::filesystem::remove_all(out64);
  }
  // The same file is also re-derived by k3-verify --full under the same limit:
  // it must succeed (exit 0, summary ok), not merely avoid a crash.
  o.log = d / "vlog";
  const int vrc = Run({Bin("k3-verify"), out, "--full", "--json", "--threads", "2", "--source", src}, o);
  const std::string vl = ReadAll(o.log);
  INFO("k3-verify output: " << vl);
  CHECK(vrc == 0);
  CHECK(vl.find("\"event\":\"summary\",\"ok\":true") != std::string::npos);
  const size_t vat = vl.find("\"peak_rss_bytes\":");
  REQUIRE(vat != std::string::npos);
  const uint64_t vrss = std::stoull(vl.substr(vat + 17));
  MESSAGE("k3-verify --full peak RSS " << vrss / (1 << 20) << " MiB");
  CHECK(vrss < kStreamingRssBytes);
  // ... and it really compared the big expert with the source.
  const size_t eat = vl.find("\"expert_bytes_compared\":");
  REQUIRE(eat != std::string::npos);
  CHECK(std::stoull(vl.substr(eat + 24)) >= uint64_t(ex_rows * ex_cols));
}

TEST_CASE(
    "k3-fixture small snapshot (multi-layer, ~270 MB): --bits 8 bytes vs the independent "
    "quantizer, verify --full [slow]") {
  TempDir d("k3small");
  const std::string src = d / "src";
  REQUIRE(Run({Bin("k3-fixture"), "--preset", "small", "--out", src, "-q"}) == 0);
  const std::string out = d / "out";
  REQUIRE(Run({Bin("k3-repack"), src, out}) == 0);
  ContainerCounts c = CheckContainer(out, 8, src);
  CHECK(c.quantized > 0);
  CHECK(c.experts > 0);
  CHECK(Run({Bin("k3-verify"), out, "--full", "--source", src}) == 0);
  if (Exists("/usr/bin/xxhsum")) {
    CHECK(std::system(
              ("cd '" + out + "' && /usr/bin/xxhsum -H2 -c --quiet checksums.xxh128").c_str()) ==
          0);
  }
}

// ---------------------------------------------------------------------------
// Data safety (docs/repack.md)

namespace {
// The file with its first `from` replaced by `to`.
void Replace(const std::string& path, const std::string& from, const std::string& to) {
  std::string c = ReadAll(path);
  size_t at = c.find(from);
  REQUIRE(at != std::string::npos);
  c.replace(at, from.size(), to);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << c;
}
}  // namespace

TEST_CASE("a config.json that contradicts the tensors is refused before anything is written") {
  TempDir d;
  const std::string src = Copy(TinySnapshot(), d / "src");
  Replace(src + "/config.json", "\"hidden_size\": 128", "\"hidden_size\": 256");
  const std::string out = d / "out", log = d / "log";
  CHECK(Run({Bin("k3-repack"), src, out}, {.log = log}) == 4);
  CHECK(!Exists(out));
  const std::string l = ReadAll(log);
  CHECK(l.find("contradicts the snapshot's tensors (145 problem(s); nothing was written)") != std::string::npos);
  // The problem text is k3-verify's: the same container with the same config.
  const std::string bad = Copy(ReferenceDir(), d / "bad");
  Replace(bad + "/config.json", "\"hidden_size\": 128", "\"hidden_size\": 256");
  const std::string vlog = d / "vlog";
  CHECK(Run({Bin("k3-verify"), bad}, {.log = vlog}) != 0);
  const std::string what = "'language_model.model.embed_tokens.weight': shape [2304,128], expected [2304,256] [corrupt]";
  CHECK(l.find(what) != std::string::npos);
  CHECK(ReadAll(vlog).find(what) != std::string::npos);
  // Into an existing container: left exactly as it was.
  const std::string full = Copy(ReferenceDir(), d / "full");
  auto before = ReadTree(full);
  CHECK(Run({Bin("k3-repack"), src, full}) == 4);
  CHECK(TreeDiff(before, ReadTree(full)) == "");
}

namespace {
// The value of a "key":"string" field in JSON text (no escapes in the value).
std::string JsonString(const std::string& text, const std::string& key) {
  size_t at = text.find("\"" + key + "\":\"");
  if (at == std::string::npos) return {};
  at += key.size() + 4;
  return text.substr(at, text.find('"', at) - at);
}
}  // namespace

TEST_CASE("--recheck finds a kept shard damaged after it was written; k3-verify prints the repair") {
  TempDir d;
  const std::string out = Copy(ReferenceDir(), d / "out");
  const std::string shard = out + "/model-00003-of-000009.safetensors";
  {
    std::string c = ReadAll(shard);
    c[c.size() - 7] = static_cast<char>(c[c.size() - 7] ^ 0x01);  // data bytes: header and size stay valid
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << c;
  }
  // A plain rerun keeps it (size and header are right) ...
  const std::string log = d / "log";
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), out, "--json"}, {.log = log}) == 0);
  CHECK(ReadAll(log).find("\"event\":\"shard_skipped\",\"shard\":\"model-00003-of-000009.safetensors\"") !=
        std::string::npos);
  // ... k3-verify finds it and says how to repair it ...
  const std::string vlog = d / "vlog";
  CHECK(Run({Bin("k3-verify"), out, "--source", TinySnapshot(), "--json"}, {.log = vlog}) == 5);
  const std::string repair = JsonString(ReadAll(vlog), "repair");
  CHECK(repair == "k3-repack " + TinySnapshot() + " " + out + " --recheck");
  const std::string tlog = d / "tlog";
  CHECK(Run({Bin("k3-verify"), out}, {.log = tlog}) == 5);
  CHECK(ReadAll(tlog).find("to repair: k3-repack SRC " + out + " --recheck") != std::string::npos);
  // ... and that command converts it again: the container is the reference again.
  REQUIRE(repair.rfind("k3-repack ", 0) == 0);
  const std::string rlog = d / "rlog";
  CHECK(std::system((Bin("k3-repack") + repair.substr(9) + " --json > '" + rlog + "' 2>&1").c_str()) == 0);
  CHECK(ReadAll(rlog).find("\"event\":\"shard_done\",\"shard\":\"model-00003-of-000009.safetensors\"") !=
        std::string::npos);
  CHECK(ReadAll(rlog).find(
            "\"event\":\"shard_skipped\",\"shard\":\"model-00001-of-000009.safetensors\","
            "\"detail\":\"complete, checksum and source verified\"") != std::string::npos);
  CHECK(TreeDiff(ReadTree(ReferenceDir()), ReadTree(out)) == "");
  CHECK(Run({Bin("k3-verify"), out}) == 0);
  // --verify-full rechecks too.
  {
    std::string c = ReadAll(shard);
    c[c.size() - 7] = static_cast<char>(c[c.size() - 7] ^ 0x01);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << c;
  }
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), out, "--verify-full"}) == 0);
  CHECK(TreeDiff(ReadTree(ReferenceDir()), ReadTree(out)) == "");
}

TEST_CASE("two identical repacks into one DST at once: the second waits per shard, both succeed") {
  const auto ref = ReadTree(ReferenceDir());
  bool waited = false;
  for (int round = 0; round < 3; ++round) {
    TempDir d;
    const std::string out = d / "out";
    std::vector<pid_t> pids;
    for (int k = 0; k < 2; ++k) {
      pids.push_back(Spawn({Bin("k3-repack"), TinySnapshot(), out}, {.log = d / ("log" + std::to_string(k))}));
    }
    for (pid_t p : pids) CHECK(Wait(p) == 0);
    for (int k = 0; k < 2; ++k) {
      std::string l = ReadAll(d / ("log" + std::to_string(k)));
      CHECK(l.find("error") == std::string::npos);
      waited = waited || l.find("is being converted by process ") != std::string::npos;
    }
    CHECK(TreeDiff(ref, ReadTree(out)) == "");
    CHECK(Run({Bin("k3-verify"), out}) == 0);
  }
  // Not guaranteed by the scheduler, only overwhelmingly likely: both start on shard 1.
  MESSAGE("a pass waited for the other in some round: " << waited);
}

TEST_CASE("k3-verify --full --source compares the copied files with the source's") {
  TempDir d;
  const std::string out = Copy(ReferenceDir(), d / "out");
  // Copied files that differ from the source's, with a manifest that agrees with
  // them: only the comparison with the source can find it.
  Replace(out + "/config.json", "\"rms_norm_eps\"", "\"rms_norm_eps\" ");
  Replace(out + "/tokenizer_config.json", "{", "{ ");
  const std::string manifest = out + "/checksums.xxh128";
  k3::repack::ChecksumManifest m = k3::repack::ReadChecksumManifest(manifest);
  for (const char* f : {"config.json", "tokenizer_config.json"}) m[f] = k3::repack::HashFileXxh128(out + "/" + f);
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << k3::repack::RenderChecksumManifest(m);
  CHECK(Run({Bin("k3-verify"), out}) == 0);
  const std::string log = d / "log";
  CHECK(Run({Bin("k3-verify"), out, "--full", "--source", TinySnapshot()}, {.log = log}) == 5);
  const std::string l = ReadAll(log);
  CHECK(l.find(out + "/config.json: offset ") != std::string::npos);
  CHECK(l.find("differs from the source's " + TinySnapshot() + "/config.json") != std::string::npos);
  CHECK(l.find("differs from the source's " + TinySnapshot() + "/tokenizer_config.json") != std::string::npos);
  // The repair k3-verify prints restores them from the source.
  CHECK(Run({Bin("k3-repack"), TinySnapshot(), out, "--recheck"}) == 0);
  CHECK(Run({Bin("k3-verify"), out, "--full", "--source", TinySnapshot()}) == 0);
}

TEST_CASE("k3-verify: a missing or truncated shard is one line, first, with its own exit code") {
  TempDir d;
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const std::string shard = "/model-00004-of-000009.safetensors";
  {
    const std::string out = Copy(ReferenceDir(), d / "missing");
    REQUIRE(::unlink((out + shard).c_str()) == 0);
    const std::string log = d / "log1";
    CHECK(Run({Bin("k3-verify"), out}, {.log = log}) == 3);
    const std::string l = ReadAll(log);
    CHECK(count(l, "PROBLEM ") == 1);
    CHECK(l.find("PROBLEM " + out + shard + ": shard missing (container incomplete: 8 of 9 shards present)") !=
          std::string::npos);
    CHECK(l.find("1 problem(s) (and ") != std::string::npos);
  }
  {
    const std::string out = Copy(ReferenceDir(), d / "truncated");
    REQUIRE(::truncate((out + shard).c_str(), 5000) == 0);
    const std::string log = d / "log2";
    CHECK(Run({Bin("k3-verify"), out, "--json"}, {.log = log}) == 4);
    const std::string l = ReadAll(log);
    CHECK(count(l, "\"event\":\"problem\"") == 1);
    CHECK(l.find("\"code\":\"truncated\"") < l.find("\"event\":\"summary\""));
    // Progress: one event per file hashed, before the summary.
    CHECK(count(l, "\"event\":\"progress\"") == 15);
    CHECK(l.find("\"files_done\":15,\"files_total\":15") != std::string::npos);
  }
  {
    // Two independent faults: both listed, and a line per file.
    const std::string out = Copy(ReferenceDir(), d / "two");
    REQUIRE(::truncate((out + shard).c_str(), 5000) == 0);
    std::string p2 = out + "/model-00002-of-000009.safetensors";
    std::string c = ReadAll(p2);
    c[c.size() - 100] = static_cast<char>(c[c.size() - 100] ^ 0x10);
    std::ofstream(p2, std::ios::binary | std::ios::trunc) << c;
    const std::string log = d / "log3";
    CHECK(Run({Bin("k3-verify"), out}, {.log = log}) == 4);
    const std::string l = ReadAll(log);
    CHECK(count(l, "PROBLEM ") == 2);
    CHECK(l.find("per file:\n  " + p2 + ": 1 problem(s) (checksum-mismatch)\n  " + out + shard +
                 ": 1 problem(s) (truncated)") != std::string::npos);
  }
}

TEST_CASE("a partly converted container is named as such when a model is opened from it") {
  TempDir d;
  const std::string out = d / "out";
  // Two of the nine output shards, as an interrupted or partial multi-host run leaves it.
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), out, "--shards", "1,2"}) == 0);
  try {
    k3::Snapshot::OpenOrThrow(out);
    FAIL("opened");
  } catch (const k3::Error& e) {
    CHECK(e.code() == k3::ErrorCode::kNotFound);
    CHECK(std::string(e.what()).find("incomplete container: 2 of 9 shards; rerun k3-repack SRC " + out) !=
          std::string::npos);
  }
  REQUIRE(Run({Bin("k3-repack"), TinySnapshot(), out}) == 0);
  CHECK_NOTHROW(k3::Snapshot::OpenOrThrow(out));
}

namespace {

// Flips the lowest bit of one byte in the middle of the largest routed-expert
// tensor of `shard` (MXFP4 bytes: any value is valid, and experts are copied
// byte for byte, so k3-verify --full sees the difference). Header and size stay.
void FlipExpertByte(const std::string& shard) {
  uint64_t at = 0;
  {
    k3::SafetensorsFile f = k3::SafetensorsFile::OpenOrThrow(shard);
    const k3::TensorInfo* big = nullptr;
    for (const auto& t : f.tensors()) {
      if (t.name.find(".experts.") != std::string::npos && (!big || t.nbytes() > big->nbytes()))
        big = &t;
    }
    REQUIRE(big != nullptr);
    at = f.AbsoluteOffset(*big) + big->nbytes() / 2;
  }
  const int fd = ::open(shard.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  char c = 0;
  REQUIRE(::pread(fd, &c, 1, static_cast<off_t>(at)) == 1);
  c = static_cast<char>(c ^ 0x01);
  REQUIRE(::pwrite(fd, &c, 1, static_cast<off_t>(at)) == 1);
  ::close(fd);
}

bool HasEntryStartingWith(const std::string& dir, const std::string& prefix) {
  for (const auto& n : ListDir(dir)) {
    if (n.starts_with(prefix)) return true;
  }
  return false;
}

}  // namespace

TEST_CASE(
    "a source shard that changes while it is read is not published; resume and --recheck repair") {
  TempDir d;
  const std::string src = Copy(TinySnapshot(), d / "src");
  const std::string out = d / "out";
  const std::string shard3 = "model-00003-of-000009.safetensors";
  // Shards 3 and 4 at once, each source read delayed (a test-only flag), so
  // the source can be rewritten while shard 3 is read.
  const std::string log = d / "log";
  const pid_t pid =
      SpawnExeced({Bin("k3-repack"), src, out, "--json", "--shards", "3,4", "--streams", "2",
                   "--reads", "1", "--block-mib", "1", "--test-read-delay-ms", "40"},
                  {.log = log});
  REQUIRE(pid > 0);
  bool seen = false;
  for (int i = 0; i < 6000 && !seen; ++i) {  // <= 30 s
    seen = HasEntryStartingWith(out, shard3 + ".tmp.");
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(seen);
  FlipExpertByte(src + "/model-00003-of-000011.safetensors");
  CHECK(Wait(pid) == 5);  // checksum-mismatch: docs/errors.md
  const std::string l = ReadAll(log);
  INFO(l);
  CHECK(l.find("\"event\":\"shard_failed\",\"shard\":\"" + shard3 + "\"") != std::string::npos);
  CHECK(l.find("source shard changed while it was converted (mtime ") != std::string::npos);
  CHECK(l.find(src + "/model-00003-of-000011.safetensors") != std::string::npos);
  // Nothing of shard 3 published or left behind; shard 4 went on and was published.
  CHECK_FALSE(Exists(out + "/" + shard3));
  CHECK_FALSE(HasEntryStartingWith(out, shard3 + ".tmp."));
  CHECK(l.find("\"event\":\"shard_done\",\"shard\":\"model-00004-of-000009.safetensors\"") !=
        std::string::npos);
  CHECK(Exists(out + "/model-00004-of-000009.safetensors"));
  CHECK(l.find("\"event\":\"error\",\"code\":\"checksum-mismatch\"") != std::string::npos);

  // Resume: the missing shard is converted from the source as it is now.
  REQUIRE(Run({Bin("k3-repack"), src, out}) == 0);
  CHECK(Run({Bin("k3-verify"), out, "--full", "--source", src}) == 0);

  // A source that changes after its shard was published (what the old binary
  // let through mid-read): k3-verify --full finds it and its repair, --recheck,
  // re-reads the source against k3-repack.sources and converts that shard again.
  FlipExpertByte(src + "/model-00005-of-000011.safetensors");
  const std::string vlog = d / "vlog";
  CHECK(Run({Bin("k3-verify"), out, "--full", "--source", src, "--json"}, {.log = vlog}) == 5);
  const std::string repair = JsonString(ReadAll(vlog), "repair");
  REQUIRE(repair == "k3-repack " + src + " " + out + " --recheck");
  const std::string rlog = d / "rlog";
  CHECK(std::system(
            (Bin("k3-repack") + repair.substr(9) + " --json > '" + rlog + "' 2>&1").c_str()) == 0);
  const std::string r = ReadAll(rlog);
  INFO(r);
  CHECK(r.find("\"event\":\"shard_done\",\"shard\":\"model-00005-of-000009.safetensors\"") !=
        std::string::npos);
  CHECK(r.find("model-00005-of-000011.safetensors changed since it was converted") !=
        std::string::npos);
  CHECK(r.find("\"event\":\"shard_skipped\",\"shard\":\"model-00004-of-000009.safetensors\","
               "\"detail\":\"complete, checksum and source verified\"") != std::string::npos);
  CHECK(Run({Bin("k3-verify"), out, "--full", "--source", src}) == 0);
}

namespace {

// What cp or rsync does to a source shard: a new file (new inode, new times)
// renamed over the old name, with the same size; `flip` changes one expert byte.
void ReplaceSourceShard(const std::string& shard, bool flip) {
  const std::string fresh = shard + ".new";
  REQUIRE(std::system(("cp '" + shard + "' '" + fresh + "'").c_str()) == 0);
  if (flip) FlipExpertByte(fresh);
  REQUIRE(::rename(fresh.c_str(), shard.c_str()) == 0);
}

std::string SkippedDetail(const std::string& log, const std::string& shard) {
  const std::string key = "\"event\":\"shard_skipped\",\"shard\":\"" + shard + "\",\"detail\":\"";
  const size_t at = log.find(key);
  if (at == std::string::npos) return "(not skipped)";
  const size_t from = at + key.size();
  return log.substr(from, log.find('"', from) - from);
}

}  // namespace

TEST_CASE("a plain rerun converts again a shard whose source was replaced since it was converted") {
  TempDir d;
  const std::string src = Copy(TinySnapshot(), d / "src");
  const std::string out = d / "out";
  REQUIRE(Run({Bin("k3-repack"), src, out}) == 0);
  const std::string stats = ReadAll(out + "/k3-repack.source-stats");
  CHECK(stats.find("  model-00006-of-000009.safetensors\n") != std::string::npos);

  // Shard 6's source: same size, one expert byte changed, a new inode and
  // mtime. Shard 4's: the same bytes under a new inode (a copy), which a
  // stat cannot tell from an edit, so its bytes are re-read and it is kept.
  ReplaceSourceShard(src + "/model-00006-of-000011.safetensors", /*flip=*/true);
  ReplaceSourceShard(src + "/model-00004-of-000011.safetensors", /*flip=*/false);
  const std::string log = d / "log";
  REQUIRE(Run({Bin("k3-repack"), src, out, "--json"}, {.log = log}) == 0);
  const std::string l = ReadAll(log);
  INFO(l);
  CHECK(l.find("\"event\":\"shard_done\",\"shard\":\"model-00006-of-000009.safetensors\"") !=
        std::string::npos);
  CHECK(l.find("source stat ") != std::string::npos);
  CHECK(l.find("model-00006-of-000011.safetensors changed since it was converted") !=
        std::string::npos);
  const std::string kept4 = SkippedDetail(l, "model-00004-of-000009.safetensors");
  CHECK(kept4.find("its source was re-read after ") != std::string::npos);
  CHECK(kept4.find("inode ") != std::string::npos);
  CHECK(kept4.find("same bytes") != std::string::npos);
  CHECK(SkippedDetail(l, "model-00005-of-000009.safetensors") == "complete and valid");
  CHECK(Run({Bin("k3-verify"), out, "--full", "--source", src}) == 0);

  // Both new stats were recorded: the next rerun reads no source.
  const std::string log2 = d / "log2";
  REQUIRE(Run({Bin("k3-repack"), src, out, "--json"}, {.log = log2}) == 0);
  const std::string l2 = ReadAll(log2);
  CHECK(SkippedDetail(l2, "model-00004-of-000009.safetensors") == "complete and valid");
  CHECK(SkippedDetail(l2, "model-00006-of-000009.safetensors") == "complete and valid");

  // A damaged record is named, not trusted.
  {
    std::ofstream bad(out + "/k3-repack.source-stats", std::ios::app);
    bad << "12 nonsense\n";
  }
  const std::string log3 = d / "log3";
  CHECK(Run({Bin("k3-repack"), src, out}, {.log = log3}) != 0);
  CHECK(ReadAll(log3).find("k3-repack.source-stats") != std::string::npos);
}
