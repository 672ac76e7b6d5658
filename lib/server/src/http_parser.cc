// RFC 9112 request heads and chunked bodies (http_parser.h). Lenient only
// where the RFC allows it (a bare LF ends a line, leading empty lines are
// skipped); strict wherever leniency has let requests be smuggled past a
// proxy (whitespace before a colon, obs-fold, Content-Length together with
// Transfer-Encoding, differing Content-Lengths: all 400).
#include "k3/server/http_parser.h"

#include <algorithm>
#include <cctype>

namespace k3::server {
namespace {

constexpr size_t kMaxLeadingEmptyLines = 8;

bool IsTChar(unsigned char c) {
  if (std::isalnum(c)) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](char c) { return IsTChar(static_cast<unsigned char>(c)); });
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Calls f(token) for each comma-separated, trimmed, non-empty element.
template <typename F>
void ForEachListItem(std::string_view v, F f) {
  while (!v.empty()) {
    size_t comma = v.find(',');
    std::string_view item = TrimOws(v.substr(0, comma));
    if (!item.empty()) f(item);
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool Fail(HttpParseError& error, int status, std::string message) {
  error.status = status;
  error.message = std::move(message);
  return false;
}

bool ParseRequestLine(std::string_view line, const HttpLimits& limits, RequestHead& head,
                      HttpParseError& error) {
  size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return Fail(error, 400, "malformed request line");
  size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Fail(error, 400, "malformed request line");
  }
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method)) return Fail(error, 400, "malformed method");
  if (target.empty()) return Fail(error, 400, "empty request target");
  for (char c : target) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f)
      return Fail(error, 400, "control character or space in the request target");
  }
  if (target.size() > limits.max_request_line_bytes)
    return Fail(error, 414, "request target too long");
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" ||
      !std::isdigit(static_cast<unsigned char>(version[5])) || version[6] != '.' ||
      !std::isdigit(static_cast<unsigned char>(version[7]))) {
    return Fail(error, 400, "malformed HTTP version");
  }
  if (version[5] != '1') return Fail(error, 505, "only HTTP/1.0 and HTTP/1.1 are served");
  head.version_minor = version[7] - '0';
  head.method = std::string(method);
  head.target = std::string(target);
  // origin-form "/path?query", absolute-form "http://authority/path" (RFC
  // 9112 3.2.2: a server must accept it), asterisk-form "*" for OPTIONS.
  std::string_view path = target;
  if (path.front() != '/' && path != "*") {
    size_t scheme = path.find("://");
    if (scheme == std::string_view::npos || !IsToken(path.substr(0, scheme))) {
      return Fail(error, 400, "request target is not a path");
    }
    size_t slash = path.find('/', scheme + 3);
    path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
  }
  head.path = std::string(path.substr(0, path.find('?')));
  return true;
}

}  // namespace

std::string_view RequestHead::Header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return v;
  }
  return {};
}

bool RequestHead::Has(std::string_view lower_name) const {
  return std::any_of(headers.begin(), headers.end(),
                     [&](const auto& kv) { return kv.first == lower_name; });
}

void HeadScanner::Reset() {
  pos_ = line_start_ = lines_ = skipped_ = skipped_lines_ = head_bytes_ = 0;
  started_ = false;
  error_ = HttpParseError();
}

HeadScanner::State HeadScanner::Fail(int status, std::string message) {
  error_.status = status;
  error_.message = std::move(message);
  return State::kError;
}

HeadScanner::State HeadScanner::Feed(std::string_view buffer, RequestHead& head) {
  if (error_.status) return State::kError;
  if (head_bytes_) return State::kDone;
  for (; pos_ < buffer.size(); ++pos_) {
    const size_t line_bytes = pos_ - line_start_ + 1;  // including this byte
    if (buffer[pos_] != '\n') {
      if (!started_ && buffer[pos_] != '\r') started_ = true;
      if (lines_ == 0) {
        if (line_bytes > limits_.max_request_line_bytes) return Fail(414, "request line too long");
      } else if (line_bytes > limits_.max_header_line_bytes) {
        return Fail(431, "header line too long");
      }
      if (pos_ + 1 - skipped_ > limits_.max_head_bytes) return Fail(431, "request head too large");
      continue;
    }
    std::string_view line = buffer.substr(line_start_, pos_ - line_start_);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      if (lines_ == 0) {  // an empty line before the request line
        if (++skipped_lines_ > kMaxLeadingEmptyLines)
          return Fail(400, "empty lines instead of a request");
        skipped_ = pos_ + 1;
        line_start_ = pos_ + 1;
        continue;
      }
      head_bytes_ = pos_ + 1;
      HttpParseError error;
      if (!ParseRequestHead(buffer.substr(skipped_, head_bytes_ - skipped_), limits_, head,
                            error)) {
        error_ = std::move(error);
        return State::kError;
      }
      return State::kDone;
    }
    if (++lines_ > limits_.max_headers + 1) return Fail(431, "too many header fields");
    line_start_ = pos_ + 1;
  }
  return State::kNeedMore;
}

