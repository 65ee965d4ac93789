// `train_gpt` on the command line: bad values and bad files exit 2 with a
// message written for people, before any training (docs/errors.md).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

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
           Case{"--export " + d.path(), "--export: cannot write '" + d.path() + "': it is a directory"},
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
