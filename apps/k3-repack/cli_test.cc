// Unit tests of k3-repack's command-line helpers: --shards and --worker
// values, and the terminal's progress line.
#include "cli.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "k3/core/error.h"

using k3::repack_cli::ParseShardList;
using k3::repack_cli::ParseWorker;
using k3::repack_cli::ProgressLine;

TEST_CASE("--shards and --worker parsing") {
  CHECK(ParseShardList("1,2,5-7") == std::vector<int64_t>{1, 2, 5, 6, 7});
  CHECK(ParseShardList(" 94 ") == std::vector<int64_t>{94});
  CHECK_THROWS_AS(ParseShardList("0"), k3::Error);
  CHECK_THROWS_AS(ParseShardList("5-3"), k3::Error);
  CHECK_THROWS_AS(ParseShardList("a"), k3::Error);
  CHECK_THROWS_AS(ParseShardList(""), k3::Error);
  int i, n;
  ParseWorker("3/8", &i, &n);
  CHECK(i == 3);
  CHECK(n == 8);
  CHECK_THROWS_AS(ParseWorker("8/8", &i, &n), k3::Error);
  CHECK_THROWS_AS(ParseWorker("1", &i, &n), k3::Error);
}

TEST_CASE("TTY progress line: erases what was there; ETA from the conversion's own rate, not before 1 s") {
  k3::repack::RepackEvent e;
  e.kind = k3::repack::RepackEvent::Kind::kProgress;
  e.shard = "model-00001-of-000002.safetensors";
  e.bytes_todo = 10'000'000'000ull;
  e.bytes_done = 50'000'000ull;
  e.elapsed_seconds = 120;  // a long pre-flight (hashing the source headers) ...
  e.convert_seconds = 0.4;  // ... but converting only just began
  std::string l = ProgressLine(e);
  CHECK(l.rfind("\r\033[K", 0) == 0);
  CHECK(l.find("ETA --") != std::string::npos);
  CHECK(l.find("   ") == std::string::npos);  // no padding to wipe a previous line
  e.bytes_done = 1'000'000'000ull;
  e.convert_seconds = 2;  // 0.5 GB/s: 9 GB left is 18 s (elapsed_seconds would say 1071 s)
  l = ProgressLine(e);
  CHECK(l.find("0.50 GB/s") != std::string::npos);
  CHECK(l.find("ETA 18 s") != std::string::npos);
}
