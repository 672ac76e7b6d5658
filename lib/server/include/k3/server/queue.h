// The server's admission queue: up to `slots` generations at a time on the
// model (k3-run serve --parallel; 1: one at a time), at most `capacity`
// requests waiting behind them in arrival (FIFO) order; beyond that
// TryEnqueue refuses (the HTTP layer answers 429 with Retry-After).
//
// Thread-safe. A Ticket is owned by one request thread; destroying it leaves
// the queue (or frees the model) so no exit path can wedge the queue.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace k3::server {

class RequestQueue {
 public:
  explicit RequestQueue(int capacity, int slots = 1);

  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    int64_t number() const { return number_; }  // arrival order, from 1
    // Blocks until this request may use the model. `still_wanted` is called
    // every `poll` while waiting (the server writes a heartbeat there); when it
    // returns false the request leaves the queue and WaitTurn returns false.
    bool WaitTurn(const std::function<bool()>& still_wanted, std::chrono::milliseconds poll);
    bool running() const { return running_; }
    int64_t start_index() const { return start_index_; }  // order of reaching the model, from 1
    // Place among the waiting requests (1: next to reach the model); 0 once
    // running or after leaving.
    int position() const;

   private:
    friend class RequestQueue;
    Ticket(RequestQueue* q, int64_t n) : queue_(q), number_(n) {}
    RequestQueue* queue_;
    int64_t number_;
    bool running_ = false;
    int64_t start_index_ = 0;
  };

  // A ticket in the queue, or null when `capacity` requests already wait.
  std::unique_ptr<Ticket> TryEnqueue();

  // Wakes every waiter now, so each asks its still_wanted at once (shutdown).
  void WakeAll();
  int waiting() const;  // requests queued, not counting the running ones
  bool busy() const;    // a request holds the model
  int running() const;  // requests holding a slot
  int capacity() const { return capacity_; }
  int slots() const;
  // Sets the slots (k3-run serve --parallel 0: known once the engine has
  // loaded, before any request can reach it); waiters are re-examined.
  void SetSlots(int slots);

 private:
  void Leave(Ticket& t);
  const int capacity_;
  int slots_;  // under mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int64_t> waiting_;  // ticket numbers, arrival order
  int running_ = 0;              // tickets holding a slot
  int64_t next_number_ = 1;
  int64_t started_ = 0;
  uint64_t wake_generation_ = 0;  // WakeAll calls
};

}  // namespace k3::server
