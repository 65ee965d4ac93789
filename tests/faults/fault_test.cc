// The fault-injection suite (issue 16; docs/faults.md).
//
// Each scenario starts a job, `tessera run` (2 or 4 workers), `tessera bench
// -r 2` or `mpirun -np 2`, with TESSERA_JOB_ID=<unique id> and TMPDIR=<a
// fresh directory> in its environment. Once the ranks loop in their
// all-reduce (tessera_fault_worker's pid files; bench ranks with their peers'
// shared memory mapped), it waits a random time (seeded: the seed is printed,
// TESSERA_FAULT_SEED=N repeats a run) and sends SIGKILL, SIGTERM, SIGINT or
// SIGSTOP to the launcher (the bench parent, mpirun), to a random worker or
// to that worker's child. Then, within the timeouts:
//   - no process of the job is left: none whose /proc/PID/environ holds the
//     job id (every process inherits it; the name of a process says nothing);
//   - the job's TMPDIR is empty (tessera's store directories; OpenMPI's
//     session directory and shared-memory segments, which the scenario puts
//     there) and no tessera segment appeared in /dev/shm;
//   - the exit code and the message name the cause.
// A stopped launcher: `tessera run`'s workers must end on their own (they
// lose its coordinator's heartbeats) and after SIGCONT it exits naming the
// cause; a stopped bench parent or mpirun gets what a shell's `kill %1` sends
// (SIGTERM, then SIGCONT) and must end the job as it would running.
//
// The suite prints how many scenarios ran and passed. Whatever happens, a
// scenario kills every process of its job and removes its directory.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/launcher/subprocess.h"
#include "tests/test_timeouts.h"

using namespace tessera::testing;
using namespace std::chrono_literals;
namespace test_time = tessera::test_time;
namespace fs = std::filesystem;

namespace {

const std::string kTessera = TESSERA_BIN;
const std::string kWorker = FAULT_WORKER_BIN;
const std::string kMpirun = MPIRUN_BIN;

uint64_t suite_seed() {
  static const uint64_t seed = [] {
    const char* v = std::getenv("TESSERA_FAULT_SEED");
    if (v && *v) return static_cast<uint64_t>(std::strtoull(v, nullptr, 10));
    return static_cast<uint64_t>(std::random_device{}()) % 1000000;
  }();
  return seed;
}

struct Tally {
  int ran = 0, passed = 0;
  std::vector<std::string> failed;
};
Tally& tally() {
  static Tally t;
  return t;
}

class Report : public ::testing::Environment {
 public:
  void SetUp() override {
    std::printf("fault-injection seed %llu (TESSERA_FAULT_SEED=%llu repeats this run)\n",
                static_cast<unsigned long long>(suite_seed()), static_cast<unsigned long long>(suite_seed()));
  }
  void TearDown() override {
    const Tally& t = tally();
    if (t.ran == 0) return;
    std::printf("fault-injection scenarios: %d ran, %d passed, %d failed (seed %llu)\n", t.ran, t.passed,
                t.ran - t.passed, static_cast<unsigned long long>(suite_seed()));
    for (const auto& n : t.failed) std::printf("  failed: %s\n", n.c_str());
  }
};
[[maybe_unused]] ::testing::Environment* const kReport = ::testing::AddGlobalTestEnvironment(new Report);

// ---- /proc ------------------------------------------------------------------

std::vector<std::string> environ_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::vector<std::string> out;
  for (std::string s; std::getline(f, s, '\0');) out.push_back(s);
  return out;
}

std::string env_value(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& kv : env)
    if (kv.size() > name.size() && kv.compare(0, name.size() + 1, name + "=") == 0) return kv.substr(name.size() + 1);
  return "";
}

std::vector<pid_t> all_pids() {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long v = std::strtol(e->d_name, &end, 10);
    if (v > 0 && end && *end == 0) out.push_back(static_cast<pid_t>(v));
  }
  closedir(d);
  return out;
}

pid_t parent_of(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto p = stat.rfind(')');
  if (p == std::string::npos) return -1;
  std::istringstream in(stat.substr(p + 2));
  std::string state;
  pid_t ppid = -1;
  in >> state >> ppid;
  return ppid;
}

