// `tessera bench --compare mpi` is honest: the MPI figure it prints agrees
// within 25% with a standalone MPI_Allreduce loop (tests/bench/
// osu_allreduce.cc) run under mpirun with the same settings in the same
// minutes, and the output says which settings were used.
//
// The two measure the same thing: the same mpirun flags (--oversubscribe
// only when the ranks outnumber the CPUs), the yield mode the bench kept, the
// same warm-up and timed call counts (read from the bench's JSON), a barrier
// and then back-to-back calls, the mean over ranks, and no thread of
// tessera's alive in either. What differs from run to run is the machine
// (2 cores shared by several jobs), so both run many times in the same
// minutes: each round runs the standalone loop, the bench, and the
// standalone loop again; 15 rounds of 20000 calls (~8 ms) at 2 ranks, 12
// rounds of 5000 calls (~10-20 ms) at cores + 1 ranks. A round that another
// job preempted is 2-200x slower; each side's figure is the mean of its
// rounds at most 2x its median, and the two figures must agree within
// 25%.
//
// Why 25% holds (measured 21:57-22:10 UTC, load 4-7, 10 runs of each case):
// the ratio of the clean means was 0.94-1.07 at 2 ranks and 0.97-1.19 at 3
// ranks. At 3 ranks OpenMPI itself is bimodal (2.1 or 3.3 us, by how the
// ranks fall on the cores; the same in the bench and the standalone loop),
// which the mean absorbs where a median or a minimum would flip between the
// modes (a fastest-round ratio also met a standalone round at 0.22 us
// against a usual 0.37: 1.69). Per-round ratios range 0.02-50 (one side
// preempted), so single rounds or the median of 11 round ratios (failed 2 of
// 10 runs at load 5-11) are no test. A comparison under the wrong conditions
// (MPI inside tessera's processes, beside tessera's polling threads) was off
// by 20-70x.
//
// 8 bytes is the size the complaint was about. 4 KiB is no use here:
// MPI's own time at 2 ranks is bimodal from run to run there (0.85 or
// 2.8-5.6 us, in the bench and the standalone loop alike).
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/checkpoint/test_util.h"
#include "tests/test_timeouts.h"
#include "tests/timing_gate.h"

namespace {

namespace fs = std::filesystem;

constexpr int kWarmup = 100;
constexpr double kTolerance = 0.25;

int cpus() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

// The mean of the rounds at most 2x the median. A round that another job
// preempted is 2-200x slower (a time slice is milliseconds, a call
// microseconds); OpenMPI's two placements of 3 ranks on 2 cores differ by
// 1.6x, and both are kept. Measured from the median, not from the fastest
// round: on a 2-core AMD EPYC guest (2026-12-06) 2 ranks were bimodal too,
// 0.18-0.26 us in a few rounds and 0.45-0.55 us in the rest, on either
// side; "within 2x of the fastest" then kept only the fast mode's few
// rounds, and the test failed twice (ratios 2.27 and 1.26) where the
// per-round ratios had a median of 0.96-0.98.
double clean_mean(const std::vector<double>& v) {
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  double sum = 0;
  int kept = 0;
  for (double x : v) {
    if (x > 2 * median) continue;
    sum += x;
    ++kept;
  }
  return sum / kept;
}

// No command may hang the test: each gets two minutes (scaled).
std::string bounded(const std::string& cmd) {
  return "timeout -k 5 " + std::to_string(std::lround(tessera::test_time::seconds(120))) + " " + cmd;
}

// The number after `key` in `setting` ("yield_when_idle=1 iters=300 warmup=100"), or "".
std::string setting_value(const std::string& setting, const std::string& key) {
  const auto at = setting.find(key);
  if (at == std::string::npos) return "";
  const auto from = at + key.size();
  return setting.substr(from, setting.find(' ', from) - from);
}

// How the bench ran MPI for the row: the yield mode ("" when it passed
// none), the binding, and the calls timed and warmed up.
struct MpiRun {
  double us = 0;
  std::string yield, bind;  // bind: "" for OpenMPI's default binding
  long iters = 0, warmup = 0;
};

MpiRun bench_run(const std::string& js, int n, bool over, long iters) {
  auto r = tessera::testing::run_command(bounded(std::string(TESSERA_BIN) + " bench allr -r " + std::to_string(n) +
                                                 " -b 8 -e 8 -n " + std::to_string(iters) + " -w " +
                                                 std::to_string(kWarmup) + " --compare mpi --json " + js));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("# mpi: "), std::string::npos) << r.out;  // the settings are printed
  std::ifstream f(js);
  const auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.contains("results") || j["results"].size() != 1u) {
    ADD_FAILURE() << "no one-row JSON report in " << js << "\n" << r.out;
    return {};
  }
  const std::string settings = j.value("compare_settings", "");
  EXPECT_EQ(settings.find("mpirun --oversubscribe -np") != std::string::npos, over) << settings;
  EXPECT_EQ(settings.find("mpi_yield_when_idle 0 and 1") != std::string::npos, over) << settings;
  const auto& row = j["results"][0];
  const std::string setting = row.value("compare_setting", "");
  MpiRun m;
  m.us = row.value("compare_time_us", 0.0);
  m.yield = setting_value(setting, "yield_when_idle=");
  m.bind = setting_value(setting, "bind=");
  m.iters = std::atol(setting_value(setting, "iters=").c_str());
  m.warmup = std::atol(setting_value(setting, "warmup=").c_str());
  EXPECT_EQ(!m.yield.empty(), over) << setting;  // both modes measured, the faster kept
  EXPECT_GT(m.iters, 0) << setting;
  return m;
}

