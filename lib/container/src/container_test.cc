#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstring>
#include <string>

#include "k3/container/safetensors.h"
#include "k3/container/snapshot.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3_test_support.h"

using namespace k3;

namespace {
std::string TempDir() { return test::MakeTempDir("k3_container_test"); }
const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny";
}  // namespace

TEST_CASE("writer output round-trips through the reader") {
  std::string dir = TempDir();
  std::string path = JoinPath(dir, "a.safetensors");
  std::vector<PlannedTensor> plan = {
      {"x", DType::kF32, {2, 3}}, {"y", DType::kU8, {5}}, {"z", DType::kBF16, {1}}};
  SafetensorsWriter w(path, plan, {{"format", "pt"}});
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  w.Write(std::as_bytes(std::span(x)));
  uint8_t y[5] = {1, 2, 3, 4, 5};
  w.Write(std::as_bytes(std::span(y)));
  CHECK_THROWS_AS(w.Commit(), Error);  // z still missing
  uint16_t z = 0x3f80;
  w.Write(std::as_bytes(std::span(&z, 1)));
  w.Commit();

  SafetensorsFile f = SafetensorsFile::OpenOrThrow(path);
  CHECK(f.header().data_offset() % 8 == 0);
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.tensors()[0].name == "x");
  CHECK(f.header().metadata().at(0).second == "pt");
  CHECK(f.ReadF32OrThrow(*f.Find("x")) == x);
  CHECK(f.ReadF32OrThrow(*f.Find("z"))[0] == 1.0f);
  CHECK_THROWS_AS(f.ReadF32OrThrow(*f.Find("y")), Error);
}

TEST_CASE("oracle snapshot opens with prefix and finds tensors") {
  Snapshot s = Snapshot::OpenOrThrow(kOracle);
  CHECK(s.prefix() == "language_model.");
  CHECK(s.shards().size() == 11);
  auto r = s.FindOrThrow("model.norm.weight");
  CHECK(r.info->dtype == DType::kBF16);
  CHECK(s.Find("model.layers.1.block_sparse_moe.experts.3.w1.weight_packed").has_value());
  CHECK_FALSE(s.Find("nope").has_value());
  try {
    s.FindOrThrow("model.layers.99.input_layernorm.weight");
    FAIL("expected kNotFound");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kNotFound);
  }
  uint64_t total = 0;
  for (const auto& f : s.shards())
    for (const auto& t : f.tensors()) total += t.nbytes();
  CHECK(s.index_total_size().value() == total);
}
