// `tessera run` end to end: it spawns real workers (tessera_hello) and the
// tests check ranks, environments, logs, exit codes, timings of failure
// handling, and that no process is left behind. Also plain mpirun.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <regex>
#include <stdexcept>
#include <thread>

#include "launcher/coordinator.h"
#include "runtime/error.h"
#include "tests/launcher/subprocess.h"
#include "tests/runtime/special_files.h"
#include "tests/test_timeouts.h"

using namespace tessera::testing;
using namespace std::chrono_literals;
namespace test_time = tessera::test_time;

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

// Workers that die by PR_SET_PDEATHSIG go a moment after their launcher:
// waits (bounded) for that instead of sleeping a fixed time.
void expect_all_gone_soon(const std::string& dir, size_t expected) {
  test_time::wait_until(
      [&] {
        for (pid_t p : read_pids(dir))
          if (alive(p)) return false;
        return true;
      },
      test_time::scaled(2s));
  expect_all_gone(dir, expected);
}

// Waits (bounded) until `file` holds `n` lines that contain `what`.
bool wait_for_lines(const std::string& file, const std::string& what, int n) {
  return test_time::wait_until([&] { return count(read_file(file), what) >= n; }, test_time::scaled(10s), 20ms);
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_port: socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  if (!ok) throw std::runtime_error("free_port: cannot bind a loopback port");
  return ntohs(a.sin_port);
}

// `tessera run` of node `node` of 2 (2 workers each) running `script` under /bin/sh.
std::vector<std::string> two_node_sh(const std::string& coord, const char* node, const std::string& script) {
  return {kTessera, "run", "--nproc-per-node", "2",  "--nnodes", "2", "--node-rank", node, "--coordinator",
          coord,    "--",  "/bin/sh",          "-c", script};
}

}  // namespace

class RunWorld : public ::testing::TestWithParam<int> {};

TEST_P(RunWorld, EveryRankGetsItsEnvironmentAndPassesTheBarrier) {
  const int n = GetParam();
  TempDir d;
  Subprocess p(
      run_cmd({"--nproc-per-node", std::to_string(n), "--log-dir", d.path + "/logs"}, {"--print-env", "--comm"}),
      d.path);
  ASSERT_EQ(p.wait(60s), 0) << p.err();
  const std::string out = p.out();
  // (std::regex trips GCC 12's -Wmaybe-uninitialized under ASan.)
  auto value_of = [&out](const std::string& key) {
    auto at = out.find(key);
    return at == std::string::npos ? std::string() : out.substr(at + key.size(), out.find('\n', at) - at - key.size());
  };
  const std::string port = value_of("env MASTER_PORT="), coord = value_of("env TESSERA_COORDINATOR=127.0.0.1:");
  ASSERT_FALSE(port.empty()) << out;
  ASSERT_FALSE(coord.empty()) << out;
  // MASTER_PORT is rank 0's own store's (torchrun's meaning), not the coordinator's.
  EXPECT_NE(port, coord);
  for (int r = 0; r < n; ++r) {
    const std::string pre = "[" + std::to_string(r) + "] ";
    const std::string R = std::to_string(r), N = std::to_string(n);
    EXPECT_EQ(count(out, tessera::detail::concat(pre, "rank ", R, " of ", N, " ok (round 0)\n")), 1) << out;
    for (const std::string& kv : std::vector<std::string>{
             "TESSERA_RANK=" + R, "TESSERA_WORLD_SIZE=" + N, "TESSERA_LOCAL_RANK=" + R, "TESSERA_LOCAL_SIZE=" + N,
             "TESSERA_NODE_RANK=0", "RANK=" + R, "WORLD_SIZE=" + N, "LOCAL_RANK=" + R, "LOCAL_WORLD_SIZE=" + N,
             "GROUP_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "TESSERA_COORDINATOR=127.0.0.1:" + coord,
             "TORCHELASTIC_RESTART_COUNT=0", "TESSERA_JOB_TOKEN=set"})
      EXPECT_EQ(count(out, tessera::detail::concat(pre, "env ", kv, "\n")), 1) << kv << "\n" << out;
    // On the coordinator's host, its Unix socket (launcher/coordinator.h).
    EXPECT_EQ(count(out, pre + "env TESSERA_COORDINATOR_LOCAL=unix-abstract:tessera-coordinator-"), 1) << out;
    // One log file per rank, without the prefix.
    std::string log = read_file(d.path + "/logs/rank_" + R + ".log");
    EXPECT_NE(log.find(tessera::detail::concat("rank ", R, " of ", N, " ok")), std::string::npos) << log;
    EXPECT_EQ(log.find("[" + R + "]"), std::string::npos) << log;
  }
}
INSTANTIATE_TEST_SUITE_P(Sizes, RunWorld, ::testing::Values(1, 2, 3, 5, 8));

