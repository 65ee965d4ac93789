// `tessera ckpt` against damaged and hostile input (issue 13's defects): file
// hashes, manifests that lie, FIFOs, non-finite weights, flags that disagree
// with a file, outputs that would overwrite inputs, trailing slashes, and
// every command the README and docs/checkpoint.md show, run as written.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/ckpt_tool.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "tests/checkpoint/gpt2_test_files.h"
#include "tests/checkpoint/llama_test_files.h"
#include "tests/checkpoint/manifest_edit.h"
#include "tests/checkpoint/test_util.h"
#include "tests/test_timeouts.h"

namespace tessera::parallel::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::TempDir;

const ModelConfig kCfg = gpt2_config(67, 16, 32, 3, 4);

void make_file(const std::string& path, const ModelConfig& c, uint32_t seed, float poison = 0.f,
               const std::string& poisoned = "") {
  auto t = testing::random_gpt2_tensors(c, DType::F32, seed, 0.02f);
  for (auto& [name, tensor] : t)
    if (name == poisoned && tensor.numel() > 5) tensor.data<float>()[5] = poison;
  write_gpt2_safetensors(path, c, t);
}

std::string shard_path(const std::string& dir, int tp, int pp) {
  return dir + "/" + rank_stem(0, tp, pp) + ".safetensors";
}

std::pair<int, std::string> run_out(const std::string& cmd) {
  auto r = tessera::testing::run_command(cmd);
  return {r.code, r.out};
}

// `fn` throws FormatError whose message holds every one of `says`.
template <typename Fn>
void expect_format_error(Fn fn, const std::vector<std::string>& says) {
  try {
    fn();
    ADD_FAILURE() << "no FormatError; expected one saying " << says.front();
  } catch (const FormatError& e) {
    for (const std::string& s : says) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

json read_json(const std::string& p) { return json::parse(testing::read_bytes(p)); }
void write_json(const std::string& p, const json& j) { testing::write_bytes(p, j.dump(1)); }

TEST(CkptIntegrity, FlippedDataByteIsCaughtByEveryReader) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_file(src, kCfg, 1);
  shard_gpt2(src, d.file("s"), {2, 1, 1, 0});
  const std::string victim = shard_path(d.file("s"), 1, 0);
  std::string bytes = testing::read_bytes(victim);
  bytes[bytes.size() - 3] ^= 0x01;  // a bit of the last tensor's data: still a valid safetensors file
  testing::write_bytes(victim, bytes);
  SafetensorsReader still_parses(victim);  // the format alone cannot see it
  expect_format_error([&] { consolidate_gpt2(d.file("s"), d.file("o.safetensors")); }, {victim, "SHA-256"});
  EXPECT_FALSE(fs::exists(d.file("o.safetensors")));
  expect_format_error([&] { verify_shard_dir(d.file("s")); }, {victim, "SHA-256"});
  expect_format_error([&] { reshard_gpt2(d.file("s"), d.file("r"), {1, 1, 1, 0}); }, {victim});
  EXPECT_FALSE(fs::exists(d.file("r")));
  auto [code, out] = run_out(std::string(TESSERA_BIN) + " ckpt inspect " + d.file("s"));
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find(victim), std::string::npos) << out;
}

TEST(CkptIntegrity, SwappedRankFilesAreCaught) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_file(src, kCfg, 2);
  shard_gpt2(src, d.file("s"), {2, 1, 1, 0});
  const std::string a = shard_path(d.file("s"), 0, 0), b = shard_path(d.file("s"), 1, 0);
  fs::rename(a, d.file("tmp"));
  fs::rename(b, a);
  fs::rename(d.file("tmp"), b);
  expect_format_error([&] { consolidate_gpt2(d.file("s"), d.file("o.safetensors")); },
                      {rank_stem(0, 0, 0), "another rank"});
}

