// Time bounds for tests, from one place.
//
// A test that asserts "within N seconds" writes the bound as
// test_time::scaled(N): N times a factor that is 1 on a quiet machine, larger
// under sanitizers (which run several times slower), and set by
// TESSERA_TEST_TIME_SCALE (e.g. 3 on a loaded CI runner). Lower bounds
// (a timeout must not fire early) and the timeouts a test configures are not
// scaled: only the slack a test allows. Waits for an event poll for it with
// wait_until() instead of sleeping a fixed time.
#pragma once

#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define TESSERA_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(TESSERA_SANITIZER_BUILD)
#define TESSERA_TEST_SANITIZED 1
#endif

namespace tessera::test_time {

#if defined(TESSERA_TEST_SANITIZED)
inline constexpr double kDefaultScale = 3.0;
#else
inline constexpr double kDefaultScale = 1.0;
#endif

// TESSERA_TEST_TIME_SCALE when set to a positive number, else kDefaultScale.
inline double scale() {
  static const double s = [] {
    const char* v = std::getenv("TESSERA_TEST_TIME_SCALE");
    if (v && *v) {
      char* end = nullptr;
      const double x = std::strtod(v, &end);
      if (end && *end == '\0' && x > 0) return x;
    }
    return kDefaultScale;
  }();
  return s;
}

// A time bound in seconds, scaled.
inline double seconds(double s) { return s * scale(); }

// A time bound as a duration, scaled (milliseconds).
template <typename Rep, typename Period>
std::chrono::milliseconds scaled(std::chrono::duration<Rep, Period> d) {
  const double ms = std::chrono::duration<double, std::milli>(d).count() * scale();
  return std::chrono::milliseconds(std::llround(ms));
}

// What a piece of work cost since construction: this process's CPU time
// (every thread) and the wall time. A test that bounds how much work a call
// does (refusing /dev/zero without reading it, failing fast on a lying
// manifest) bounds the CPU time, which other builds loading the machine do
// not change; the wall time bounds only waits (a call that blocks), with
// scaled slack.
class Cost {
 public:
  Cost() : wall0_(std::chrono::steady_clock::now()), cpu0_(process_cpu_seconds()) {}
  double cpu_seconds() const { return process_cpu_seconds() - cpu0_; }
  double wall_seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0_).count();
  }
  static double process_cpu_seconds() {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }

 private:
  std::chrono::steady_clock::time_point wall0_;
  double cpu0_;
};

// Polls cond every `every` until it holds (true) or `timeout` passes (false).
inline bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout,
                       std::chrono::milliseconds every = std::chrono::milliseconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (cond()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(every);
  }
}

}  // namespace tessera::test_time
