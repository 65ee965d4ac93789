#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "parallel/models/gpt/hf.h"
#include "tests/checkpoint/test_util.h"

namespace tessera::parallel::checkpoint {
namespace {

using namespace tessera::parallel::models::gpt;  // NOLINT(google-build-using-namespace)

using tessera::testing::TempDir;

const ModelConfig kTiny = gpt2_config(/*vocab=*/11, /*n_positions=*/7, /*hidden=*/8, /*layers=*/2, /*heads=*/2);

// Every tensor filled with a value derived from its position in the list, so
// mix-ups show.
std::vector<std::pair<std::string, Tensor>> tiny_tensors(const ModelConfig& c, const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> ts;
  int i = 0;
  for (const std::string& n : gpt2_tensor_names(c)) {
    std::string stored = prefix + n.substr(std::string("transformer.").size());
    ts.emplace_back(stored, Tensor::full(gpt2_tensor_shape(c, n), 0.5 * ++i, DType::F32));
  }
  return ts;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

TEST(HfGpt2, NamesAndShapesFollowHuggingFace) {
  auto names = gpt2_tensor_names(kTiny);
  ASSERT_EQ(names.size(), 2u + 12u * 2u + 2u);
  EXPECT_EQ(names.front(), "transformer.wte.weight");
  EXPECT_EQ(names.back(), "transformer.ln_f.bias");
  EXPECT_NE(std::find(names.begin(), names.end(), "transformer.h.1.mlp.c_proj.bias"), names.end());
  // Conv1D weights are [in, out].
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.wte.weight"), (Shape{11, 8}));
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.wpe.weight"), (Shape{7, 8}));
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.h.0.attn.c_attn.weight"), (Shape{8, 24}));
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.h.0.attn.c_attn.bias"), (Shape{24}));
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.h.1.attn.c_proj.weight"), (Shape{8, 8}));
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.h.1.mlp.c_fc.weight"), (Shape{8, 32}));
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.h.1.mlp.c_fc.bias"), (Shape{32}));
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.h.1.mlp.c_proj.weight"), (Shape{32, 8}));
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.h.0.ln_2.bias"), (Shape{8}));
  EXPECT_EQ(gpt2_tensor_shape(kTiny, "transformer.ln_f.weight"), (Shape{8}));
  EXPECT_THROW(gpt2_tensor_shape(kTiny, "transformer.h.2.ln_1.weight"), InvalidArgument);  // layer out of range
  EXPECT_THROW(gpt2_tensor_shape(kTiny, "transformer.h.0.attn.bias"), InvalidArgument);
  EXPECT_THROW(gpt2_tensor_shape(kTiny, "lm_head.weight"), InvalidArgument);
}

TEST(HfGpt2, ExportThenInferAndValidate) {
  TempDir dir;
  const std::string path = dir.file("gpt2.safetensors");
  auto ts = tiny_tensors(kTiny, "transformer.");
  std::reverse(ts.begin(), ts.end());  // any order in, canonical order out
  write_gpt2_safetensors(path, kTiny, ts, {{"step", "3"}});
  SafetensorsReader r(path);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("n_head"), "2");
  EXPECT_EQ(r.metadata().at("step"), "3");
  EXPECT_EQ(r.entries().front().name, "transformer.wte.weight");
  EXPECT_EQ(infer_gpt2_config(r, 0), kTiny);  // heads from metadata
  ModelConfig four = kTiny;
  four.heads = four.kv_heads = 4;
  EXPECT_EQ(infer_gpt2_config(r, 4), four);  // hint wins
  EXPECT_THROW(infer_gpt2_config(r, 3), InvalidArgument);
  EXPECT_TRUE(gpt2_problems(r, kTiny).empty()) << joined(gpt2_problems(r, kTiny));
  EXPECT_NO_THROW(check_gpt2(r, kTiny));
  Tensor dst = Tensor::zeros({8, 32}, DType::F32);
  read_gpt2_tensor(r, "transformer.h.1.mlp.c_fc.weight", dst);
  // Position of that name in the canonical list (1-based) is 2 + 12 + 9 = 23.
  EXPECT_EQ(dst.item(0), 0.5 * 23);
}

TEST(HfGpt2, AcceptsGpt2ModelNamesMaskBuffersAndTiedHead) {
  // Like openai-community/gpt2's model.safetensors: no "transformer." prefix,
  // causal-mask buffers h.N.attn.bias, and (from some exporters) lm_head.weight equal to wte.
  TempDir dir;
  auto ts = tiny_tensors(kTiny, "");
  for (int l = 0; l < 2; ++l) {
    ts.emplace_back("h." + std::to_string(l) + ".attn.bias", Tensor::full({1, 1, 7, 7}, 1, DType::F32));
  }
  Tensor wte = ts[0].second;
  ts.emplace_back("lm_head.weight", wte);
  const std::string path = dir.file("bare.safetensors");
  write_safetensors(path, ts, {{"format", "pt"}});
  SafetensorsReader r(path);
  ModelConfig c = infer_gpt2_config(r, 2);
  EXPECT_EQ(c, kTiny);
  EXPECT_TRUE(gpt2_problems(r, c).empty()) << joined(gpt2_problems(r, c));
  EXPECT_EQ(gpt2_stored_name(r, "transformer.ln_f.bias"), "ln_f.bias");
  Tensor b = Tensor::zeros({8}, DType::BF16);
  read_gpt2_tensor(r, "transformer.ln_f.bias", b);
  EXPECT_EQ(b.item(3), 0.5 * 28);  // last of 28 names
}

TEST(HfGpt2, HeadsDefaultToHiddenOver64) {
  TempDir dir;
  ModelConfig c = gpt2_config(5, 4, 128, 1, 2);
  const std::string path = dir.file("h.safetensors");
  write_safetensors(path, tiny_tensors(c, "transformer."));  // no metadata
  SafetensorsReader r(path);
  EXPECT_EQ(infer_gpt2_config(r, 0).heads, 2);
  // hidden 8 with no metadata and no hint: cannot guess.
  write_safetensors(path, tiny_tensors(kTiny, "transformer."));
  SafetensorsReader r8(path);
  EXPECT_THROW(infer_gpt2_config(r8, 0), FormatError);
}

TEST(HfGpt2, MisShapedMissingAndExtraTensorsReportedByNameAndFile) {
  TempDir dir;
  auto ts = tiny_tensors(kTiny, "transformer.");
  for (auto& [n, t] : ts) {
    // The classic mistake: an nn.Linear [out, in] weight where Conv1D [in, out] belongs.
    if (n == "transformer.h.1.mlp.c_fc.weight") t = Tensor::zeros({32, 8}, DType::F32);
  }
  ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& p) { return p.first == "transformer.h.0.ln_2.bias"; }),
           ts.end());
  ts.emplace_back("transformer.h.0.attn.rotary", Tensor::zeros({3}, DType::F32));
  ts.emplace_back("transformer.h.0.ln_2.bias", Tensor::zeros({8}, DType::I32));  // back, but an int
  const std::string path = dir.file("bad.safetensors");
  write_safetensors(path, ts);
  SafetensorsReader r(path);
  ModelConfig c = infer_gpt2_config(r, 2);
  EXPECT_EQ(c, kTiny);
  auto problems = gpt2_problems(r, c);
  ASSERT_EQ(problems.size(), 3u) << joined(problems);
  const std::string all = joined(problems);
  EXPECT_NE(all.find(path + ": tensor 'transformer.h.1.mlp.c_fc.weight' has shape [32, 8], expected [8, 32]"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find(path + ": tensor 'transformer.h.0.ln_2.bias' has dtype I32"), std::string::npos) << all;
  EXPECT_NE(all.find(path + ": extra tensor 'transformer.h.0.attn.rotary'"), std::string::npos) << all;
  try {
    check_gpt2(r, c);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.1.mlp.c_fc.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("3 problems"), std::string::npos) << e.what();
  }
  // Validating against a config with more layers says so in one line (not each tensor of the layers it lacks).
  ModelConfig three = kTiny;
  three.layers = 3;
  EXPECT_EQ(gpt2_problems(r, three),
            std::vector<std::string>{path + ": the config gives n_layer 3, but the weights hold layers 0 to 1"});
}

