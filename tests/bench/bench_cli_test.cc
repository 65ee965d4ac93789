// `tessera bench` end to end: the real binary, its ranks, exit codes and files.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/checkpoint/test_util.h"
#include "tests/test_timeouts.h"

namespace {

namespace fs = std::filesystem;

using RunResult = tessera::testing::CommandResult;

RunResult run(const std::string& args, const std::string& env = "") {
  return tessera::testing::run_command(env + " " + TESSERA_BIN + std::string(" ") + args);
}

class BenchCli : public ::testing::Test {
 protected:
  // `tessera bench ARGS` in the background, SIGTERM to it after `secs`:
  // what the shell says (rc=N) and the bench's stderr.
  std::pair<std::string, std::string> term_after(const std::string& args, int secs) const {
    const std::string script = "TMPDIR=" + dir_ + " " + TESSERA_BIN + " bench " + args + " >/dev/null 2>" + dir_ +
                               "/err & P=$!; sleep " + std::to_string(secs) + "; kill $P; wait $P; echo rc=$?";
    FILE* p = popen(("sh -c '" + script + "'").c_str(), "r");
    std::string out;
    if (p == nullptr) return {"popen failed", ""};
    char buf[256];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
    std::ifstream ef(dir_ + "/err");
    return {out, std::string((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>())};
  }
  void SetUp() override {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("TESSERA_TIMEOUT_S", "60", 1);
#if defined(__SANITIZE_ADDRESS__)
    // OpenMPI dlclose()s its plugins, so with the default frame-pointer unwind
    // their leaks show only <unknown module> frames; the slow unwinder records
    // the libmpi/libopen-rte callers that tests/sanitizers/lsan.supp names.
    // Only these tests (ranks under MPI) pay for it. A user's setting wins.
    setenv("ASAN_OPTIONS", "fast_unwind_on_malloc=0", 0);
#endif
    char tmpl[] = "/tmp/tessera-bench-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  nlohmann::json read_json(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
  }
  std::string dir_;
};

// A small sweep, checked, for every transport and group size.
TEST_F(BenchCli, TransportsOverTwoToFourRanksGiveCheckedResults) {
  for (const char* t : {"shm", "tcp"}) {
    for (int n : {2, 3, 4}) {
      for (const char* op : {"all_reduce", "all_gather", "sendrecv"}) {
        SCOPED_TRACE(std::string(t) + " " + op + " ranks " + std::to_string(n));
        std::string js = dir_ + "/r.json";
        RunResult r = run(std::string("bench ") + op + " -r " + std::to_string(n) + " --transport " + t +
                          " -b 4K -e 256K -f 8 -n 2 -w 1 --json " + js);
        ASSERT_EQ(r.code, 0) << r.out;
        auto j = read_json(js);
        EXPECT_EQ(j["ranks"], n);
        EXPECT_EQ(j["transport"], t);
        ASSERT_EQ(j["results"].size(), 3u);  // 4K, 32K, 256K
        for (const auto& row : j["results"]) {
          EXPECT_EQ(row["oop"]["wrong"], 0);
          EXPECT_GT(row["oop"]["busbw_gbps"].get<double>(), 0.0);
          if (std::string(op) != "sendrecv") {
            EXPECT_EQ(row["ip"]["wrong"], 0);
          }
        }
        // At the start of a line: the ranks' lines are relayed without tessera run's "[rank] " prefix.
        EXPECT_NE(r.out.find("\n# Avg bus bandwidth : "), std::string::npos) << r.out;
      }
    }
  }
}

TEST_F(BenchCli, FaultHookCorruptsOneElementAndFailsTheRun) {
  std::string js = dir_ + "/f.json";
  RunResult r = run("bench allr -r 3 -b 1K -e 16K -f 4 -n 1 -w 0 --json " + js, "TESSERA_BENCH_CORRUPT=2");
  EXPECT_EQ(r.code, 1) << r.out;
  auto j = read_json(js);
  ASSERT_EQ(j["results"].size(), 3u);
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["oop"]["wrong"], 1);
    EXPECT_EQ(row["ip"]["wrong"], 1);
  }
  EXPECT_NE(r.out.find("FAILED"), std::string::npos);
  // The same run without the hook passes: the count came from the corruption.
  RunResult ok = run("bench allr -r 3 -b 1K -e 16K -f 4 -n 1 -w 0");
  EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST_F(BenchCli, EveryOpChecksOutOnOddRankCounts) {
  for (const char* op : {"reduce_scatter", "alltoall", "broadcast", "reduce"}) {
    SCOPED_TRACE(op);
    RunResult r = run(std::string("bench ") + op + " -r 3 -b 0 -e 100K -f 9 -n 1 -w 0 -d bf16 -o max --root 2");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("Out of bounds values : 0 OK"), std::string::npos) << r.out;
  }
}

