// The HTTP/1.1 head parser and chunked decoder (http_parser.h) on the cases
// RFC 9112 and the request-smuggling write-ups name, fed whole and byte by byte.
#include "k3/server/http_parser.h"

#include <doctest/doctest.h>

#include <string>

namespace k3::server {
namespace {

struct Scan {
  HeadScanner::State state;
  int status = 0;
  RequestHead head;
  size_t head_bytes = 0;
};

// Feeds `text` one byte at a time (the slow sender's way) and checks that
// feeding it at once gives the same result.
Scan ScanBytewise(const std::string& text, const HttpLimits& limits = {}) {
  Scan s;
  HeadScanner scanner(limits);
  s.state = HeadScanner::State::kNeedMore;
  for (size_t n = 1; n <= text.size() && s.state == HeadScanner::State::kNeedMore; ++n) {
    s.state = scanner.Feed(std::string_view(text).substr(0, n), s.head);
  }
  s.status = scanner.error().status;
  s.head_bytes = scanner.head_bytes();
  HeadScanner at_once(limits);
  RequestHead h;
  CHECK(at_once.Feed(text, h) == s.state);
  CHECK(at_once.error().status == s.status);
  return s;
}

TEST_CASE("a well-formed head is parsed whole and byte by byte") {
  std::string req =
      "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: "
      "127.0.0.1:8080\r\nContent-Type:application/json \r\n"
      "Content-Length: 12\r\n\r\n{\"a\":1}";
  Scan s = ScanBytewise(req);
  REQUIRE(s.state == HeadScanner::State::kDone);
  CHECK(s.head.method == "POST");
  CHECK(s.head.path == "/v1/chat/completions");
  CHECK(s.head.target == "/v1/chat/completions?x=1");
  CHECK(s.head.Header("content-type") == "application/json");
  CHECK(s.head.content_length == 12);
  CHECK(s.head.keep_alive);
  CHECK(s.head_bytes == req.find("{"));
}

TEST_CASE("framing rules: keep-alive, HTTP/1.0, Expect, absolute-form, leading empty lines") {
  CHECK_FALSE(
      ScanBytewise("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").head.keep_alive);
  CHECK_FALSE(ScanBytewise("GET / HTTP/1.0\r\n\r\n").head.keep_alive);
  CHECK(ScanBytewise("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").head.keep_alive);
  CHECK(ScanBytewise(
            "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n")
            .head.expect_continue);
  CHECK(ScanBytewise("GET http://a:1/health?q HTTP/1.1\r\nHost: a\r\n\r\n").head.path == "/health");
  Scan lf = ScanBytewise("\r\n\nGET /x HTTP/1.1\nHost: a\n\n");
  CHECK(lf.state == HeadScanner::State::kDone);
  CHECK(lf.head.path == "/x");
  CHECK(ScanBytewise("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n")
            .head.content_length == 5);
}

TEST_CASE("malformed and smuggling-prone heads are refused with the RFC's status") {
  struct Case {
    const char* what;
    std::string text;
    int status;
  };
  const Case cases[] = {
      {"no version", "GET /\r\nHost: a\r\n\r\n", 400},
      {"HTTP/2 on the wire", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
      {"missing Host", "GET / HTTP/1.1\r\n\r\n", 400},
      {"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"space before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400},
      {"obs-fold", "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n", 400},
      {"CL and TE",
       "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
       400},
      {"differing CLs",
       "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400},
      {"signed CL", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n", 400},
      {"gzip TE", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"chunked twice", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
       501},
      {"TE in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"bare CR", "GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", 400},
      {"NUL in value", std::string("GET / HTTP/1.1\r\nHost: a") + '\0' + "b\r\n\r\n", 400},
      {"CL over the cap", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999\r\n\r\n", 413},
      {"CL of 30 digits",
       "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 999999999999999999999999999999\r\n\r\n", 413},
      {"Expect other", "POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", 417},
      {"target not a path", "GET foo HTTP/1.1\r\nHost: a\r\n\r\n", 400},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    Scan s = ScanBytewise(c.text);
    CHECK(s.state == HeadScanner::State::kError);
    CHECK(s.status == c.status);
  }
}

TEST_CASE("caps are enforced while the head arrives, before its end") {
  HttpLimits limits;
  limits.max_request_line_bytes = 100;
  limits.max_header_line_bytes = 50;
  limits.max_headers = 3;
  limits.max_head_bytes = 200;
  // A request line that never ends: refused at its cap, not at a newline.
  Scan line = ScanBytewise("GET /" + std::string(1000, 'a'), limits);
  CHECK(line.status == 414);
  Scan field = ScanBytewise("GET / HTTP/1.1\r\nX: " + std::string(1000, 'b'), limits);
  CHECK(field.status == 431);
  Scan many = ScanBytewise("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 1\r\nC: 1\r\n\r\n", limits);
  CHECK(many.status == 431);
  std::string big = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 4; ++i) big += "X" + std::to_string(i) + ": " + std::string(45, 'c') + "\r\n";
  HttpLimits roomy = limits;
  roomy.max_headers = 10;
  Scan total = ScanBytewise(big + "\r\n", roomy);
  CHECK(total.status == 431);
  // Exactly at the caps is fine.
  Scan ok = ScanBytewise("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 1\r\n\r\n", limits);
  CHECK(ok.state == HeadScanner::State::kDone);
}

std::string DecodeBytewise(const std::string& body, ChunkedDecoder::State& end, int& status,
                           size_t& used_total, const HttpLimits& limits = {}) {
  ChunkedDecoder d(limits);
  std::string out;
  end = ChunkedDecoder::State::kNeedMore;
  used_total = 0;
  for (size_t i = 0; i < body.size() && end == ChunkedDecoder::State::kNeedMore; ++i) {
    size_t used = 0;
    end = d.Feed(std::string_view(body).substr(i, 1), used, &out);
    used_total += used;
  }
  status = d.error().status;
  return out;
}

TEST_CASE("chunked bodies: data, extensions, trailers, and what follows them") {
  ChunkedDecoder::State end;
  int status = 0;
  size_t used = 0;
  std::string body = "5;name=val\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\nGET /next";
  CHECK(DecodeBytewise(body, end, status, used) == "hello world");
  CHECK(end == ChunkedDecoder::State::kDone);
  CHECK(used == body.find("GET"));
  // Whole, with `out` null (a body being discarded): same bytes consumed.
  ChunkedDecoder d{HttpLimits{}};
  size_t whole = 0;
  CHECK(d.Feed(body, whole, nullptr) == ChunkedDecoder::State::kDone);
  CHECK(whole == used);
  CHECK(d.body_bytes() == 11);
}

TEST_CASE("chunked bodies: the cap is checked at the chunk size, before the data") {
  HttpLimits limits;
  limits.max_body_bytes = 10;
  ChunkedDecoder::State end;
  int status = 0;
  size_t used = 0;
  std::string out = DecodeBytewise("8\r\n12345678\r\n3\r\n", end, status, used, limits);
  CHECK(end == ChunkedDecoder::State::kError);
  CHECK(status == 413);
  CHECK(out == "12345678");  // the second chunk's bytes were never read
  DecodeBytewise("fffffffffffffffff\r\n", end, status, used, limits);
  CHECK(status == 413);
  for (const char* bad : {"x\r\n", "5\r\nhelloX\r\n", "\r\n", "5\rhello"}) {
    INFO(bad);
    DecodeBytewise(bad, end, status, used, limits);
    CHECK(end == ChunkedDecoder::State::kError);
    CHECK(status == 400);
  }
  HttpLimits tight;
  tight.max_chunk_line_bytes = 16;
  DecodeBytewise("1;" + std::string(100, 'e') + "\r\n", end, status, used, tight);
  CHECK(status == 400);
}

}  // namespace
}  // namespace k3::server
