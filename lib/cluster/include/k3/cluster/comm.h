// Comm: the only door to MPI. Everything else in k3 talks to ranks through
// this small interface (nonblocking byte messages with tags, polled with a
// deadline), so the MPI calls sit in one file (src/comm_mpi.cc) and the
// project builds without MPI (-DK3_MPI=OFF: Available() is false and
// InitOrThrow throws kUnsupported).
//
// Errors: MPI_ERRORS_RETURN is set on the world communicator, so a failing
// call becomes a k3::Error (kUnavailable, naming the peer) instead of Open
// MPI's default abort. Ownership: one Comm per process, created first and
// destroyed last (MPI_Finalize), unless Abandon() was called after a peer was
// lost (MPI_Finalize would wait for it). Thread-safety: calls from one thread
// at a time (MPI_THREAD_SERIALIZED).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace k3::cluster {

class Comm {
 public:
  // One outstanding send or receive. Destroying an unfinished one cancels it.
  class Request {
   public:
    Request();
    ~Request();
    Request(Request&&) noexcept;
    Request& operator=(Request&&) noexcept;
    bool active() const;
    struct Impl;

   private:
    friend class Comm;
    std::unique_ptr<Impl> impl_;
  };

  static bool Available();
  // MPI_Init_thread (SERIALIZED) once per process; a process started without
  // mpirun is a world of one rank.
  static std::unique_ptr<Comm> InitOrThrow(int* argc, char*** argv);
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string host() const;  // MPI_Get_processor_name

  // `data` must stay valid and unchanged until the request completes.
  Request Isend(int peer, int tag, const void* data, size_t bytes);
  Request Irecv(int peer, int tag, void* data, size_t capacity);
  // True once complete (the request is then inactive); `bytes` gets the
  // received length. Throws kUnavailable naming the peer on an MPI error.
  bool Test(Request& r, size_t* bytes = nullptr);
  // Nonblocking probe of a message from `peer` with any tag: its tag and size.
  bool Probe(int peer, int* tag, size_t* bytes);
  // After a lost peer: skip MPI_Finalize at destruction.
  void Abandon() { abandoned_ = true; }
  // A start-up refusal that every rank has heard (the coordinator's BYE sent
  // and complete, or received): the error that follows needs no Abandon, and
  // every rank finalizes. Ranks that all left MPI without MPI_Finalize at
  // once could leave mpirun (Open MPI 4.1) hanging with its ranks gone.
  void Settle() { settled_ = true; }
  bool settled() const { return settled_; }

 private:
  Comm() = default;
  int rank_ = 0;
  int size_ = 1;
  bool abandoned_ = false;
  bool settled_ = false;
};

}  // namespace k3::cluster
