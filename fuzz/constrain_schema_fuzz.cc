// libFuzzer harness for lib/constrain: a request's JSON Schema is network input.
// Input: schema text, a NUL byte, a format byte (bit 0: Python separators,
// bit 1: raw top-level string), then output bytes to drive the constraint.
// Checks: compiling either succeeds or throws k3::Error (nothing else, no
// crash); after every fed byte, the mask over a byte vocabulary equals feeding
// each byte directly, and Accepting() implies the text so far is a prefix the
// automaton took. Also replayed by constrain_fuzz_replay_test in normal builds.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "k3/constrain/constrain.h"
#include "k3/core/error.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& text) {
  std::fprintf(stderr, "constrain_schema_fuzz: %s after %zu bytes: '%s'\n", what, text.size(), text.c_str());
  std::abort();
}

const k3::constrain::Vocabulary& ByteVocab() {
  static const k3::constrain::Vocabulary v = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.emplace_back(1, char(b));
    return k3::constrain::Vocabulary(std::move(t), 256 + 2);
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t nul = in.find('\0');
  std::string_view schema_text = in.substr(0, nul);
  std::string_view drive = nul == std::string_view::npos ? std::string_view{} : in.substr(nul + 1);
  k3::constrain::Format format;
  if (!drive.empty()) {
    format.python_separators = drive[0] & 1;
    format.raw_top_string = drive[0] & 2;
    drive.remove_prefix(1);
  }
  std::vector<k3::constrain::CompiledSchema> schemas;
  try {
    schemas.push_back(k3::constrain::Schema::CompileOrThrow(schema_text));
  } catch (const k3::Error&) {
  }
  // Non-strict (docs/constrain.md): refuses nothing but oversized text, and the relaxed
  // automaton meets the same invariants.
  try {
    schemas.push_back(k3::constrain::Schema::CompileOrThrow(schema_text, {.strict = false}));
  } catch (const k3::Error& e) {
    if (schema_text.size() <= k3::constrain::kMaxSchemaBytes)
      Fail("a non-strict compile refused", e.what());
  }
  schemas.push_back(k3::constrain::Schema::JsonObject());
  const auto& vocab = ByteVocab();
  std::vector<uint64_t> mask;
  for (const auto& schema : schemas) {
    std::unique_ptr<k3::constrain::TokenConstraint> cp;
    try {
      cp = std::make_unique<k3::constrain::TokenConstraint>(schema, vocab, format);
    } catch (const k3::Error&) {
      continue;  // raw_top_string with a schema that is not a string
    }
    k3::constrain::TokenConstraint& c = *cp;
    for (size_t i = 0; i < drive.size() && i < 256; ++i) {
      c.AllowedMask(mask);
      k3::constrain::TokenConstraint direct(schema, vocab, format);
      if (!direct.AdvanceBytes(c.text())) Fail("the text so far is refused", c.text());
      for (uint32_t b = 0; b < 256; ++b)
        if (((mask[b / 64] >> (b % 64)) & 1) != direct.Allowed(b)) Fail("mask differs from the direct check", c.text());
      for (uint32_t sp = 256; sp < vocab.vocab_size(); ++sp)
        if ((mask[sp / 64] >> (sp % 64)) & 1) Fail("a special is allowed", c.text());
      uint8_t b = uint8_t(drive[i]);
      // Mostly follow the input; map refused bytes onto an allowed one so the
      // walk goes deep instead of stopping at the first refusal.
      if (!((mask[b / 64] >> (b % 64)) & 1)) {
        std::vector<uint32_t> ok;
        for (uint32_t x = 0; x < 256; ++x)
          if ((mask[x / 64] >> (x % 64)) & 1) ok.push_back(x);
        if (ok.empty()) {
          if (!c.Accepting()) Fail("dead end", c.text());
          break;
        }
        b = uint8_t(ok[b % ok.size()]);
      }
      c.Advance(b);
    }
    (void)c.Complete();
  }
  return 0;
}
