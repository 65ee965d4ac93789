// WorkerContext outside a job: a lone worker's barrier returns at once.
#include "launcher/worker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "launcher/slurm.h"

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

// Slurm's host lists and tasks-per-node lists, as srun writes them.
TEST(Slurm, FirstHostOfANodeList) {
  EXPECT_EQ(first_slurm_host("node-a"), "node-a");
  EXPECT_EQ(first_slurm_host("node[07-09,12],gpu1"), "node07");
  EXPECT_EQ(first_slurm_host("gpu1,node[07-09]"), "gpu1");
  EXPECT_EQ(first_slurm_host("rack[3-4]-n[1-2]"), "rack3-n1");
  EXPECT_EQ(first_slurm_host("n[010-012]x"), "n010x");
  EXPECT_THROW(first_slurm_host(""), InvalidArgument);
  EXPECT_THROW(first_slurm_host("n[1-2"), InvalidArgument);
  EXPECT_THROW(first_slurm_host("n[x]"), InvalidArgument);
}

TEST(Slurm, TasksOnANode) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  for (int n : {0, 1, 2}) EXPECT_EQ(slurm_tasks_on_node("2(x3),1", n), 2) << n;
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_THROW(slurm_tasks_on_node("2(x3),1", 4), InvalidArgument);
  EXPECT_THROW(slurm_tasks_on_node("two", 0), InvalidArgument);
  EXPECT_THROW(slurm_tasks_on_node("2(x3", 0), InvalidArgument);
}

}  // namespace
}  // namespace tessera::launcher
