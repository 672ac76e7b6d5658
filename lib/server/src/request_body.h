// Private to lib/server: the first steps every API's request parser takes on
// a body (size cap, parser sized to the body with the depth cap, parse),
// shared by request.cc (OpenAI) and messages.cc (Anthropic).
#pragma once

#include <simdjson.h>

#include <string_view>

#include "k3/server/api.h"

namespace k3::server {

// Throws kNoSpace over policy.max_body_bytes (before copying anything),
// kInvalidArgument for JSON that does not parse, nests deeper than
// policy.max_depth or is not an object. Fills `padded` with the body; it and
// `parser` must outlive the returned element.
simdjson::dom::element ParseBodyOrThrow(std::string_view body, const ApiPolicy& policy,
                                        simdjson::dom::parser& parser, simdjson::padded_string& padded);

}  // namespace k3::server