TEST(HfGpt2, UntiedLmHeadIsAnError) {
  TempDir dir;
  auto ts = tiny_tensors(kTiny, "transformer.");
  ts.emplace_back("lm_head.weight", Tensor::full({11, 8}, -1, DType::F32));
  const std::string path = dir.file("untied.safetensors");
  write_safetensors(path, ts);
  SafetensorsReader r(path);
  auto problems = gpt2_problems(r, kTiny);
  ASSERT_EQ(problems.size(), 1u) << joined(problems);
  EXPECT_NE(problems[0].find("lm_head.weight' differs"), std::string::npos);
}

TEST(HfGpt2, NotAGpt2File) {
  TempDir dir;
  const std::string path = dir.file("other.safetensors");
  write_safetensors(path, {{"encoder.weight", Tensor::zeros({2, 2}, DType::F32)}});
  SafetensorsReader r(path);
  try {
    infer_gpt2_config(r, 1);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("transformer.wte.weight"), std::string::npos);
  }
  EXPECT_EQ(gpt2_problems(r, kTiny).size(), 1u);
}

TEST(HfGpt2, WriterListsEveryProblem) {
  TempDir dir;
  auto ts = tiny_tensors(kTiny, "transformer.");
  ts.pop_back();                                                          // ln_f.bias missing
  ts[0].second = Tensor::zeros({8, 11}, DType::F32);                      // wte transposed
  ts.emplace_back("lm_head.weight", Tensor::zeros({11, 8}, DType::F32));  // extra
  try {
    write_gpt2_safetensors(dir.file("x.safetensors"), kTiny, ts);
    FAIL();
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'transformer.ln_f.bias' is missing"), std::string::npos) << m;
    EXPECT_NE(m.find("'transformer.wte.weight' is f32[8, 11]"), std::string::npos) << m;
    EXPECT_NE(m.find("extra tensor 'lm_head.weight'"), std::string::npos) << m;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.safetensors")));
}

TEST(HfGpt2, ShardedCheckpointValidates) {
  TempDir dir;
  write_sharded_safetensors(dir.path(), tiny_tensors(kTiny, "transformer."), 1000, {{"n_head", "2"}});
  auto src = open_safetensors(dir.path());
  EXPECT_EQ(infer_gpt2_config(*src, 0), kTiny);
  EXPECT_TRUE(gpt2_problems(*src, kTiny).empty()) << joined(gpt2_problems(*src, kTiny));
}

// config.json keys tessera does not compute are kept through ModelConfig
// (and its checkpoint JSON) into the config.json written back.
TEST(HfGpt2, ConfigKeysTesseraDoesNotComputeAreWrittenBack) {
  nlohmann::json j = nlohmann::json::parse(models::gpt::hf_config_json(kTiny));
  j["bos_token_id"] = 50256;
  j["task_specific_params"] = {{"text-generation", {{"do_sample", true}, {"max_length", 50}}}};
  const ModelConfig c = models::gpt::config_from_hf_json(j.dump(), "config.json");
  const ModelConfig via_ckpt = ModelConfig::from_json_text(c.to_json(), "the manifest's model");
  EXPECT_EQ(via_ckpt.hf_extra, c.hf_extra);
  const nlohmann::json back = nlohmann::json::parse(models::gpt::hf_config_json(via_ckpt));
  EXPECT_EQ(back["bos_token_id"], 50256);
  EXPECT_EQ(back["task_specific_params"], j["task_specific_params"]);
  EXPECT_EQ(back["n_embd"], kTiny.hidden);
}

// A config with more layers than the file holds is one problem, found
// before laying out the model (not 12 missing tensors a layer).
TEST(HfGpt2, MoreLayersThanTheFileHoldsIsOneProblem) {
  TempDir dir;
  write_safetensors(dir.file("m.safetensors"), tiny_tensors(kTiny, "transformer."), {});
  auto src = open_safetensors(dir.file("m.safetensors"));
  ModelConfig lying = kTiny;
  lying.layers = 1000000;
  EXPECT_EQ(gpt2_problems(*src, lying),
            std::vector<std::string>{dir.file("m.safetensors") +
                                     ": the config gives n_layer 1000000, but the weights hold layers 0 to 1"});
}

// A directory holding both forms reads model.safetensors, as transformers'
// from_pretrained does (it checks for the single file before the index).
TEST(HfGpt2, ADirectoryWithBothFormsReadsTheSingleFile) {
  TempDir dir;
  write_sharded_safetensors(dir.path(), tiny_tensors(kTiny, "transformer."), 1000, {});
  std::vector<std::pair<std::string, Tensor>> one = tiny_tensors(kTiny, "transformer.");
  one.front().second = Tensor::zeros(one.front().second.shape(), DType::F32);
  write_safetensors(dir.file("model.safetensors"), one, {});
  auto src = open_safetensors(dir.path());
  EXPECT_EQ(src->path(), dir.file("model.safetensors"));
  EXPECT_EQ(src->get(one.front().first).to_float_vector(), one.front().second.to_float_vector());
}

}  // namespace
}  // namespace tessera::parallel::checkpoint

