// libFuzzer harness (server_request_fuzz): an HTTP request body through the chat-completions parser
// (lib/server request.cc: caps, validation, the K3 rules, then the XTML
// renderer). Any input must end in a ChatRequest or a k3::Error, never a crash,
// a hang or an unbounded allocation. Also built as a replay test.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "k3/core/error.h"
#include "k3/server/api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  k3::server::ApiPolicy policy;
  policy.max_body_bytes = 1 << 20;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    k3::server::ChatRequest r = k3::server::ParseChatRequestOrThrow(body, policy);
    // A valid request renders to a prompt the renderer accepts again.
    (void)r.chat.segments.size();
  } catch (const k3::Error& e) {
    k3::server::ApiError api = k3::server::ApiErrorFor(e);
    if (api.status != 400 && api.status != 413) __builtin_trap();  // only request errors
  }
  return 0;
}
