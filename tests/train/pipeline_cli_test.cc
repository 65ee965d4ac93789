// train_gpt with pipeline parallelism as users start it: under `tessera run`
// and under `mpirun`, tp1 x pp2 (1F1B, interleaved, and GPipe with an
// explicit partition) and tp2 x pp2 (1F1B with SP), each against the serial run of the same model and
// batch: the per-step losses (from --log-json) agree within 1e-5 relative.
// Then --plan (a plan written by `tessera plan --json`, and the plans it
// refuses), --export with pp > 1 against the serial export, and the trace.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/checkpoint/safetensors.h"
#include "parallel/model_config.h"
#include "parallel/models/hf_config.h"
#include "parallel/pipeline/trace.h"
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

// `tessera plan` for the kModel GPT pinned to a layout; returns the plan file.
std::string write_plan(const TempDir& d, const std::string& name, const std::string& pins) {
  const std::string model = d.file("model.json");
  std::ofstream(model) << R"({"name": "test-gpt", "layers": 4, "hidden": 32, "heads": 4, "vocab": 256, "max_seq": 16})";
  std::string plan = d.file(name + ".json");
  auto r = tessera::testing::run_command(std::string(TESSERA_BIN) + " plan --model " + model +
                                         " --topology trn1.32xlarge --device test-core --global-batch 4 --seq 16 "
                                         "--mbs 1 --recompute none --top 1 --json " +
                                         plan + " " + pins);
  EXPECT_EQ(r.code, 0) << r.out;
  return plan;
}

const std::string kPlanPins = "--precision fp32 --cores 2 --tp 1 --pp 2 --dp 1 --zero1 off";

