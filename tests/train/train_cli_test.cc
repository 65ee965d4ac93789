// `train_gpt` on the command line: bad values and bad files exit 2 with a
// message written for people, before any training (docs/errors.md).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/checkpoint/test_util.h"

namespace {

namespace fs = std::filesystem;
using tessera::testing::TempDir;

using RunResult = tessera::testing::CommandResult;

RunResult run(const std::string& args) {
  return tessera::testing::run_command(std::string("OPENBLAS_NUM_THREADS=1 ") + TRAIN_GPT_BIN + " " + args);
}

// A model that trains a step in well under a second.
const std::string kTiny = "--steps 1 --layers 1 --hidden 32 --heads 2 --seq 16 --vocab 256 --micro-batch 1";
// The same with two layers, for pipeline flags.
const std::string kTiny2 = "--steps 1 --layers 2 --hidden 32 --heads 2 --seq 16 --vocab 256 --micro-batch 1";

TEST(TrainGptCli, TinyRunTrains) {  // the baseline the cases below differ from
  TempDir d;
  RunResult r = run(kTiny + " --export " + d.file("m.safetensors") + " --log-json " + d.file("log.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 1/1"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d.file("m.safetensors")));
  EXPECT_TRUE(fs::exists(d.file("log.json")));
}

// --export DIR writes a Hugging Face model directory (config.json, shards
// above --max-shard-size): --init DIR takes the architecture from its
// config.json and gives the same model as the single file (same eval loss,
// printed to 6 digits), with no size flags.
TEST(TrainGptCli, ExportedDirectoryReadsBackAsTheFile) {
  TempDir d;
  ASSERT_EQ(run(kTiny + " --export " + d.file("m.safetensors")).code, 0);
  RunResult r = run(kTiny + " --export " + d.file("hf") + " --max-shard-size 10KB");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(d.file("hf/config.json")));
  EXPECT_TRUE(fs::exists(d.file("hf/model.safetensors.index.json")));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(d.file("hf"))) shards += e.path().extension() == ".safetensors";
  EXPECT_GT(shards, 2) << "shards of at most 10 KB expected";
  std::ifstream in(d.file("hf/config.json"));
  const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* want : {R"("model_type": "gpt2")", R"("n_embd": 32)", R"("n_head": 2)", R"("n_layer": 1)",
                           R"("n_positions": 16)", R"("vocab_size": 256)", R"("GPT2LMHeadModel")"})
    EXPECT_NE(config.find(want), std::string::npos) << want << " in " << config;
  const std::string eval =
      " --steps 0 --seq 16 --micro-batch 1 --eval-text " + d.file("m.safetensors") + " --eval-windows 4";
  RunResult a = run("--init " + d.file("m.safetensors") + eval), b = run("--init " + d.file("hf") + eval);
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  const size_t at = a.out.find("eval_loss");
  ASSERT_NE(at, std::string::npos) << a.out;
  EXPECT_NE(b.out.find(a.out.substr(at, a.out.find('\n', at) - at)), std::string::npos) << a.out << b.out;
  // A config.json that contradicts itself or the tensors is refused naming the field (and the tensor).
  for (const auto& [from, to, says] : std::vector<std::array<std::string, 3>>{
           {R"("n_head": 2)", R"("n_head": 3)", "field 'n_head' (3) does not divide 'n_embd' (32)"},
           {R"("n_layer": 1)", R"("n_layer": 2)", "the config gives n_layer 2, but the weights hold layers 0 to 0"},
           {R"("n_embd": 32)", R"("n_embd": 64)",
            "'transformer.wte.weight' has shape [256, 32], expected [256, 64]"}}) {
    std::string lying = config;
    lying.replace(lying.find(from), from.size(), to);
    std::ofstream(d.file("hf/config.json")) << lying;
    RunResult c = run("--init " + d.file("hf") + eval);
    EXPECT_EQ(c.code, 2) << c.out;
    EXPECT_NE(c.out.find(says), std::string::npos) << c.out;
  }
}

// A size flag given beside the model's source (--model, --init, --resume of a
// checkpoint) must agree with it: exit 2 naming the flag, both values and the source.
TEST(TrainGptCli, SizeFlagsThatContradictTheModelsSourceAreRefused) {
  TempDir d;
  ASSERT_EQ(run(kTiny + " --export " + d.file("m.safetensors") + " --save " + d.file("ck")).code, 0);
  struct Case {
    std::string args, says;
  };
  for (const Case& c :
       {Case{"--model gpt2-124m --layers 3 --steps 1", "--layers 3 does not match --model gpt2-124m, which has 12"},
        Case{"--model llama3-8b --family gpt --steps 1",
             "--family gpt does not match --model llama3-8b, which has llama"},
        Case{"--init " + d.file("m.safetensors") + " --hidden 64 --steps 1",
             "--hidden 64 does not match " + d.file("m.safetensors") + ", which has 32"},
        Case{"--init " + d.file("m.safetensors") + " --family llama --steps 1",
             "--family llama does not match " + d.file("m.safetensors") + ", which has gpt"},
        Case{"--resume " + d.file("ck") + " --heads 4 --steps 2", "--heads 4 does not match checkpoint"}}) {
    SCOPED_TRACE(c.args);
    RunResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
  }
}

