// train_gpt with pipeline parallelism as users start it: under `tessera run`
// and under `mpirun`, tp1 x pp2 (1F1B, interleaved, and GPipe with an
// explicit partition) and tp2 x pp2 (1F1B with SP), each against the serial run of the same model and
// batch: the per-step losses (from --log-json) agree within 1e-5 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/checkpoint/test_util.h"

namespace {

using tessera::testing::TempDir;

const std::string kModel =
    "--steps 3 --layers 4 --hidden 32 --heads 4 --seq 16 --vocab 256 --micro-batch 1 --global-batch 4 --lr 1e-3 "
    "--device test-core";

std::vector<double> losses(const std::string& log) {
  std::vector<double> v;
  std::ifstream f(log);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) v.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return v;
}

std::vector<double> run(const std::string& launcher, const std::string& args, const TempDir& d,
                        const std::string& name) {
  const std::string log = d.file(name + ".json");
  auto r = tessera::testing::run_command("OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=60 " + launcher + " " +
                                         TRAIN_GPT_BIN + " " + kModel + " " + args + " --log-json " + log);
  EXPECT_EQ(r.code, 0) << r.out;
  return losses(log);
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), 3u) << what;
  ASSERT_EQ(want.size(), 3u) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << what << " step " << i + 1;
}

const std::string kRun = std::string(TESSERA_BIN) + " run --nproc-per-node ";
const std::string kMpirun = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(MPIRUN_BIN) +
                            " --oversubscribe --bind-to none -np ";

TEST(PipelineCli, TesseraRunMatchesSerial) {
  TempDir d;
  const auto serial = run("", "", d, "serial");
  expect_close(run(kRun + "2 --", "--pp 2 --schedule 1f1b", d, "pp2"), serial, "tessera run pp2 1f1b");
  expect_close(run(kRun + "4 --", "--tp 2 --pp 2 --schedule 1f1b --sequence-parallel", d, "tp2pp2"), serial,
               "tessera run tp2 pp2 sp");
  expect_close(run(kRun + "2 --", "--pp 2 --schedule interleaved --virtual-stages 2", d, "interleaved"), serial,
               "tessera run pp2 interleaved v2");
}

TEST(PipelineCli, MpirunMatchesSerial) {
  TempDir d;
  const auto serial = run("", "", d, "serial");
  expect_close(run(kMpirun + "2", "--pp 2 --schedule gpipe --stages 3,1", d, "pp2"), serial, "mpirun pp2 gpipe");
}

}  // namespace

namespace {

// The trace of the last step: one track (tid) per rank with every forward and
// backward of the step once, and each rank's bubble (its idle share of the
// pipeline's span, read from the events alone) near the schedule's
// (p-1)/(v m+p-1): the stages are balanced (4 blocks each; the head and the
// embeddings are small next to them), so only the pipeline fill is idle.
struct TraceCase {
  std::string args;
  int ranks, p, v, m;
};

TEST(PipelineCli, TraceShowsEachRanksOpsAndTheScheduleBubble) {
  TempDir d;
  for (const TraceCase& c :
       {TraceCase{"--pp 4 --schedule 1f1b", 4, 4, 1, 8}, TraceCase{"--pp 4 --schedule gpipe", 4, 4, 1, 8},
        TraceCase{"--pp 2 --schedule interleaved --virtual-stages 2", 2, 2, 2, 8}}) {
    SCOPED_TRACE(c.args);
    const std::string trace = d.file("trace.json");
    std::string cmd = "OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=60 " + kRun + std::to_string(c.ranks) + " -- " +
                      TRAIN_GPT_BIN +
                      " --steps 2 --layers 16 --hidden 128 --heads 4 --seq 16 --vocab 256 --micro-batch 1 "
                      "--global-batch 8 --device test-core --trace ";
    cmd += trace + " " + c.args;
    auto r = tessera::testing::run_command(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("bubble stage 0:"), std::string::npos) << r.out;
    std::ifstream f(trace);
    nlohmann::json doc = nlohmann::json::parse(f);
    std::vector<double> busy(static_cast<size_t>(c.ranks), 0);
    std::vector<int> fwd(static_cast<size_t>(c.ranks), 0), bwd(static_cast<size_t>(c.ranks), 0);
    std::vector<bool> named(static_cast<size_t>(c.ranks), false);
    double end = 0;
    for (const auto& e : doc.at("traceEvents")) {
      const int tid = e.at("tid").get<int>();
      ASSERT_TRUE(tid >= 0 && tid < c.ranks) << e.dump();
      if (e.at("ph") == "M") {
        named[static_cast<size_t>(tid)] = true;
        continue;
      }
      ASSERT_EQ(e.at("ph"), "X") << e.dump();
      const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
      ASSERT_GE(dur, 0) << e.dump();
      end = std::max(end, ts + dur);
      const std::string cat = e.at("cat");
      if (cat == "bubble") continue;
      busy[static_cast<size_t>(tid)] += dur;
      (cat == "forward" ? fwd : bwd)[static_cast<size_t>(tid)]++;
    }
    const double want = static_cast<double>(c.p - 1) / (c.v * c.m + c.p - 1);
    for (int t = 0; t < c.ranks; ++t) {
      EXPECT_TRUE(named[static_cast<size_t>(t)]) << "rank " << t << " has no track name";
      EXPECT_EQ(fwd[static_cast<size_t>(t)], c.m * c.v) << "rank " << t;
      EXPECT_EQ(bwd[static_cast<size_t>(t)], c.m * c.v) << "rank " << t;
      const double bubble = 1 - busy[static_cast<size_t>(t)] / end;
      EXPECT_NEAR(bubble, want, 0.03) << "rank " << t << " bubble " << bubble << " schedule " << want;
    }
  }
}

}  // namespace
