// Small, valid tokenizer files for the tokenizer fuzz harnesses: 256 single-byte
// ranks plus a few merges, and a tokenizer_config.json naming the XTML markers.
#pragma once

#include <string>

namespace k3::fuzz {

inline std::string Base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    unsigned v = (unsigned char)in[i] << 16 | (unsigned char)in[i + 1] << 8 | (unsigned char)in[i + 2];
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], k[v & 63]};
  }
  if (i + 1 == in.size()) {
    unsigned v = (unsigned char)in[i] << 16;
    out += {k[v >> 18], k[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    unsigned v = (unsigned char)in[i] << 16 | (unsigned char)in[i + 1] << 8;
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
  }
  return out;
}

// Ranks 0..255 are the single bytes, then a few merges ("he", "ll", "hello", " w").
inline const std::string& SmallTiktokenModel() {
  static const std::string text = [] {
    std::string t;
    int rank = 0;
    for (int b = 0; b < 256; ++b) t += Base64(std::string(1, char(b))) + " " + std::to_string(rank++) + "\n";
    for (const char* m : {"he", "ll", "hell", "hello", " w", "or", "ld"}) {
      t += Base64(m) + " " + std::to_string(rank++) + "\n";
    }
    return t;
  }();
  return text;
}

// Specials start at the vocabulary size (263 here): the four XTML markers.
inline const std::string& SmallTokenizerConfig() {
  static const std::string text =
      R"({"added_tokens_decoder":{"263":{"content":"[BOS]","special":true},)"
      R"("264":{"content":"<|open|>","special":true},"265":{"content":"<|close|>","special":true},)"
      R"("266":{"content":"<|sep|>","special":true},"267":{"content":"<|end_of_msg|>","special":true}},)"
      R"("bos_token":"[BOS]","eos_token":"<|end_of_msg|>"})";
  return text;
}

}  // namespace k3::fuzz
