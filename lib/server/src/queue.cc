#include "k3/server/queue.h"

#include <algorithm>

namespace k3::server {

RequestQueue::RequestQueue(int capacity, int slots)
    : capacity_(std::max(0, capacity)), slots_(std::max(1, slots)) {}

int RequestQueue::slots() const {
  std::lock_guard lock(mu_);
  return slots_;
}

void RequestQueue::SetSlots(int slots) {
  {
    std::lock_guard lock(mu_);
    slots_ = std::max(1, slots);
  }
  cv_.notify_all();
}

std::unique_ptr<RequestQueue::Ticket> RequestQueue::TryEnqueue() {
  std::lock_guard lock(mu_);
  // With a slot free and nobody waiting, the request runs at once and does
  // not take a queue place.
  if (int(waiting_.size()) >= capacity_ && (running_ >= slots_ || !waiting_.empty()))
    return nullptr;
  int64_t n = next_number_++;
  waiting_.push_back(n);
  return std::unique_ptr<Ticket>(new Ticket(this, n));
}

bool RequestQueue::Ticket::WaitTurn(const std::function<bool()>& still_wanted, std::chrono::milliseconds poll) {
  RequestQueue& q = *queue_;
  std::unique_lock lock(q.mu_);
  for (;;) {
    if (q.running_ < q.slots_ && !q.waiting_.empty() && q.waiting_.front() == number_) {
      q.waiting_.pop_front();
      ++q.running_;
      running_ = true;
      start_index_ = ++q.started_;
      return true;
    }
    const uint64_t generation = q.wake_generation_;
    q.cv_.wait_for(lock, poll);
    const bool woken = q.wake_generation_ != generation;
    if (!woken && q.running_ < q.slots_ && !q.waiting_.empty() && q.waiting_.front() == number_)
      continue;
    lock.unlock();
    bool wanted = still_wanted ? still_wanted() : true;
    lock.lock();
    if (!wanted) {
      auto it = std::find(q.waiting_.begin(), q.waiting_.end(), number_);
      if (it != q.waiting_.end()) q.waiting_.erase(it);
      q.cv_.notify_all();
      number_ = -number_;  // left: the destructor has nothing to do
      return false;
    }
  }
}

RequestQueue::Ticket::~Ticket() { queue_->Leave(*this); }

int RequestQueue::Ticket::position() const {
  std::lock_guard lock(queue_->mu_);
  auto it = std::find(queue_->waiting_.begin(), queue_->waiting_.end(), number_);
  return it == queue_->waiting_.end() ? 0 : int(it - queue_->waiting_.begin()) + 1;
}

void RequestQueue::Leave(Ticket& t) {
  std::lock_guard lock(mu_);
  if (t.running_) {
    --running_;
    t.running_ = false;
  } else if (t.number_ > 0) {
    auto it = std::find(waiting_.begin(), waiting_.end(), t.number_);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  cv_.notify_all();
}

void RequestQueue::WakeAll() {
  std::lock_guard lock(mu_);
  ++wake_generation_;
  cv_.notify_all();
}

int RequestQueue::waiting() const {
  std::lock_guard lock(mu_);
  return int(waiting_.size());
}

bool RequestQueue::busy() const {
  std::lock_guard lock(mu_);
  return running_ > 0;
}

int RequestQueue::running() const {
  std::lock_guard lock(mu_);
  return running_;
}

}  // namespace k3::server
