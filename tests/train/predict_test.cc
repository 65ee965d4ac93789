// Prediction equals emulation: for layouts the demo and the tests run on 8
// emulated cores, `tessera plan --json` pinned to the layout (on the
// emulated:8 topology, the device and precision of the run) predicts the
// modeled step time train_gpt logs (--log-json, steady-state steps). The
// issue asks for 10%; both sum the same per-kernel and per-collective costs
// (runtime/kernel_cost.h, collectives/coll_cost.h), so they must agree to
// 0.5%: the smallest single charge either side could drop or add (the loss
// all-reduce, a ZeRO-1 bucket's all-gather) is about 0.5-1% of a step here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/checkpoint/test_util.h"

namespace {

using tessera::testing::TempDir;

struct Layout {
  std::string name;
  int tp, pp, dp, mbs;
  std::string schedule;
  int v;
  bool zero1;
  std::string launcher = "run";  // "run" (tessera run) or "mpirun"
};

constexpr int kGlobalBatch = 16;

double planned(const Layout& l, const TempDir& d) {
  const std::string model = d.file("model.json"), json = d.file(l.name + "_plan.json");
  {
    std::ofstream f(model);
    f << R"({"name": "demo-gpt", "layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "max_seq": 128})";
  }
  std::string cmd = std::string(TESSERA_BIN) + " plan --model " + model +
                    " --topology emulated:8 --device trn1-core --precision fp32 --seq 128 --global-batch " +
                    std::to_string(kGlobalBatch) + " --tp " + std::to_string(l.tp) + " --pp " + std::to_string(l.pp) +
                    " --dp " + std::to_string(l.dp) + " --mbs " + std::to_string(l.mbs) + " --zero1 " +
                    (l.zero1 ? "on" : "off") + " --sequence-parallel off --recompute none --virtual-stages " +
                    std::to_string(l.v) + (l.pp > 1 ? " --schedule " + l.schedule : std::string()) + " --json " + json;
  auto r = tessera::testing::run_command(cmd);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
  std::ifstream f(json);
  if (!f) return -1;
  return nlohmann::json::parse(f).at("step_time_s").at("total").get<double>();
}

// The median modeled step time of steps 2 and later.
double emulated(const Layout& l, const TempDir& d) {
  const std::string log = d.file(l.name + "_log.jsonl");
  const std::string launch =
      l.launcher == "run"
          ? std::string(TESSERA_BIN) + " run --nproc-per-node 8 --log-dir " + d.file(l.name + "_logs") + " --"
          : "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(MPIRUN_BIN) +
                " --oversubscribe --bind-to none -np 8";
  std::string cmd =
      "OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=120 " + launch + " " + TRAIN_GPT_BIN +
      " --layers 4 --hidden 128 --heads 4 --seq 128 --steps 3 --lr 3e-3 --device trn1-core --global-batch " +
      std::to_string(kGlobalBatch) + " --micro-batch " + std::to_string(l.mbs) + " --tp " + std::to_string(l.tp) +
      " --pp " + std::to_string(l.pp) + " --dp " + std::to_string(l.dp) + (l.zero1 ? " --zero1" : "") + " --log-json " +
      log;
  if (l.pp > 1) cmd += " --schedule " + l.schedule + " --virtual-stages " + std::to_string(l.v);
  auto r = tessera::testing::run_command(cmd);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
  std::vector<double> steps;
  std::ifstream f(log);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) {
      auto j = nlohmann::json::parse(line);
      if (j.at("step").get<int>() >= 2) steps.push_back(j.at("modeled_step_s").get<double>());
    }
  if (steps.empty()) return -1;
  std::sort(steps.begin(), steps.end());
  return steps[steps.size() / 2];
}

TEST(PredictEqualsEmulation, WithinTenPercent) {
  TempDir d;
  const std::vector<Layout> layouts = {
      {"tp2dp4_zero1", 2, 1, 4, 4, "1f1b", 1, true},
      {"tp2pp2dp2_1f1b", 2, 2, 2, 2, "1f1b", 1, false},
      {"tp2pp2dp2_1f1b_zero1_mpirun", 2, 2, 2, 2, "1f1b", 1, true, "mpirun"},
      {"tp1pp4dp2_gpipe", 1, 4, 2, 2, "gpipe", 1, false},
      {"tp2pp2dp2_interleaved2", 2, 2, 2, 2, "interleaved", 2, false},
      {"tp2pp4dp1_1f1b", 2, 4, 1, 2, "1f1b", 1, false},
  };
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    const double p = planned(l, d), e = emulated(l, d);
    ASSERT_GT(p, 0);
    ASSERT_GT(e, 0);
    std::printf("%-28s predicted %8.1f us  emulated %8.1f us  error %+.2f%%\n", l.name.c_str(), p * 1e6, e * 1e6,
                100 * (p - e) / e);
    EXPECT_NEAR(p, e, 0.005 * e) << "predicted " << p << " s, emulated " << e << " s";
  }
}

}  // namespace
