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
