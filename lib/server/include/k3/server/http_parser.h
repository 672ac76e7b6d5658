// The HTTP/1.1 request head parser and chunked-body decoder behind
// HttpServer (RFC 9112), with every cap checked as bytes arrive, before
// anything is kept: a head is scanned once, byte by byte, so a client sending
// one byte at a time costs O(bytes), and a line without a newline is refused
// as soon as it passes its cap (docs/server.md "Limits").
//
// Pure, no I/O, not thread-safe per object (one per connection). Failures are
// values (HttpParseError: the status to answer and why), never exceptions:
// the caller answers them and closes the connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace k3::server {

struct HttpLimits {
  size_t max_request_line_bytes = 8192;  // longer: 414 (the target is what grows)
  size_t max_header_line_bytes = 8192;   // one field line; longer: 431
  size_t max_headers = 100;              // more field lines: 431
  size_t max_head_bytes = 65536;         // request line + fields + CRLFs; more: 431
  size_t max_body_bytes = 16u << 20;     // Content-Length or chunked total; more: 413
  size_t max_chunk_line_bytes = 1024;    // chunk-size line with extensions; more: 400
  size_t max_trailer_bytes = 8192;       // all trailer fields of a chunked body; more: 431
};

struct HttpParseError {
  int status = 0;  // 0: no error
  std::string message;
};

struct RequestHead {
  std::string method;
  std::string target;     // as sent
  std::string path;       // target without the query
  int version_minor = 1;  // HTTP/1.x
  // Field names lower-cased; values with surrounding spaces/tabs removed.
  std::vector<std::pair<std::string, std::string>> headers;
  // Credentials compared exactly ("Bearer KEY " is not the key):
  // the bytes after "Authorization:" / "x-api-key:" less one conventional
  // space, nothing trimmed.
  std::string raw_authorization, raw_x_api_key;
  bool chunked = false;
  uint64_t content_length = 0;  // 0 when chunked
  bool keep_alive = true;       // after the version and Connection
  bool expect_continue = false;

  // The first value of a (lower-case) field name; empty when absent.
  std::string_view Header(std::string_view lower_name) const;
  bool Has(std::string_view lower_name) const;
};

// Scans a request head as it arrives. Feed the whole buffer received so far
// (it must begin at the request's first byte); bytes already scanned are not
// looked at again.
class HeadScanner {
 public:
  enum class State { kNeedMore, kDone, kError };
  explicit HeadScanner(const HttpLimits& limits) : limits_(limits) {}
  // kDone: head_bytes() bytes of `buffer` are the head, parsed into `head`.
  State Feed(std::string_view buffer, RequestHead& head);
  size_t head_bytes() const { return head_bytes_; }
  const HttpParseError& error() const { return error_; }
  void Reset();
  // True once a byte of the request line arrived (leading empty lines, which
  // RFC 9112 2.2 lets a server ignore, do not count).
  bool started() const { return started_; }

 private:
  State Fail(int status, std::string message);
  const HttpLimits& limits_;
  size_t pos_ = 0;         // next byte to scan
  size_t line_start_ = 0;  // first byte of the current line
  size_t lines_ = 0;       // complete lines of the head so far (request line included)
  size_t skipped_ = 0;     // bytes of leading empty lines
  size_t skipped_lines_ = 0;
  size_t head_bytes_ = 0;
  bool started_ = false;
  HttpParseError error_;
};

// Parses a complete head (what HeadScanner found; also the fuzz target's
// entry): request line, fields, and the framing rules (Content-Length vs
// Transfer-Encoding, Connection, Expect). Returns false with `error` set.
bool ParseRequestHead(std::string_view head_text, const HttpLimits& limits, RequestHead& head,
                      HttpParseError& error);

// Decodes a chunked body as it arrives, keeping its data (or discarding it:
// `out` null) with the body cap checked at every chunk size, before the data
// is read.
class ChunkedDecoder {
 public:
  enum class State { kNeedMore, kDone, kError };
  explicit ChunkedDecoder(const HttpLimits& limits) : limits_(limits) {}
  // Consumes bytes from `in` (sets `consumed`); appends data to `out` unless null.
  State Feed(std::string_view in, size_t& consumed, std::string* out);
  const HttpParseError& error() const { return error_; }
  uint64_t body_bytes() const { return total_; }

 private:
  State Fail(int status, std::string message);
  enum class Step {
    kSize,
    kExt,
    kSizeLf,
    kData,
    kDataCr,
    kDataLf,
    kTrailerLine,
    kTrailerLf,
    kDone
  };
  const HttpLimits& limits_;
  Step step_ = Step::kSize;
  uint64_t chunk_left_ = 0;
  uint64_t total_ = 0;
  size_t line_bytes_ = 0;  // of the current size or trailer line
  size_t digits_ = 0;
  size_t trailer_bytes_ = 0;
  HttpParseError error_;
};

}  // namespace k3::server
