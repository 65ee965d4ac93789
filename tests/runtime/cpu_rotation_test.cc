#include "runtime/cpu_rotation.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <set>
#include <thread>

#include "runtime/error.h"
#include "tests/test_timeouts.h"
#include "tests/timing_gate.h"

namespace tessera {
namespace {

World world(int size, int local_rank, int local_size) {
  World w;
  w.size = size;
  w.rank = local_rank;
  w.local_rank = local_rank;
  w.local_size = local_size;
  w.source = WorldSource::Tessera;
  return w;
}

TEST(CpuRotationPlan, AutoRotatesOnlyWhenEveryLocalRankHasACpu) {
  const std::vector<int> two{0, 1}, four{0, 2, 4, 6};
  EXPECT_FALSE(plan_cpu_rotation(world(1, 0, 1), two, "").enabled);
  EXPECT_FALSE(plan_cpu_rotation(world(4, 0, 1), two, "auto").enabled);  // one rank per host
  EXPECT_FALSE(plan_cpu_rotation(world(8, 0, 8), two, "").enabled);      // oversubscribed: the kernel places them
  EXPECT_FALSE(plan_cpu_rotation(world(2, 0, 2), {3}, "").enabled);      // bound to one CPU (mpirun -np 2)
  CpuRotationPlan p = plan_cpu_rotation(world(2, 1, 2), two, "");
  EXPECT_TRUE(p.enabled) << p.reason;
  EXPECT_EQ(p.period.count(), 50);
  EXPECT_EQ(p.cpus, two);
  p = plan_cpu_rotation(world(8, 3, 4), four, "auto");
  EXPECT_TRUE(p.enabled) << p.reason;
  EXPECT_EQ(p.cpus, four);
}

TEST(CpuRotationPlan, SettingTurnsItOffOrSetsThePeriod) {
  const std::vector<int> two{0, 1};
  EXPECT_FALSE(plan_cpu_rotation(world(2, 0, 2), two, "off").enabled);
  CpuRotationPlan p = plan_cpu_rotation(world(2, 0, 2), two, "20");
  EXPECT_TRUE(p.enabled);
  EXPECT_EQ(p.period.count(), 20);
  // A period alone does not force rotation where auto would not rotate.
  EXPECT_FALSE(plan_cpu_rotation(world(8, 0, 8), two, "20").enabled);
  for (const char* bad : {"0", "-5", "20x", "fast", "99999999999999999999", "60001"}) {
    try {
      plan_cpu_rotation(world(2, 0, 2), two, bad);
      ADD_FAILURE() << "accepted TESSERA_CPU_ROTATION=" << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("TESSERA_CPU_ROTATION"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(CpuRotationSlot, LocalRanksNeverShareACpuAndEachVisitsEveryCpu) {
  for (int n = 1; n <= 5; ++n) {
    for (int64_t k = 0; k < int64_t{3} * n; ++k) {
      std::set<int> used;
      for (int r = 0; r < n; ++r) {
        int s = rotation_slot(r, k, n);
        ASSERT_GE(s, 0);
        ASSERT_LT(s, n);
        used.insert(s);
      }
      EXPECT_EQ(static_cast<int>(used.size()), n) << "n " << n << " period " << k;
    }
    for (int r = 0; r < n; ++r) {
      std::set<int> visited;
      for (int64_t k = 1000; k < 1000 + n; ++k) visited.insert(rotation_slot(r, k, n));
      EXPECT_EQ(static_cast<int>(visited.size()), n);
    }
  }
}

TEST(CpuRotation, MovesTheThreadEveryPeriodAndRestoresItsMask) {
  TESSERA_TIMING_TEST();  // samples a 20 ms period: late under load
  const std::vector<int> original = current_cpu_mask();
  if (original.size() < 2) GTEST_SKIP() << "needs two CPUs in the affinity mask, have " << original.size();
  const std::vector<int> cpus{original[0], original[1]};
  const auto period = std::chrono::milliseconds(20);
  int samples = 0, on_time = 0;
  std::set<int> seen;
  {
    CpuRotation rot(/*local_rank=*/1, cpus, period);
    const auto end = std::chrono::steady_clock::now() + test_time::scaled(std::chrono::milliseconds(400));
    while (std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const auto t0 = std::chrono::steady_clock::now();
      const int cpu = sched_getcpu();
      const auto t1 = std::chrono::steady_clock::now();
      ASSERT_TRUE(cpu == cpus[0] || cpu == cpus[1]) << "ran on CPU " << cpu;
      seen.insert(cpu);
      const auto ms0 = std::chrono::duration_cast<std::chrono::milliseconds>(t0.time_since_epoch()).count();
      const auto ms1 = std::chrono::duration_cast<std::chrono::milliseconds>(t1.time_since_epoch()).count();
      const int64_t k = ms0 / period.count();
      // Away from the boundaries, where the rotation thread may not have moved us yet.
      if (k != ms1 / period.count() || ms0 % period.count() < 5) continue;
      ++samples;
      if (cpu == cpus[rotation_slot(1, k, 2)]) ++on_time;
    }
    EXPECT_GE(rot.moves(), 10);
  }
  EXPECT_EQ(seen.size(), 2u);
  ASSERT_GT(samples, 20);
  EXPECT_GE(on_time, samples * 3 / 4) << on_time << " of " << samples << " samples on the scheduled CPU";
  EXPECT_EQ(current_cpu_mask(), original);
}

}  // namespace
}  // namespace tessera
