// Server-sent-events framing, the one place every streamed dialect's bytes
// are cut into events (the WHATWG event-stream format).
#pragma once

#include <string>
#include <string_view>

namespace k3::server {

// A comment line: clients ignore it, proxies and idle timeouts see traffic.
inline std::string SseComment(std::string_view what) {
  std::string out = ": ";
  out += what;
  out += "\n\n";
  return out;
}

// An unnamed event (OpenAI's chat.completions chunks).
inline std::string SseData(std::string_view json) {
  std::string out = "data: ";
  out += json;
  out += "\n\n";
  return out;
}

// A named event (Anthropic's and the Responses API's typed events).
inline std::string SseEvent(std::string_view type, std::string_view json) {
  std::string out = "event: ";
  out += type;
  out += "\ndata: ";
  out += json;
  out += "\n\n";
  return out;
}

}  // namespace k3::server
