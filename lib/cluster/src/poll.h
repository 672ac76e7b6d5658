// Waiting with a deadline: spin briefly (a decode exchange on a fast link is
// tens of microseconds), then yield, then sleep in short steps so an idle
// rank does not take a core from the ranks that compute.
#pragma once

#include <sched.h>
#include <time.h>

#include "k3/core/sys.h"

namespace k3::cluster {

class Deadline {
 public:
  explicit Deadline(double seconds) : end_(NowSeconds() + seconds) {}
  Deadline(double seconds, double from) : end_(from + seconds) {}
  bool passed() const { return NowSeconds() >= end_; }

 private:
  double end_;
};

// Calls `done()` until it returns true (-> true) or the deadline passes (-> false).
template <typename F>
bool PollUntil(const Deadline& deadline, F&& done) {
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (deadline.passed()) return false;
    if (i < 200) continue;
    if (i < 2000) {
      sched_yield();
    } else {
      const timespec ts{0, 50000};  // 50 us
      nanosleep(&ts, nullptr);
    }
  }
}

}  // namespace k3::cluster
