// The MPI bootstrap (collectives/mpi/mpi_env.h), run under mpirun:
//   mpirun --oversubscribe -np 3 mpi_env_test
// Every rank runs every test in the same order (the calls are collective).
// The oracles are the OpenMPI environment variables, MPI's own queries and
// the file system, never the module under test.
#include "collectives/mpi/mpi_env.h"

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.h"

namespace tessera::collectives::mpi {
namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

TEST(MpiEnv, InitIsIdempotentAndReportsTheLevelItGot) {
  ASSERT_TRUE(under_mpirun());
  EXPECT_FALSE(initialized());
  const ThreadLevel first = init();
  EXPECT_TRUE(initialized());
  // MPI's own answer is the oracle.
  int provided = -1, is_main = 0;
  MPI_Query_thread(&provided);
  MPI_Is_thread_main(&is_main);
  EXPECT_EQ(static_cast<int>(first), provided - MPI_THREAD_SINGLE) << thread_level_name(first);
  EXPECT_TRUE(is_main);
  // The watch threads' MPI_Abort needs MULTIPLE; Debian's OpenMPI provides it.
  EXPECT_EQ(first, ThreadLevel::Multiple) << thread_level_name(first);
  EXPECT_STREQ(thread_level_name(ThreadLevel::Multiple), "MPI_THREAD_MULTIPLE");
  // Later calls, also from several threads at once, return the same level.
  std::vector<ThreadLevel> got(4, ThreadLevel::Single);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < got.size(); ++i) ts.emplace_back([&got, i] { got[i] = init(); });
  for (auto& t : ts) t.join();
  for (ThreadLevel l : got) EXPECT_EQ(l, first);
  EXPECT_EQ(init(), first);
  EXPECT_EQ(thread_level(), first);
}

TEST(MpiEnv, WorldMatchesTheLauncher) {
  EXPECT_EQ(world_rank(), env_int("OMPI_COMM_WORLD_RANK"));
  EXPECT_EQ(world_size(), env_int("OMPI_COMM_WORLD_SIZE"));
  EXPECT_GE(world_size(), 2) << "run under mpirun -np 2 or more";
}

TEST(MpiEnv, BroadcastStringCarriesEveryByteFromAnyRoot) {
  for (int root = 0; root < world_size(); ++root) {
    std::string mine = "rank " + std::to_string(world_rank()) + std::string(1, '\0') + std::string(70000, 'x');
    mine[100] = static_cast<char>(0xff);
    std::string want = "rank " + std::to_string(root) + std::string(1, '\0') + std::string(70000, 'x');
    want[100] = static_cast<char>(0xff);
    EXPECT_EQ(broadcast_string(mine, root), want) << "root " << root;
  }
  // An empty value, and a root value that is shorter than the others'.
  EXPECT_EQ(broadcast_string(world_rank() == 0 ? "" : "not me"), "");
}

TEST(MpiEnv, NodeIndexNumbersHostsByTheirLowestRank) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::map<std::string, int> index;  // host -> its node index, in rank order
  int mine = -1;
  for (int r = 0; r < world_size(); ++r) {
    const std::string h = broadcast_string(host, r);
    if (!index.count(h)) {
      const int next = static_cast<int>(index.size());
      index[h] = next;
    }
    if (r == world_rank()) mine = index[h];
  }
  EXPECT_EQ(node_index(), mine);
}

// Without the barrier rank 0 would look before rank 2 (which sleeps 200 ms) wrote.
TEST(MpiEnv, BarrierWaitsForEveryRank) {
  std::string dir;
  if (world_rank() == 0) {
    dir = (std::filesystem::temp_directory_path() / "tessera-mpi-XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  }
  dir = broadcast_string(dir);
  std::this_thread::sleep_for(std::chrono::milliseconds(100 * world_rank()));
  std::ofstream(dir + "/r" + std::to_string(world_rank())) << "here";
  barrier();
  for (int r = 0; r < world_size(); ++r) EXPECT_TRUE(std::filesystem::exists(dir + "/r" + std::to_string(r))) << r;
  barrier();
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::collectives::mpi

// finalize() is idempotent, ends initialized(), and MPI cannot start again.
int main(int argc, char** argv) {
  using namespace tessera::collectives;
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  if (!mpi::initialized()) mpi::init();
  mpi::finalize();
  mpi::finalize();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (mpi::initialized() || !finalized) {
    std::fprintf(stderr, "FAILED: finalize() left MPI initialised\n");
    rc = 1;
  }
  try {
    mpi::init();
    std::fprintf(stderr, "FAILED: init() after finalize() did not throw\n");
    rc = 1;
  } catch (const tessera::Error& e) {
    if (std::string(e.what()).find("after MPI_Finalize") == std::string::npos) rc = 1;
  }
  return rc;
}
