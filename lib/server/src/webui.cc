// The web chat page, compiled into the binary (no CDN, no network at build time).
#include "k3/server/server.h"

namespace k3::server {
namespace {
constexpr char kPage[] =
#include "webui.html.inc"
    ;
}  // namespace

std::string_view WebPage() { return std::string_view(kPage, sizeof kPage - 1); }

}  // namespace k3::server
