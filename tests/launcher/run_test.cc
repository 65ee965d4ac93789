// `tessera run` end to end: it spawns real workers (tessera_hello) and the
// tests check ranks, environments, logs, exit codes, timings of failure
// handling, and that no process is left behind. Also plain mpirun.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <regex>

#include "tests/launcher/subprocess.h"

using namespace tessera::testing;
using namespace std::chrono_literals;

namespace {

const std::string kTessera = TESSERA_BIN;
const std::string kHello = TESSERA_HELLO_BIN;

std::vector<std::string> run_cmd(std::vector<std::string> launcher_flags, std::vector<std::string> hello_flags) {
  std::vector<std::string> v{kTessera, "run"};
  v.insert(v.end(), launcher_flags.begin(), launcher_flags.end());
  v.push_back("--");
  v.push_back(kHello);
  v.insert(v.end(), hello_flags.begin(), hello_flags.end());
  return v;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

void expect_all_gone(const std::string& dir, size_t expected) {
  auto pids = read_pids(dir);
  EXPECT_EQ(pids.size(), expected);
  for (pid_t p : pids) EXPECT_FALSE(alive(p)) << "worker " << p << " outlived the launcher";
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

}  // namespace

class RunWorld : public ::testing::TestWithParam<int> {};

TEST_P(RunWorld, EveryRankGetsItsEnvironmentAndPassesTheBarrier) {
  const int n = GetParam();
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", std::to_string(n), "--log-dir", d.path + "/logs"},
                       {"--print-env", "--comm"}),
               d.path);
  ASSERT_EQ(p.wait(60s), 0) << p.err();
  const std::string out = p.out();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(env MASTER_PORT=(\d+))")));
  const std::string port = m[1];
  for (int r = 0; r < n; ++r) {
    const std::string pre = "[" + std::to_string(r) + "] ";
    const std::string R = std::to_string(r), N = std::to_string(n);
    EXPECT_EQ(count(out, pre + "rank " + R + " of " + N + " ok (round 0)\n"), 1) << out;
    for (const std::string& kv : std::vector<std::string>{"TESSERA_RANK=" + R, "TESSERA_WORLD_SIZE=" + N, "TESSERA_LOCAL_RANK=" + R, "TESSERA_LOCAL_SIZE=" + N,
          "TESSERA_NODE_RANK=0", "RANK=" + R, "WORLD_SIZE=" + N, "LOCAL_RANK=" + R, "LOCAL_WORLD_SIZE=" + N,
          "GROUP_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
          "TESSERA_COORDINATOR=127.0.0.1:" + port, "TORCHELASTIC_RESTART_COUNT=0", "TESSERA_JOB_TOKEN=set"})
      EXPECT_EQ(count(out, pre + "env " + kv + "\n"), 1) << kv << "\n" << out;
    // One log file per rank, without the prefix.
    std::string log = read_file(d.path + "/logs/rank_" + R + ".log");
    EXPECT_NE(log.find("rank " + R + " of " + N + " ok"), std::string::npos) << log;
    EXPECT_EQ(log.find("[" + R + "]"), std::string::npos) << log;
  }
}
INSTANTIATE_TEST_SUITE_P(Sizes, RunWorld, ::testing::Values(1, 2, 3, 5, 8));

