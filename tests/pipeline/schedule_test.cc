// parallel/pipeline/schedule.h: each stage's exact F/B order against
// hand-written lists (Megatron-core's non-interleaved 1F1B and GPipe).
#include "parallel/pipeline/schedule.h"

#include <gtest/gtest.h>

#include "runtime/error.h"

namespace tessera::parallel::pipeline {
namespace {

std::string order(Schedule s, int p, int m, int stage) { return ops_str(schedule_ops(s, p, m, stage)); }

TEST(Schedule, OneFOneBWarmsUpCoolsDown) {
  // p = 4, m = 6: stage s warms up with 3 - s forwards.
  EXPECT_EQ(order(Schedule::k1F1B, 4, 6, 0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(order(Schedule::k1F1B, 4, 6, 1), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(order(Schedule::k1F1B, 4, 6, 2), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(order(Schedule::k1F1B, 4, 6, 3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // p = 2, m = 3.
  EXPECT_EQ(order(Schedule::k1F1B, 2, 3, 0), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(order(Schedule::k1F1B, 2, 3, 1), "F0 B0 F1 B1 F2 B2");
  // m < p - 1: the warm-up stops at m.
  EXPECT_EQ(order(Schedule::k1F1B, 4, 2, 0), "F0 F1 B0 B1");
  EXPECT_EQ(order(Schedule::k1F1B, 4, 2, 2), "F0 F1 B0 B1");
  EXPECT_EQ(order(Schedule::k1F1B, 4, 2, 3), "F0 B0 F1 B1");
  // One stage: forward, backward, in turn.
  EXPECT_EQ(order(Schedule::k1F1B, 1, 3, 0), "F0 B0 F1 B1 F2 B2");
}

TEST(Schedule, GpipeAllForwardsThenAllBackwards) {
  EXPECT_EQ(order(Schedule::kGpipe, 2, 3, 0), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(order(Schedule::kGpipe, 2, 3, 1), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(order(Schedule::kGpipe, 4, 1, 3), "F0 B0");
}

TEST(Schedule, ActivationsInFlight) {
  // 1F1B: p - stage (at most m); GPipe: m.
  for (int s = 0; s < 4; ++s) EXPECT_EQ(max_in_flight(schedule_ops(Schedule::k1F1B, 4, 8, s)), 4 - s) << s;
  EXPECT_EQ(max_in_flight(schedule_ops(Schedule::k1F1B, 4, 2, 0)), 2);
  EXPECT_EQ(max_in_flight(schedule_ops(Schedule::kGpipe, 4, 8, 3)), 8);
}

TEST(Schedule, BubbleFraction) {
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(2, 8), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(1, 8), 0.0);
}

TEST(Schedule, BadArguments) {
  EXPECT_EQ(parse_schedule("gpipe"), Schedule::kGpipe);
  EXPECT_EQ(parse_schedule("1f1b"), Schedule::k1F1B);
  EXPECT_THROW(parse_schedule("1F1B-ish"), InvalidArgument);
  EXPECT_THROW(schedule_ops(Schedule::k1F1B, 2, 0, 0), InvalidArgument);
  EXPECT_THROW(schedule_ops(Schedule::k1F1B, 2, 4, 2), InvalidArgument);
  EXPECT_THROW(schedule_ops(Schedule::kGpipe, 0, 4, 0), InvalidArgument);
}

}  // namespace
}  // namespace tessera::parallel::pipeline
