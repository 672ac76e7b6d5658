// Capacity measured at start (--cluster-ram-gb auto, --cluster-disk-gbps
// auto): the disk read counts expert bytes only, skips the holes of a
// prepared share, stops at its byte cap; the RAM is the cache size given.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>

#include "k3/cluster/cluster.h"
#include "k3/fixture/spec.h"
#include "k3/fixture/writer.h"

using namespace k3;
using namespace k3::cluster;

TEST_CASE("capacity: the disk read covers expert bytes, skips another rank's holes, keeps its caps") {
  const std::string dir = "/tmp/k3_cluster_capacity_" + std::to_string(::getpid());
  fixture::Preset preset = fixture::PresetOrThrow("tiny");
  fixture::WriteFixtureOrThrow(preset, dir + "/full", {});
  const Snapshot snap = Snapshot::OpenOrThrow(dir + "/full");
  const ModelConfig c = ModelConfig::ParseOrThrow(snap.config_json(), "config.json");
  const model::ExpertTable table(snap, c);
  const uint64_t all = table.slot_bytes() * static_cast<uint64_t>(c.num_moe_layers() * c.num_experts);

  // Everything: each part read once, rounded out to 4 KiB blocks.
  const DiskRate whole = MeasureDiskRate(table, 60, uint64_t(1) << 40, 2);
  CHECK(whole.errors == 0);
  CHECK(whole.bytes >= all);
  CHECK(whole.bytes <= all + uint64_t(c.num_moe_layers() * c.num_experts) * 6 * 2 * 4096);
  CHECK(whole.bytes_per_s > 0);
  MESSAGE("tiny fixture: " << whole.bytes << " bytes in " << whole.seconds << " s, direct " << whole.direct);

  // The byte cap stops the read (one read per thread may pass it).
  const DiskRate capped = MeasureDiskRate(table, 60, 64 << 10, 1);
  CHECK(capped.bytes >= (64u << 10));
  CHECK(capped.bytes < whole.bytes);

  // On rank 1's prepared share, rank 2's experts are holes: not read.
  const Placement p = Placement::Compute(c, {1, 2}, {{}, {}});
  PrepareShareOrThrow(dir + "/full", p, 1, dir + "/r1");
  const Snapshot s1 = Snapshot::OpenOrThrow(dir + "/r1");
  const model::ExpertTable t1(s1, c);
  const DiskRate share = MeasureDiskRate(t1, 60, uint64_t(1) << 40, 2);
  CHECK(share.bytes > 0);
  CHECK(share.bytes < whole.bytes * 3 / 4);

  // MeasureCapacity: only what options.measure_* name; two significant digits.
  ClusterOptions o;
  o.measure_ram = true;
  Capacity given{123, 456};
  Capacity m = MeasureCapacity(table, 387654321, given, o, 1);
  CHECK(m.ram_bytes == 380000000);
  CHECK(m.disk_bytes_per_s == 456);
  o.measure_ram = false;
  o.measure_disk = true;
  m = MeasureCapacity(table, 387654321, given, o, 1);
  CHECK(m.ram_bytes == 123);
  CHECK(m.disk_bytes_per_s > 0);
  std::system(("rm -rf " + dir).c_str());
}