namespace tessera::parallel::checkpoint {
namespace {

// The model description a checkpoint records is the planner's model JSON:
// every field round-trips (GPT-2, and a Llama preset with GQA, RoPE scaling
// and an untied head), and config.json <-> ModelConfig for GPT-2.
TEST(HfGpt2, ModelJsonAndConfigJsonRoundTrip) {
  for (const ModelConfig& c : {models::gpt::gpt2_config(50257, 1024, 768, 12, 12), ModelConfig::preset("llama3-8b")}) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(ModelConfig::from_json_text(c.to_json(), "round trip"), c);
  }
  ModelConfig g = models::gpt::gpt2_config(67, 16, 32, 3, 4);
  g.norm_eps = 1e-6;
  const ModelConfig back = models::gpt::config_from_hf_json(models::gpt::hf_config_json(g), "config.json");
  EXPECT_EQ(back, g);
  EXPECT_THROW(models::gpt::config_from_hf_json(R"({"model_type": "llama"})", "c.json"), FormatError);
  try {
    models::gpt::config_from_hf_json(R"({"vocab_size": 67, "n_positions": 16, "n_embd": 32, "n_layer": 3})", "c.json");
    ADD_FAILURE() << "no throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("c.json: field 'n_head' is missing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::parallel::checkpoint

namespace tessera::parallel::checkpoint {
namespace {

// config.json beside a Hugging Face file is the source of the architecture:
// it gives the heads the shapes cannot show, a --heads that disagrees is
// refused naming both, and a config.json that contradicts the tensors is
// refused naming the field's consequence (the tensor) and the file.
TEST(HfGpt2, ConfigJsonBesideTheFileIsTheArchitecture) {
  TempDir dir;
  const ModelConfig c = models::gpt::gpt2_config(67, 16, 32, 3, 4);
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const std::string& n : models::gpt::gpt2_tensor_names(c))
    ts.emplace_back(n, Tensor::zeros(models::gpt::gpt2_tensor_shape(c, n), DType::F32));
  write_safetensors(dir.file("model.safetensors"), ts, {{"format", "pt"}});  // no n_head: 32 is not a multiple of 64
  SafetensorsReader r(dir.file("model.safetensors"));
  EXPECT_THROW(models::gpt::infer_gpt2_config(r, 0), FormatError);
  testing::write_bytes(dir.file("config.json"), models::gpt::hf_config_json(c));
  EXPECT_EQ(models::gpt::infer_gpt2_config(r, 0), c);
  EXPECT_THROW(models::gpt::infer_gpt2_config(r, 2), InvalidArgument);
  ModelConfig four_layers = c;
  four_layers.layers = 4;
  testing::write_bytes(dir.file("config.json"), models::gpt::hf_config_json(four_layers));
  try {
    models::gpt::open_hf_gpt2(r, 0);
    ADD_FAILURE() << "no throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("the config gives n_layer 4, but the weights hold layers 0 to 2"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(dir.file("model.safetensors")), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::parallel::checkpoint