TEST(CkptIntegrity, ManifestThatLiesFailsFastNamingTheField) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_file(src, kCfg, 3);
  shard_gpt2(src, d.file("base"), {2, 1, 1, 0});
  int k = 0;
  // Every edit with the marker re-hashed (as someone who knows the format
  // would), so the manifest's own checks are what is tested.
  auto edited = [&](const std::function<void(json&)>& edit) {
    std::string dir = d.file("m" + std::to_string(k++));
    fs::copy(d.file("base"), dir, fs::copy_options::recursive);
    testing::edit_manifest_rehashed(dir, edit);
    return dir;
  };
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> says;
  };
  const std::string r0 = rank_stem(0, 0, 0) + ".safetensors";
  const std::string wte = "param/transformer.wte.weight";
  const std::vector<Case> cases = {
      {[](json& j) { j["model"]["layers"] = 1000000; }, {"manifest's model", "1000000 layers", "layers 0..2"}},
      {[](json& j) { j["model"]["vocab"] = int64_t{1} << 40; }, {"manifest's model", "'vocab'"}},
      {[](json& j) { j["model"]["vocab"] = 68; }, {"manifest's model", "transformer.wte.weight", "[68, 32]"}},
      {[](json& j) { j["model"]["family"] = "mamba"; }, {"manifest's model", "family"}},
      // A layout the layers cannot have (verify said OK, reshard wrote it on).
      {[](json& j) {
         j["layout"]["pp"] = 3;
         j["layout"]["stages"] = {5, 5};
       },
       {"manifest.json layout", "pp is 3", "3 layers"}},
      {[](json& j) { j["layout"]["pp"] = 4; }, {"manifest.json layout", "3 layers"}},
      {[](json& j) { j["files"][0]["name"] = "../model.safetensors"; }, {"manifest.json", "../model.safetensors"}},
      {[](json& j) { j["files"][1]["name"] = j["files"][0]["name"]; }, {"manifest.json", "listed twice"}},
      {[](json& j) { j["files"].erase(1); }, {"transformer.", "in no file"}},
      {[](json& j) { j["files"][0]["bytes"] = 12; }, {r0, "the manifest says 12"}},
      {[](json& j) { j["files"][0].erase("sha256"); }, {"manifest.json", "'sha256' is missing"}},
      {[](json& j) {
         j["tensors"]["transformer.wpe.weight"]["shape"] = {1, 2};
       },
       {"transformer.wpe.weight", "[1, 2]"}},
      {[](json& j) { j["tensors"]["transformer.wpe.weight"]["dtype"] = "BF16"; }, {r0, "the manifest says BF16"}},
      {[](json& j) { j["tensors"]["transformer.wpe.weight"]["dtype"] = "Q7"; }, {"manifest.json", "'Q7'"}},
      {[](json& j) { j["files"][1]["pieces"][0]["split_dim"] = 1; }, {"manifest.json", "shard_shape"}},
      {[](json& j) {
         j["files"][1]["pieces"][0]["range"] = {0, 1};
       },
       {"transformer.wte.weight", "in no file"}},
      {[](json& j) {
         j["files"][0]["pieces"][0]["range"] = {0, 1u << 30};
       },
       {"manifest.json", "not inside"}},
      {[](json& j) { j["version"] = 99; }, {"manifest.json", "version 99"}},
  };
  (void)wte;
  for (const Case& c : cases) {
    const std::string dir = edited(c.edit);
    SCOPED_TRACE(c.says.back());
    const tessera::test_time::Cost cost;
    expect_format_error([&] { consolidate_gpt2(dir, dir + ".o.safetensors"); }, c.says);
    // Fast: no layout of 10^6 layers, no 2^40-row tensor (CPU time, which load does not change).
    EXPECT_LT(cost.cpu_seconds(), 2.0);
    EXPECT_LT(cost.wall_seconds(), tessera::test_time::seconds(20));
    EXPECT_FALSE(fs::exists(dir + ".o.safetensors"));
  }
  // Not re-hashed: the marker refuses the edited manifest.
  {
    const std::string dir = d.file("unhashed");
    fs::copy(d.file("base"), dir, fs::copy_options::recursive);
    json j = read_json(dir + "/manifest.json");
    j["model"]["heads"] = 8;
    write_json(dir + "/manifest.json", j);
    expect_format_error([&] { consolidate_gpt2(dir, dir + ".o.safetensors"); },
                        {"manifest.json", "the manifest was changed after the save"});
  }
  // The CLI: exit 2 and no bad_alloc.
  const std::string dir = edited([](json& j) { j["model"]["vocab"] = int64_t{1} << 40; });
  auto [code, out] =
      run_out(std::string(TESSERA_BIN) + " ckpt consolidate --out " + d.file("x.safetensors") + " " + dir);
  EXPECT_EQ(code, 2) << out;
  EXPECT_EQ(out.find("bad_alloc"), std::string::npos) << out;
  EXPECT_NE(out.find("vocab"), std::string::npos) << out;
}

