// A snapshot repacked into a k3 container for the suites that load one
// (mmap'd containers against the int8 goldens).
#pragma once

#include <string>

#include "k3/repack/repack.h"

namespace k3::test {

// Repacks `src` into `dst` with every class at int8 (no free-space check);
// returns dst.
inline std::string RepackInt8(const std::string& src, const std::string& dst) {
  repack::RepackOptions ro;
  ro.src = src;
  ro.dst = dst;
  ro.bits.bits = 8;
  ro.bits.mla_bits = 8;
  ro.bits.head_bits = 8;
  ro.space_check = false;
  repack::RunRepack(ro, [](const repack::RepackEvent&) {});
  return dst;
}

}  // namespace k3::test
