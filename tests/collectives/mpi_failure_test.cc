// The MPI backend's failure paths, each under mpirun (one process per rank):
// a stuck rank ends the job through the watchdog's MPI_Abort naming the
// collective and the group, a killed rank ends it through mpirun, and an
// aborted communicator fails every later call at once. No mode may hang.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/launcher/subprocess.h"
#include "tests/test_timeouts.h"

using namespace tessera::testing;
using namespace std::chrono_literals;
namespace test_time = tessera::test_time;

namespace {

const std::string kDriver = TESSERA_MPI_FAILURE_DRIVER;

// Under ASan, OpenMPI's own allocations show as leaks at exit (see run_test.cc).
Subprocess mpirun(const std::string& mode, const TempDir& d) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  return Subprocess({"mpirun", "--oversubscribe", "-np", "3", "-x", "ASAN_OPTIONS=detect_leaks=0", kDriver, "--mode",
                     mode, "--timeout-ms", "1000"},
                    d.path, mode);
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

// The stuck rank sleeps 60 s: the job ending well before shows the watchdog ended it.
TEST(MpiFailure, StuckRankEndsTheJobThroughTheWatchdog) {
  TempDir d;
  Subprocess p = mpirun("timeout", d);
  const int rc = p.wait(90s);
  ASSERT_NE(rc, -1) << "mpirun did not end";
  EXPECT_NE(rc, 0) << p.err();
  EXPECT_LT(p.seconds(), test_time::seconds(15.0)) << p.err();
  const std::string log = p.out() + p.err();  // spdlog writes to stdout
  EXPECT_NE(log.find("mpi all_reduce on group 'victims' did not finish within 1000 ms; aborting the job"),
            std::string::npos)
      << log;
}

TEST(MpiFailure, StuckRankAtSplitEndsTheJobThroughTheWatchdog) {
  TempDir d;
  Subprocess p = mpirun("split-timeout", d);
  const int rc = p.wait(90s);
  ASSERT_NE(rc, -1) << "mpirun did not end";
  EXPECT_NE(rc, 0) << p.err();
  EXPECT_LT(p.seconds(), test_time::seconds(15.0)) << p.err();
  const std::string log = p.out() + p.err();
  EXPECT_NE(log.find("mpi split on group 'victims' did not finish within 1000 ms"), std::string::npos) << log;
}

// The survivors' timeout is 60 s: mpirun, not the watchdog, ends the job.
TEST(MpiFailure, KilledRankEndsTheJob) {
  TempDir d;
  Subprocess p = mpirun("dead", d);
  const int rc = p.wait(90s);
  ASSERT_NE(rc, -1) << "mpirun did not end";
  EXPECT_NE(rc, 0) << p.err();
  EXPECT_LT(p.seconds(), test_time::seconds(15.0)) << p.err();
  const std::string log = p.out() + p.err();
  EXPECT_EQ(log.find("did not finish within"), std::string::npos) << log;
  EXPECT_EQ(log.find("the job was not ended"), std::string::npos) << log;
  // mpirun names the process that died and how.
  EXPECT_NE(log.find("process rank 1 "), std::string::npos) << log;
  EXPECT_NE(log.find("signal 9"), std::string::npos) << log;
}

TEST(MpiFailure, AbortFailsEveryLaterCallAtOnce) {
  TempDir d;
  Subprocess p = mpirun("abort", d);
  ASSERT_EQ(p.wait(60s), 0) << p.err();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(count(p.out(), "rank " + std::to_string(r) + " ok\n"), 1) << p.out() << p.err();
}
