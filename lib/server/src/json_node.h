// Private to lib/server: reading a validated JSON body field by field with the
// API's own path in every error ("input[2].content[0].text"), shared by the
// Messages (messages.cc) and Responses (responses.cc) parsers, which both map
// their body to the equivalent chat.completions request.
//
// Every accessor throws k3::Error kInvalidArgument whose object() is the path
// (ApiErrorFor turns it into a 400 naming the field); Unsupported throws
// kUnsupported for valid requests k3 cannot serve.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "k3/core/json_writer.h"
#include "k3/server/api.h"

namespace k3::server::json_node {

// A JSON value and the path that names it in errors.
struct Node {
  simdjson::dom::element v;
  std::string path;
};

[[noreturn]] inline void Unsupported(const std::string& path, std::string message) {
  throw Error(ErrorCode::kUnsupported, std::move(message), {}, Error::kNoOffset, path);
}

// A client's string shown in a message: JSON-quoted, at most 80 bytes.
inline std::string Shown(std::string_view s) {
  std::string out;
  AppendJsonString(out, s.substr(0, 80));
  return out;
}

inline std::string Child(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

// The member `key`, absent when missing or null (clients send nulls).
inline std::optional<Node> Member(const Node& obj, std::string_view key) {
  simdjson::dom::element v;
  if (obj.v[key].get(v) != simdjson::SUCCESS || v.is_null()) return std::nullopt;
  return Node{v, Child(obj.path, key)};
}

inline Node Need(const Node& obj, std::string_view key) {
  auto n = Member(obj, key);
  if (!n) ThrowBadParam(Child(obj.path, key), Child(obj.path, key) + " is required");
  return *n;
}

inline void MustBeObject(const Node& n) {
  if (!n.v.is_object()) ThrowBadParam(n.path, n.path + " must be an object");
}

inline std::string_view Text(const Node& n) {
  if (!n.v.is_string()) ThrowBadParam(n.path, n.path + " must be a string");
  return n.v.get_string().value_unsafe();
}

inline bool Flag(const Node& n) {
  if (!n.v.is_bool()) ThrowBadParam(n.path, n.path + " must be a boolean");
  return n.v.get_bool().value_unsafe();
}

inline int64_t Integer(const Node& n) {
  using simdjson::dom::element_type;
  if (n.v.type() == element_type::INT64) return n.v.get_int64().value_unsafe();
  if (n.v.type() == element_type::UINT64) ThrowBadParam(n.path, n.path + " is too large");
  ThrowBadParam(n.path, n.path + " must be an integer");
}

inline double Number(const Node& n) {
  using simdjson::dom::element_type;
  switch (n.v.type()) {
    case element_type::INT64:
      return double(n.v.get_int64().value_unsafe());
    case element_type::UINT64:
      return double(n.v.get_uint64().value_unsafe());
    case element_type::DOUBLE:
      return n.v.get_double().value_unsafe();
    default:
      ThrowBadParam(n.path, n.path + " must be a number");
  }
}

inline std::vector<Node> Items(const Node& n, std::string_view what) {
  simdjson::dom::array a;
  if (n.v.get_array().get(a) != simdjson::SUCCESS)
    ThrowBadParam(n.path, n.path + " must be " + std::string(what));
  std::vector<Node> out;
  size_t i = 0;
  for (simdjson::dom::element e : a)
    out.push_back(Node{e, n.path + "[" + std::to_string(i++) + "]"});
  return out;
}

// The object's "type" (the object must be one and must carry it).
inline std::string_view TypeOf(const Node& obj) {
  MustBeObject(obj);
  return Text(Need(obj, "type"));
}

// A text part of a chat message's content (each its own segment, as the
// renderer treats parts).
inline void TextPart(JsonWriter& j, std::string_view text) {
  j.BeginObject().Field("type", "text").Field("text", text).EndObject();
}

// The fields the twin takes as they are sent: stream, return_progress (k3's
// extension), ignore_eos (llama-server's / vLLM's field); then closes it.
inline void PassRunFlagsAndClose(const Node& root, JsonWriter& chat) {
  bool stream = false;
  if (auto s = Member(root, "stream")) stream = Flag(*s);
  chat.Field("stream", stream);
  if (auto rp = Member(root, "return_progress")) chat.Field("return_progress", Flag(*rp));
  if (auto ie = Member(root, "ignore_eos")) chat.Field("ignore_eos", Flag(*ie));
  chat.EndObject();
}

// Renames the field an error of the chat.completions twin's parser names: the
// first pair whose `from` occurs is replaced (in the message and the param),
// so a 400 speaks the API the client used.
inline Error Renamed(const Error& e,
                     const std::vector<std::pair<std::string, std::string>>& names) {
  for (const auto& pair : names) {
    // Named references, not a structured binding: clang 14 (the fuzz build)
    // cannot capture a binding in the lambda below.
    const std::string& from = pair.first;
    const std::string& to = pair.second;
    if (e.object().find(from) == std::string::npos && e.detail().find(from) == std::string::npos)
      continue;
    auto rename = [&](std::string s) {
      for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
        s.replace(at, from.size(), to);
      }
      return s;
    };
    return Error(e.code(), rename(e.detail()), {}, Error::kNoOffset, rename(e.object()));
  }
  return e;
}

}  // namespace k3::server::json_node
