// Argument parsing shared by k3-run subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace k3::run {

// Parses a list of token ids separated by commas and/or spaces ("1,2 3").
// Empty items are skipped; an item that is not a decimal in [0, INT32_MAX]
// throws Error(kInvalidArgument) naming --ids.
std::vector<int32_t> ParseIdList(const std::string& csv);

}  // namespace k3::run