bool ParseRequestHead(std::string_view text, const HttpLimits& limits, RequestHead& head,
                      HttpParseError& error) {
  head = RequestHead();
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    size_t lf = text.find('\n');
    std::string_view line = text.substr(0, lf);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find('\r') != std::string_view::npos)
      return Fail(error, 400, "bare CR in the request head");
    if (line.find('\0') != std::string_view::npos)
      return Fail(error, 400, "NUL in the request head");
    if (line.empty()) break;  // the end of the head
    lines.push_back(line);
    if (lf == std::string_view::npos) break;
    text.remove_prefix(lf + 1);
  }
  if (lines.empty()) return Fail(error, 400, "no request line");
  if (lines.size() - 1 > limits.max_headers) return Fail(error, 431, "too many header fields");
  if (!ParseRequestLine(lines[0], limits, head, error)) return false;

  size_t host_count = 0, te_count = 0;
  std::string content_length;
  bool has_content_length = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    if (line.size() > limits.max_header_line_bytes) return Fail(error, 431, "header line too long");
    if (line.front() == ' ' || line.front() == '\t')
      return Fail(error, 400, "obsolete line folding");
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return Fail(error, 400, "header line without a colon");
    std::string_view name = line.substr(0, colon);
    if (!IsToken(name))
      return Fail(error, 400, "malformed header name (or whitespace before the colon)");
    std::string_view value = TrimOws(line.substr(colon + 1));
    for (char c : value) {
      unsigned char u = static_cast<unsigned char>(c);
      if ((u < 0x20 && u != '\t') || u == 0x7f)
        return Fail(error, 400, "control character in a header value");
    }
    std::string lname = Lower(name);
    if (lname == "authorization" || lname == "x-api-key") {
      std::string_view raw = line.substr(colon + 1);
      if (!raw.empty() && raw.front() == ' ') raw.remove_prefix(1);
      (lname == "authorization" ? head.raw_authorization : head.raw_x_api_key) = std::string(raw);
    }
    if (lname == "host") ++host_count;
    if (lname == "transfer-encoding") {
      ++te_count;
      bool ok = true;
      ForEachListItem(value, [&](std::string_view item) {
        if (!EqualsNoCase(item, "chunked") || head.chunked) ok = false;
        head.chunked = true;
      });
      if (!ok || !head.chunked)
        return Fail(error, 501, "only Transfer-Encoding: chunked is supported");
    }
    if (lname == "content-length") {
      // "5, 5" and repeated equal fields are one length (RFC 9110 8.6); any
      // other difference could frame the body two ways: refused.
      bool ok = true;
      ForEachListItem(value, [&](std::string_view item) {
        if (!std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }))
          ok = false;
        while (item.size() > 1 && item.front() == '0') item.remove_prefix(1);
        if (has_content_length && item != content_length) ok = false;
        content_length = std::string(item);
        has_content_length = true;
      });
      if (!ok || !has_content_length)
        return Fail(error, 400, "malformed or conflicting Content-Length");
    }
    if (lname == "connection") {
      ForEachListItem(value, [&](std::string_view item) {
        if (EqualsNoCase(item, "close")) head.keep_alive = false;
      });
    }
    if (lname == "expect") {
      if (!EqualsNoCase(value, "100-continue"))
        return Fail(error, 417, "only Expect: 100-continue is supported");
      head.expect_continue = true;
    }
    head.headers.emplace_back(std::move(lname), std::string(value));
  }
  if (head.version_minor == 0) {
    // HTTP/1.0 closes unless asked not to; it has no chunked coding.
    bool keep = false;
    ForEachListItem(head.Header("connection"), [&](std::string_view item) {
      if (EqualsNoCase(item, "keep-alive")) keep = true;
    });
    head.keep_alive = head.keep_alive && keep;
    if (head.chunked) return Fail(error, 400, "Transfer-Encoding in an HTTP/1.0 request");
  } else if (host_count != 1) {
    return Fail(error, 400, host_count == 0 ? "missing Host header" : "more than one Host header");
  }
  if (host_count > 1) return Fail(error, 400, "more than one Host header");
  if (te_count > 1) return Fail(error, 400, "more than one Transfer-Encoding header");
  if (head.chunked && has_content_length) {
    return Fail(error, 400, "both Content-Length and Transfer-Encoding");
  }
  if (has_content_length) {
    if (content_length.size() > 19) return Fail(error, 413, "request body too large");
    head.content_length = std::stoull(content_length);
    if (head.content_length > limits.max_body_bytes)
      return Fail(error, 413, "request body too large");
  }
  return true;
}