TEST(Run, TwoNodesRendezvousThroughNodeZero) {
  TempDir d;
  const std::string coord = "127.0.0.1:" + std::to_string(free_port());
  setenv("TESSERA_JOB_TOKEN", "two-node-test-token", 1);
  Subprocess n1(run_cmd({"--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1", "--coordinator", coord},
                        {"--print-env"}),
                d.path, "n1");
  std::this_thread::sleep_for(100ms);  // node 1 first: it must wait for node 0 to come up
  Subprocess n0(run_cmd({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0", "--coordinator", coord},
                        {"--print-env"}),
                d.path, "n0");
  unsetenv("TESSERA_JOB_TOKEN");
  ASSERT_EQ(n0.wait(60s), 0) << n0.err();
  ASSERT_EQ(n1.wait(60s), 0) << n1.err();
  for (int r = 0; r < 5; ++r) {
    const auto& out = r < 2 ? n0.out() : n1.out();
    const std::string pre = "[" + std::to_string(r) + "] ";
    EXPECT_EQ(count(out, pre + "rank " + std::to_string(r) + " of 5 ok"), 1) << out;
    EXPECT_EQ(count(out, pre + "env GROUP_RANK=" + std::string(r < 2 ? "0" : "1") + "\n"), 1) << out;
    EXPECT_EQ(count(out, pre + "env LOCAL_RANK=" + std::to_string(r < 2 ? r : r - 2) + "\n"), 1) << out;
  }
}

TEST(Run, FailedWorkerExitCodeWithin5sAndNothingLeft) {
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", "4"}, {"--exit-code", "3", "--fail-rank", "2", "--sleep", "60",
                                                   "--pid-dir", d.path}),
               d.path);
  ASSERT_EQ(p.wait(30s), 3) << p.err();
  EXPECT_LT(p.seconds(), 5.0);
  const std::string err = p.err();
  EXPECT_NE(err.find("root cause: rank 2 on node 0"), std::string::npos) << err;
  EXPECT_NE(err.find("exit code: 3"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 2 exiting with code 3 as asked"), std::string::npos) << err;  // the log tail
  expect_all_gone(d.path, 4);
}

TEST(Run, KilledWorkerReportsTheSignal) {
  TempDir d;
  // rank 1 throws: reported by the worker itself as the root cause.
  Subprocess p(run_cmd({"--nproc-per-node", "3"}, {"--throw-rank", "1", "--sleep", "60", "--pid-dir", d.path}),
               d.path);
  ASSERT_EQ(p.wait(30s), 1) << p.err();
  EXPECT_LT(p.seconds(), 5.0);
  EXPECT_NE(p.err().find("root cause: rank 1 on node 0 (" ), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("injected failure on rank 1"), std::string::npos) << p.err();
  expect_all_gone(d.path, 3);
}

TEST(Run, StoppedWorkerTriggersTheHeartbeatAbort) {
  TempDir d;
  // The others are blocked in all-reduces waiting for the stopped rank.
  Subprocess p(run_cmd({"--nproc-per-node", "3", "--heartbeat-timeout", "1"},
                       {"--comm", "--loop-seconds", "60", "--stop-rank", "1", "--pid-dir", d.path}),
               d.path);
  ASSERT_EQ(p.wait(30s), 1) << p.err();
  // 1 s timeout + detection + stop: well within timeout + 5 s.
  EXPECT_LT(p.seconds(), 6.0);
  EXPECT_NE(p.err().find("root cause: rank 1 on node 0"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("no heartbeat"), std::string::npos) << p.err();
  expect_all_gone(d.path, 3);
}

TEST(Run, SigtermReachesEveryWorker) {
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", "3"}, {"--sleep", "60", "--pid-dir", d.path, "--term-dir", d.path}),
               d.path);
  for (int i = 0; i < 500 && count(read_file(d.path + "/p.out"), " ok (round 0)") < 3; ++i)
    std::this_thread::sleep_for(20ms);
  ASSERT_EQ(count(read_file(d.path + "/p.out"), " ok (round 0)"), 3);
  kill(p.pid(), SIGTERM);
  EXPECT_EQ(p.wait(10s), 128 + SIGTERM) << p.err();
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(std::filesystem::exists(d.path + "/" + std::to_string(r) + ".term")) << "rank " << r << "\n" << p.err();
  expect_all_gone(d.path, 3);
}

TEST(Run, KilledLauncherTakesItsWorkersAlong) {
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", "2"}, {"--sleep", "60", "--pid-dir", d.path}), d.path);
  for (int i = 0; i < 500 && count(read_file(d.path + "/p.out"), " ok (round 0)") < 2; ++i)
    std::this_thread::sleep_for(20ms);
  kill(p.pid(), SIGKILL);  // no chance to clean up: PR_SET_PDEATHSIG must do it
  p.wait(5s);
  std::this_thread::sleep_for(300ms);
  expect_all_gone(d.path, 2);
}

TEST(Run, RestartRoundsUntilSuccess) {
  TempDir d;
  // Rank 0 fails in rounds 0 and 1; round 2 succeeds.
  Subprocess p(run_cmd({"--nproc-per-node", "3", "--max-restarts", "2"},
                       {"--exit-code", "5", "--fail-rank", "0", "--fail-round", "2"}),
               d.path);
  ASSERT_EQ(p.wait(60s), 0) << p.err();
  const std::string out = p.out();
  for (int round = 0; round < 3; ++round)
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(count(out, "[" + std::to_string(r) + "] rank " + std::to_string(r) + " of 3 ok (round " +
                               std::to_string(round) + ")"),
                1)
          << out;
  EXPECT_EQ(count(p.err(), "restarting"), 2) << p.err();
}

TEST(Run, RestartsExhausted) {
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", "2", "--max-restarts", "1"}, {"--exit-code", "5", "--fail-rank", "1"}),
               d.path);
  ASSERT_EQ(p.wait(60s), 5) << p.err();
  EXPECT_NE(p.err().find("after 1 restart"), std::string::npos) << p.err();
}

TEST(Run, BadUsageExits2WithUsage) {
  TempDir d;
  for (const auto& args : std::vector<std::vector<std::string>>{
           {kTessera, "run", "--no-such-flag", "--nproc-per-node", "2", "--", kHello},
           {kTessera, "run", "--nproc-per-node", "0", "--", kHello},
           {kTessera, "run", "--nproc-per-node", "two", "--", kHello},
           {kTessera, "run", "--nproc-per-node", "2"},
           {kTessera, "run", "--nproc-per-node", "2", "--nnodes", "2", "--", kHello},
           {kTessera, "run", "--nproc-per-node", "2", "--", "/no/such/program"}}) {
    Subprocess p(args, d.path);
    EXPECT_EQ(p.wait(10s), 2) << args[2] << " " << args[3] << "\n" << p.err();
    EXPECT_NE(p.err().find("Usage: tessera run"), std::string::npos) << p.err();
  }
}

TEST(Mpirun, BootstrapsWithoutTesseraRun) {
  TempDir d;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  Subprocess p({"mpirun", "--oversubscribe", "-np", "4", kHello, "--comm", "--pid-dir", d.path}, d.path);
  ASSERT_EQ(p.wait(60s), 0) << p.err();
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(count(p.out(), "rank " + std::to_string(r) + " of 4 ok"), 1) << p.out() << p.err();
}

TEST(Mpirun, FailureEndsTheJobThroughMpiAbort) {
  TempDir d;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  Subprocess p({"mpirun", "--oversubscribe", "-np", "4", kHello, "--throw-rank", "2", "--sleep", "60"}, d.path);
  int rc = p.wait(60s);
  EXPECT_NE(rc, 0);
  EXPECT_NE(rc, -1) << "mpirun did not end";
  EXPECT_LT(p.seconds(), 15.0);
  EXPECT_NE(p.err().find("job aborted: rank 2"), std::string::npos) << p.err();
}
