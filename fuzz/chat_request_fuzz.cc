// libFuzzer target: the chat request JSON that `k3-run render` (and the server)
// reads, rendered to XTML segments and encoded. Refusals are kInvalidArgument
// (what the encoder refuses) or kUnsupported (images); an accepted request's
// special segments are exactly the four markers.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_tokenizer_data.h"
#include "k3/core/error.h"
#include "k3/tokenizer/chat.h"
#include "k3/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const k3::tok::Tokenizer tok =
      k3::tok::Tokenizer::FromStringsOrThrow(k3::fuzz::SmallTiktokenModel(), k3::fuzz::SmallTokenizerConfig());
  std::string_view request(reinterpret_cast<const char*>(data), size);
  try {
    k3::tok::RenderedChat r = k3::tok::RenderChatRequestOrThrow(request);
    for (const auto& s : r.segments) {
      K3_CHECK(!s.text.empty());
      if (s.allow_special) {
        K3_CHECK(s.text == "<|open|>" || s.text == "<|close|>" || s.text == "<|sep|>" || s.text == "<|end_of_msg|>");
      }
    }
    std::vector<k3::tok::TokenId> ids = k3::tok::EncodeChatSegments(tok, r.segments);
    K3_CHECK(ids.size() >= r.segments.size());
  } catch (const k3::Error& e) {
    K3_CHECK(e.code() == k3::ErrorCode::kInvalidArgument || e.code() == k3::ErrorCode::kUnsupported);
  }
  return 0;
}
