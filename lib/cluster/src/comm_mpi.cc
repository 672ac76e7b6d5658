// The MPI implementation of Comm (built when K3_MPI finds Open MPI).
#include <mpi.h>

#include <climits>
#include <string>

#include "k3/cluster/comm.h"
#include "k3/core/error.h"

namespace k3::cluster {
namespace {

std::string MpiErrorText(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(buf, static_cast<size_t>(len));
}

// A failed call towards `peer`: kUnavailable naming the rank.
Error PeerError(const std::string& call, int peer, int rc) {
  const std::string rank = "rank " + std::to_string(peer);
  return Error(ErrorCode::kUnavailable, call + rank + ": " + MpiErrorText(rc), {}, Error::kNoOffset,
               rank);
}

}  // namespace

struct Comm::Request::Impl {
  MPI_Request req = MPI_REQUEST_NULL;
  int peer = -1;
};

Comm::Request::Request() = default;
Comm::Request::~Request() {
  if (impl_ && impl_->req != MPI_REQUEST_NULL) {
    // A send or receive abandoned after a deadline: cancel and free it; a
    // cancel may fail for a send that is already on its way, which is fine.
    MPI_Cancel(&impl_->req);
    MPI_Request_free(&impl_->req);
  }
}
Comm::Request::Request(Request&&) noexcept = default;
Comm::Request& Comm::Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    Request dead(std::move(*this));
    impl_ = std::move(o.impl_);
  }
  return *this;
}
bool Comm::Request::active() const { return impl_ && impl_->req != MPI_REQUEST_NULL; }

bool Comm::Available() { return true; }

std::unique_ptr<Comm> Comm::InitOrThrow(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS)
      throw Error(ErrorCode::kUnavailable, "MPI_Init_thread: " + MpiErrorText(rc));
    if (provided < MPI_THREAD_SERIALIZED) {
      throw Error(ErrorCode::kUnsupported, "the MPI library offers no MPI_THREAD_SERIALIZED");
    }
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::unique_ptr<Comm> c(new Comm);
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
  return c;
}

Comm::~Comm() {
  if (!abandoned_) MPI_Finalize();
}

std::string Comm::host() const {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  return std::string(name, static_cast<size_t>(len));
}

Comm::Request Comm::Isend(int peer, int tag, const void* data, size_t bytes) {
  if (bytes > static_cast<size_t>(INT_MAX)) {
    throw Error(ErrorCode::kUnsupported,
                "cluster message of " + std::to_string(bytes) + " bytes exceeds MPI's int count");
  }
  Request r;
  r.impl_ = std::make_unique<Request::Impl>();
  r.impl_->peer = peer;
  const int rc =
      MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r.impl_->req);
  if (rc != MPI_SUCCESS) {
    r.impl_->req = MPI_REQUEST_NULL;
    throw PeerError("MPI_Isend to ", peer, rc);
  }
  return r;
}

Comm::Request Comm::Irecv(int peer, int tag, void* data, size_t capacity) {
  Request r;
  r.impl_ = std::make_unique<Request::Impl>();
  r.impl_->peer = peer;
  const int count = capacity > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(capacity);
  const int rc = MPI_Irecv(data, count, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r.impl_->req);
  if (rc != MPI_SUCCESS) {
    r.impl_->req = MPI_REQUEST_NULL;
    throw PeerError("MPI_Irecv from ", peer, rc);
  }
  return r;
}

bool Comm::Test(Request& r, size_t* bytes) {
  if (!r.active()) return true;
  int done = 0;
  MPI_Status st;
  const int rc = MPI_Test(&r.impl_->req, &done, &st);
  if (rc != MPI_SUCCESS) {
    const int peer = r.impl_->peer;
    throw PeerError("", peer, rc);
  }
  if (done && bytes) {
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    *bytes = static_cast<size_t>(count);
  }
  return done != 0;
}

bool Comm::Probe(int peer, int* tag, size_t* bytes) {
  int flag = 0;
  MPI_Status st;
  const int rc = MPI_Iprobe(peer, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
  if (rc != MPI_SUCCESS) {
    throw PeerError("", peer, rc);
  }
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  *tag = st.MPI_TAG;
  *bytes = static_cast<size_t>(count);
  return true;
}

}  // namespace k3::cluster