TEST(CkptIntegrity, FifosAreRefusedNotWaitedOn) {
  TempDir d;
  const std::string fifo = d.file("pipe.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_format_error([&] { SafetensorsReader r(fifo); }, {fifo, "not a regular file (a FIFO)"});
  expect_format_error([&] { open_safetensors(fifo); }, {fifo, "FIFO"});
  // Named in an index.
  testing::write_bytes(d.file("model.safetensors.index.json"),
                       R"({"weight_map": {"transformer.wte.weight": "pipe.safetensors"}})");
  expect_format_error([&] { open_safetensors(d.path()); }, {fifo, "FIFO"});
  // An index that is a FIFO.
  const std::string fifo_index = d.file("x.index.json");
  ASSERT_EQ(::mkfifo(fifo_index.c_str(), 0600), 0);
  expect_format_error([&] { open_safetensors(fifo_index); }, {fifo_index, "FIFO"});
  // A manifest and a shard that are FIFOs.
  const std::string src = d.file("model.safetensors");
  make_file(src, kCfg, 4);
  shard_gpt2(src, d.file("s"), {2, 1, 1, 0});
  fs::remove(shard_path(d.file("s"), 1, 0));
  ASSERT_EQ(::mkfifo(shard_path(d.file("s"), 1, 0).c_str(), 0600), 0);
  expect_format_error([&] { consolidate_gpt2(d.file("s"), d.file("o.safetensors")); },
                      {shard_path(d.file("s"), 1, 0), "FIFO"});
  fs::remove(d.file("s/manifest.json"));
  ASSERT_EQ(::mkfifo(d.file("s/manifest.json").c_str(), 0600), 0);
  expect_format_error([&] { consolidate_gpt2(d.file("s"), d.file("o.safetensors")); }, {"manifest.json", "FIFO"});
  // train_gpt --data FIFO: exit 2 naming it (a hang would hit ctest's timeout).
  auto [code, out] = run_out(std::string(TRAIN_GPT_BIN) +
                             " --steps 1 --layers 1 --hidden 32 --heads 2 --seq 8 "
                             "--vocab 256 --micro-batch 1 --data " +
                             fifo);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find(fifo), std::string::npos) << out;
}

TEST(CkptIntegrity, NonFiniteWeightsAreReportedByTensor) {
  TempDir d;
  const std::string src = d.file("nan.safetensors");
  make_file(src, kCfg, 5, std::nanf(""), "transformer.h.1.mlp.c_fc.weight");
  expect_format_error(
      [&] {
        shard_gpt2(src, d.file("s"), {2, 1, 1, 0});
      },
      {src, "transformer.h.1.mlp.c_fc.weight", "1 non-finite value", "--allow-nonfinite"});
  EXPECT_FALSE(fs::exists(d.file("s")));
  ShardOptions o{2, 1, 1, 0};
  o.allow_nonfinite = true;
  shard_gpt2(src, d.file("s"), o);
  expect_format_error([&] { consolidate_gpt2(d.file("s"), d.file("o.safetensors")); },
                      {"transformer.h.1.mlp.c_fc.weight", "non-finite"});
  consolidate_gpt2(d.file("s"), d.file("o.safetensors"), /*allow_nonfinite=*/true);
  const std::string inf = d.file("inf.safetensors");
  make_file(inf, kCfg, 5, -INFINITY, "transformer.wpe.weight");
  expect_format_error([&] { check_finite(*open_safetensors(inf)); }, {"transformer.wpe.weight", "-inf"});
}

TEST(CkptIntegrity, TrainGptInitChecksWeightsAndFlags) {
  TempDir d;
  const ModelConfig c = gpt2_config(256, 16, 32, 1, 4);
  const std::string good = d.file("good.safetensors"), bad = d.file("nan.safetensors");
  make_file(good, c, 6);
  make_file(bad, c, 6, std::nanf(""), "transformer.h.0.attn.c_attn.weight");
  const std::string train = std::string("OPENBLAS_NUM_THREADS=1 ") + TRAIN_GPT_BIN + " --micro-batch 1 --seq 8 ";
  {
    auto [code, out] = run_out(train + "--steps 1 --init " + good + " --heads 8");
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find("--heads 8"), std::string::npos) << out;
    EXPECT_NE(out.find("has 4"), std::string::npos) << out;
  }
  {
    auto [code, out] = run_out(train + "--steps 1 --init " + good + " --heads 4");
    EXPECT_EQ(code, 0) << out;
  }
  {
    auto [code, out] = run_out(train + "--steps 1 --init " + bad);
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find("transformer.h.0.attn.c_attn.weight"), std::string::npos) << out;
  }
  {  // Loaded anyway, training stops at the first non-finite loss with exit 1.
    auto [code, out] = run_out(train + "--steps 3 --init " + bad + " --allow-nonfinite --export " + d.file("e"));
    EXPECT_EQ(code, 1) << out;
    EXPECT_NE(out.find("step 1: non-finite loss"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(d.file("e")));
  }
}

