// libFuzzer harness (messages_request_fuzz): an HTTP request body through the
// Anthropic Messages parser (lib/server messages.cc: caps, validation with
// Anthropic's field names, the raw-span pass, the chat.completions twin, the
// OpenAI parser and the XTML renderer). Any input must end in a
// MessagesRequest or a k3::Error that is a request error (400 / 413), never a
// crash, a hang or an unbounded allocation. Also built as a replay test.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "k3/core/error.h"
#include "k3/server/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  k3::server::ApiPolicy policy;
  policy.max_body_bytes = 1 << 20;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto call : {k3::server::MessagesCall::kCreate, k3::server::MessagesCall::kCountTokens}) {
    try {
      k3::server::MessagesRequest r = k3::server::ParseMessagesRequestOrThrow(body, policy, call);
      // The twin is itself a request the OpenAI parser accepts.
      (void)k3::server::ParseChatRequestOrThrow(r.openai_body, policy);
    } catch (const k3::Error& e) {
      k3::server::ApiError api = k3::server::ApiErrorFor(e);
      if (api.status != 400 && api.status != 413) __builtin_trap();  // only request errors
    }
  }
  return 0;
}