// The standalone loop with the bench's settings for the row.
double osu_us(int n, bool over, const MpiRun& as) {
  std::string cmd = "mpirun ";
  if (over) cmd += "--oversubscribe ";
  cmd += "-np " + std::to_string(n) + " ";
  if (!as.yield.empty()) cmd += "--mca mpi_yield_when_idle " + as.yield + " ";
  if (!as.bind.empty()) cmd += "--bind-to " + as.bind + " ";
  cmd += std::string(OSU_ALLREDUCE_BIN) + " 2 " + std::to_string(as.iters) + " " + std::to_string(as.warmup);
  auto r = tessera::testing::run_command(bounded(cmd));
  EXPECT_EQ(r.code, 0) << r.out;
  auto at = r.out.find("avg_us ");
  EXPECT_NE(at, std::string::npos) << r.out;
  return at == std::string::npos ? 0.0 : std::atof(r.out.c_str() + at + 7);
}

class CompareMpi : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    char tmpl[] = "/tmp/tessera-compare-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

// n = 2 fits the cores of the CI machines (no --oversubscribe); n = cores + 1
// does not (both yield modes are measured). Both compare two timings, so both
// run only under ctest -L timing: the fitting case failed too, in
// 4 of 8 default-suite runs beside a sanitizer build (load 4-11).
TEST_P(CompareMpi, MpiColumnAgreesWithAStandaloneMpiAllreduceLoop) {
  TESSERA_TIMING_TEST();  // a ratio of two timings: noise on a loaded machine
  const int n = GetParam() == 0 ? 2 : cpus() + 1;
  const bool over = n > cpus();
  const long iters = over ? 5000 : 20000;
  const int rounds = over ? 12 : 15;
  // Each round: the standalone loop (with the previous round's settings),
  // the bench, the standalone loop again (with this round's; the first
  // reruns if they differ).
  MpiRun prev{0, over ? "1" : "", "", iters, kWarmup};
  std::vector<double> bench, osu;
  std::string seen;
  for (int round = 0; round < rounds; ++round) {
    double before = osu_us(n, over, prev);
    const MpiRun b = bench_run(dir_ + "/c" + std::to_string(round) + ".json", n, over, iters);
    if (::testing::Test::HasFailure()) return;
    if (b.yield != prev.yield || b.bind != prev.bind || b.iters != prev.iters || b.warmup != prev.warmup)
      before = osu_us(n, over, b);
    const double after = osu_us(n, over, b);
    prev = b;
    ASSERT_GT(b.us, 0.0);
    ASSERT_GT(before, 0.0);
    ASSERT_GT(after, 0.0);
    bench.push_back(b.us);
    osu.insert(osu.end(), {before, after});
    seen += " " + std::to_string(before).substr(0, 5) + "/" + std::to_string(b.us).substr(0, 5) + "/" +
            std::to_string(after).substr(0, 5);
  }
  const double b = clean_mean(bench), o = clean_mean(osu);
  const double fb = *std::min_element(bench.begin(), bench.end()), fo = *std::min_element(osu.begin(), osu.end());
  EXPECT_LE(std::abs(b / o - 1), kTolerance) << "mean of the clean rounds: --compare mpi " << b << " us, standalone "
                                             << o << " us; rounds (us, bench/standalone):" << seen;
  std::cout << n << " ranks, 8-byte all-reduce, " << rounds << " rounds: clean means --compare mpi " << b
            << " us, standalone " << o << " us, ratio " << b / o << "; fastest " << fb << " / " << fo << " us, ratio "
            << fb / fo << "; rounds (us):" << seen << "\n";
}

INSTANTIATE_TEST_SUITE_P(Ranks, CompareMpi, ::testing::Values(0, 1),
                         [](const auto& info) { return info.param == 0 ? "fit" : "oversubscribed"; });

}  // namespace