TEST(CkptIntegrity, ConsolidateRefusesToOverwriteAndEmptyVocabIsInvalid) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_file(src, kCfg, 7);
  shard_gpt2(src, d.file("s"), {2, 1, 1, 0});
  const std::string shard = shard_path(d.file("s"), 0, 0);
  const std::string before = testing::read_bytes(shard);
  auto [code, out] = run_out(std::string(TESSERA_BIN) + " ckpt consolidate --out " + shard + " " + d.file("s"));
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("exists"), std::string::npos) << out;
  EXPECT_TRUE(testing::read_bytes(shard) == before);
  EXPECT_THROW(consolidate_gpt2(d.file("s"), src), InvalidArgument);

  const std::string empty = d.file("empty.safetensors");
  make_file(empty, gpt2_config(0, 16, 32, 1, 4), 8);
  expect_format_error([&] { shard_gpt2(empty, d.file("e"), {1, 1, 1, 0}); }, {empty, "wte.weight", "[0, 32]"});
  EXPECT_FALSE(fs::exists(d.file("e")));
  auto [icode, iout] = run_out(std::string(TESSERA_BIN) + " ckpt inspect " + empty);
  EXPECT_EQ(icode, 2) << iout;  // bad input, as the other subcommands say of it
  EXPECT_EQ(iout.find("valid checkpoint of it\n"), std::string::npos) << iout;
  EXPECT_NE(iout.find("not a valid checkpoint"), std::string::npos) << iout;
}

// One tensor named for a far layer: refused at once, naming the gap, instead
// of a model of a million layers being laid out to list what it lacks
// (4 GB and 35 s; with a 9-digit index, std::bad_alloc). GPT-2 infers its
// layers from the names; a Llama config.json that claims them too is caught
// the same way.
TEST(CkptIntegrity, ALayerIndexBeyondTheOthersIsAGapNotAModel) {
  TempDir d;
  auto with_far_layer = [](std::vector<std::pair<std::string, Tensor>> t, const std::string& name) {
    t.emplace_back(name, Tensor::from_vector(std::vector<float>(8, 0.5f), {8}, DType::F32));
    return t;
  };
  const std::string gpt = d.file("far.safetensors");
  write_safetensors(gpt, with_far_layer(testing::random_gpt2_tensors(kCfg, DType::F32, 3, 0.02f),
                                        "transformer.h.1000000.ln_1.weight"));
  expect_format_error(
      [&] {
        shard_gpt2(gpt, d.file("s"), {2, 1, 1, 0});
      },
      {gpt, "layer 1000000", "no tensor of layer 3"});
  EXPECT_FALSE(fs::exists(d.file("s")));
  auto [code, out] = run_out(std::string(TESSERA_BIN) + " ckpt inspect " + gpt);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("no tensor of layer 3"), std::string::npos) << out;

  ModelConfig m = testing::tiny_llama();
  testing::write_llama_model(d.file("llama"), m, DType::F32, 0);
  const std::string shard = d.file("llama/model.safetensors");
  auto src = open_safetensors(shard);
  std::vector<std::pair<std::string, Tensor>> t;
  for (const std::string& n : src->names()) t.emplace_back(n, src->get(n));
  src.reset();
  write_safetensors(shard, with_far_layer(t, "model.layers.999999.input_layernorm.weight"));
  json cfg = json::parse(testing::read_bytes(d.file("llama/config.json")));
  cfg["num_hidden_layers"] = 1000000;
  testing::write_bytes(d.file("llama/config.json"), cfg.dump());
  auto [lcode, lout] =
      run_out(std::string(TESSERA_BIN) + " ckpt shard --tp 2 --out " + d.file("ls") + " " + d.file("llama"));
  EXPECT_EQ(lcode, 2) << lout;
  EXPECT_NE(lout.find("the weights hold layer 999999 but no tensor of layer " + std::to_string(m.layers)),
            std::string::npos)
      << lout;
  EXPECT_FALSE(fs::exists(d.file("ls")));
}