// The launch benchmark's floor (tessera_hello --bare: one channel, one
// barrier) meets as a whole join does, and refuses to run outside a job.
TEST(Run, BareWorkersMeetAtOneBarrier) {
  TempDir d;
  Subprocess p({kTessera, "run", "--nproc-per-node", "3", "--", kHello, "--bare"}, d.path);
  ASSERT_EQ(p.wait(60s), 0) << p.err();
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(count(p.out(), tessera::detail::concat("[", r, "] rank ", r, " of 3 ok (round 0)\n")), 1) << p.out();
  Subprocess alone({kHello, "--bare"}, d.path, "alone");
  EXPECT_EQ(alone.wait(30s), 1);
  EXPECT_NE(alone.err().find("--bare runs only under `tessera run`"), std::string::npos) << alone.err();
}

TEST(Run, TwoNodesRendezvousThroughNodeZero) {
  TempDir d;
  const std::string coord = "127.0.0.1:" + std::to_string(free_port());
  setenv("TESSERA_JOB_TOKEN", "two-node-test-token", 1);
  Subprocess n1(run_cmd({"--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1", "--coordinator", coord,
                         "--heartbeat-timeout", "1"},
                        {"--print-env"}),
                d.path, "n1");
  // Node 1 first, for longer than its heartbeat give-up (2 s): it must keep
  // waiting for node 0 to come up, and its heartbeats must work once it does
  // (node 0's workers outlast the 1 s heartbeat timeout).
  std::this_thread::sleep_for(2500ms);
  Subprocess n0(run_cmd({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0", "--coordinator", coord,
                         "--heartbeat-timeout", "1"},
                        {"--print-env", "--sleep", "1.5"}),
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
    // Only node 0's workers share the coordinator's host (its Unix socket);
    // node 1's dial TCP.
    EXPECT_EQ(count(out, pre + "env TESSERA_COORDINATOR_LOCAL=" + (r < 2 ? "unix-abstract:" : "\n")), 1) << out;
  }
}

namespace {

// A lone worker (rank 0 of 1) started as `tessera run` starts one, given
// these coordinator addresses, against a coordinator this test hosts; it
// must pass its barrier.
void expect_lone_worker_joins(const tessera::launcher::CoordinatorOptions& o, const std::string& tcp,
                              const std::string& local) {
  TempDir d;
  const std::vector<std::pair<const char*, std::string>> env = {{"TESSERA_COORDINATOR", tcp},
                                                                {"TESSERA_COORDINATOR_LOCAL", local},
                                                                {"TESSERA_JOB_TOKEN", o.token},
                                                                {"TESSERA_RANK", "0"},
                                                                {"TESSERA_WORLD_SIZE", "1"}};
  for (const auto& [k, v] : env) setenv(k, v.c_str(), 1);
  Subprocess p({kHello, "--meet-only"}, d.path);
  for (const auto& [k, v] : env) unsetenv(k);
  ASSERT_EQ(p.wait(60s), 0) << p.err();
  EXPECT_EQ(count(p.out(), "rank 0 of 1 ok (round 0)\n"), 1) << p.out();
}

tessera::launcher::CoordinatorOptions lone_worker_job(const std::string& local_address) {
  tessera::launcher::CoordinatorOptions o;
  o.token = "local-address-test-token";
  o.num_nodes = 0;
  o.world_size = 1;
  o.local_address = local_address;
  return o;
}

}  // namespace

