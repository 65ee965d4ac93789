// `generate` on the command line (examples/gpt/generate.cc): a tiny model
// exported and saved by train_gpt generates from either source, with the
// same greedy tokens; bad flags exit 2 with usage; a bad --init names the
// file; a model other than --model's and a prompt past the context are
// refused by name (docs/errors.md).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/checkpoint/test_util.h"

namespace {

using tessera::testing::CommandResult;
using tessera::testing::TempDir;

CommandResult run(const char* bin, const std::string& args) {
  return tessera::testing::run_command(std::string("OPENBLAS_NUM_THREADS=1 ") + bin + " " + args);
}
CommandResult generate(const std::string& args) { return run(GENERATE_BIN, args); }

// A one-layer GPT-2 of context 16 over byte tokens, exported (a Hugging Face directory) and saved
// (checkpoint); `model` replaces its shape flags (a Llama: --family llama --kv-heads K).
struct Tiny {
  TempDir d;
  std::string hf = d.file("hf"), ckpt = d.file("ck");
  explicit Tiny(const std::string& model = "--layers 1 --hidden 32 --heads 2 --seq 16 --vocab 256", int steps = 1) {
    const CommandResult r = run(TRAIN_GPT_BIN, "--steps " + std::to_string(steps) + " " + model +
                                                   " --micro-batch 1 --export " + hf + " --save " + ckpt);
    EXPECT_EQ(r.code, 0) << r.out;
  }
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// Every sequence's new tokens in a --json file, in prompt order.
std::vector<std::vector<int>> all_tokens(const std::string& path) {
  const nlohmann::json j = read_json(path);
  std::vector<std::vector<int>> out;
  if (!j.is_object() || !j.contains("sequences")) return out;
  for (const auto& s : j["sequences"]) out.push_back(s["tokens"].get<std::vector<int>>());
  return out;
}

std::string write_file(const TempDir& d, const std::string& name, const std::string& text) {
  std::string path = d.file(name);
  std::ofstream(path) << text;
  return path;
}

// Lines of `out` that start with `prefix`.
std::vector<std::string> lines_starting(const std::string& out, const std::string& prefix) {
  std::vector<std::string> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) v.push_back(line);
  return v;
}

const std::string kUnderTesseraRun =
    std::string("OPENBLAS_NUM_THREADS=1 TESSERA_TIMEOUT_S=60 ") + TESSERA_BIN + " run --nproc-per-node 2 -- ";

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
           {"--init " + t.hf + " --prompt-tokens 1,,3", "--prompt-tokens 1: '1,,3' has an empty id between commas"},
           {"--init " + t.hf + " --prompt-tokens '1, ,3'", "--prompt-tokens 1: '1, ,3' has an empty id between commas"},
           {"--init " + t.hf + " --prompt-tokens 1,2,", "--prompt-tokens 1: '1,2,' has an empty id between commas"},
           {init + " --tp 2", "--tp 2 needs 2 processes, one per rank, and this job has 1"},
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

// --requests with --max-batch 2: request 1 leaves after its one token, request 2 arrives at step 1 and
// joins in request 1's slot; the log gives each step's batch and who joins.
TEST(GenerateCli, ContinuousBatchingLogsTheBatchPerStep) {
  Tiny t;
  const std::string reqs =
      write_file(t.d, "reqs.jsonl",
                 "{\"prompt\": \"hello\", \"max_new_tokens\": 3}\n"
                 "{\"prompt\": \"hi\", \"max_new_tokens\": 1}\n"
                 "\n"
                 "{\"prompt_tokens\": [97, 98, 99], \"max_new_tokens\": 3, \"arrival_step\": 1}\n");
  const CommandResult r =
      generate("--init " + t.hf + " --requests " + reqs + " --max-batch 2 --json " + t.d.file("c.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> steps = lines_starting(r.out, "step ");
  ASSERT_EQ(steps.size(), 4u) << r.out;
  EXPECT_EQ(steps[0].rfind("step 0 batch 2 (2 joining): [0] ", 0), 0u) << steps[0];
  EXPECT_NE(steps[0].find(" [1] "), std::string::npos) << steps[0];
  EXPECT_EQ(steps[1].rfind("step 1 batch 2 (1 joining): [0] ", 0), 0u) << steps[1];
  EXPECT_NE(steps[1].find(" [2] "), std::string::npos) << steps[1];
  EXPECT_EQ(steps[2].rfind("step 2 batch 2: [0] ", 0), 0u) << steps[2];
  EXPECT_EQ(steps[3].rfind("step 3 batch 1: [2] ", 0), 0u) << steps[3];
  const std::vector<std::vector<int>> tok = all_tokens(t.d.file("c.json"));
  ASSERT_EQ(tok.size(), 3u);
  EXPECT_EQ(tok[0].size(), 3u);
  EXPECT_EQ(tok[1].size(), 1u);
  EXPECT_EQ(tok[2].size(), 3u);
  // The same requests all at once decode the same tokens (greedy).
  const std::string at_once = write_file(t.d, "once.jsonl",
                                         "{\"prompt\": \"hello\", \"max_new_tokens\": 3}\n"
                                         "{\"prompt\": \"hi\", \"max_new_tokens\": 1}\n"
                                         "{\"prompt\": \"abc\", \"max_new_tokens\": 3}\n");
  const CommandResult o = generate("--init " + t.hf + " --requests " + at_once + " --json " + t.d.file("o.json"));
  ASSERT_EQ(o.code, 0) << o.out;
  EXPECT_EQ(all_tokens(t.d.file("o.json")), tok);
  EXPECT_EQ(lines_starting(o.out, "step 0 batch 3 (3 joining):").size(), 1u) << o.out;
}

// Seeded top-k/top-p sampling: the same seed gives the same tokens twice, alone and under TP 2, and
// the same in both; another seed or greedy decoding gives others.
TEST(GenerateCli, SeededSamplingRepeatsUnderTp1AndTp2) {
  Tiny t;
  const std::string args = " --init " + t.hf + " --prompt hello --prompt hi --max-new-tokens 8 --quiet";
  const std::string sample = " --temperature 1.5 --top-k 50 --top-p 0.95";
  auto tokens = [&](const std::string& launcher, const std::string& more, const std::string& name) {
    const CommandResult r =
        tessera::testing::run_command(launcher + GENERATE_BIN + args + more + " --json " + t.d.file(name));
    EXPECT_EQ(r.code, 0) << more << "\n" << r.out;
    return all_tokens(t.d.file(name));
  };
  const std::string alone = "OPENBLAS_NUM_THREADS=1 ";
  const auto a = tokens(alone, sample + " --seed 7", "a.json");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(a[0].size(), 8u);
  EXPECT_EQ(tokens(alone, sample + " --seed 7", "b.json"), a);
  EXPECT_NE(tokens(alone, sample + " --seed 8", "c.json"), a) << "another seed drew the same tokens";
  EXPECT_NE(tokens(alone, "", "greedy.json"), a) << "sampling drew the greedy tokens";
  EXPECT_EQ(tokens(kUnderTesseraRun, " --tp 2" + sample + " --seed 7", "d.json"), a);
  EXPECT_EQ(tokens(kUnderTesseraRun, " --tp 2" + sample + " --seed 7", "e.json"), a);
}

// --prompt-file: one prompt per line (empty lines skipped), the tokens of the same --prompt flags; the
// JSON's timings are there and positive, the planned ones beside them.
TEST(GenerateCli, PromptFileAndJsonTimings) {
  Tiny t;
  const std::string prompts = write_file(t.d, "prompts.txt", "hello\n\nhi there\n");
  const CommandResult f =
      generate("--init " + t.hf + " --prompt-file " + prompts + " --max-new-tokens 4 --json " + t.d.file("f.json"));
  ASSERT_EQ(f.code, 0) << f.out;
  EXPECT_NE(f.out.find("[1] hi there"), std::string::npos) << f.out;
  const CommandResult p = generate("--init " + t.hf + " --prompt hello --prompt 'hi there' --max-new-tokens 4 --json " +
                                   t.d.file("p.json"));
  ASSERT_EQ(p.code, 0) << p.out;
  const auto tok = all_tokens(t.d.file("f.json"));
  ASSERT_EQ(tok.size(), 2u);
  EXPECT_EQ(tok, all_tokens(t.d.file("p.json")));
  const nlohmann::json j = read_json(t.d.file("f.json"));
  ASSERT_TRUE(j.is_object());
  for (const char* k : {"ttft_wall_s", "ttft_emulated_s", "tpot_wall_s", "tpot_emulated_s", "planned_ttft_s",
                        "planned_tpot_s", "kv_cache_bytes", "planned_kv_cache_bytes", "weight_bytes"}) {
    ASSERT_TRUE(j.contains(k) && j[k].is_number()) << k;
    EXPECT_GT(j[k].get<double>(), 0) << k;
  }
  EXPECT_EQ(j["kv_cache_bytes"].get<double>(), j["planned_kv_cache_bytes"].get<double>());
  ASSERT_EQ(j["steps"].size(), 4u);
  for (const auto& s : j["steps"]) {
    EXPECT_GT(s["wall_s"].get<double>(), 0);
    EXPECT_GT(s["emulated_s"].get<double>(), 0);
  }
}

// A Llama of 4 heads over 1 K/V head: TP 2 replicates the K/V head (tp > kv_heads) and generates the
// serial run's greedy tokens.
TEST(GenerateCli, LlamaWithTpOverKvHeads) {
  Tiny t("--family llama --layers 1 --hidden 32 --heads 4 --kv-heads 1 --seq 16 --vocab 256");
  const std::string args = " --init " + t.hf + " --prompt hello --prompt hi --max-new-tokens 4 --json ";
  const CommandResult serial = generate(args + t.d.file("s.json"));
  ASSERT_EQ(serial.code, 0) << serial.out;
  EXPECT_NE(serial.out.find("generate: Llama"), std::string::npos) << serial.out;
  const auto want = all_tokens(t.d.file("s.json"));
  ASSERT_EQ(want.size(), 2u);
  const CommandResult r =
      tessera::testing::run_command(kUnderTesseraRun + GENERATE_BIN + " --tp 2" + args + t.d.file("t.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(all_tokens(t.d.file("t.json")), want);
}

// 80 sequences of 1 + 1000 tokens need 80 x 1001 x (K, V) x 2 layers x 256 x 4 bytes = 328 MB of KV
// cache beside 7.6 MB of weights on a 256 MiB test-core: refused with exit 2 before any forward,
// naming the batch, the bytes and the device.
TEST(GenerateCli, RefusesABatchTheKvCacheCannotHold) {
  Tiny t("--layers 2 --hidden 256 --heads 4 --seq 1024 --vocab 256", /*steps=*/0);
  std::string lines;
  for (int i = 0; i < 80; ++i) lines += "a\n";
  const std::string many = write_file(t.d, "many.txt", lines);
  const CommandResult r =
      generate("--init " + t.hf + " --device test-core --prompt-file " + many + " --max-new-tokens 1000 --quiet");
  EXPECT_EQ(r.code, 2) << r.out;
  const std::string need = std::to_string(int64_t{80} * 1001 * 2 * 2 * 256 * 4);
  EXPECT_NE(r.out.find(
                "the batch does not fit the KV cache: 80 sequence(s) of up to 1001 tokens (80080 cached tokens) need " +
                need + " bytes"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("device test-core"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of 268435456 bytes free"), std::string::npos) << r.out;
}

// A bad --requests file: which file and line, which field, what was expected (no library text).
TEST(GenerateCli, RequestsFileErrorsNameTheFileAndField) {
  Tiny t;
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"{\"prompt\": \"hi\"}\n{\"prompt\": \"hi\",\n", "line 2: not JSON (bad syntax at column"},
           {"{\"prompt\": \"hi\", \"max_new_tokens\": 1e400}\n", "line 1: not JSON (number overflow parsing '1e400')"},
           {"[1, 2]\n", "line 1: expected a JSON object such as {\"prompt\": \"Hello\"}, not an array"},
           {"{\"prompt\": 5}\n", "line 1: field 'prompt' must be a string (text), not the integer 5"},
           {"{\"prompt_tokens\": \"1,2\"}\n",
            "line 1: field 'prompt_tokens' must be an array of token ids, not a string"},
           {"{\"prompt_tokens\": [1, -2]}\n",
            "line 1: field 'prompt_tokens[1]' must be a token id (an integer >= 0), not the integer -2"},
           {"{\"prompt\": \"hi\", \"max_new_tokens\": 2.5}\n",
            "line 1: field 'max_new_tokens' must be a positive integer, not the number 2.5"},
           {"{\"prompt\": \"hi\", \"max_new_tokens\": 0}\n",
            "line 1: field 'max_new_tokens' must be a positive integer, not the integer 0"},
           {"{\"prompt\": \"hi\", \"max_new_tokens\": 18446744073709551615}\n",
            "line 1: field 'max_new_tokens' must be a positive integer, not the integer 18446744073709551615"},
           {"{\"prompt\": \"hi\", \"arrival_step\": \"1\"}\n",
            "line 1: field 'arrival_step' must be an integer >= 0 (a decode step), not a string"},
           {"{\"prompt\": \"hi\", \"prompt_tokens\": [1]}\n", "line 1: give 'prompt' or 'prompt_tokens', not both"},
           {"{\"prompt\": \"hi\", \"arrival\": 1}\n", "line 1: unknown field 'arrival'"},
           // What the model refuses, still named by file and line (it was "prompt 0: ...").
           {"{\"prompt\": \"\", \"max_new_tokens\": 4}\n", "line 1: field 'prompt' is empty"},
           {"{\"prompt\": \"hi\", \"max_new_tokens\": 4}\n{\"prompt_tokens\": [1, 99999], \"max_new_tokens\": 4}\n",
            "line 2: field 'prompt_tokens[1]' is token id 99999, outside the vocabulary [0, "},
           {"{\"prompt\": \"Hi\", \"max_new_tokens\": 100000}\n",
            "line 1: 2 prompt tokens + max_new_tokens 100000 exceed the model's context of "}}) {
    const std::string file = write_file(t.d, "r.jsonl", text);
    const CommandResult r = generate("--init " + t.hf + " --requests " + file);
    EXPECT_EQ(r.code, 2) << text << "\n" << r.out;
    std::string want = "--requests " + file;
    want += " " + says;
    EXPECT_NE(r.out.find(want), std::string::npos) << text << "\n" << r.out;
    EXPECT_EQ(r.out.find("json.exception"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("type must be"), std::string::npos) << r.out;
  }
}

}  // namespace