// A manifest the done marker does not vouch for is never parsed: the hash
// is the first thing said (a manifest padded to 1 GiB was parsed three
// times, 4 GB and over a minute, before the hash refused it). And degrees
// beyond what a manifest may hold are refused before any allocation or
// file (--tp 2^30 ended in std::bad_alloc; --dp 2^31 wrote files for ever).
TEST(CkptIntegrity, TheMarkersHashComesBeforeTheParseAndDegreesAreBounded) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_file(src, kCfg, 12);
  shard_gpt2(src, d.file("s"), {2, 1, 1, 0});
  testing::write_bytes(d.file("s/manifest.json"), "{\"format\": [[[[");
  for (const char* sub : {"verify ", "inspect "}) {
    auto [code, out] = run_out(std::string(TESSERA_BIN) + " ckpt " + sub + d.file("s"));
    EXPECT_NE(code, 0) << out;
    EXPECT_NE(out.find("does not match the done marker"), std::string::npos) << sub << out;
    EXPECT_EQ(out.find("not valid JSON"), std::string::npos) << sub << out;
  }
  for (const std::string& flags : {std::string("--tp 1073741824"), std::string("--tp 1 --dp 2147483647")}) {
    const std::string cmd =
        tessera::detail::concat(TESSERA_BIN, " ckpt shard ", flags, " --out ", d.file("o"), " ", src);
    auto [code, out] = run_out(cmd);
    EXPECT_EQ(code, 2) << flags << "\n" << out;
    EXPECT_NE(out.find("must be in [1, 2^20]"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(d.file("o")));
  }
}

TEST(CkptIntegrity, TrailingSlashesAndFailuresLeaveNothing) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_file(src, kCfg, 9);
  const std::string bin = TESSERA_BIN;
  auto run = [&](const std::string& args) { return run_out("cd " + d.path() + " && " + bin + " ckpt " + args); };
  EXPECT_EQ(run("shard --tp 4 --pp 2 --out shards/ model.safetensors").first, 0);
  auto [code, out] = run("reshard --tp 2 --out shards-tp2/ shards/");
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(fs::exists(d.file("shards-tp2/manifest.json")));
  EXPECT_EQ(run("reshard --tp 2 --out shards-tp2b shards").first, 0);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(testing::read_bytes(shard_path(d.file("shards-tp2"), r, 0)) ==
                testing::read_bytes(shard_path(d.file("shards-tp2b"), r, 0)));
  // Failures (3 heads do not divide 4; a missing parent) leave nothing behind.
  const auto listing = [&] {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(d.path())) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  };
  const std::vector<std::string> before = listing();
  EXPECT_EQ(run("reshard --tp 3 --out bad/ shards/").first, 2);
  EXPECT_EQ(run("shard --tp 3 --out bad/ model.safetensors").first, 2);
  EXPECT_NE(run("reshard --tp 2 --out no/such/bad/ shards/").first, 0);
  EXPECT_NE(run("shard --tp 2 --out no/such/bad model.safetensors").first, 0);
  EXPECT_EQ(listing(), before);
}