TEST_F(BenchCli, BadFlagsExitTwo) {
  for (const char* args :
       {"bench", "bench nosuchop", "bench allr -b 1X", "bench allr --transport udp", "bench allr -f 2 -i 1K",
        "bench allr -c 5", "bench allr -b 64M -e 1M", "bench allr --compare nccl", "bench allr --topology nosuch",
        "bench allr -d f128", "bench allr -o median", "bench allr -n 0", "bench allr --no-such-flag"}) {
    SCOPED_TRACE(args);
    RunResult r = run(args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_FALSE(r.out.empty());
  }
}

// Bad values and bad files exit 2 with a message written for people, before
// any rank starts (docs/errors.md).
TEST_F(BenchCli, BadInputExitsTwoWithAMessage) {
  { std::ofstream(dir_ + "/bad.json") << "{\"name\": \"x\", \"dims\": ["; }
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {
           Case{"bench allr --topology " + dir_ + "/bad.json", dir_ + "/bad.json"},
           Case{"bench allr --topology " + dir_ + "/missing.json", dir_ + "/missing.json"},
           Case{"bench allr -r 0", "--nworkers: must be an integer from 1 to 1024, got 0"},
           Case{"bench allr -n 0", "--iters: must be an integer from 1 to 1000000, got 0"},
           Case{"bench allr --root 2147483648",
                "--root: must be an integer from -2147483648 to 2147483647, got 2147483648"},
           Case{"bench allr --timeout 0", "--timeout: must be a number from 0.001 to 1000000, got 0"},
           Case{"bench allr -b 8 -e 8 --json " + dir_ + "/no/such/dir/r.json",
                "--json: cannot write '" + dir_ + "/no/such/dir/r.json': directory '" + dir_ +
                    "/no/such/dir' does not exist"},
           Case{"bench allr -b 8 -e 8 --plot " + dir_, "--plot: cannot write '" + dir_ + "': it is a directory"},
       }) {
    SCOPED_TRACE(c.args);
    RunResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("0.000000"), std::string::npos) << r.out;             // no doubles for integer bounds
    EXPECT_EQ(r.out.find("# Avg bus bandwidth"), std::string::npos) << r.out;  // nothing ran
  }
  // Several ranks with no job to join (no coordinator, mpirun or srun) are refused, naming the ways to start them.
  RunResult alone = run("bench allr -b 8 -e 8", "TESSERA_RANK=0 TESSERA_WORLD_SIZE=2");
  EXPECT_EQ(alone.code, 2) << alone.out;
  EXPECT_NE(alone.out.find("rank 0 of 2 has no job to join: start the ranks with -r N, tessera run, mpirun or srun"),
            std::string::npos)
      << alone.out;
}

