// Prediction equals emulation: for layouts the demo and the tests run on 8
// emulated cores, `tessera plan --json` pinned to the layout (on the
// emulated:8 topology, the device and precision of the run) predicts the
// modeled step time train_gpt logs (--log-json, steady-state steps). The
// issue asks for 10%; both sum the same per-kernel and per-collective costs
// (runtime/kernel_cost.h, collectives/coll_cost.h), so they must agree to
// 0.5%: the smallest single charge either side could drop or add (the loss
// all-reduce, a ZeRO-1 bucket's all-gather) is about 0.5-1% of a step here.
//
// With pp > 1 the run also writes its trace (--trace), and every rank's
// bubble fraction read back from it (trace_bubbles) equals the plan's
// stage_bubble_fraction for the rank's stage. The demo's 4 layers are
// unequal stages (the first carries the embedding, the last the head), so
// these differ from (p-1)/(v m+p-1) by several points; the planner simulates
// the schedule as the executor runs it, from the same op costs, so they
// agree to 0.01 point: the only difference is the executor's send time
// stamps, whole nanoseconds (about 1e-4 points here), while one op or link
// transfer more or less moves a stage's bubble by 1 point or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/pipeline/trace.h"
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
  // Where the ranks sit: emulated:8 (every group its own ring), or the first
  // 8 cores of a topology preset, placed as the planner places them
  // (train_gpt --topology, tessera plan --topology --cores 8).
  std::string topology = "emulated:8";
  // The demo's model as GPT-2, or as a Llama with kv_heads K/V heads of its 4 (tp > kv_heads: replicated).
  std::string family = "gpt";
  int kv_heads = 4;
  std::string precision = "fp32";  // bf16: fp32 master weights, gradients reduced in bf16
};

std::string model_json(const Layout& l) {
  if (l.family == "gpt")
    return R"({"name": "demo-gpt", "layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "max_seq": 128})";
  return R"({"name": "demo-llama", "family": "llama", "layers": 4, "hidden": 128, "heads": 4, "kv_heads": )" +
         std::to_string(l.kv_heads) + R"(, "ffn_hidden": 384, "vocab": 256, "max_seq": 128})";
}

std::string model_flags(const Layout& l) {
  if (l.family == "gpt") return " --layers 4 --hidden 128 --heads 4";
  return " --family llama --layers 4 --hidden 128 --heads 4 --kv-heads " + std::to_string(l.kv_heads) +
         " --ffn-hidden 384";
}

constexpr int kGlobalBatch = 16;

// The plan `tessera plan` writes for the layout.
nlohmann::json planned(const Layout& l, const TempDir& d) {
  const std::string model = d.file(l.name + "_model.json"), json = d.file(l.name + "_plan.json");
  {
    std::ofstream f(model);
    f << model_json(l);
  }
  std::string cmd = std::string(TESSERA_BIN) + " plan --model " + model + " --topology " + l.topology +
                    (l.topology == "emulated:8" ? "" : " --cores 8") + " --device trn1-core --precision " +
                    l.precision + " --seq 128 --global-batch " + std::to_string(kGlobalBatch) + " --tp " +
                    std::to_string(l.tp) + " --pp " + std::to_string(l.pp) + " --dp " + std::to_string(l.dp) +
                    " --mbs " + std::to_string(l.mbs) + " --zero1 " + (l.zero1 ? "on" : "off") +
                    " --sequence-parallel off --recompute none --virtual-stages " + std::to_string(l.v) +
                    (l.pp > 1 ? " --schedule " + l.schedule : std::string()) + " --json " + json;
  auto r = tessera::testing::run_command(cmd);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
  if (l.pp > 1) {
    EXPECT_NE(r.out.find("bubble per stage"), std::string::npos) << r.out;
  }
  std::ifstream f(json);
  if (!f) return nlohmann::json::object();
  return nlohmann::json::parse(f);
}

struct Emulated {
  double step_s = -1;                                            // the median modeled step time of steps 2 and later
  std::vector<tessera::parallel::pipeline::RankBubble> bubbles;  // per rank, from the last step's trace (pp > 1)
};