// A model whose weights cannot fit the device is refused before its layers
// are laid out (10^9 layers grew to 10 GB of host memory first), and a
// hidden size whose 4x MLP width overflows an int is named, not called
// "not positive".
TEST(TrainGptCli, ModelsTooLargeAreRefusedAtOnce) {
  RunResult big = run("--layers 1000000000 --steps 1");
  EXPECT_NE(big.code, 0) << big.out;
  EXPECT_NE(big.out.find("device out of memory"), std::string::npos) << big.out;
  RunResult wide = run("--hidden 600000000 --heads 6 --steps 1");
  EXPECT_EQ(wide.code, 2) << wide.out;
  EXPECT_NE(wide.out.find("hidden 600000000 is too large: its MLP width 2400000000"), std::string::npos) << wide.out;
}

TEST(TrainGptCli, BadInputExitsTwoBeforeTraining) {
  TempDir d;
  std::ofstream(d.file("empty.txt")).flush();
  std::ofstream(d.file("three.txt")) << "abc";
  std::ofstream(d.file("bad.safetensors")) << "not a safetensors file";
  struct Case {
    std::string args, says;
    bool before_training = true;
    const std::string* base = &kTiny;
  };
  for (const Case& c : {
           Case{"--tp 0", "--tp: must be a positive integer, got 0"},
           Case{"--tp 2147483648", "--tp: must be a positive integer no larger than 2147483647, got 2147483648"},
           Case{"--steps 9223372036854775808",
                "--steps: must be a non-negative integer no larger than 9223372036854775807"},
           Case{"--lr 0", "--lr: must be a positive number, got 0"},
           Case{"--dp 2147483647", "--tp 1 x --dp 2147483647 x --pp 1 is more than 2^24 ranks"},
           Case{"--pp 2", "--pp 2 is more than the model's 1 layers"},
           Case{"--pp 0", "--pp: must be a positive integer, got 0"},
           Case{"--schedule zigzag", "--schedule: zigzag not in {gpipe,1f1b,interleaved}"},
           Case{"--pp 2 --stages 2,1", "--stages 2,1 sums to 3, the model has 2 layers", true, &kTiny2},
           Case{"--pp 2 --stages 1,x", "--stages '1,x' is not a comma-separated list", true, &kTiny2},
           Case{"--stages 1,1", "--stages needs --pp", true, &kTiny2},
           Case{"--pp 2 --stages 1,1,0", "--stages has 3 entries but --pp x --virtual-stages is 2", true, &kTiny2},
           Case{"--virtual-stages 2", "--virtual-stages 2 needs --schedule interleaved", true, &kTiny2},
           Case{"--trace " + d.file("t.json"), "--trace needs a pipeline (--pp > 1)"},
           Case{"--pp 2 --trace " + d.file("no/such/t.json"), "--trace: cannot write '" + d.file("no/such/t.json"),
                true, &kTiny2},
           Case{"--pp 2 --schedule interleaved", "--pp 2 x --virtual-stages 2 is more than the model's 2 layers", true,
                &kTiny2},
           Case{"--pp 2 --schedule interleaved --virtual-stages 1", "needs --virtual-stages >= 2", true, &kTiny2},
           Case{"--pp 2 --trace-clock utc", "--trace-clock: utc not in {emulated,wall}", true, &kTiny2},
           Case{"--plan " + d.file("no_plan.json"), "--plan: File does not exist: " + d.file("no_plan.json")},
           // One process for a tp1 x pp2 job: refused as the job starts.
           Case{"--pp 2", "this job has 1 process(es) but --tp 1 x --pp 2 x --dp 1 = 2 are needed", false, &kTiny2},
           Case{"--seed -1", "--seed: must be a non-negative integer, got '-1'"},
           Case{"--data " + d.file("empty.txt"), "data file '" + d.file("empty.txt") + "' is empty"},
           // Three bytes are read, then found too short for one window once training sets up.
           Case{"--data " + d.file("three.txt"), "fewer than one window", false},
           Case{"--init " + d.file("bad.safetensors"), d.file("bad.safetensors")},
           Case{"--export " + d.file("no/such/m.safetensors"), "--export: cannot write '" +
                                                                   d.file("no/such/m.safetensors") + "': directory '" +
                                                                   d.file("no/such") + "' does not exist"},
           // A path without .safetensors is a model directory: new or empty.
           Case{"--export " + d.path(), "--export: '" + d.path() + "' exists and is not an empty directory"},
           Case{"--export " + d.file("no/such/model"),
                "--export: directory '" + d.file("no/such") + "' does not exist"},
           Case{"--max-shard-size 2GB", "--max-shard-size needs --export DIR"},
           Case{"--export " + d.file("m") + " --max-shard-size 2XB", "2XB"},
           Case{"--log-json " + d.file("no/such/log.json"), "--log-json: cannot write '" + d.file("no/such/log.json")},
       }) {
    SCOPED_TRACE(c.args);
    RunResult r = run(*c.base + " " + c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("0.000000"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step 1/1"), std::string::npos) << r.out;  // no step ran
    if (c.before_training) {
      EXPECT_EQ(r.out.find("train_gpt: 1 rank(s)"), std::string::npos) << r.out;
    }
  }
}

}  // namespace
