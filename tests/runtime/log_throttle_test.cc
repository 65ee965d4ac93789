// LogThrottle (runtime/log_throttle.h): 5 lines per window, then silence,
// then one line that counts what was not logged.
#include "runtime/log_throttle.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(LogThrottle, BurstThenSilenceThenACount) {
  using namespace std::chrono_literals;
  LogThrottle t(10s, 5);
  const auto t0 = LogThrottle::Clock::time_point{} + 1h;
  int logged = 0;
  uint64_t dropped = 99;
  for (int i = 0; i < 2020; ++i)  // 2,020 refused calls within one second
    if (t.allow(&dropped, t0 + std::chrono::microseconds(i * 400))) {
      ++logged;
      EXPECT_EQ(dropped, 0u);
    }
  EXPECT_EQ(logged, 5);
  ASSERT_TRUE(t.allow(&dropped, t0 + 10s));  // a new window
  EXPECT_EQ(dropped, 2015u);
  ASSERT_TRUE(t.allow(&dropped, t0 + 10s));
  EXPECT_EQ(dropped, 0u);
}

}  // namespace
}  // namespace tessera