// The plan's layout, schedule and partition run, and give the serial losses;
// the run prints the plan's predicted step time against the emulated one.
TEST(PipelineCli, PlanRunsItsLayoutAndMatchesSerial) {
  TempDir d;
  const std::string plan = write_plan(d, "gpipe", kPlanPins + " --schedule gpipe");
  const nlohmann::json j = nlohmann::json::parse(tessera::testing::read_bytes(plan));
  EXPECT_EQ(j.at("schedule"), "gpipe");
  EXPECT_EQ(j.at("device"), "test-core");
  EXPECT_EQ(j.at("model_shape").at("hidden"), 32);
  EXPECT_EQ(j.at("stages").size(), 2u);
  const auto serial = run("", "", d, "serial");
  // kModel's flags agree with the plan, so they may be given with it.
  const std::string log = d.file("plan.log");
  auto r = tessera::testing::run_command("OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=60 " + kRun + "2 -- " +
                                         TRAIN_GPT_BIN + " " + kModel + " --plan " + plan + " --log-json " + log);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_close(losses(log), serial, "--plan pp2 gpipe");
  EXPECT_NE(r.out.find("tp=1 pp=2 dp=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("schedule gpipe"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step time: predicted "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", emulated "), std::string::npos) << r.out;
  // The plan carries its topology (trn1.32xlarge, first 2 cores): the run is
  // placed there and charges the same links, so the emulated step is the
  // predicted one (it was 15% off when each group was charged as its own ring).
  const size_t pct = r.out.find("median modeled step after step 1, ");
  ASSERT_NE(pct, std::string::npos) << r.out;
  EXPECT_LT(std::fabs(std::stod(r.out.substr(pct + std::strlen("median modeled step after step 1, ")))), 0.5) << r.out;
  // Each stage's bubble from the trace, with the plan's prediction for it beside it.
  ASSERT_EQ(j.at("stage_bubble_fraction").size(), 2u);
  for (int s = 0; s < 2; ++s) {
    char want[96];
    std::snprintf(want, sizeof want, "; planned %.1f%%)",
                  100 * j.at("stage_bubble_fraction").at(static_cast<size_t>(s)).get<double>());
    const size_t at = r.out.find("bubble stage " + std::to_string(s) + ": ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_TRUE(line.size() > std::strlen(want) && line.substr(line.size() - std::strlen(want)) == want)
        << "want '" << want << "' at the end of '" << line << "'";
  }

  // Interleaved: the plan's virtual stages and partition (one layer per virtual stage).
  const std::string inter = write_plan(d, "inter", kPlanPins + " --schedule interleaved");
  EXPECT_EQ(nlohmann::json::parse(tessera::testing::read_bytes(inter)).at("virtual_stages"), 2);
  const std::string log2 = d.file("inter.log");
  r = tessera::testing::run_command("OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=60 " + kRun + "2 -- " + TRAIN_GPT_BIN +
                                    " --steps 3 --lr 1e-3 --plan " + inter + " --log-json " + log2);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_close(losses(log2), serial, "--plan pp2 interleaved");
  EXPECT_NE(r.out.find("2 stages x 2 virtual, [1,1,1,1]"), std::string::npos) << r.out;
}

// `tessera plan --model DIR` reads a Hugging Face directory's config.json, as
// train_gpt --init does: the plan equals the one for the preset it describes.
TEST(PipelineCli, PlanTakesAHuggingFaceDirectory) {
  TempDir d;
  const std::string hf = d.file("Llama-3-8B");
  std::filesystem::create_directory(hf);
  std::ofstream(hf + "/config.json") << tessera::parallel::models::hf_config_text(
      tessera::parallel::ModelConfig::preset("llama3-8b"), "bfloat16");
  auto plan = [&](const std::string& model, const std::string& out) {
    auto r =
        tessera::testing::run_command(std::string(TESSERA_BIN) + " plan --model " + model +
                                      " --topology trn1.32xlarge --global-batch 32 --seq 2048 --top 1 --json " + out);
    EXPECT_EQ(r.code, 0) << r.out;
    return nlohmann::json::parse(tessera::testing::read_bytes(out));
  };
  const nlohmann::json from_dir = plan(hf, d.file("dir.json")), from_preset = plan("llama3-8b", d.file("preset.json"));
  nlohmann::json dir_shape = from_dir.at("model_shape"), preset_shape = from_preset.at("model_shape");
  EXPECT_EQ(dir_shape.value("tie_embeddings", false), false);  // config.json states it; the preset leaves it unset
  dir_shape.erase("tie_embeddings");
  EXPECT_EQ(dir_shape, preset_shape);
  EXPECT_EQ(from_dir.at("model_shape").at("kv_heads"), 8);
  for (const char* k : {"tp", "pp", "dp", "step_time_s", "memory_bytes_per_rank"})
    EXPECT_EQ(from_dir.at(k), from_preset.at(k)) << k;
}

// Exit 2, naming the plan file and the values that disagree.
void expect_refused(const std::string& args, const std::string& plan, const std::vector<std::string>& needles) {
  auto r = tessera::testing::run_command("OPENBLAS_NUM_THREADS=1 " + std::string(TRAIN_GPT_BIN) + " --steps 1 " + args +
                                         " --plan " + plan);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
  EXPECT_NE(r.out.find(plan), std::string::npos) << r.out;
  for (const auto& n : needles) EXPECT_NE(r.out.find(n), std::string::npos) << "want '" << n << "' in\n" << r.out;
}

TEST(PipelineCli, PlanThatDoesNotMatchTheJobIsRefused) {
  TempDir d;
  const std::string plan = write_plan(d, "p", kPlanPins + " --schedule 1f1b");
  // World size: the plan is for 2 ranks, this is one process.
  expect_refused("", plan, {"is for 2 ranks", "has 1 process"});
  // Model, from the command line.
  expect_refused("--hidden 64", plan, {"hidden 32", "--hidden 64"});
  expect_refused("--layers 8", plan, {"layers 4", "--layers 8"});
  expect_refused("--seq 8", plan, {"seq 16", "--seq 8"});
  // Device.
  expect_refused("--device trn1-core", plan, {"device test-core", "--device trn1-core"});
  // Flags that contradict the plan.
  expect_refused("--tp 2", plan, {"tp 1", "--tp 2"});
  expect_refused("--schedule gpipe", plan, {"schedule 1f1b", "--schedule gpipe"});
  expect_refused("--micro-batch 2", plan, {"micro-batch 1", "--micro-batch 2"});
  expect_refused("--zero1", plan, {"zero1"});
  expect_refused("--stages 3,1", plan, {"stages 2,2", "--stages 3,1"});
  // A bf16 plan runs bf16 with fp32 master weights and bf16 gradient
  // reduction: another precision or either variant is refused.
  const std::string bf16 = write_plan(d, "bf16", "--precision bf16 --cores 2 --tp 1 --pp 2 --dp 1");
  expect_refused("--precision fp32", bf16, {"precision bf16", "--precision fp32"});
  expect_refused("--no-master-weights", bf16, {"--no-master-weights"});
  expect_refused("--accumulate-allreduce-grads-in-fp32", bf16, {"--accumulate-allreduce-grads-in-fp32"});
  // What train_gpt cannot run: a rank order of its own.
  expect_refused("", write_plan(d, "order", kPlanPins + " --order pp-dp-tp"), {"pp-dp-tp", "tp-dp-pp"});
  // Not a plan at all.
  const std::string bad = d.file("bad.json");
  std::ofstream(bad) << R"({"tp": 1, "colour": 2})";
  expect_refused("", bad, {"colour"});
}

// tp2 x pp2 (and interleaved pp2) export the same Hugging Face file as the
// serial run after the same steps.
TEST(PipelineCli, ExportWithPipelineEqualsSerialExport) {
  TempDir d;
  auto exported = [&](const std::string& launcher, const std::string& args, const std::string& name) {
    std::string out = d.file(name + ".safetensors");
    auto r = tessera::testing::run_command("OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=60 " + launcher + " " +
                                           TRAIN_GPT_BIN + " " + kModel + " " + args + " --export " + out);
    EXPECT_EQ(r.code, 0) << r.out;
    return out;
  };
  const std::string serial = exported("", "", "serial");
  for (const auto& [launcher, args] :
       {std::pair<std::string, std::string>{kRun + "4 --", "--tp 2 --pp 2 --schedule 1f1b"},
        std::pair<std::string, std::string>{kRun + "2 --", "--pp 2 --schedule interleaved --virtual-stages 2"}}) {
    SCOPED_TRACE(args);
    const std::string got = exported(launcher, args, "pp");
    auto a = tessera::parallel::checkpoint::open_safetensors(serial);
    auto b = tessera::parallel::checkpoint::open_safetensors(got);
    ASSERT_EQ(a->names(), b->names());
    EXPECT_EQ(a->metadata(), b->metadata());
    for (const std::string& n : a->names()) {
      tessera::Tensor x = a->get(n), y = b->get(n);
      ASSERT_EQ(x.shape(), y.shape()) << n;
      const float* px = x.data<float>();
      const float* py = y.data<float>();
      int bad = 0;
      for (int64_t i = 0; i < x.numel() && bad < 3; ++i)
        if (std::abs(px[i] - py[i]) > 1e-5 * (1 + std::abs(px[i])))
          ADD_FAILURE() << n << "[" << i << "]: serial " << px[i] << ", pipeline " << py[i] << " (" << ++bad << ")";
    }
  }
}

// The trace of the last step: one track (tid) per rank with every forward and
// backward of the step once, the optimizer and (with dp > 1) every DP
// bucket's collective on each rank, and each rank's bubble read back from the
// events (trace_bubbles) near the schedule's (p-1)/(v m+p-1): the stages are
// balanced (4 blocks each; the head and the embeddings are small next to
// them), so only the pipeline fill and drain are idle. Ranks are placed
// tp-dp-pp: rank t is on stage t / (ranks / p).
struct TraceCase {
  std::string args;
  int ranks, p, v, m;
  bool dp_comm;
};

TEST(PipelineCli, TraceShowsEveryRanksStepAndTheScheduleBubble) {
  TempDir d;
  for (const TraceCase& c :
       {TraceCase{"--pp 4 --schedule 1f1b", 4, 4, 1, 8, false}, TraceCase{"--pp 4 --schedule gpipe", 4, 4, 1, 8, false},
        TraceCase{"--pp 2 --schedule interleaved --virtual-stages 2", 2, 2, 2, 8, false},
        TraceCase{"--pp 4 --schedule interleaved --virtual-stages 2", 4, 4, 2, 8, false},  // 8 chunks of 2 blocks
        TraceCase{"--tp 2 --pp 2 --schedule 1f1b", 4, 2, 1, 8, false},
        TraceCase{"--pp 2 --dp 2 --schedule 1f1b --zero1 --bucket-mb 0.25", 4, 2, 1, 4, true}}) {
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
    const std::string text = tessera::testing::read_bytes(trace);
    const nlohmann::json doc = nlohmann::json::parse(text);
    EXPECT_EQ(doc.at("otherData").at("clock"), "emulated");
    const size_t n = static_cast<size_t>(c.ranks);
    std::vector<int> fwd(n, 0), bwd(n, 0), opt(n, 0), dp(n, 0), gather(n, 0), sends(n, 0), recvs(n, 0);
    std::vector<bool> named(n, false);
    for (const auto& e : doc.at("traceEvents")) {
      const int tid = e.at("tid").get<int>();
      ASSERT_TRUE(tid >= 0 && tid < c.ranks) << e.dump();
      const size_t t = static_cast<size_t>(tid);
      if (e.at("ph") == "M") {
        if (e.at("name") == "thread_name") named[t] = true;
        continue;
      }
      const std::string cat = e.at("cat"), name = e.at("name");
      if (e.at("ph") == "i") {  // the pipeline's sends and receives
        ASSERT_EQ(cat, "p2p") << e.dump();
        ASSERT_GE(e.at("ts").get<double>(), 0) << e.dump();
        ++(name.rfind("send ", 0) == 0 ? sends : recvs)[t];
        continue;
      }
      ASSERT_EQ(e.at("ph"), "X") << e.dump();
      ASSERT_GE(e.at("dur").get<double>(), 0) << e.dump();
      ASSERT_GE(e.at("ts").get<double>(), 0) << e.dump();
      if (cat == "forward") ++fwd[t];
      if (cat == "backward") ++bwd[t];
      if (name == "AdamW update") ++opt[t];
      if (cat == "dp_comm" && name.find("DP reduce-scatter bucket") == 0) ++dp[t];
      if (cat == "dp_comm" && name.find("ZeRO-1 all-gather bucket") == 0) ++gather[t];
    }
    const double want = static_cast<double>(c.p - 1) / (c.v * c.m + c.p - 1);
    const auto bubbles = tessera::parallel::pipeline::trace_bubbles(text, trace);
    ASSERT_EQ(bubbles.size(), n);
    for (size_t t = 0; t < n; ++t) {
      EXPECT_TRUE(named[t]) << "rank " << t << " has no track name";
      EXPECT_EQ(fwd[t], c.m * c.v) << "rank " << t;
      EXPECT_EQ(bwd[t], c.m * c.v) << "rank " << t;
      EXPECT_EQ(opt[t], 1) << "rank " << t;
      // Virtual stage chunk*p + stage sends its output forward unless it is
      // the last, its input gradient back unless it is the first; it
      // receives exactly what its neighbours send it.
      const int stage = static_cast<int>(t) / (c.ranks / c.p), nv = c.p * c.v;
      int links = 0;
      for (int chunk = 0; chunk < c.v; ++chunk)
        links += (chunk * c.p + stage < nv - 1 ? 1 : 0) + (chunk * c.p + stage > 0 ? 1 : 0);
      EXPECT_EQ(sends[t], c.m * links) << "rank " << t;
      EXPECT_EQ(recvs[t], c.m * links) << "rank " << t;
      if (c.dp_comm) {
        EXPECT_GE(dp[t], 2) << "rank " << t << ": a reduce-scatter per bucket";
        EXPECT_EQ(gather[t], dp[t]) << "rank " << t << ": an all-gather per bucket";
      }
      EXPECT_NEAR(bubbles[t].fraction(), want, 0.03)
          << "rank " << t << " bubble " << bubbles[t].fraction() << " schedule " << want;
    }
    // train_gpt prints each stage's bubble with the cost model's prediction
    // for the stage, which is what the trace reads (to the printed 0.1%).
    for (int s = 0; s < c.p; ++s) {
      const size_t at = r.out.find("bubble stage " + std::to_string(s) + ": ");
      ASSERT_NE(at, std::string::npos) << r.out;
      const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
      const size_t p = line.find("; predicted ");
      ASSERT_NE(p, std::string::npos) << line;
      const double predicted = std::stod(line.substr(p + std::strlen("; predicted ")));
      const double traced = 100 * bubbles[static_cast<size_t>(s) * static_cast<size_t>(c.ranks / c.p)].fraction();
      EXPECT_NEAR(predicted, traced, 0.051) << line;
    }
  }
}

// --trace-clock wall: the same tracks, measured times.
TEST(PipelineCli, WallClockTrace) {
  TempDir d;
  const std::string trace = d.file("wall.json");
  auto r =
      tessera::testing::run_command("OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=60 " + kRun + "2 -- " + TRAIN_GPT_BIN +
                                    " " + kModel + " --pp 2 --trace " + trace + " --trace-clock wall");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json doc = nlohmann::json::parse(tessera::testing::read_bytes(trace));
  EXPECT_EQ(doc.at("otherData").at("clock"), "wall");
  std::vector<int> ops(2, 0);
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "X" && (e.at("cat") == "forward" || e.at("cat") == "backward"))
      ++ops.at(e.at("tid").get<size_t>());
  EXPECT_EQ(ops, (std::vector<int>{8, 8}));  // 4 micro-batches, forward and backward, per rank
}

}  // namespace
