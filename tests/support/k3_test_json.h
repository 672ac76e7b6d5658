// JSON helpers for the doctest suites that read oracle files (needs simdjson:
// link simdjson::simdjson).
#pragma once

#include <doctest/doctest.h>
#include <simdjson.h>

#include <cstdint>
#include <string>
#include <vector>

#include "k3/core/file.h"

namespace k3::test {

// The integer array `key` of the JSON object in `path` (e.g. greedy.json's
// "prompt_ids"); the test fails (REQUIRE) on anything else.
inline std::vector<int32_t> JsonIds(const std::string& path, const char* key) {
  std::string text = ReadFileOrThrow(path, 1 << 20);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(text).get(doc) == simdjson::SUCCESS);
  simdjson::dom::array arr;
  REQUIRE(doc[key].get_array().get(arr) == simdjson::SUCCESS);
  std::vector<int32_t> ids;
  for (auto v : arr) {
    int64_t id = 0;
    REQUIRE(v.get_int64().get(id) == simdjson::SUCCESS);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

}  // namespace k3::test
