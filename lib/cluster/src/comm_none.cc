// Comm without MPI (-DK3_MPI=OFF, or AUTO without Open MPI): --cluster is refused.
#include "k3/cluster/comm.h"
#include "k3/core/error.h"

namespace k3::cluster {

struct Comm::Request::Impl {};
Comm::Request::Request() = default;
Comm::Request::~Request() = default;
Comm::Request::Request(Request&&) noexcept = default;
Comm::Request& Comm::Request::operator=(Request&&) noexcept = default;
bool Comm::Request::active() const { return false; }

bool Comm::Available() { return false; }
std::unique_ptr<Comm> Comm::InitOrThrow(int*, char***) {
  throw Error(ErrorCode::kUnsupported,
              "this k3 was built without MPI (-DK3_MPI=OFF or no libopenmpi-dev): no --cluster");
}
Comm::~Comm() = default;
std::string Comm::host() const { return "localhost"; }
Comm::Request Comm::Isend(int, int, const void*, size_t) { return {}; }
Comm::Request Comm::Irecv(int, int, void*, size_t) { return {}; }
bool Comm::Test(Request&, size_t*) { return true; }
bool Comm::Probe(int, int*, size_t*) { return false; }

}  // namespace k3::cluster
