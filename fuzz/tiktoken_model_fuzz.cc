// libFuzzer target: tiktoken.model text, the first file the tokenizer trusts.
// Any k3::Error is a correct refusal; on an accepted vocabulary, valid UTF-8
// must round-trip through encode and decode.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_tokenizer_data.h"
#include "k3/core/error.h"
#include "k3/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view model(reinterpret_cast<const char*>(data), size);
  try {
    k3::tok::Tokenizer t = k3::tok::Tokenizer::FromStringsOrThrow(model, R"({"added_tokens_decoder":{}})");
    for (std::string_view s : {"hello world", "\xe4\xbd\xa0\xe5\xa5\xbd 123", ""}) {
      K3_CHECK(t.Decode(t.EncodeOrdinary(s)) == s);
    }
  } catch (const k3::Error& e) {
    K3_CHECK(e.code() != k3::ErrorCode::kOk && e.code() != k3::ErrorCode::kInternal);
  }
  return 0;
}
