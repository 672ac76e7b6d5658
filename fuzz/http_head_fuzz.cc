// libFuzzer harness (http_head_fuzz): bytes as they arrive on a connection
// through the HTTP/1.1 head scanner, the head parser and the chunked-body
// decoder (lib/server http_parser.cc), fed in pieces whose sizes come from the
// input itself. Any input must end in a parsed head, "need more", or an error
// with a 4xx/5xx status, never a crash, a hang or memory past the caps; and
// the scanner fed in pieces must agree with the scanner fed everything at once.
// Also built as a replay test.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "k3/server/http_parser.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  k3::server::HttpLimits limits;
  limits.max_request_line_bytes = 256;
  limits.max_header_line_bytes = 256;
  limits.max_headers = 16;
  limits.max_head_bytes = 2048;
  limits.max_body_bytes = 4096;
  limits.max_chunk_line_bytes = 64;
  limits.max_trailer_bytes = 256;
  const size_t step = 1 + data[0] % 17;  // piece size
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);

  using State = k3::server::HeadScanner::State;
  k3::server::HeadScanner whole(limits);
  k3::server::RequestHead whole_head;
  State whole_state = whole.Feed(input, whole_head);

  k3::server::HeadScanner pieces(limits);
  k3::server::RequestHead head;
  State st = State::kNeedMore;
  size_t have = 0;
  while (st == State::kNeedMore && have < input.size()) {
    have = std::min(input.size(), have + step);
    st = pieces.Feed(input.substr(0, have), head);
  }
  Check(st == whole_state);
  if (st == State::kError) {
    Check(pieces.error().status >= 400 && pieces.error().status < 600);
    Check(pieces.error().status == whole.error().status);
    return 0;
  }
  if (st == State::kNeedMore) {
    // Never more than the caps allow to be held without an answer.
    Check(input.size() <= limits.max_head_bytes + 8 * 2);  // + at most 8 leading CRLFs
    return 0;
  }
  Check(pieces.head_bytes() == whole.head_bytes() && head.method == whole_head.method &&
        head.path == whole_head.path && head.headers == whole_head.headers);
  Check(head.content_length <= limits.max_body_bytes);
  Check(!(head.chunked && head.content_length));
  Check(!head.path.empty() && (head.path[0] == '/' || head.path == "*"));

  std::string_view rest = input.substr(pieces.head_bytes());
  if (head.chunked) {
    k3::server::ChunkedDecoder decoder(limits);
    std::string body;
    size_t at = 0;
    auto cst = k3::server::ChunkedDecoder::State::kNeedMore;
    while (cst == k3::server::ChunkedDecoder::State::kNeedMore && at < rest.size()) {
      size_t used = 0;
      cst = decoder.Feed(rest.substr(at, step), used, &body);
      // "Need more" means every byte offered was taken.
      if (cst == k3::server::ChunkedDecoder::State::kNeedMore)
        Check(used == std::min(step, rest.size() - at));
      at += used;
    }
    Check(body.size() <= limits.max_body_bytes);
    if (cst == k3::server::ChunkedDecoder::State::kDone) Check(body.size() == decoder.body_bytes());
    if (cst == k3::server::ChunkedDecoder::State::kError) {
      Check(decoder.error().status >= 400 && decoder.error().status < 600);
    }
  }
  return 0;
}