TEST_F(BenchCli, RunsUnderMpirun) {
  std::string js = dir_ + "/m.json";
  RunResult r = run(std::string("bench allr --transport mpi -b 1K -e 64K -f 8 -n 2 -w 1 --json ") + js,
                    std::string("mpirun --oversubscribe -np 2"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = read_json(js);
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["transport"], "mpi");
  for (const auto& row : j["results"]) EXPECT_EQ(row["oop"]["wrong"], 0);
  // sendrecv over MPI (MPI_Sendrecv), checked; 3 ranks, so the ranks a rank
  // sends to and receives from differ.
  RunResult sr = run(std::string("bench sendrecv --transport mpi -b 1K -e 1M -f 32 -n 2 -w 1 --json ") + js,
                     std::string("mpirun --oversubscribe -np 3"));
  ASSERT_EQ(sr.code, 0) << sr.out;
  auto js2 = read_json(js);
  EXPECT_EQ(js2["ranks"], 3);
  ASSERT_EQ(js2["results"].size(), 3u);  // 1K, 32K, 1M
  for (const auto& row : js2["results"]) EXPECT_EQ(row["oop"]["wrong"], 0);
  // shm under mpirun: the store directory travels over MPI.
  RunResult s = run("bench allg --transport shm -b 1K -e 8K -f 8 -n 1 -w 0", "mpirun --oversubscribe -np 2");
  EXPECT_EQ(s.code, 0) << s.out;
  EXPECT_NE(s.out.find("2 ranks, transport shm"), std::string::npos) << s.out;
}

// One cost model: the modeled column under MPI is what tessera's own
// communicator charges for the same group without shared memory (two ranks
// over TCP, the default ring), row by row: rd's one exchange at 1 KiB and
// 32 KiB, the ring at 1 MiB (not NetModel's ring closed form).
TEST_F(BenchCli, MpiModeledColumnIsTheCommunicatorsCharge) {
  const std::string flags = " -b 1K -e 1M -f 32 -n 1 -w 0 --json ";
  RunResult m = run("bench allr --transport mpi" + flags + dir_ + "/mm.json", "mpirun --oversubscribe -np 2");
  ASSERT_EQ(m.code, 0) << m.out;
  RunResult t = run("bench allr --transport tcp -r 2" + flags + dir_ + "/mt.json");
  ASSERT_EQ(t.code, 0) << t.out;
  auto jm = read_json(dir_ + "/mm.json"), jt = read_json(dir_ + "/mt.json");
  ASSERT_EQ(jm["results"].size(), 3u);
  ASSERT_EQ(jt["results"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const double a = jm["results"][i]["modeled_busbw_gbps"], b = jt["results"][i]["modeled_busbw_gbps"];
    EXPECT_NEAR(a, b, 1e-9 * b) << "row " << i;
  }
}

TEST_F(BenchCli, RunsUnderTesseraRun) {
  std::string js = dir_ + "/l.json";
  RunResult r = run(std::string("run --nproc-per-node 3 -- ") + TESSERA_BIN +
                    " bench allr --transport shm -b 1K -e 64K -f 8 -n 2 -w 1 --json " + js);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = read_json(js);
  EXPECT_EQ(j["ranks"], 3);
  for (const auto& row : j["results"]) EXPECT_EQ(row["oop"]["wrong"], 0);
}

TEST_F(BenchCli, CompareMpiPrintsARatioPerRow) {
  std::string js = dir_ + "/c.json";
  RunResult r = run("bench allr -r 2 -b 4K -e 32K -f 8 -n 2 -w 1 --compare mpi --json " + js);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = read_json(js);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& row : j["results"]) {
    double mine = row["oop"]["busbw_gbps"], theirs = row["compare_busbw_gbps"];
    ASSERT_GT(theirs, 0.0);
    EXPECT_NEAR(row["compare_ratio"].get<double>(), mine / theirs, 1e-9);
  }
  EXPECT_NE(r.out.find("ratio"), std::string::npos);
}

TEST_F(BenchCli, BaselinesAndPlot) {
  std::string js = dir_ + "/b.json", png = dir_ + "/b.png";
  RunResult r =
      run("bench allr -r 2 --transport tcp -b 64K -e 1M -f 4 -n 2 -w 1 --baseline --json " + js + " --plot " + png);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = read_json(js);
  EXPECT_GT(j["baselines"]["memcpy_gbps"].get<double>(), 0.0);
  EXPECT_GT(j["baselines"]["memcpy_all_gbps"].get<double>(), 0.0);  // both ranks copying at once
  EXPECT_GT(j["baselines"]["tcp_loopback_gbps"].get<double>(), 0.0);
  EXPECT_GT(j["baselines"]["tcp_loopback_unidir_gbps"].get<double>(), 0.0);
  std::ifstream f(png, std::ios::binary);
  char magic[8] = {};
  f.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

TEST_F(BenchCli, TopologyPresetGivesModeledBusbw) {
  std::string js = dir_ + "/t.json";
  RunResult r = run("bench allr -r 2 -b 1M -e 1M -n 1 -w 0 --topology trn1.32xlarge --json " + js);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = read_json(js);
  EXPECT_GT(j["results"][0]["modeled_busbw_gbps"].get<double>(), 0.0);
}

// With --topology and no sweep flags the default sweep leads with decode's
// latency-bound all-reduce sizes (2, 8 and 32 KiB) before 32M, each with a
// modeled busbw that the fixed per-hop latency holds below the large size's;
// the ring (one row) and the switch presets alike. -b alone gives just its sweep.
TEST_F(BenchCli, TopologyDefaultSweepHasDecodeSizes) {
  for (const std::string topo : {"inf2.48xlarge", "trn3-ultraserver"}) {
    SCOPED_TRACE(topo);
    const std::string js = dir_ + "/d.json";
    std::string cmd = "bench allr -r 2 -n 1 -w 0 --topology ";
    cmd += topo;
    cmd += " --json ";
    cmd += js;
    RunResult r = run(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    auto j = read_json(js);
    std::vector<size_t> sizes;
    for (const auto& row : j["results"]) {
      sizes.push_back(row["size_bytes"].get<size_t>());
      EXPECT_GT(row["modeled_busbw_gbps"].get<double>(), 0.0) << row.dump();
    }
    EXPECT_EQ(sizes, (std::vector<size_t>{2048, 8192, 32768, 33554432}));
    EXPECT_LT(j["results"][0]["modeled_busbw_gbps"].get<double>(),
              0.5 * j["results"][3]["modeled_busbw_gbps"].get<double>());
  }
  RunResult r = run("bench allr -r 2 -n 1 -w 0 -b 1M --topology inf2.48xlarge --json " + dir_ + "/e.json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = read_json(dir_ + "/e.json");
  ASSERT_FALSE(j["results"].empty());
  EXPECT_EQ(j["results"][0]["size_bytes"].get<size_t>(), size_t{1} << 20);
}

}  // namespace

namespace {

// Processes whose environment holds `needle` (e.g. TESSERA_STORE_DIR=<dir>).
int processes_with_env(const std::string& needle) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "environ");
    std::string env((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::ifstream st(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
    const auto paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') continue;  // dead
    if (env.find(needle) != std::string::npos) ++n;
  }
  return n;
}

}  // namespace

// -r beyond 64 ranks per CPU is refused before anything starts, naming the
// limit; --oversubscribe lifts it (not run here: it would start them).
TEST_F(BenchCli, RankCountBeyondTheMachineIsRefused) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int limit = 64 * CPU_COUNT(&set);
  if (limit + 1 > 1024) GTEST_SKIP() << "more than 16 CPUs: -r's own range (1024) is below the limit";
  auto r = run("bench all_reduce -b 8 -e 8 -r " + std::to_string(limit + 1), "TMPDIR=" + dir_);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("at most " + std::to_string(limit)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--oversubscribe"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_empty(dir_)) << "a store directory was made";
}

// SIGTERM to the bench parent: its ranks are a one-node tessera run job's
// workers, so it is stopped as tessera run stops one: the signal forwarded
// to every rank, the parent exits 143 once they are gone, nothing left in
// TMPDIR and no rank running.
TEST_F(BenchCli, TermToTheParentEndsEveryRank) {
  const auto [out, err] = term_after("all_reduce -r 2 -b 1M -e 1M -n 1000000", 2);
  EXPECT_NE(out.find("rc=143"), std::string::npos) << out;
  EXPECT_NE(err.find("tessera run: got Terminated; stopping workers"), std::string::npos) << err;
  int left = 0;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.path().filename().string() != "err") ++left;
  EXPECT_EQ(left, 0) << "something was left in " << dir_;
  EXPECT_EQ(processes_with_env("TMPDIR=" + dir_), 0);
}

// SIGTERM to the bench parent while --compare mpi's mpirun runs: mpirun and
// its ranks are stopped too (they ran on for 35 s when the parent only
// waited for them), the parent exits 143 and the store directory goes.
TEST_F(BenchCli, TermDuringTheMpiPhaseStopsMpirunAndItsRanks) {
  const auto [out, err] = term_after("all_reduce -r 2 -b 64M -e 64M -n 1000000 --compare mpi", 1);
  EXPECT_NE(out.find("rc=143"), std::string::npos) << out;
  EXPECT_NE(err.find("got SIGTERM; stopping mpirun"), std::string::npos) << err;
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_NE(e.path().filename().string().rfind("tessera-bench-", 0), 0u) << "left: " << e.path();
  // OpenMPI puts each rank in a process group of its own and mpirun may exit
  // while the last rank is still on its way out (slower under ASan): gone
  // within seconds, not left running (they ran on for 35 s).
  EXPECT_TRUE(tessera::test_time::wait_until([&] { return processes_with_env("TMPDIR=" + dir_) == 0; },
                                             tessera::test_time::scaled(std::chrono::seconds(5))))
      << "mpirun or a rank of it is still running";
}
