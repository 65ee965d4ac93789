// `generate` on the command line (examples/gpt/generate.cc): a tiny model
// exported and saved by train_gpt generates from either source, with the
// same greedy tokens; bad flags exit 2 with usage; a bad --init names the
// file; a model other than --model's and a prompt past the context are
// refused by name (docs/errors.md).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/checkpoint/test_util.h"

namespace {

using tessera::testing::CommandResult;
using tessera::testing::TempDir;

CommandResult run(const char* bin, const std::string& args) {
  return tessera::testing::run_command(std::string("OPENBLAS_NUM_THREADS=1 ") + bin + " " + args);
}
CommandResult generate(const std::string& args) { return run(GENERATE_BIN, args); }

// A one-layer GPT-2 of context 16 over byte tokens, exported (a Hugging Face directory) and saved (checkpoint).
struct Tiny {
  TempDir d;
  std::string hf = d.file("hf"), ckpt = d.file("ck");
  Tiny() {
    const CommandResult r = run(TRAIN_GPT_BIN,
                                "--steps 1 --layers 1 --hidden 32 --heads 2 --seq 16 --vocab 256 "
                                "--micro-batch 1 --export " +
                                    hf + " --save " + ckpt);
    EXPECT_EQ(r.code, 0) << r.out;
  }
};

std::string json_tokens(const std::string& path) {  // the "tokens" array of the first sequence, as written
  std::ifstream in(path);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = s.find("\"tokens\"");
  return at == std::string::npos ? "" : s.substr(at, s.find(']', at) - at);
}

TEST(GenerateCli, GeneratesFromTheExportAndTheCheckpointAlike) {
  Tiny t;
  const std::string args = " --prompt hello --prompt hi --max-new-tokens 4 --json ";
  const CommandResult a = generate("--init " + t.hf + args + t.d.file("a.json"));
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("time to first token: wall"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("time per output token: wall"), std::string::npos) << a.out;
  const CommandResult b =
      generate("--init " + t.ckpt + " --model " + t.hf + "/config.json" + args + t.d.file("b.json"));
  ASSERT_EQ(b.code, 0) << b.out;
  const std::string ta = json_tokens(t.d.file("a.json"));
  ASSERT_NE(ta.find('['), std::string::npos) << ta;
  EXPECT_EQ(ta, json_tokens(t.d.file("b.json")));
}

// Under both launchers, TP 2 generates the serial run's greedy tokens, and
// rank 0 alone writes the JSON.
TEST(GenerateCli, UnderTesseraRunAndMpirunTp2GivesTheSerialTokens) {
  Tiny t;
  const std::string args = " --init " + t.hf + " --prompt hello --prompt hi --max-new-tokens 4 --json ";
  const CommandResult serial = generate(args + t.d.file("serial.json"));
  ASSERT_EQ(serial.code, 0) << serial.out;
  const std::string want = json_tokens(t.d.file("serial.json"));
  ASSERT_NE(want.find('['), std::string::npos) << want;
  const std::string env = "OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=60 ";
  const std::string launchers[] = {env + TESSERA_BIN + " run --nproc-per-node 2 -- ",
                                   env + "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + MPIRUN_BIN +
                                       " --oversubscribe --bind-to none -np 2 "};
  int i = 0;
  for (const std::string& launcher : launchers) {
    SCOPED_TRACE(launcher);
    const std::string out = t.d.file("tp2_" + std::to_string(i++) + ".json");
    std::string cmd = launcher + GENERATE_BIN;
    cmd += " --tp 2";
    cmd += args;
    cmd += out;
    const CommandResult r = tessera::testing::run_command(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(json_tokens(out), want);
  }
}

TEST(GenerateCli, BadFlagsExit2WithUsage) {
  Tiny t;
  const std::string init = "--init " + t.hf + " --prompt hello";
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--prompt hello", "--init is required"},
           {init + " --max-new-tokens 0", "--max-new-tokens: must be a positive integer, got 0"},
           {init + " --greedy --temperature 0.5", "--greedy excludes --temperature"},
           {init + " --top-p 2", "--top-p"},
           {init + " --no-such-flag", "no-such-flag"},
           {init + " --max-batch 2", "--max-batch needs --requests"},
           {init + " --precision fp8", "--precision"}}) {
    const CommandResult r = generate(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << "\n" << r.out;
  }
}

TEST(GenerateCli, RefusesBadInitOtherModelAndLongPrompt) {
  Tiny t;
  const std::string bad = t.d.file("bad.safetensors");
  std::ofstream(bad) << "garbage";
  CommandResult r = generate("--init " + bad + " --prompt hello");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(bad + ":"), std::string::npos) << r.out;
  r = generate("--init " + t.d.file("nowhere") + " --prompt hello");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("nowhere"), std::string::npos) << r.out;
  // A checkpoint of another model than --model's, by the fields that differ.
  r = generate("--init " + t.ckpt + " --model gpt2-124m --prompt hello");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("holds another model than --model gpt2-124m"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers: it has 1, --model gpt2-124m 12"), std::string::npos) << r.out;
  // 24 prompt bytes + 2 new past the context of 16.
  r = generate("--init " + t.hf + " --prompt 'a prompt of twenty bytes' --max-new-tokens 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("exceed model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("context of 16"), std::string::npos) << r.out;
}

}  // namespace