// Every `tessera ckpt` command in a code block of README.md and
// docs/checkpoint.md, run as written (in order, in one directory), after the
// one input file they start from is made. The test follows the docs.
TEST(CkptIntegrity, EveryDocumentedCommandRuns) {
  TempDir d;
  const std::string root = TESSERA_SOURCE_DIR;
  std::vector<std::string> cmds;
  for (const char* doc : {"README.md", "docs/checkpoint.md"}) {
    std::ifstream f(root + "/" + doc);
    ASSERT_TRUE(f) << doc;
    std::string line;
    bool fence = false;
    int n = 0;
    while (std::getline(f, line)) {
      if (line.rfind("```", 0) == 0) fence = !fence;
      // Commands on the training run's `ckpt` directory (README's resume section)
      // need that run first: train_ckpt_cli_test covers that flow.
      static const std::regex on_training_dir(R"(\sckpt(/step_\d+)?(\s|$))");
      if (fence && line.rfind("build/bin/tessera ckpt ", 0) == 0 &&
          !std::regex_search(line.substr(23), on_training_dir)) {
        cmds.push_back(line);
        ++n;
      }
    }
    EXPECT_GE(n, 3) << doc << " shows fewer tessera ckpt commands than expected";
  }
  // The README starts from train_gpt's export; any GPT-2 file serves.
  fs::create_directories(d.file("out/demo"));
  fs::create_directories(d.file("build/bin"));
  fs::create_symlink(TESSERA_BIN, d.file("build/bin/tessera"));
  for (const std::string& c : cmds) {
    std::smatch m;
    static const std::regex in(R"((out/demo/[A-Za-z0-9_]+\.safetensors))");
    if (std::regex_search(c, m, in) && !fs::exists(d.file(m[1].str()))) make_file(d.file(m[1].str()), kCfg, 10);
    // ... and the Llama ones from the demo's Hugging Face directory; any small Llama serves.
    static const std::regex llama(R"(out/demo/llama(\s|/|$))");
    if (std::regex_search(c, llama) && !fs::exists(d.file("out/demo/llama")))
      testing::write_llama_model(d.file("out/demo/llama"), testing::tiny_llama(), DType::BF16, 0);
  }
  for (const std::string& c : cmds) {
    SCOPED_TRACE(c);
    auto [code, out] = run_out("cd " + d.path() + " && " + c);
    EXPECT_EQ(code, 0) << out;
  }
}

}  // namespace
}  // namespace tessera::parallel::checkpoint

namespace tessera::parallel::checkpoint {
namespace {

// kill -9 of shard, reshard and consolidate halfway through their outputs
// and before the commit: no --out appears, the input is untouched and
// still verifies, and the next run (its temp directory's pid dead)
// succeeds and leaves no temp directory behind.
TEST(CkptIntegrity, KillDuringEveryCommandLeavesTheInputAndNoOutput) {
  TempDir d;
  const std::string src = d.file("model.safetensors");
  make_file(src, kCfg, 10);
  shard_gpt2(src, d.file("in"), {2, 1, 1, 0});
  std::map<std::string, std::string> before;
  for (const auto& e : fs::directory_iterator(d.file("in"))) before[e.path().string()] = testing::read_bytes(e.path());
  const std::string bin = TESSERA_BIN;
  struct Cmd {
    std::string args, out;
  };
  const std::vector<Cmd> cmds = {
      {"shard --tp 4 --pp 2 --out " + d.file("o_shard") + " " + src, d.file("o_shard")},
      {"reshard --tp 4 --out " + d.file("o_reshard") + " " + d.file("in"), d.file("o_reshard")},
      {"consolidate --out " + d.file("o_c.safetensors") + " " + d.file("in"), d.file("o_c.safetensors")},
      {"consolidate --max-shard-size 20KB --out " + d.file("o_hf") + " " + d.file("in"), d.file("o_hf")},
  };
  for (const Cmd& c : cmds) {
    for (const char* point : {"mid_output", "before_commit"}) {
      if (c.args.rfind("consolidate", 0) == 0 && std::string(point) == "mid_output") continue;  // one pass, one point
      SCOPED_TRACE(c.args + " killed at " + point);
      auto [code, out] = run_out("TESSERA_CKPT_FAULT=" + std::string(point) + " " + bin + " ckpt " + c.args);
      EXPECT_EQ(code, 128 + SIGKILL) << out;
      EXPECT_FALSE(fs::exists(c.out)) << out;
      for (const auto& [path, bytes] : before) EXPECT_TRUE(testing::read_bytes(path) == bytes) << path;
      EXPECT_NO_THROW(verify_shard_dir(d.file("in")));
    }
    auto [code, out] = run_out(bin + " ckpt " + c.args);
    EXPECT_EQ(code, 0) << out;
    for (const auto& e : fs::directory_iterator(d.path()))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();
  }
  // The outputs of the runs after the kills are right: every tensor of the source, byte for byte.
  consolidate_gpt2(d.file("o_shard"), d.file("back.safetensors"));
  SafetensorsReader a(d.file("back.safetensors")), b(src);
  for (const SafetensorsEntry& e : b.entries())
    EXPECT_EQ(std::memcmp(a.bytes(a.entry(e.name)), b.bytes(e), e.end - e.begin), 0) << e.name;
}

}  // namespace
}  // namespace tessera::parallel::checkpoint
