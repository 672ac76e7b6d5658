// The dialect table: every API route k3 serves, in route order.
#include "k3/server/dialect.h"

namespace k3::server {

std::span<const Dialect* const> Dialects() {
  static const Dialect* const table[] = {
      &kChatCompletionsDialect,
      &kMessagesDialect,
      &kResponsesDialect,
  };
  return table;
}

const Dialect& DialectForPath(std::string_view path) {
  for (const Dialect* d : Dialects()) {
    const std::string_view own = d->path;
    if (path == own || (path.size() > own.size() && path.starts_with(own) && path[own.size()] == '/')) return *d;
  }
  return kChatCompletionsDialect;
}

}  // namespace k3::server
