// Unit tests of lib/repack's pure parts: §7.1 classification, expert order keys,
// shard names, --bits values, the xxh128 manifest format (checked
// against a digest printed by the real xxhsum 0.8.1), and the fingerprint.
#include "k3/repack/repack.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/repack/checksums.h"
#include "k3/repack/classify.h"
#include "k3/repack/container.h"

using namespace k3::repack;

TEST_CASE("classification follows spec §7.1, first matching rule") {
  // Layers 0,1,2 KDA; 3 MLA.
  const std::vector<bool> kda = {true, true, true, false};
  auto c = [&](const std::string& n) { return ClassifyTensor("language_model." + n, kda); };
  CHECK(ClassifyTensor("vision_tower.blocks.0.w", kda) == TensorRole::kDrop);
  CHECK(ClassifyTensor("language_model.mm_projector.proj.weight", kda) == TensorRole::kDrop);
  CHECK(c("model.layers.1.block_sparse_moe.experts.7.w2.weight_scale") == TensorRole::kExpert);
  CHECK(c("lm_head.weight") == TensorRole::kQuantHead);
  CHECK(ClassifyTensor("lm_head.weight", kda) == TensorRole::kQuantHead);  // no prefix
  for (const char* leaf : {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"}) {
    CHECK(c(std::string("model.layers.3.self_attn.") + leaf + ".weight") == TensorRole::kQuantMla);
  }
  for (const char* leaf : {"q_proj", "k_proj", "v_proj"}) {
    CHECK(c(std::string("model.layers.1.self_attn.") + leaf + ".weight") == TensorRole::kQuantBits);
  }
  // o/g: by layer type.
  CHECK(c("model.layers.2.self_attn.o_proj.weight") == TensorRole::kQuantBits);
  CHECK(c("model.layers.2.self_attn.g_proj.weight") == TensorRole::kQuantBits);
  CHECK(c("model.layers.3.self_attn.o_proj.weight") == TensorRole::kQuantMla);
  CHECK(c("model.layers.3.self_attn.g_proj.weight") == TensorRole::kQuantMla);
  CHECK_THROWS_AS(c("model.layers.9.self_attn.o_proj.weight"), k3::Error);
  // Other self_attn weights stay as they are.
  for (const char* n : {"q_conv1d.weight", "f_a_proj.weight", "f_b_proj.weight", "b_proj.weight",
                        "o_norm.weight", "q_a_layernorm.weight", "A_log", "dt_bias"}) {
    CHECK(c(std::string("model.layers.1.self_attn.") + n) == TensorRole::kPassthrough);
  }
  for (const char* n : {"block_sparse_moe.routed_expert_down_proj.weight",
                        "block_sparse_moe.routed_expert_up_proj.weight",
                        "block_sparse_moe.shared_experts.gate_proj.weight",
                        "block_sparse_moe.shared_experts.up_proj.weight",
                        "block_sparse_moe.shared_experts.down_proj.weight", "mlp.gate_proj.weight",
                        "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
    CHECK(c(std::string("model.layers.1.") + n) == TensorRole::kQuantBits);
  }
  for (const char* n :
       {"model.layers.1.block_sparse_moe.gate.weight",
        "model.layers.1.block_sparse_moe.gate.e_score_correction_bias",
        "model.layers.1.block_sparse_moe.routed_expert_norm.weight", "model.embed_tokens.weight",
        "model.norm.weight", "model.layers.0.mlp_res_proj.weight",
        "model.output_attn_res_norm.weight"}) {
    CHECK(c(n) == TensorRole::kPassthrough);
  }
}

TEST_CASE("expert order key: id, then w1<w2<w3, packed before scale") {
  auto k = [](const std::string& n) {
    return ParseExpertName("language_model.model.layers.4.block_sparse_moe.experts." + n);
  };
  REQUIRE(k("12.w3.weight_packed"));
  CHECK(k("12.w3.weight_packed")->expert == 12);
  CHECK(k("12.w3.weight_packed")->matrix == 3);
  CHECK(*k("2.w3.weight_scale") < *k("10.w1.weight_packed"));
  CHECK(*k("2.w1.weight_scale") < *k("2.w2.weight_packed"));
  CHECK(*k("2.w1.weight_packed") < *k("2.w1.weight_scale"));
  CHECK(!k("2.w4.weight_packed"));
  CHECK(!k("x.w1.weight_packed"));
  CHECK(!k("2.w1.bias"));
}

TEST_CASE("shard names") {
  auto s = ParseShardName("model-00094-of-000096.safetensors");
  REQUIRE(s);
  CHECK(s->number == 94);
  CHECK(s->total == 96);
  CHECK(FormatShardName(3, 94) == "model-00003-of-000094.safetensors");
  CHECK(!ParseShardName("model-00003-of-000094.safetensors.tmp.12"));
  CHECK(!ParseShardName("model-0000x-of-000094.safetensors"));
  CHECK(!ParseShardName("model-00000-of-000094.safetensors"));
  CHECK(!ParseShardName("other.safetensors"));
}

TEST_CASE("--bits, --mla-bits and --head-bits values") {
  CHECK_THROWS_AS(ValidateBits({32, 8, 8}), k3::Error);
  CHECK_NOTHROW(ValidateBits({4, 8, 8}));
  CHECK_NOTHROW(ValidateBits({8, 4, 4}));
  // Only the two container layouts: everything in between is refused, naming the flag.
  for (int v : {0, 1, 3, 5, 6, 7, 16}) {
    CHECK_THROWS_WITH_AS(ValidateBits({v, 8, 8}), doctest::Contains(("--bits " + std::to_string(v)).c_str()), k3::Error);
    CHECK_THROWS_WITH_AS(ValidateBits({8, v, 8}), doctest::Contains("--mla-bits"), k3::Error);
    CHECK_THROWS_WITH_AS(ValidateBits({8, 8, v}), doctest::Contains("--head-bits"), k3::Error);
  }
}

TEST_CASE("XXH3-128 digests in xxhsum's canonical form; manifest round trip") {
  // `printf 'hello\n' | xxhsum -H2` (xxhsum 0.8.1) prints this digest.
  const std::string hello = "hello\n";
  CHECK(Xxh128Hex(std::as_bytes(std::span(hello.data(), hello.size()))) ==
        "6bba86c7e069f56d5a10b435f1c8e49c");
  Xxh128 h;  // streaming == one shot
  h.Update(std::as_bytes(std::span(hello.data(), 2)));
  h.Update(std::as_bytes(std::span(hello.data() + 2, 4)));
  CHECK(h.HexDigest() == "6bba86c7e069f56d5a10b435f1c8e49c");
  ChecksumManifest m = {{"b.json", std::string(32, 'a')}, {"a.bin", std::string(32, '0')}};
  CHECK(RenderChecksumManifest(m) ==
        std::string(32, '0') + "  a.bin\n" + std::string(32, 'a') + "  b.json\n");
}

TEST_CASE("fingerprint: deterministic text, round trip, differences named") {
  Fingerprint f;
  f.bits = {8, 8, 8};
  f.output_shards = 94;
  f.source_index_xxh128 = std::string(32, '1');
  f.source_shards = {{"model-00001-of-000096.safetensors", 123, std::string(32, '2')}};
  std::string text = f.Render();
  CHECK(text.back() == '\n');
  Fingerprint g = Fingerprint::ParseOrThrow(text, "fp");
  CHECK(g.Render() == text);
  CHECK(g.Difference(f).empty());
  Fingerprint h = f;
  h.bits.bits = 4;
  CHECK(f.Difference(h).find("--bits 4") != std::string::npos);
  h = f;
  h.source_shards[0].size = 124;
  CHECK(f.Difference(h).find("different source") != std::string::npos);
  CHECK_THROWS_AS(Fingerprint::ParseOrThrow("{}", "fp"), k3::Error);
}

TEST_CASE("pipeline plan: defaults sized to the memory budget; given values kept or refused") {
  constexpr uint64_t MiB = 1ull << 20;
  // Per stream, by hand: read pool (2 queued + reads - 1), output pool of 2 half
  // blocks, staging writes + 1; one stream queues 4 per stage.
  CHECK(BlocksPerStream(4, 8, 8) == 9 + 1 + 9);
  CHECK(BlocksPerStream(2, 2, 2) == 3 + 1 + 3);
  CHECK(BlocksPerStream(1, 1, 1) == 4 + 2 + 2);
  CHECK(PipelineBufferBytes(4, 8, 8, 4 * MiB) == 4 * 19 * 4 * MiB);

  RepackOptions o;
  // Everything automatic, plenty of memory: 8 MiB blocks with as many reads
  // and writes in flight as 768 MiB holds: 4 x (2 x 10 + 3) x 8 MiB = 736 MiB
  // (11 would be 800).
  PipelinePlan p = ResolvePipeline(o, 96, 64ull << 30);
  CHECK(p.streams == 4);
  CHECK(p.reads == 10);
  CHECK(p.writes == 10);
  CHECK(p.block_bytes == 8 * MiB);
  CHECK(p.budget_bytes == 768 * MiB);
  CHECK(!p.budget_given);
  CHECK(p.buffer_bytes == 736 * MiB);
  CHECK(p.Describe().find("4 stream(s) x 10 read(s) and 10 write(s) in flight, 8 MiB blocks: buffers <= "
                          "736 MiB of a 768 MiB budget (automatic") != std::string::npos);
  // Never more streams than shards to convert; fewer streams, more in flight.
  p = ResolvePipeline(o, 3, 64ull << 30);
  CHECK(p.streams == 3);
  CHECK(p.reads == 14);  // 3 x 31 x 8 MiB = 744 MiB
  CHECK(p.buffer_bytes == 744 * MiB);
  // One stream (a pool of 4 queued reads, 4 quantized blocks): the automatic
  // counts stop at 16 in flight, well inside the budget (16 + 3 + 2 + 17 blocks).
  p = ResolvePipeline(o, 1, 64ull << 30);
  CHECK(p.streams == 1);
  CHECK(p.reads == kDefaultReadsInFlight);
  CHECK(p.writes == kDefaultWritesInFlight);
  CHECK(p.buffer_bytes == 38 * 8 * MiB);
  CHECK(ResolvePipeline(o, 0, 64ull << 30).streams == 1);
  // A small machine: a quarter of MemAvailable (1 GiB -> 256 MiB); 8 MiB blocks
  // would leave 2 in flight, so 4 MiB with 6 (4 x 15 x 4 MiB = 240 MiB).
  p = ResolvePipeline(o, 96, 1ull << 30);
  CHECK(p.budget_bytes == 256 * MiB);
  CHECK(p.block_bytes == 4 * MiB);
  CHECK(p.reads == 6);
  CHECK(p.buffer_bytes == 240 * MiB);
  // Under an address-space limit of 1 GiB: 3/8 of it, 384 MiB
  // (4 x (2 x 4 + 3) x 8 MiB = 352 MiB), and the line says why.
  p = ResolvePipeline(o, 96, 64ull << 30, 1ull << 30);
  CHECK(p.budget_bytes == 384 * MiB);
  CHECK(p.budget_by_address_space);
  CHECK(p.block_bytes == 8 * MiB);
  CHECK(p.reads == 4);
  CHECK(p.buffer_bytes == 352 * MiB);
  CHECK(p.Describe().find("384 MiB budget (automatic: 3/8 of the address-space limit, RLIMIT_AS)") !=
        std::string::npos);
  // A limit that leaves more than the default changes nothing.
  p = ResolvePipeline(o, 96, 64ull << 30, 8ull << 30);
  CHECK(p.budget_bytes == 768 * MiB);
  CHECK(!p.budget_by_address_space);
  // A budget too small for 4 in flight even at 1 MiB: 3 (4 x 9 x 1 MiB = 36 MiB).
  o.mem_budget_bytes = 40 * MiB;
  p = ResolvePipeline(o, 96, 64ull << 30);
  CHECK(p.budget_given);
  CHECK(p.block_bytes == MiB);
  CHECK(p.reads == 3);
  CHECK(p.writes == 3);
  CHECK(p.buffer_bytes == 36 * MiB);
  CHECK(p.Describe().find("(--mem-mb)") != std::string::npos);
  // Smaller still: one in flight, then streams go (1 stream: 4 + 2 + 2 blocks).
  o.mem_budget_bytes = 16 * MiB;
  p = ResolvePipeline(o, 96, 64ull << 30);
  CHECK(p.streams == 3);  // 3 x (2 + 1 + 2) x 1 MiB = 15 MiB
  CHECK(p.reads == 1);
  CHECK(p.buffer_bytes == 15 * MiB);
  // Given values are never changed: what fits is kept, what does not is refused
  // naming --mem-mb and what it would need.
  o.mem_budget_bytes = 512 * MiB;
  o.streams = 4;
  o.reads_in_flight = 4;
  o.writes_in_flight = 4;
  o.block_bytes = 8 * MiB;
  p = ResolvePipeline(o, 96, 64ull << 30);
  CHECK(p.buffer_bytes == 4 * 11 * 8 * MiB);
  CHECK(p.Describe().find("(given)") != std::string::npos);
  o.block_bytes = 16 * MiB;  // 704 MiB
  try {
    ResolvePipeline(o, 96, 64ull << 30);
    FAIL("expected an error");
  } catch (const k3::Error& e) {
    CHECK(e.code() == k3::ErrorCode::kInvalidArgument);
    CHECK(std::string(e.what()).find("--mem-mb 512") != std::string::npos);
    CHECK(std::string(e.what()).find("need 704 MiB") != std::string::npos);
  }
  // Without --mem-mb the flags given are taken as asked, and said to exceed the budget.
  o.mem_budget_bytes = 0;
  o.block_bytes = 32 * MiB;
  p = ResolvePipeline(o, 96, 64ull << 30);
  CHECK(p.buffer_bytes == 1408 * MiB);
  CHECK(p.Describe().find("exceed") != std::string::npos);
  // Only the block given: the automatic counts shrink around it.
  o = RepackOptions{};
  o.block_bytes = 16 * MiB;
  p = ResolvePipeline(o, 96, 64ull << 30);
  CHECK(p.block_bytes == 16 * MiB);
  CHECK(p.reads == 4);  // 4 x 11 x 16 MiB = 704 MiB
  CHECK(p.buffer_bytes == 704 * MiB);
}