Emulated emulated(const Layout& l, const TempDir& d) {
  const std::string log = d.file(l.name + "_log.jsonl"), trace = d.file(l.name + "_trace.json");
  const std::string launch =
      l.launcher == "run"
          ? std::string(TESSERA_BIN) + " run --nproc-per-node 8 --log-dir " + d.file(l.name + "_logs") + " --"
          : "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(MPIRUN_BIN) +
                " --oversubscribe --bind-to none -np 8";
  std::string cmd = "OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=120 " + launch + " " + TRAIN_GPT_BIN + model_flags(l) +
                    " --seq 128 --steps 3 --lr 3e-3 --device trn1-core --global-batch " + std::to_string(kGlobalBatch) +
                    " --micro-batch " + std::to_string(l.mbs) + " --tp " + std::to_string(l.tp) + " --pp " +
                    std::to_string(l.pp) + " --dp " + std::to_string(l.dp) + (l.zero1 ? " --zero1" : "") +
                    " --precision " + l.precision + " --log-json " + log;
  if (l.pp > 1) cmd += " --schedule " + l.schedule + " --virtual-stages " + std::to_string(l.v) + " --trace " + trace;
  if (l.topology != "emulated:8") cmd += " --topology " + l.topology;
  auto r = tessera::testing::run_command(cmd);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
  Emulated out;
  std::vector<double> steps;
  std::ifstream f(log);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) {
      auto j = nlohmann::json::parse(line);
      if (j.at("step").get<int>() >= 2) steps.push_back(j.at("modeled_step_s").get<double>());
    }
  if (!steps.empty()) {
    std::sort(steps.begin(), steps.end());
    out.step_s = steps[steps.size() / 2];
  }
  if (l.pp > 1 && r.code == 0)
    out.bubbles = tessera::parallel::pipeline::trace_bubbles(tessera::testing::read_bytes(trace), trace);
  return out;
}

void check(const std::vector<Layout>& layouts);

TEST(PredictEqualsEmulation, StepTimeAndEachStagesBubble) {
  check({
      {"tp2dp4_zero1", 2, 1, 4, 4, "1f1b", 1, true},
      {"tp2pp2dp2_1f1b", 2, 2, 2, 2, "1f1b", 1, false},
      {"tp2pp2dp2_1f1b_zero1_mpirun", 2, 2, 2, 2, "1f1b", 1, true, "mpirun"},  // the demo's layout
      {"tp1pp4dp2_gpipe", 1, 4, 2, 2, "gpipe", 1, false},
      {"tp1pp4dp2_1f1b", 1, 4, 2, 2, "1f1b", 1, false},
      {"tp2pp2dp2_interleaved2", 2, 2, 2, 2, "interleaved", 2, false},
      {"tp2pp4dp1_1f1b", 2, 4, 1, 2, "1f1b", 1, false},
      // Placed on a topology: every group charged on the links it spans.
      {"tp2dp4_zero1_trn1", 2, 1, 4, 4, "1f1b", 1, true, "run", "trn1.32xlarge"},
      {"tp2pp2dp2_1f1b_trn1", 2, 2, 2, 2, "1f1b", 1, false, "run", "trn1.32xlarge"},
      {"tp2pp2dp2_1f1b_trn2", 2, 2, 2, 2, "1f1b", 1, false, "run", "trn2.48xlarge"},
      // Llama: GQA's smaller K/V projections, SwiGLU's three matrices, RMSNorm, RoPE.
      {"llama_tp2dp4_zero1_kv2", 2, 1, 4, 4, "1f1b", 1, true, "run", "emulated:8", "llama", 2},
      {"llama_tp2pp2dp2_1f1b_kv2", 2, 2, 2, 2, "1f1b", 1, false, "run", "emulated:8", "llama", 2},
      {"llama_tp2pp2dp2_trn1_kv2", 2, 2, 2, 2, "1f1b", 1, false, "run", "trn1.32xlarge", "llama", 2},
      // tp > kv_heads: each K/V head on tp / kv_heads ranks, its gradient all-reduced over them.
      {"llama_tp4dp2_zero1_kv2", 4, 1, 2, 2, "1f1b", 1, true, "run", "emulated:8", "llama", 2},
      {"llama_tp4dp2_kv1_mpirun", 4, 1, 2, 2, "1f1b", 1, false, "mpirun", "emulated:8", "llama", 1},
      {"llama_tp4pp2_1f1b_kv1", 4, 2, 1, 2, "1f1b", 1, false, "run", "emulated:8", "llama", 1},
  });
}

