// WorkerContext outside a job: a lone worker's barrier returns at once.
#include "launcher/worker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

namespace tessera::launcher {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// No coordinator at all (a context that never joined a job): a world of one
// has nobody to wait for.
TEST(WorkerBarrier, WorldOfOneWithoutCoordinatorReturnsAtOnce) {
  WorkerContext ctx;
  ASSERT_EQ(ctx.client, nullptr);
  const auto t0 = Clock::now();
  EXPECT_NO_THROW(ctx.barrier());
  EXPECT_NO_THROW(ctx.barrier("named"));
  EXPECT_LT(since(t0), 0.1);
  // A bigger world without a coordinator is a caller's bug, and says so.
  ctx.world.size = 2;
  EXPECT_THROW(ctx.barrier(), InternalError);
}

// init_worker alone (no launcher, no mpirun): barriers return at once, many times.
TEST(WorkerBarrier, LoneInitWorkerReturnsAtOnce) {
  for (const char* v : {"TESSERA_COORDINATOR", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "TESSERA_RANK",
                        "TESSERA_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"})
    ::unsetenv(v);
  WorkerOptions o;
  o.create_communicator = false;
  WorkerContext ctx = init_worker(o);
  EXPECT_EQ(ctx.mode, BootstrapMode::Single);
  EXPECT_EQ(ctx.world.size, 1);
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) EXPECT_NO_THROW(ctx.barrier());
  EXPECT_LT(since(t0), 0.5);
  shutdown(ctx);
}

}  // namespace
}  // namespace tessera::launcher
