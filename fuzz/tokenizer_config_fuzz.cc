// libFuzzer target: tokenizer_config.json (the specials and BOS/EOS names) with
// a fixed valid vocabulary. Any k3::Error is a correct refusal; an accepted
// config must give a tokenizer whose encode/decode round-trips.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_tokenizer_data.h"
#include "k3/core/error.h"
#include "k3/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view config(reinterpret_cast<const char*>(data), size);
  try {
    k3::tok::Tokenizer t = k3::tok::Tokenizer::FromStringsOrThrow(k3::fuzz::SmallTiktokenModel(), config);
    for (std::string_view s : {"hello world", "<|open|>x<|sep|>"}) {
      K3_CHECK(t.Decode(t.EncodeOrdinary(s)) == s);
      K3_CHECK(t.Decode(t.Encode(s, /*allow_special=*/true)) == s);
    }
  } catch (const k3::Error& e) {
    K3_CHECK(e.code() != k3::ErrorCode::kOk && e.code() != k3::ErrorCode::kInternal);
  }
  return 0;
}
