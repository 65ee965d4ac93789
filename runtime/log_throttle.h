// A limit on repeated log lines (docs/errors.md, "Logging"): a line a
// remote peer can trigger at will (a refused call) must not let it flood the
// log. The first `burst` events of each `interval` may log; the rest are
// counted, and the next line that logs says how many were not.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace tessera {

class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogThrottle(std::chrono::milliseconds interval = std::chrono::seconds(10), int burst = 5)
      : interval_(interval), burst_(burst) {}
  // True when this event may log; then *suppressed is the number of events
  // not logged since the last line that was. Thread-safe.
  bool allow(uint64_t* suppressed, Clock::time_point now = Clock::now()) {
    std::lock_guard<std::mutex> l(mu_);
    if (now - window_start_ >= interval_ || !started_) {
      started_ = true;
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= burst_) {
      ++dropped_;
      return false;
    }
    ++in_window_;
    *suppressed = dropped_;
    dropped_ = 0;
    return true;
  }

 private:
  std::mutex mu_;
  const std::chrono::milliseconds interval_;
  const int burst_;
  bool started_ = false;
  Clock::time_point window_start_{};
  int in_window_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace tessera
