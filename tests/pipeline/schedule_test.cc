// parallel/pipeline/schedule.h: each stage's exact F/B order against
// hand-written lists (Megatron-core's non-interleaved 1F1B and GPipe).
#include "parallel/pipeline/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/error.h"

namespace tessera::parallel::pipeline {
namespace {

std::string order(Schedule s, int p, int m, int stage, int v = 1) { return ops_str(schedule_ops(s, p, m, stage, v)); }

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

// Megatron's interleaved order, p = 2, v = 2, m = 4: forward k is chunk
// (k mod 4) / 2 of micro-batch (k / 4) 2 + k mod 2; warm-up 2 (p - s - 1) + (v - 1) p.
TEST(Schedule, InterleavedIsMegatrons) {
  EXPECT_EQ(order(Schedule::kInterleaved, 2, 4, 0, 2),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(order(Schedule::kInterleaved, 2, 4, 1, 2),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // m == p: every forward first.
  EXPECT_EQ(order(Schedule::kInterleaved, 2, 2, 1, 2), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  // Every (chunk, micro-batch) exactly once each way.
  for (int s = 0; s < 4; ++s) {
    const auto ops = schedule_ops(Schedule::kInterleaved, 4, 8, s, 3);
    EXPECT_EQ(ops.size(), 2u * 8 * 3) << s;
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 8; ++i)
        for (PipeOp::Kind k : {PipeOp::kForward, PipeOp::kBackward})
          EXPECT_EQ(std::count(ops.begin(), ops.end(), PipeOp{k, i, c}), 1) << s << " " << i << "." << c;
  }
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8, 2), 3.0 / 19.0);
}

TEST(Schedule, InterleavedNeedsMegatronsConstraints) {
  EXPECT_THROW(schedule_ops(Schedule::kInterleaved, 2, 3, 0, 2), InvalidArgument);  // m not a multiple of p
  EXPECT_THROW(schedule_ops(Schedule::kInterleaved, 1, 4, 0, 2), InvalidArgument);  // one stage
  EXPECT_THROW(schedule_ops(Schedule::kInterleaved, 2, 4, 0, 1), InvalidArgument);  // one chunk
  EXPECT_THROW(schedule_ops(Schedule::k1F1B, 2, 4, 0, 2), InvalidArgument);         // chunks without interleaving
  EXPECT_EQ(parse_schedule("interleaved"), Schedule::kInterleaved);
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