// A worker dials TESSERA_COORDINATOR_LOCAL when it is given, not
// TESSERA_COORDINATOR: nothing listens at the TCP address here, so the
// worker passes its barrier only through the coordinator's Unix socket.
TEST(Run, WorkerDialsTheLocalAddressWhenGiven) {
  const auto o = lone_worker_job("unix-abstract:tessera-run-test-" + std::to_string(getpid()));
  tessera::launcher::Coordinator coordinator(o);
  ASSERT_EQ(coordinator.local_address(), o.local_address);
  expect_lone_worker_joins(o, "127.0.0.1:" + std::to_string(free_port()), o.local_address);
}

// A worker that cannot reach the Unix socket (here: nobody serves the name;
// in practice a program in another network namespace) dials TCP instead.
TEST(Run, WorkerFallsBackToTcpWhenTheLocalAddressIsUnreachable) {
  const auto o = lone_worker_job("");
  tessera::launcher::Coordinator coordinator(o);
  expect_lone_worker_joins(o, "127.0.0.1:" + std::to_string(coordinator.port()),
                           "unix-abstract:tessera-nobody-" + std::to_string(getpid()));
}

TEST(Run, SigtermDuringRendezvous) {
  TempDir d;
  const std::string coord = "127.0.0.1:" + std::to_string(free_port());
  setenv("TESSERA_JOB_TOKEN", "lonely-node-token", 1);
  // Node 1 of 2, and node 0 never comes.
  Subprocess n1(run_cmd({"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--coordinator", coord}, {}),
                d.path, "n1");
  unsetenv("TESSERA_JOB_TOKEN");
  // Once the launcher blocks and handles SIGTERM, the signal is its to handle.
  ASSERT_TRUE(test_time::wait_until([&] { return handles_signal(n1.pid(), SIGTERM); }, test_time::scaled(10s)));
  auto t0 = std::chrono::steady_clock::now();
  kill(n1.pid(), SIGTERM);
  EXPECT_EQ(n1.wait(10s), 128 + SIGTERM) << n1.err();
  // exit(143) from the launcher's own handling, not the default death by SIGTERM.
  EXPECT_FALSE(n1.signaled()) << "killed by the signal instead of handling it\n" << n1.err();
  EXPECT_NE(n1.err().find("tessera run: interrupted by Terminated during rendezvous"), std::string::npos) << n1.err();
  // A join slice (0.5 s + 0.5 s slack) and an in-flight heartbeat (<= 1 s).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, test_time::scaled(4s));
}

