#include "cli_util.h"

#include <cstdint>
#include <cstdlib>

#include "k3/core/error.h"

namespace k3::run {

std::vector<int32_t> ParseIdList(const std::string& csv) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < csv.size()) {
    size_t j = csv.find_first_of(", ", i);
    if (j == std::string::npos) j = csv.size();
    std::string part = csv.substr(i, j - i);
    if (!part.empty()) {
      char* end = nullptr;
      long long v = std::strtoll(part.c_str(), &end, 10);
      if (end == part.c_str() || *end != '\0' || v < 0 || v > INT32_MAX) {
        throw Error(ErrorCode::kInvalidArgument, "--ids: '" + part + "' is not a token id");
      }
      ids.push_back(static_cast<int32_t>(v));
    }
    i = j + 1;
  }
  return ids;
}

}  // namespace k3::run