// Live processes of the job: TESSERA_JOB_ID=<id> in their environment. (A
// zombie's environment cannot be read: it is gone but for its exit status.)
std::vector<pid_t> job_processes(const std::string& id) {
  std::vector<pid_t> out;
  for (pid_t pid : all_pids())
    if (pid != getpid() && alive(pid) && env_value(environ_of(pid), "TESSERA_JOB_ID") == id) out.push_back(pid);
  return out;
}

std::string describe(const std::vector<pid_t>& pids) {
  std::string s;
  for (pid_t p : pids) {
    std::string cmd = read_file("/proc/" + std::to_string(p) + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    s += "  pid " + std::to_string(p) + " (parent " + std::to_string(parent_of(p)) + "): " + cmd.substr(0, 160) + "\n";
  }
  return s;
}

// Kills (SIGKILL) whatever of the job is still there, so a failed scenario
// leaves nothing behind.
struct JobReaper {
  std::string id;
  ~JobReaper() {
    for (int round = 0; round < 50; ++round) {
      auto left = job_processes(id);
      if (left.empty()) return;
      for (pid_t p : left) kill(p, SIGKILL);
      std::this_thread::sleep_for(20ms);
    }
  }
};

// Counts the scenario as passed when no assertion failed in it.
struct Scored {
  std::string name;
  explicit Scored(std::string n) : name(std::move(n)) { ++tally().ran; }
  ~Scored() {
    if (::testing::Test::HasFailure())
      tally().failed.push_back(name);
    else
      ++tally().passed;
  }
};

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string sig_name(int sig) { return std::string("SIG") + sigabbrev_np(sig); }

// ---- scenarios ------------------------------------------------------------------

enum class Kind { Run, Bench, Mpirun };

struct Scenario {
  Kind kind;
  int n;
  std::string target;  // "launcher", "worker", "child"
  int sig;
};

std::string scenario_name(const Scenario& s) {
  const char* k = s.kind == Kind::Run ? "run" : s.kind == Kind::Bench ? "bench" : "mpirun";
  return k + std::to_string(s.n) + "_" + s.target + "_" + sigabbrev_np(s.sig);
}

// gtest prints a failed parameter with this instead of its bytes.
// NOLINTNEXTLINE(readability-identifier-naming): gtest finds it by this name
[[maybe_unused]] void PrintTo(const Scenario& s, std::ostream* os) { *os << scenario_name(s); }

// What the launcher must say: exit codes allowed and a pattern the output
// must contain. `rank` and `pid` are the target's.
struct Expectation {
  std::vector<int> codes;
  std::string pattern;
};

Expectation expected(const Scenario& s, int rank, pid_t pid) {
  const std::string r = std::to_string(rank), p = std::to_string(pid), name = sig_name(s.sig);
  const int by_signal = 128 + s.sig;
  const std::string child = "data child \\(pid " + p + "\\) ";
  const std::string child_why =
      s.sig == SIGSTOP ? child + "sent nothing for [0-9]+ ms \\(state T: stopped\\)" : child + "killed by " + name;
  switch (s.kind) {
    case Kind::Run:
      if (s.target == "launcher") {
        if (s.sig == SIGKILL) return {{137}, ""};  // nothing can speak for a SIGKILLed process
        if (s.sig == SIGSTOP) return {{1}, "job failed"};
        return {{by_signal}, std::string("tessera run: got ") + strsignal(s.sig) + "; stopping workers"};
      }
      if (s.target == "worker") {
        if (s.sig == SIGKILL) return {{137}, "tessera run: rank " + r + " killed by SIGKILL \\(not by this launcher"};
        if (s.sig == SIGSTOP) return {{1}, "root cause: rank " + r + " .*no heartbeat for [0-9]+ ms"};
        return {{by_signal},
                "root cause: rank " + r + " [^\n]*\n(.*\n)*? +signal: +" + std::to_string(s.sig) + " \\(" +
                    strsignal(s.sig) + "\\)"};
      }
      return {{1}, "root cause: rank " + r + " [^\n]*" + child_why};
    case Kind::Bench:
      // Its ranks are a one-node tessera run job's workers: run's messages,
      // but a stopped parent then gets SIGTERM (a shell's `kill %1`), and a
      // stopped rank is found by its peer's collective timeout.
      if (s.sig == SIGSTOP)
        return s.target == "launcher" ? Expectation{{128 + SIGTERM}, "tessera run: got Terminated; stopping workers"}
                                      : Expectation{{1}, "timed out"};
      return expected(Scenario{Kind::Run, s.n, s.target, s.sig}, rank, pid);
    case Kind::Mpirun:
      if (s.target == "launcher") {
        if (s.sig == SIGKILL) return {{137}, ""};
        // OpenMPI 4.1's mpirun forwards SIGTERM and SIGINT to the ranks and
        // exits 1 without a word; the test holds it to that.
        return {{1}, ""};
      }
      if (s.target == "worker") {
        // Rank 0 hosts the coordinator: when it is the stopped one, the others' beats find nobody.
        if (s.sig == SIGSTOP) return {{1}, "no heartbeat (reached the coordinator )?for [0-9]+ ms"};
        // OpenMPI 4.1 prints "PID 0" here.
        return {{by_signal, 1},
                "process rank " + r + " with PID [0-9]+ on node \\S+ exited on signal " + std::to_string(s.sig)};
      }
      return {{1}, child_why};
  }
  return {};
}

// The timeouts of a job (seconds): the heartbeat timeout (`tessera run`,
// and under mpirun the coordinator rank 0 hosts) and bench's collective
// timeout. Short (2 s and 3 s, scaled) only where the scenario needs them
// to fire: a stopped worker or launcher is found by its lost heartbeats, a
// stopped bench rank by its peers' timeout. Everywhere else they must not
// fire, and under load (a build beside the suite) a live rank starved for
// 2 s was taken for a lost one, which changes the cause the scenario
// checks: 30 s there (each scenario ends long before on its own: a killed
// process is seen by waitpid, a dead launcher by its workers' parent watch
// and keepers).
struct Timeouts {
  double heartbeat_s, bench_s;
};
Timeouts timeouts_of(const Scenario& s) {
  const bool lost_heartbeat = s.sig == SIGSTOP && s.target != "child" && s.kind != Kind::Bench;
  const bool bench_timeout = s.sig == SIGSTOP && s.target == "worker" && s.kind == Kind::Bench;
  return {test_time::seconds(lost_heartbeat ? 2 : 30), test_time::seconds(bench_timeout ? 3 : 30)};
}

std::string decimal(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::vector<std::string> job_argv(const Scenario& s, const std::string& id, const std::string& tmp,
                                  const std::string& pids) {
  std::vector<std::string> v{"env", "TESSERA_JOB_ID=" + id, "TMPDIR=" + tmp};
  const std::string n = std::to_string(s.n);
  const Timeouts t = timeouts_of(s);
  switch (s.kind) {
    case Kind::Run:
      v.insert(v.end(), {kTessera, "run", "--nproc-per-node", n, "--heartbeat-timeout", decimal(t.heartbeat_s),
                         "--kill-grace", "1", "--", kWorker, "--seconds", "120", "--pid-dir", pids});
      break;
    case Kind::Bench:
      v.insert(v.end(), {kTessera, "bench", "all_reduce", "-r", n, "-b", "1M", "-e", "1M", "-n", "1000000", "-w", "1",
                         "--timeout", decimal(t.bench_s)});
      break;
    case Kind::Mpirun:
      // OpenMPI's shared memory goes to TMPDIR too, where the scenario checks it.
      v.insert(v.end(), {"OMPI_MCA_btl_vader_backing_directory=" + tmp,
                         "TESSERA_HEARTBEAT_TIMEOUT_MS=" + std::to_string(std::llround(t.heartbeat_s * 1000)), kMpirun,
                         "--oversubscribe", "--bind-to", "none", "-np", n, "-x", "TESSERA_JOB_ID", "-x", "TMPDIR", "-x",
                         "TESSERA_HEARTBEAT_TIMEOUT_MS", kWorker, "--seconds", "120", "--pid-dir", pids});
      break;
  }
  return v;
}

pid_t read_pid(const std::string& path) {
  const std::string s = read_file(path);
  return s.empty() ? -1 : static_cast<pid_t>(std::atol(s.c_str()));
}

int count_lines_with(const std::string& text, const std::string& what) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

std::vector<std::string> tessera_shm() {
  std::vector<std::string> out;
  for (const auto& e : entries("/dev/shm"))
    if (e.find("tessera") != std::string::npos) out.push_back(e);
  return out;
}

void run_scenario(const Scenario& s) {
  const std::string name = scenario_name(s);
  Scored scored(name);
  std::mt19937_64 rng(suite_seed() * 1000003 + std::hash<std::string>{}(name));
  TempDir d;
  const std::string tmp = d.path + "/tmp", pids = d.path + "/pids";
  fs::create_directory(tmp);
  fs::create_directory(pids);
  const std::string id = "faults-" + std::to_string(getpid()) + "-" + name;
  JobReaper reaper{id};
  const auto shm_before = tessera_shm();
  Subprocess p(job_argv(s, id, tmp, pids), d.path, "job");
  auto output = [&] { return "--- stdout:\n" + p.out() + "--- stderr:\n" + p.err(); };

  // 1. Wait until every rank loops in its collective.
  std::vector<pid_t> workers(static_cast<size_t>(s.n), -1), children(workers);
  const bool ready = test_time::wait_until(
      [&] {
        if (!alive(p.pid())) return true;  // ended early: reported below
        if (s.kind != Kind::Bench) {
          for (int r = 0; r < s.n; ++r) {
            workers[r] = read_pid(pids + "/worker." + std::to_string(r) + ".pid");
            children[r] = read_pid(pids + "/child." + std::to_string(r) + ".pid");
            if (workers[r] <= 0 || children[r] <= 0) return false;
          }
          return true;
        }
        // bench ranks: children of the parent's keepers (launcher/spawn.h) with TESSERA_RANK, each with its
        // peers' segments mapped.
        int found = 0;
        for (pid_t q : job_processes(id)) {
          if (parent_of(parent_of(q)) != p.pid()) continue;
          const std::string rank = env_value(environ_of(q), "TESSERA_RANK");
          if (rank.empty()) continue;
          const int r = std::atoi(rank.c_str());
          if (r < 0 || r >= s.n) continue;
          workers[r] = q;
          if (count_lines_with(read_file("/proc/" + std::to_string(q) + "/maps"), "memfd:tessera") >= s.n) ++found;
        }
        return found == s.n;
      },
      test_time::scaled(90s), 50ms);
  ASSERT_TRUE(ready) << name << ": the ranks did not start their collectives in time\n" << output();
  ASSERT_TRUE(alive(p.pid())) << name << ": the job ended before the fault\n" << output();
  // Every process of the job carries the id: launcher, ranks, children (and keepers, mpirun's helpers).
  const auto procs = job_processes(id);
  EXPECT_GE(procs.size(), static_cast<size_t>(1 + s.n + (s.kind == Kind::Bench ? 0 : s.n))) << describe(procs);

  // 2. The fault, at a random time inside the loop.
  const int rank = std::uniform_int_distribution<int>(0, s.n - 1)(rng);
  const int delay_ms = std::uniform_int_distribution<int>(0, 400)(rng);
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  const pid_t target = s.target == "launcher" ? p.pid() : s.target == "worker" ? workers[rank] : children[rank];
  ASSERT_GT(target, 0);
  std::printf("[ scenario ] %s: %s to the %s (rank %d, pid %d) after %d ms\n", name.c_str(), sig_name(s.sig).c_str(),
              s.target.c_str(), rank, target, delay_ms);
  std::fflush(stdout);
  ASSERT_EQ(kill(target, s.sig), 0);
  const auto t0 = std::chrono::steady_clock::now();

  if (s.target == "launcher" && s.sig == SIGSTOP) {
    if (s.kind == Kind::Run) {
      // The workers lose the coordinator (it is in the stopped launcher) and end on their own.
      const bool gone = test_time::wait_until(
          [&] {
            auto left = job_processes(id);
            left.erase(std::remove(left.begin(), left.end(), p.pid()), left.end());
            return left.empty();
          },
          test_time::scaled(40s), 100ms);
      EXPECT_TRUE(gone) << name << ": workers still there with the launcher stopped\n" << describe(job_processes(id));
    } else {
      std::this_thread::sleep_for(500ms);
      EXPECT_TRUE(alive(p.pid()));
      kill(p.pid(), SIGTERM);  // what a shell's `kill %1` does to a stopped job
    }
    kill(p.pid(), SIGCONT);
  }

  // 3. The launcher ends, and nothing of the job is left.
  const int rc = p.wait(test_time::scaled(60s));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(rc, -1) << name << ": the launcher did not end\n" << output();
  std::vector<pid_t> left;
  const bool gone = test_time::wait_until(
      [&] {
        left = job_processes(id);
        return left.empty();
      },
      test_time::scaled(5s), 50ms);
  EXPECT_TRUE(gone) << name << ": processes of the job outlived it:\n" << describe(left);

  // 4. The exit code and the message name the cause.
  const Expectation e = expected(s, rank, target);
  EXPECT_NE(std::find(e.codes.begin(), e.codes.end(), rc), e.codes.end()) << name << ": exit code " << rc << "\n"
                                                                          << output();
  if (!e.pattern.empty()) {
    EXPECT_TRUE(std::regex_search(p.out() + p.err(), std::regex(e.pattern)))
        << name << ": the output does not match /" << e.pattern << "/\n"
        << output();
  }

  // 5. No temporary file or directory, no shared memory of the job.
  auto tmp_left = entries(tmp);
  if (s.kind == Kind::Mpirun && s.target == "launcher" && s.sig == SIGKILL) {
    // OpenMPI 4.1 leaves its session directory (and its shared-memory
    // segments, here in TMPDIR) when mpirun is SIGKILLed: OpenMPI's, not
    // tessera's. Listed, then removed.
    std::vector<std::string> ours;
    for (const auto& x : tmp_left)
      if (x.rfind("ompi.", 0) != 0 && x.rfind("vader_segment.", 0) != 0) ours.push_back(x);
    if (ours.size() != tmp_left.size())
      std::printf("[ scenario ] %s: OpenMPI left %s\n", name.c_str(), join(tmp_left).c_str());
    tmp_left = ours;
  }
  EXPECT_TRUE(tmp_left.empty()) << name << ": left in TMPDIR: " << join(tmp_left);
  EXPECT_EQ(tessera_shm(), shm_before) << name << ": shared memory left in /dev/shm";
  std::printf("[ scenario ] %s: exit %d after %.1f s%s\n", name.c_str(), rc, secs,
              ::testing::Test::HasFailure() ? " FAILED" : ", nothing left");
  std::fflush(stdout);
}

class Quick : public ::testing::TestWithParam<Scenario> {};
class All : public ::testing::TestWithParam<Scenario> {};
TEST_P(Quick, NothingOutlivesTheJobAndTheCauseIsNamed) { run_scenario(GetParam()); }
TEST_P(All, NothingOutlivesTheJobAndTheCauseIsNamed) { run_scenario(GetParam()); }

// The fast ones (about 30 s together): one of each job kind and target, no
// wait for the 10 s heartbeat give-up or the bench's collective timeout.
std::vector<Scenario> quick_scenarios() {
  return {{Kind::Run, 2, "launcher", SIGKILL},    {Kind::Run, 4, "worker", SIGKILL},
          {Kind::Run, 2, "child", SIGTERM},       {Kind::Run, 2, "worker", SIGSTOP},
          {Kind::Run, 4, "child", SIGSTOP},       {Kind::Bench, 2, "launcher", SIGTERM},
          {Kind::Bench, 2, "launcher", SIGKILL},  {Kind::Bench, 2, "worker", SIGKILL},
          {Kind::Mpirun, 2, "launcher", SIGKILL}, {Kind::Mpirun, 2, "worker", SIGTERM}};
}

bool is_quick(const Scenario& s) {
  for (const auto& q : quick_scenarios())
    if (scenario_name(q) == scenario_name(s)) return true;
  return false;
}

// The rest of the matrix: every job kind x target x signal.
std::vector<Scenario> other_scenarios() {
  std::vector<Scenario> out;
  const std::vector<std::pair<Kind, int>> jobs{{Kind::Run, 2}, {Kind::Run, 4}, {Kind::Bench, 2}, {Kind::Mpirun, 2}};
  for (const auto& [kind, n] : jobs)
    for (const char* target : {"launcher", "worker", "child"}) {
      if (kind == Kind::Bench && std::string(target) == "child") continue;  // bench ranks start no children
      for (int sig : {SIGKILL, SIGTERM, SIGINT, SIGSTOP}) {
        Scenario s{kind, n, target, sig};
        if (!is_quick(s)) out.push_back(s);
      }
    }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Scenario>& i) { return scenario_name(i.param); }

INSTANTIATE_TEST_SUITE_P(Quick, Quick, ::testing::ValuesIn(quick_scenarios()), param_name);
INSTANTIATE_TEST_SUITE_P(All, All, ::testing::ValuesIn(other_scenarios()), param_name);

// ---- temporary files of dead processes ------------------------------------------

pid_t dead_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

struct SleepingChild {
  pid_t pid = fork();
  SleepingChild() {
    if (pid == 0) {
      pause();
      _exit(0);
    }
  }
  ~SleepingChild() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

// `tessera bench` removes the temporary directories that dead processes left
// (a process killed by SIGKILL cannot remove its own) and never a live one's:
// one rank alone makes one (-r N makes none: its ranks meet at tessera run's
// coordinator).
TEST(Cleanup, BenchRemovesDeadStoreDirectoriesAndKeepsLiveOnes) {
  TempDir d;
  const std::string tmp = d.path + "/tmp";
  fs::create_directory(tmp);
  SleepingChild live;
  const std::string dead_dir = "tessera-bench-" + std::to_string(dead_pid()) + "-AbCdEf";
  const std::string dead_job_dir = "tessera-bench-" + std::to_string(dead_pid()) + "-job_7-GhIjKl";
  const std::string live_dir = "tessera-bench-" + std::to_string(live.pid) + "-MnOpQr";
  const std::string old_dir = "tessera-bench-StUvWx";  // no pid: not ours to judge
  for (const auto& x : {dead_dir, dead_job_dir, live_dir, old_dir}) fs::create_directory(fs::path(tmp) / x);
  std::ofstream(tmp + "/" + dead_dir + "/key") << "v";
  Subprocess p({"env", "TMPDIR=" + tmp, kTessera, "bench", "all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0"},
               d.path, "bench");
  ASSERT_EQ(p.wait(test_time::scaled(60s)), 0) << p.err();
  std::vector<std::string> want{live_dir, old_dir};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(entries(tmp), want);  // and its own directory is gone too
}

// Where each tool writes temporaries is in its --help.
TEST(Cleanup, HelpSaysWhereTemporaryFilesGo) {
  TempDir d;
  for (const char* cmd : {"run", "bench", "ckpt", "plan"}) {
    Subprocess p({kTessera, cmd, "--help"}, d.path, cmd);
    EXPECT_EQ(p.wait(test_time::scaled(30s)), 0) << cmd;
    EXPECT_NE(p.out().find("Temporary files:"), std::string::npos) << "tessera " << cmd << " --help:\n" << p.out();
  }
  Subprocess b({kTessera, "bench", "--help"}, d.path, "bench2");
  b.wait(test_time::scaled(30s));
  EXPECT_NE(b.out().find("$TMPDIR/tessera-bench-<pid>-"), std::string::npos) << b.out();
}

// ---- memory ------------------------------------------------------------------

// bench refuses, before any rank starts, buffers beyond the available memory,
// and says the numbers. TESSERA_TEST_MEM_AVAILABLE stands in for MemAvailable.
TEST(Memory, BenchRefusesBuffersThatDoNotFit) {
  TempDir d;
  const std::string tmp = d.path + "/tmp";
  fs::create_directory(tmp);
  const std::string id = "faults-mem-" + std::to_string(getpid());
  JobReaper reaper{id};
  Subprocess big({"env", "TMPDIR=" + tmp, "TESSERA_JOB_ID=" + id, "TESSERA_TEST_MEM_AVAILABLE=4G", kTessera, "bench",
                  "all_reduce", "-b", "2G", "-e", "2G", "-r", "3"},
                 d.path, "big");
  EXPECT_EQ(big.wait(test_time::scaled(20s)), 2) << big.err();
  // 3 ranks x (2 GiB send + 2 GiB receive) = 12 GiB against 4 GiB.
  EXPECT_NE(big.err().find("the buffers do not fit in memory: 3 rank(s) x 4096 MiB (send and receive buffer of 2048 "
                           "MiB each) = 12288 MiB, but MemAvailable is 4096 MiB (TESSERA_TEST_MEM_AVAILABLE)"),
            std::string::npos)
      << big.err();
  EXPECT_LT(big.seconds(), test_time::seconds(5)) << "refused only after allocating?";
  EXPECT_TRUE(entries(tmp).empty()) << join(entries(tmp));  // nothing started
  // The bound is exact: 3 x 2 x 1 MiB = 6 MiB fits in 6 MiB and not in one byte less.
  Subprocess fits({"env", "TMPDIR=" + tmp, "TESSERA_TEST_MEM_AVAILABLE=6M", kTessera, "bench", "all_reduce", "-b", "1M",
                   "-e", "1M", "-r", "3", "-n", "1", "-w", "0"},
                  d.path, "fits");
  EXPECT_EQ(fits.wait(test_time::scaled(60s)), 0) << fits.err();
  Subprocess over({"env", "TMPDIR=" + tmp, "TESSERA_TEST_MEM_AVAILABLE=6291455", kTessera, "bench", "all_reduce", "-b",
                   "1M", "-e", "1M", "-r", "3", "-n", "1", "-w", "0"},
                  d.path, "over");
  EXPECT_EQ(over.wait(test_time::scaled(20s)), 2) << over.err();
  EXPECT_NE(over.err().find("= 6 MiB, but MemAvailable is 5 MiB"), std::string::npos) << over.err();
  // Without the override the machine's own MemAvailable is the bound.
  Subprocess real({"env", "TMPDIR=" + tmp, kTessera, "bench", "all_reduce", "-b", "16T", "-e", "16T", "-r", "2"},
                  d.path, "real");
  EXPECT_EQ(real.wait(test_time::scaled(20s)), 2) << real.err();
  EXPECT_TRUE(std::regex_search(real.err(), std::regex("but MemAvailable is [0-9]+ MiB; lower"))) << real.err();
  EXPECT_TRUE(entries(tmp).empty()) << join(entries(tmp));
}

// A memory cgroup of the test's own with a limit: cgroup v2 (memory.max) or
// v1 (memory.limit_in_bytes). `why` says why not when neither can be made.
struct MemCgroup {
  std::string dir, why;
  explicit MemCgroup(uint64_t bytes) {
    std::ifstream in("/proc/self/cgroup");
    std::string v2, v1;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("0::", 0) == 0) v2 = line.substr(3);
      const auto at = line.find(":memory:");
      if (at != std::string::npos) v1 = line.substr(at + 8);
    }
    const std::string leaf = "/tessera-faults-" + std::to_string(getpid());
    std::vector<std::pair<std::string, std::string>> tries;  // (directory, limit file)
    if (!v1.empty()) tries.emplace_back("/sys/fs/cgroup/memory" + v1 + leaf, "memory.limit_in_bytes");
    tries.emplace_back("/sys/fs/cgroup" + (v2 == "/" ? "" : v2) + leaf, "memory.max");
    for (const auto& [d, limit] : tries) {
      if (mkdir(d.c_str(), 0755) != 0) {
        const char* err = std::strerror(errno);
        why.append(d).append(": ").append(err).append("; ");
        continue;
      }
      std::ofstream f(fs::path(d) / limit);
      f << bytes << "\n";
      f.close();
      if (f.good() && fs::exists(d + "/cgroup.procs")) {
        dir = d;
        return;
      }
      why.append(d).append("/").append(limit).append(": cannot set the limit; ");
      rmdir(d.c_str());
    }
    why = "no memory cgroup can be made here (" + why + ")";
  }
  ~MemCgroup() {
    if (dir.empty()) return;
    for (int i = 0; i < 100 && rmdir(dir.c_str()) != 0; ++i) std::this_thread::sleep_for(20ms);
  }
};

// A worker killed by the kernel's OOM killer: the launcher says so.
TEST(Memory, OomKillIsNamedByTheLauncher) {
  MemCgroup cg(uint64_t{384} << 20);
  if (cg.dir.empty()) GTEST_SKIP() << cg.why;
  TempDir d;
  const std::string id = "faults-oom-" + std::to_string(getpid());
  JobReaper reaper{id};
  // The launcher joins the cgroup before exec, so the whole job is in it.
  Subprocess p({"sh", "-c", "echo $$ > \"$0\" && exec \"$@\"", cg.dir + "/cgroup.procs", "env", "TESSERA_JOB_ID=" + id,
                kTessera, "run", "--nproc-per-node", "2", "--", kWorker, "--no-child", "--seconds", "60", "--hog-rank",
                "1", "--hog-mib", "8192"},
               d.path, "oom");
  const int rc = p.wait(test_time::scaled(90s));
  EXPECT_EQ(rc, 137) << p.err();
  EXPECT_TRUE(std::regex_search(p.err(), std::regex("tessera run: rank 1 killed by SIGKILL: the kernel's OOM killer "
                                                    "chose it \\(oom_kill of this memory cgroup went from 0 to [1-9]")))
      << p.err();
  EXPECT_TRUE(std::regex_search(p.out() + p.err(), std::regex("root cause: rank 1 [^\n]*\n(.*\n)*? +signal: +9 ")))
      << p.out() << p.err();
  EXPECT_TRUE(test_time::wait_until([&] { return job_processes(id).empty(); }, test_time::scaled(5s), 50ms))
      << describe(job_processes(id));
}

}  // namespace