// bf16 mixed precision: kernels at the bf16 peak with 2-byte traffic, the
// optimizer's in fp32, 16-bit all-gathers (ZeRO-1), reductions widened to
// fp32 on the wire.
TEST(PredictEqualsEmulation, Bf16StepTimeAndEachStagesBubble) {
  check({
      {"tp2dp4_zero1_bf16", 2, 1, 4, 4, "1f1b", 1, true, "run", "emulated:8", "gpt", 4, "bf16"},
      {"tp2pp2dp2_1f1b_bf16", 2, 2, 2, 2, "1f1b", 1, false, "run", "emulated:8", "gpt", 4, "bf16"},
      {"tp1pp4dp2_gpipe_bf16", 1, 4, 2, 2, "gpipe", 1, false, "run", "emulated:8", "gpt", 4, "bf16"},
      {"tp2pp2dp2_1f1b_trn1_bf16", 2, 2, 2, 2, "1f1b", 1, false, "run", "trn1.32xlarge", "gpt", 4, "bf16"},
      {"llama_tp2dp4_zero1_kv2_bf16", 2, 1, 4, 4, "1f1b", 1, true, "run", "emulated:8", "llama", 2, "bf16"},
      {"llama_tp2pp2dp2_1f1b_kv2_bf16", 2, 2, 2, 2, "1f1b", 1, false, "run", "emulated:8", "llama", 2, "bf16"},
  });
}

void check(const std::vector<Layout>& layouts) {
  TempDir d;
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    const nlohmann::json plan = planned(l, d);
    const Emulated e = emulated(l, d);
    ASSERT_TRUE(plan.contains("step_time_s"));
    const double p = plan.at("step_time_s").at("total").get<double>();
    ASSERT_GT(p, 0);
    ASSERT_GT(e.step_s, 0);
    std::printf("%-28s predicted %8.1f us  emulated %8.1f us  error %+.2f%%\n", l.name.c_str(), p * 1e6, e.step_s * 1e6,
                100 * (p - e.step_s) / e.step_s);
    EXPECT_NEAR(p, e.step_s, 0.005 * e.step_s) << "predicted " << p << " s, emulated " << e.step_s << " s";
    if (l.pp == 1) continue;
    // Ranks are placed tp-dp-pp (TP fastest): rank r is on stage r / (tp dp).
    const std::vector<double> stage = plan.at("stage_bubble_fraction").get<std::vector<double>>();
    ASSERT_EQ(stage.size(), static_cast<size_t>(l.pp));
    ASSERT_EQ(e.bubbles.size(), 8u);
    const double formula = plan.at("schedule_bubble_fraction").get<double>();
    const int m = kGlobalBatch / (l.dp * l.mbs);  // micro-batches per DP rank
    EXPECT_NEAR(formula, (l.pp - 1.0) / (l.v * m + l.pp - 1.0), 1e-12);
    std::printf("%-28s bubble per rank, trace / planned (formula %.1f%%):", l.name.c_str(), 100 * formula);
    for (const auto& b : e.bubbles) {
      const double want = stage.at(static_cast<size_t>(b.rank / (l.tp * l.dp)));
      std::printf(" %.1f/%.1f", 100 * b.fraction(), 100 * want);
      EXPECT_NEAR(b.fraction(), want, 1e-4) << "rank " << b.rank << ": trace " << b.fraction() << ", planned " << want;
    }
    std::printf("\n");
  }
}

}  // namespace
