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
