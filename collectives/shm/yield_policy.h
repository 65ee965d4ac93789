// When a waiting rank may hand its core over with sched_yield() rather than
// sleep on a futex: learnt from the rank's own yields (docs/threads.md).
//
// A yield that comes back quickly means the core's other runnable tasks are
// ranks that each ran briefly, so yielding passes the core around the group
// without wake-ups. A slow yield (or a window of yields that took long on
// average) means some task ran for a slice: another job on the machine, or a
// peer doing real work. A yielder waits behind such a task until the tick
// preempts it, where a woken sleeper preempts it at once, so this rank then
// sleeps at once in its waits for a backoff period. Each slow verdict within
// kCleanYielding of yielding again doubles the period (up to kMaxBackoff):
// a persistent competitor costs one slow yield per 128 ms. After
// kCleanYielding of yielding without a verdict the period starts again at
// kMinBackoff: a transient one (a peer's setup, a job that ended) costs a
// few milliseconds of sleeping waits, not a mode the rank stays in.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>

namespace tessera::collectives::shm {

class YieldPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kSlowYield{1000};    // one yield this long: slow
  static constexpr std::chrono::microseconds kSlowMeanYield{50};  // a window's mean this long: slow
  static constexpr std::chrono::milliseconds kMinBackoff{1};
  static constexpr std::chrono::milliseconds kMaxBackoff{128};
  static constexpr std::chrono::milliseconds kCleanYielding{100};

  // Runs a waiting phase: polls ready(), yielding between polls, until it is
  // true (returns true) or `window` has passed since `start` or a yield was
  // slow (returns false: the caller sleeps). Skips the phase (false) while a
  // slow verdict holds.
  template <typename Ready>
  bool yield_until(Ready&& ready, Clock::time_point start, Clock::duration window) {
    auto now = Clock::now();
    if (now < no_yield_until_) return false;
    int yields = 0;
    Clock::duration total{};
    for (;;) {
      if (ready()) return true;
      if (now - start >= window) {
        if (yields > 0 && total / yields > kSlowMeanYield) slow(now);
        return false;
      }
      ::sched_yield();
      const auto after = Clock::now();
      const auto took = after - now;
      ++yields;
      total += took;
      if (took > kSlowYield) {
        slow(after);
        return false;
      }
      now = after;
    }
  }

  Clock::duration backoff() const { return backoff_; }

  // Forgets the verdicts so far (the waits of a group's creation span its
  // ranks' process startup, which says nothing of the load that follows).
  void reset() {
    no_yield_until_ = {};
    backoff_ = kMinBackoff;
  }

 private:
  void slow(Clock::time_point now) {
    if (now - no_yield_until_ >= kCleanYielding) backoff_ = kMinBackoff;
    no_yield_until_ = now + backoff_;
    backoff_ = std::min<Clock::duration>(backoff_ * 2, kMaxBackoff);
  }

  Clock::time_point no_yield_until_{};
  Clock::duration backoff_ = kMinBackoff;
};

}  // namespace tessera::collectives::shm