ChunkedDecoder::State ChunkedDecoder::Fail(int status, std::string message) {
  error_.status = status;
  error_.message = std::move(message);
  return State::kError;
}

ChunkedDecoder::State ChunkedDecoder::Feed(std::string_view in, size_t& consumed,
                                           std::string* out) {
  consumed = 0;
  if (error_.status) return State::kError;
  size_t i = 0;
  while (i < in.size() && step_ != Step::kDone) {
    const char c = in[i];
    switch (step_) {
      case Step::kData: {
        size_t n = size_t(std::min<uint64_t>(chunk_left_, in.size() - i));
        if (out) out->append(in.data() + i, n);
        i += n;
        chunk_left_ -= n;
        if (chunk_left_ == 0) step_ = Step::kDataCr;
        continue;
      }
      case Step::kDataCr:
      case Step::kDataLf:
        if (c == '\r' && step_ == Step::kDataCr) {
          step_ = Step::kDataLf;
        } else if (c == '\n') {
          step_ = Step::kSize;
          digits_ = line_bytes_ = 0;
        } else {
          consumed = i;
          return Fail(400, "chunk data not followed by CRLF");
        }
        ++i;
        continue;
      default:
        break;
    }
    // Size, extension and trailer lines: one byte at a time, with their caps.
    ++i;
    if (step_ == Step::kTrailerLine || step_ == Step::kTrailerLf) {
      if (++trailer_bytes_ > limits_.max_trailer_bytes)
        return Fail(431, "chunked trailer fields too large");
    } else if (++line_bytes_ > limits_.max_chunk_line_bytes) {
      return Fail(400, "chunk size line too long");
    }
    bool line_end = false;
    switch (step_) {
      case Step::kSize:
        if (int v = HexValue(c); v >= 0) {
          if (++digits_ > 15) return Fail(413, "request body too large (chunk size)");
          chunk_left_ = chunk_left_ * 16 + uint64_t(v);
        } else if (digits_ == 0) {
          return Fail(400, "malformed chunk size");
        } else if (c == ';' || c == ' ' || c == '\t') {
          step_ = Step::kExt;
        } else if (c == '\r') {
          step_ = Step::kSizeLf;
        } else if (c == '\n') {
          line_end = true;
        } else {
          return Fail(400, "malformed chunk size");
        }
        break;
      case Step::kExt:
        if (c == '\r') {
          step_ = Step::kSizeLf;
        } else if (c == '\n') {
          line_end = true;
        } else if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
          return Fail(400, "control character in a chunk extension");
        }
        break;
      case Step::kSizeLf:
        if (c != '\n') return Fail(400, "bare CR in a chunk size line");
        line_end = true;
        break;
      case Step::kTrailerLine:
        if (c == '\r') {
          step_ = Step::kTrailerLf;
        } else if (c == '\n') {
          line_end = true;
        } else {
          ++line_bytes_;
        }
        break;
      case Step::kTrailerLf:
        if (c != '\n') return Fail(400, "bare CR in a chunked trailer");
        line_end = true;
        break;
      default:
        break;
    }
    if (!line_end) continue;
    if (step_ == Step::kSize || step_ == Step::kExt || step_ == Step::kSizeLf) {
      if (chunk_left_ == 0) {
        step_ = Step::kTrailerLine;
        line_bytes_ = 0;
        continue;
      }
      // The cap before a byte of the chunk is read.
      if (chunk_left_ >
          limits_.max_body_bytes - std::min<uint64_t>(total_, limits_.max_body_bytes)) {
        return Fail(413, "request body too large");
      }
      total_ += chunk_left_;
      step_ = Step::kData;
    } else {  // a trailer line: the empty one ends the body
      if (line_bytes_ == 0) {
        step_ = Step::kDone;
      } else {
        step_ = Step::kTrailerLine;
        line_bytes_ = 0;
      }
    }
  }
  consumed = i;
  return step_ == Step::kDone ? State::kDone : State::kNeedMore;
}

}  // namespace k3::server