TEST(Run, FailureOnOneNodeStopsBothNodes) {
  TempDir d;
  const std::string coord = "127.0.0.1:" + std::to_string(free_port());
  setenv("TESSERA_JOB_TOKEN", "two-node-fail-token", 1);
  Subprocess n0(run_cmd({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0", "--coordinator", coord},
                        {"--exit-code", "3", "--fail-rank", "3", "--sleep", "60", "--pid-dir", d.path}),
                d.path, "n0");
  Subprocess n1(run_cmd({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--coordinator", coord},
                        {"--exit-code", "3", "--fail-rank", "3", "--sleep", "60", "--pid-dir", d.path}),
                d.path, "n1");
  unsetenv("TESSERA_JOB_TOKEN");
  EXPECT_EQ(n1.wait(30s), 3) << n1.err();
  EXPECT_EQ(n0.wait(30s), 3) << n0.err();
  EXPECT_LT(n0.seconds(), test_time::seconds(5.0));
  // Node 0 names the remote root cause, with the log tail node 1 sent.
  EXPECT_NE(n0.err().find("root cause: rank 3 on node 1"), std::string::npos) << n0.err();
  EXPECT_NE(n0.err().find("rank 3 exiting with code 3 as asked"), std::string::npos) << n0.err();
  expect_all_gone(d.path, 4);
}

// A failing rank whose last lines are a progress bar's megabytes ('\r', no
// newline): its exit still reaches the coordinator (the report with ten
// 1 MiB lines was over gRPC's 4 MiB limit, and node 0 ran on), and the
// root cause shows the bar's last state.
TEST(Run, FailureAfterMegabytesOfProgressBarStopsBothNodes) {
  TempDir d;
  const std::string coord = "127.0.0.1:" + std::to_string(free_port());
  const std::string script =
      "if [ \"$RANK\" = 3 ]; then i=0; while [ $i -lt 8 ]; do head -c 1500000 /dev/zero | tr '\\0' a; "
      "printf '\\rstep %d' $i; i=$((i+1)); done; exit 7; fi; sleep 60";
  setenv("TESSERA_JOB_TOKEN", "two-node-bar-token", 1);
  Subprocess n0(two_node_sh(coord, "0", script), d.path, "n0");
  Subprocess n1(two_node_sh(coord, "1", script), d.path, "n1");
  unsetenv("TESSERA_JOB_TOKEN");
  EXPECT_EQ(n1.wait(30s), 7);
  EXPECT_EQ(n0.wait(30s), 7);
  EXPECT_LT(n0.seconds(), test_time::seconds(10.0));
  EXPECT_NE(n0.err().find("root cause: rank 3 on node 1"), std::string::npos) << n0.err().substr(0, 2000);
  EXPECT_NE(n0.err().find("step 7"), std::string::npos) << "the bar's last state\n" << n0.err().substr(0, 2000);
}

// A node whose workers finished waits for the others, and a SIGINT then
// aborts the job (it was dropped: the node returned 0 when the others did).
TEST(Run, InterruptWhileWaitingForTheOtherNodesAbortsTheJob) {
  TempDir d;
  const std::string coord = "127.0.0.1:" + std::to_string(free_port());
  const std::string script = "[ \"$GROUP_RANK\" = 1 ] && sleep 60; echo \"rank $RANK done\"";
  setenv("TESSERA_JOB_TOKEN", "two-node-wait-token", 1);
  setenv("TESSERA_LOG_LEVEL", "debug", 1);  // node 0 says when it starts waiting for node 1
  Subprocess n0(two_node_sh(coord, "0", script), d.path, "n0");
  Subprocess n1(two_node_sh(coord, "1", script), d.path, "n1");
  unsetenv("TESSERA_JOB_TOKEN");
  unsetenv("TESSERA_LOG_LEVEL");
  // Node 0's round is over and it waits for node 1, which is what this is about.
  ASSERT_TRUE(test_time::wait_until(
      [&] { return n0.err().find("this node is done; waiting for the other nodes") != std::string::npos; },
      test_time::scaled(20s)))
      << n0.out() << n0.err();
  kill(n0.pid(), SIGINT);
  EXPECT_EQ(n0.wait(10s), 128 + SIGINT) << n0.err();
  EXPECT_NE(n0.err().find("while waiting for the other nodes; job aborted"), std::string::npos) << n0.err();
  EXPECT_NE(n1.wait(10s), 0) << n1.err();
  EXPECT_LT(n1.seconds(), test_time::seconds(30.0)) << "node 1 ran its 60 s";
}

TEST(Run, LostNodeAgentAbortsTheJob) {
  TempDir d;
  const std::string coord = "127.0.0.1:" + std::to_string(free_port());
  setenv("TESSERA_JOB_TOKEN", "two-node-lost-token", 1);
  Subprocess n0(run_cmd({"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "0", "--coordinator", coord,
                         "--heartbeat-timeout", "1"},
                        {"--sleep", "60", "--pid-dir", d.path}),
                d.path, "n0");
  Subprocess n1(run_cmd({"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--coordinator", coord,
                         "--heartbeat-timeout", "1"},
                        {"--sleep", "60", "--pid-dir", d.path}),
                d.path, "n1");
  unsetenv("TESSERA_JOB_TOKEN");
  ASSERT_TRUE(wait_for_lines(d.path + "/n1.out", " ok (round 0)", 1)) << read_file(d.path + "/n1.out");
  kill(n1.pid(), SIGKILL);  // node 1's agent vanishes (its worker follows by PDEATHSIG)
  EXPECT_EQ(n0.wait(30s), 1) << n0.err();
  EXPECT_LT(n0.seconds(), test_time::seconds(8.0));
  // Either the node's or its worker's heartbeats are noticed first.
  EXPECT_NE(n0.err().find("root cause:"), std::string::npos) << n0.err();
  EXPECT_NE(n0.err().find("no heartbeat"), std::string::npos) << n0.err();
  expect_all_gone_soon(d.path, 2);  // node 1's worker goes by PDEATHSIG
}

TEST(Run, FailedWorkerExitCodeWithin5sAndNothingLeft) {
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", "4"},
                       {"--exit-code", "3", "--fail-rank", "2", "--sleep", "60", "--pid-dir", d.path}),
               d.path);
  ASSERT_EQ(p.wait(30s), 3) << p.err();
  EXPECT_LT(p.seconds(), test_time::seconds(5.0));
  const std::string err = p.err();
  EXPECT_NE(err.find("root cause: rank 2 on node 0"), std::string::npos) << err;
  EXPECT_NE(err.find("exit code: 3"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 2 exiting with code 3 as asked"), std::string::npos) << err;  // the log tail
  expect_all_gone(d.path, 4);
}

TEST(Run, KilledWorkerReportsTheSignal) {
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", "3"}, {"--kill-rank", "0", "--sleep", "60", "--pid-dir", d.path}), d.path);
  ASSERT_EQ(p.wait(30s), 128 + SIGKILL) << p.err();
  EXPECT_LT(p.seconds(), test_time::seconds(5.0));
  EXPECT_NE(p.err().find("root cause: rank 0 on node 0"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("signal:    9 (Killed)"), std::string::npos) << p.err();
  expect_all_gone(d.path, 3);
}

TEST(Run, WorkerExceptionIsTheRootCause) {
  TempDir d;
  // rank 1 throws: reported by the worker itself as the root cause.
  Subprocess p(run_cmd({"--nproc-per-node", "3"}, {"--throw-rank", "1", "--sleep", "60", "--pid-dir", d.path}), d.path);
  ASSERT_EQ(p.wait(30s), 1) << p.err();
  EXPECT_LT(p.seconds(), test_time::seconds(5.0));
  EXPECT_NE(p.err().find("root cause: rank 1 on node 0 ("), std::string::npos) << p.err();
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
  EXPECT_LT(p.seconds(), test_time::seconds(6.0));
  EXPECT_NE(p.err().find("root cause: rank 1 on node 0"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("no heartbeat"), std::string::npos) << p.err();
  expect_all_gone(d.path, 3);
}

// SIGINT, SIGTERM, SIGHUP and SIGQUIT to the launcher: each worker gets that
// signal itself (its handler records it), and the launcher exits 128 + N of
// its own accord.
class RunSignal : public ::testing::TestWithParam<int> {};

TEST_P(RunSignal, ReachesEveryWorkerAndSetsTheExitCode) {
  const int sig = GetParam();
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", "3"}, {"--sleep", "60", "--pid-dir", d.path, "--term-dir", d.path}),
               d.path);
  ASSERT_TRUE(wait_for_lines(d.path + "/p.out", " ok (round 0)", 3)) << p.out();
  kill(p.pid(), sig);
  EXPECT_EQ(p.wait(10s), 128 + sig) << p.err();
  EXPECT_FALSE(p.signaled()) << p.err();
  EXPECT_NE(p.err().find(std::string("interrupted by ") + strsignal(sig)), std::string::npos) << p.err();
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(read_file(d.path + "/" + std::to_string(r) + ".term"), std::to_string(sig) + "\n") << "rank " << r << "\n"
                                                                                                 << p.err();
  expect_all_gone(d.path, 3);
}
INSTANTIATE_TEST_SUITE_P(Signals, RunSignal, ::testing::Values(SIGINT, SIGTERM, SIGHUP, SIGQUIT),
                         [](const auto& info) { return std::string(sigabbrev_np(info.param)); });

// A worker that ignores SIGTERM is killed after --kill-grace: not before
// (it had the grace), and not much after (the escalation to SIGKILL). The
// workers are shell loops, which use no worker library (so no watch thread
// ends them when the job aborts): only the launcher's signals do.
TEST(Run, KillGraceEscalatesToSigkill) {
  TempDir d;
  const std::string script =
      "cd " + d.path +
      "; echo $$ > $TESSERA_RANK.pid; "
      "if [ \"$TESSERA_RANK\" = 0 ]; then while [ ! -f 1.ready ]; do sleep 0.02; done; exit 3; fi; "
      "trap 'echo term >> 1.term' TERM; touch 1.ready; while :; do sleep 0.05; done";
  Subprocess p({kTessera, "run", "--nproc-per-node", "2", "--kill-grace", "1.5", "--", "/bin/sh", "-c", script},
               d.path);
  ASSERT_EQ(p.wait(30s), 3) << p.err();
  const std::string term = read_file(d.path + "/1.term");
  EXPECT_GE(count(term, "term"), 1) << "rank 1 never got SIGTERM\n" << p.err();
  // After rank 0's exit the launcher waits the 1.5 s grace, then SIGKILLs.
  EXPECT_GE(p.seconds(), 1.5) << p.err();
  EXPECT_LT(p.seconds(), 1.5 + test_time::seconds(4.0)) << p.err();
  EXPECT_NE(p.err().find("root cause: rank 0 on node 0"), std::string::npos) << p.err();
  expect_all_gone(d.path, 2);
}

// An interrupt ends the job even with restarts left: no new round.
TEST(Run, InterruptsAreNeverRestarted) {
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", "2", "--max-restarts", "3"},
                       {"--sleep", "60", "--pid-dir", d.path, "--term-dir", d.path}),
               d.path);
  ASSERT_TRUE(wait_for_lines(d.path + "/p.out", " ok (round 0)", 2)) << p.out();
  kill(p.pid(), SIGINT);
  EXPECT_EQ(p.wait(10s), 128 + SIGINT) << p.err();
  EXPECT_EQ(count(p.err(), "restarting"), 0) << p.err();
  EXPECT_EQ(count(p.out(), "(round 1)"), 0) << p.out();
  expect_all_gone(d.path, 2);
}

TEST(Run, KilledLauncherTakesItsWorkersAlong) {
  TempDir d;
  Subprocess p(run_cmd({"--nproc-per-node", "2"}, {"--sleep", "60", "--pid-dir", d.path}), d.path);
  ASSERT_TRUE(wait_for_lines(d.path + "/p.out", " ok (round 0)", 2)) << p.out();
  kill(p.pid(), SIGKILL);  // no chance to clean up: PR_SET_PDEATHSIG must do it
  p.wait(5s);
  expect_all_gone_soon(d.path, 2);
}

// The workers are shells whose child (a sleep) is what must go: the shell's
// own PDEATHSIG would not reach it, the keeper's SIGKILL to the group does.
TEST(Run, KilledLauncherTakesTheWorkersChildrenAlong) {
  TempDir d;
  const std::string script = "cd " + d.path + "; sleep 60 & echo $! > $TESSERA_RANK.pid; wait";
  Subprocess p({kTessera, "run", "--nproc-per-node", "2", "--", "/bin/sh", "-c", script}, d.path);
  auto both_running = [&] {
    auto pids = read_pids(d.path);
    return pids.size() == 2 && alive(pids[0]) && alive(pids[1]);
  };
  ASSERT_TRUE(test_time::wait_until(both_running, test_time::scaled(10s), 20ms)) << p.err();
  kill(p.pid(), SIGKILL);
  p.wait(5s);
  expect_all_gone_soon(d.path, 2);
}

TEST(Run, RestartRoundsUntilSuccess) {
  TempDir d;
  // Rank 0 fails in rounds 0 and 1; round 2 succeeds.
  Subprocess p(run_cmd({"--nproc-per-node", "3", "--max-restarts", "2", "--log-dir", d.path + "/logs"},
                       {"--exit-code", "5", "--fail-rank", "0", "--fail-round", "2"}),
               d.path);
  ASSERT_EQ(p.wait(60s), 0) << p.err();
  const std::string out = p.out();
  auto ok_line = [](int r, int round) {
    return "[" + std::to_string(r) + "] rank " + std::to_string(r) + " of 3 ok (round " + std::to_string(round) + ")";
  };
  // Failed rounds: rank 0 got through the barrier and failed (the others may be
  // stopped before they print). The last round: everyone.
  EXPECT_EQ(count(out, ok_line(0, 0)), 1) << out;
  EXPECT_EQ(count(out, ok_line(0, 1)), 1) << out;
  for (int r = 0; r < 3; ++r) EXPECT_EQ(count(out, ok_line(r, 2)), 1) << out;
  EXPECT_EQ(count(out, "(round 3)"), 0) << out;
  EXPECT_EQ(count(p.err(), "restarting"), 2) << p.err();
  // Rank 0's log holds every round, each restart marked once, in order.
  const std::string log = read_file(d.path + "/logs/rank_0.log");
  const std::string m1 = "---- tessera run: restart 1 ----\n", m2 = "---- tessera run: restart 2 ----\n";
  EXPECT_EQ(count(log, m1), 1) << log;
  EXPECT_EQ(count(log, m2), 1) << log;
  const size_t r0 = log.find("rank 0 of 3 ok (round 0)"), at1 = log.find(m1), r1 = log.find("rank 0 of 3 ok (round 1)"),
               at2 = log.find(m2), r2 = log.find("rank 0 of 3 ok (round 2)");
  EXPECT_TRUE(r0 < at1 && at1 < r1 && r1 < at2 && at2 < r2 && r2 != std::string::npos) << log;
  EXPECT_EQ(log.find("restart 3"), std::string::npos) << log;
}

// A --log-dir file whose writes fail (a full disk: rank_0.log links to a
// device with /dev/full's numbers) is reported at once naming the file and
// the OS error, the lines still reach the terminal, and the run fails (exit
// 1) though the worker succeeded; the device stays a device.
TEST(Run, ALogDirWriteThatFailsIsReportedAndFailsTheRun) {
  TempDir d;
  const std::string logs = d.path + "/logs";
  ASSERT_EQ(::mkdir(logs.c_str(), 0700), 0);
  const std::string full = full_device(d.path);
  const std::string log = logs + "/rank_0.log";
  ASSERT_EQ(::symlink(full.c_str(), log.c_str()), 0);
  Subprocess p(run_cmd({"--nproc-per-node", "1", "--log-dir", logs}, {}), d.path);
  EXPECT_EQ(p.wait(60s), 1) << p.err();
  EXPECT_NE(p.err().find(log + ": cannot write: No space left on device"), std::string::npos) << p.err();
  EXPECT_EQ(count(p.err(), ": cannot write:"), 2) << p.err();  // said when it failed, and in the run's verdict
  EXPECT_EQ(count(p.out(), "[0] rank 0 of 1 ok (round 0)"), 1) << p.out();
  struct stat st {};
  ASSERT_EQ(::stat(full.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
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
           {kTessera, "run", "--nproc-per-node", "2", "--", "/no/such/program"},
           // A value-taking flag given no value takes neither "--" nor a flag.
           {kTessera, "run", "--nproc-per-node", "2", "--log-dir", "--", kHello},
           {kTessera, "run", "--nproc-per-node", "2", "--coordinator", "--max-restarts", "1", "--", kHello},
           // IPv6 without brackets read as host ":" and port 1.
           {kTessera, "run", "--nproc-per-node", "1", "--coordinator", "::1", "--", kHello},
           // A directory no file can be created in (a read-only mount gave exit 1 at the first log).
           {kTessera, "run", "--nproc-per-node", "2", "--log-dir", "/proc/self", "--", kHello}}) {
    Subprocess p(args, d.path);
    EXPECT_EQ(p.wait(10s), 2) << args[2] << " " << args[3] << "\n" << p.err();
    EXPECT_NE(p.err().find("Usage: tessera run"), std::string::npos) << p.err();
  }
  EXPECT_FALSE(std::filesystem::exists(d.path + "/--")) << "--log-dir -- made a directory named --";
}

// A TESSERA_LOG_LEVEL spdlog does not know meant "off", which hid the root
// cause; it now keeps info and says so.
TEST(Run, AnUnknownLogLevelKeepsInfoAndTheRootCause) {
  TempDir d;
  setenv("TESSERA_LOG_LEVEL", "verbose", 1);
  Subprocess p(run_cmd({"--nproc-per-node", "2"}, {"--exit-code", "4", "--fail-rank", "1"}), d.path);
  unsetenv("TESSERA_LOG_LEVEL");
  EXPECT_EQ(p.wait(60s), 4) << p.err();
  EXPECT_NE(p.err().find("TESSERA_LOG_LEVEL='verbose' is not a level"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("root cause: rank 1"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("rank 1 exiting with code 4 as asked"), std::string::npos) << p.err();
}

// A --coordinator address this host cannot listen on is a bad value (exit
// 2), said in tessera's words: gRPC's own log lines ("E1206 ...
// chttp2_server.cc ... No address added") do not reach the terminal.
TEST(Run, ACoordinatorAddressInUseIsABadValueWithoutGrpcsLogLines) {
  TempDir d;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  const std::string coord = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  Subprocess p(run_cmd({"--nproc-per-node", "1", "--coordinator", coord}, {}), d.path);
  EXPECT_EQ(p.wait(10s), 2) << p.err();
  close(fd);
  EXPECT_NE(p.err().find("--coordinator " + coord + ": coordinator: cannot listen on"), std::string::npos) << p.err();
  EXPECT_EQ(p.err().find("chttp2"), std::string::npos) << p.err();
}

// Under ASan, OpenMPI's own allocations in MPI_Init show as leaks at exit
// (its plugins are dlclose'd, so they cannot even be suppressed by name). Leak
// checking of the worker code is done by the `tessera run` tests above.
const std::string kLsan = "ASAN_OPTIONS=detect_leaks=0";

TEST(Mpirun, BootstrapsWithoutTesseraRun) {
  TempDir d;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  Subprocess p({"mpirun", "--oversubscribe", "-np", "4", "-x", kLsan, kHello, "--comm", "--pid-dir", d.path}, d.path);
  ASSERT_EQ(p.wait(60s), 0) << p.err();
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(count(p.out(), "rank " + std::to_string(r) + " of 4 ok"), 1) << p.out() << p.err();
}

TEST(Mpirun, FailureEndsTheJobThroughMpiAbort) {
  TempDir d;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  Subprocess p({"mpirun", "--oversubscribe", "-np", "4", "-x", kLsan, kHello, "--throw-rank", "2", "--sleep", "60"},
               d.path);
  int rc = p.wait(60s);
  EXPECT_NE(rc, 0);
  EXPECT_NE(rc, -1) << "mpirun did not end";
  EXPECT_LT(p.seconds(), test_time::seconds(15.0));
  // The survivors learn of it from the launcher's watch ("job aborted: rank
  // 2 ...") or, when a store call is under way, from the call's own answer
  // ("store add ...: job aborted (round 0): rank 2 ..."): either names rank 2.
  EXPECT_TRUE(std::regex_search(p.err(), std::regex("job aborted( \\(round [0-9]+\\))?: rank 2 "))) << p.err();
}

// A rank that returns 3 under mpirun: mpirun exits 3 every time (docs/errors.md:
// the failed worker's own code). The survivors, told of the abort, called
// MPI_Abort with 1, and whichever abort reached mpirun first set the code:
// 1 in 4 of 6 runs.
TEST(Mpirun, TheFailedRanksExitCodeIsTheJobs) {
  TempDir d;
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  for (int i = 0; i < 4; ++i) {
    Subprocess p({"mpirun", "--oversubscribe", "-np", "4", "-x", kLsan, kHello, "--fail-rank", "2", "--exit-code", "3"},
                 d.path, "p" + std::to_string(i));
    EXPECT_EQ(p.wait(60s), 3) << p.err();
  }
}

// init_worker applies TESSERA_CPU_ROTATION (runtime/cpu_rotation.h): a bad
// value fails the job naming it; by default two local ranks rotate when the
// launcher's affinity mask has two CPUs for them.
TEST(RunCpuRotation, InitWorkerAppliesTheSetting) {
  TempDir d;
  setenv("TESSERA_CPU_ROTATION", "sometimes", 1);
  Subprocess bad(run_cmd({"--nproc-per-node", "2"}, {"--comm"}), d.path, "bad");
  EXPECT_NE(bad.wait(60s), 0);
  unsetenv("TESSERA_CPU_ROTATION");
  EXPECT_NE((bad.out() + bad.err()).find("TESSERA_CPU_ROTATION='sometimes'"), std::string::npos)
      << bad.out() << bad.err();

  setenv("TESSERA_LOG_LEVEL", "debug", 1);
  Subprocess ok(run_cmd({"--nproc-per-node", "2"}, {"--comm"}), d.path, "ok");
  const int code = ok.wait(60s);
  unsetenv("TESSERA_LOG_LEVEL");
  ASSERT_EQ(code, 0) << ok.err();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const std::string expect = CPU_COUNT(&set) >= 2 ? "CPU rotation on: 2 local ranks" : "CPU rotation off";
  EXPECT_EQ(count(ok.out() + ok.err(), expect), 2) << ok.out() << ok.err();
}
