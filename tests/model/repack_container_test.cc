// Containers written by the real k3-repack (lib/repack): the engine must give
// bit-identical logits from the container, from its K3_MMAP mapping and from the
// snapshot quantized at load, and match the int8/int4 oracle goldens with f32
// activations: a container is only a faster way to the same model.
#include "k3/repack/repack.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "k3/core/file.h"
#include "k3/model/model.h"
#include "k3_test_support.h"

using namespace k3;
using k3::test::RelL2;
using namespace k3::model;
namespace fs = std::filesystem;

namespace {

const std::string kOracle = std::string(K3_TEST_DATA_DIR) + "/oracle";
const std::string kTiny = kOracle + "/k3-tiny";
const std::vector<int32_t> kPrompt = {2048, 2051, 765,  1888, 786, 2053, 788,  2033, 691, 295,
                                      278,  603,  1682, 2052, 763, 2053, 2051, 2014, 428, 2053};

std::vector<float> Logits(const std::string& dir, LoadOptions lo, bool idot) {
  lo.progress = false;
  auto m = Model::LoadOrThrow(dir, lo);
  RunOptions ro;
  ro.idot = idot;
  Session s(*m, ro);
  std::vector<float> logits(kPrompt.size() * static_cast<size_t>(m->config().vocab_size));
  ForwardOutputs out;
  out.logits_all = logits.data();
  s.Forward(kPrompt, out);
  return logits;
}

}  // namespace

TEST_CASE("k3-repack container == snapshot == mmap, and matches the quantized goldens") {
  for (int bits : {8, 4}) {
    const std::string dst =
        (fs::temp_directory_path() /
         ("k3_model_repack_" + std::to_string(::getpid()) + "_" + std::to_string(bits)))
            .string();
    fs::remove_all(dst);
    repack::RepackOptions ro;
    ro.src = kTiny;
    ro.dst = dst;
    ro.bits.bits = bits;
    ro.bits.mla_bits = 8;
    ro.bits.head_bits = 8;
    ro.space_check = false;
    repack::RunRepack(ro, [](const repack::RepackEvent&) {});

    LoadOptions snap_opts;
    snap_opts.bits = bits;
    snap_opts.mla_bits = 8;
    snap_opts.head_bits = 8;
    snap_opts.bits_explicit = true;
    LoadOptions cont_opts;  // K3_BITS unset: the container's bits are used
    LoadOptions mmap_opts;
    mmap_opts.mmap = true;
    for (bool idot : {false, true}) {
      INFO("bits " << bits << " idot " << idot);
      std::vector<float> a = Logits(kTiny, snap_opts, idot);
      std::vector<float> b = Logits(dst, cont_opts, idot);
      std::vector<float> c = Logits(dst, mmap_opts, idot);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
      CHECK(std::memcmp(b.data(), c.data(), b.size() * 4) == 0);
      if (!idot) {
        std::string golden =
            kOracle + (bits == 8 ? "/k3-tiny.int8.golden" : "/k3-tiny.int4.golden");
        std::string bytes = ReadFileOrThrow(golden + "/logits.f32", 1 << 24);
        std::vector<float> g(bytes.size() / 4);
        std::memcpy(g.data(), bytes.data(), bytes.size());
        REQUIRE(g.size() == b.size());
        double e = RelL2(b, g);
        MESSAGE("container bits " << bits << ": logits rel-L2 vs golden " << e);
        CHECK(e <= k3::test::kGoldenRelL2);
      }
    }
    fs::remove_all(dst);
  }
}
