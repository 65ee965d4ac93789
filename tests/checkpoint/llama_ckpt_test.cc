// The one checkpoint format with a Llama (grouped-query attention, untied
// head): shard then consolidate gives every tensor back byte for byte for tp
// in {1, 2, 4, 8} x pp in {1, 2, 4}, including tp > kv_heads (each K/V head
// replicated onto tp / kv_heads ranks, stored once), from a single file, a
// sharded Hugging Face directory and a bf16 file; a reshard chain equals a
// direct shard file for file; a config.json that contradicts the tensors is
// refused naming the field and the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "parallel/checkpoint/ckpt_tool.h"
#include "parallel/checkpoint/safetensors.h"
#include "parallel/models/causal_lm.h"
#include "parallel/models/families.h"
#include "parallel/models/hf_io.h"
#include "runtime/error.h"
#include "tests/checkpoint/llama_test_files.h"
#include "tests/checkpoint/test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
namespace ckpt = parallel::checkpoint;
using testing::TempDir;

using testing::tiny_llama;

void write_model(const std::string& dir, const parallel::ModelConfig& m, DType dtype, uint64_t max_shard_bytes) {
  testing::write_llama_model(dir, m, dtype, max_shard_bytes);
}

// Every tensor of `a` equals `b`'s in name, dtype, shape and bytes.
void expect_same_tensors(const std::string& a, const std::string& b, const std::string& what) {
  auto x = ckpt::open_safetensors(a), y = ckpt::open_safetensors(b);
  std::vector<std::string> nx = x->names(), ny = y->names();  // a sharded source lists them sorted
  std::sort(nx.begin(), nx.end());
  std::sort(ny.begin(), ny.end());
  ASSERT_EQ(nx, ny) << what;
  for (const std::string& name : x->names()) {
    const Tensor s = x->get(name), t = y->get(name);
    ASSERT_EQ(s.dtype(), t.dtype()) << what << " " << name;
    ASSERT_EQ(s.shape(), t.shape()) << what << " " << name;
    EXPECT_EQ(std::memcmp(s.raw_data(), t.raw_data(), s.nbytes()), 0) << what << " " << name;
  }
}

struct Source {
  const char* name;
  DType dtype;
  uint64_t max_shard_bytes;  // 0: one file
};

TEST(LlamaCheckpoint, ShardThenConsolidateGivesEveryTensorBack) {
  const auto families = parallel::models::model_families();
  for (const Source& s : {Source{"f32_file", DType::F32, 0}, Source{"f32_sharded_dir", DType::F32, 20000},
                          Source{"bf16_file", DType::BF16, 0}}) {
    TempDir d;
    const std::string src = d.file("hf");
    write_model(src, tiny_llama(), s.dtype, s.max_shard_bytes);
    for (int tp : {1, 2, 4, 8})
      for (int pp : {1, 2, 4}) {
        const std::string what = std::string(s.name) + " tp " + std::to_string(tp) + " pp " + std::to_string(pp);
        SCOPED_TRACE(what);
        const std::string shards = d.file("s" + std::to_string(tp) + "x" + std::to_string(pp));
        ckpt::shard(src, shards, ckpt::ShardOptions(tp, pp), families);
        // Replicated K/V heads are stored once: the shards hold exactly the model's bytes (plus padding rows).
        const std::string out = d.file("c" + std::to_string(tp) + "x" + std::to_string(pp) + ".safetensors");
        ckpt::consolidate_path(shards, out, 0, false, false, families);
        expect_same_tensors(src, out, what);
      }
  }
}

// config.json keys tessera does not compute (token ids, a Mistral's
// model_type and architectures, initializer_range) come back from shard ->
// reshard -> consolidate as they went in, as transformers' save_pretrained
// keeps them; tessera's own keys are its own.
TEST(LlamaCheckpoint, ConsolidatedConfigKeepsTheSourcesOtherKeys) {
  const auto families = parallel::models::model_families();
  TempDir d;
  write_model(d.file("hf"), tiny_llama(), DType::BF16, 0);
  nlohmann::json config = nlohmann::json::parse(testing::read_bytes(d.file("hf/config.json")));
  const nlohmann::json extra = {{"bos_token_id", 128000},     {"eos_token_id", {128001, 128008, 128009}},
                                {"model_type", "mistral"},    {"architectures", {"MistralForCausalLM"}},
                                {"initializer_range", 0.006}, {"transformers_version", "4.44.0"}};
  config.update(extra);
  testing::write_bytes(d.file("hf/config.json"), config.dump(2));
  ckpt::shard(d.file("hf"), d.file("s"), ckpt::ShardOptions(2, 2), families);
  ckpt::reshard(d.file("s"), d.file("r"), ckpt::ShardOptions(4, 1), families);
  ckpt::consolidate_path(d.file("r"), d.file("out"), 1 << 20, false, false, families);
  const nlohmann::json back = nlohmann::json::parse(testing::read_bytes(d.file("out/config.json")));
  for (const auto& [k, v] : extra.items()) EXPECT_EQ(back.value(k, nlohmann::json()), v) << k << "\n" << back.dump(2);
  EXPECT_EQ(back["num_key_value_heads"], config["num_key_value_heads"]);
  EXPECT_EQ(back["torch_dtype"], "bfloat16");
  // The single-file form carries the same config in its metadata.
  ckpt::consolidate_path(d.file("r"), d.file("one.safetensors"), 0, false, false, families);
  const auto one = ckpt::open_safetensors(d.file("one.safetensors"));
  const nlohmann::json meta = nlohmann::json::parse(one->metadata().at("config"));
  EXPECT_EQ(meta["eos_token_id"], extra["eos_token_id"]);
}

TEST(LlamaCheckpoint, ReshardChainEqualsADirectShardFileForFile) {
  const auto families = parallel::models::model_families();
  TempDir d;
  write_model(d.file("hf"), tiny_llama(), DType::BF16, 0);
  ckpt::shard(d.file("hf"), d.file("a"), ckpt::ShardOptions(8, 1), families);
  ckpt::reshard(d.file("a"), d.file("b"), ckpt::ShardOptions(2, 4), families);
  ckpt::reshard(d.file("b"), d.file("c"), ckpt::ShardOptions(4, 2), families);
  ckpt::shard(d.file("hf"), d.file("direct"), ckpt::ShardOptions(4, 2), families);
  int files = 0;
  for (const auto& e : fs::directory_iterator(d.file("direct"))) {
    if (e.path().extension() != ".safetensors") continue;
    ++files;
    EXPECT_EQ(testing::read_bytes(e.path().string()), testing::read_bytes(d.file("c/" + e.path().filename().string())))
        << e.path().filename();
  }
  EXPECT_EQ(files, 8);
}

TEST(LlamaCheckpoint, ConfigThatContradictsTheTensorsIsRefusedByFieldAndTensor) {
  const auto families = parallel::models::model_families();
  TempDir d;
  write_model(d.file("hf"), tiny_llama(), DType::F32, 0);
  const std::string config = testing::read_bytes(d.file("hf/config.json"));
  struct Case {
    std::string from, to, says;
  };
  for (const Case& c : {Case{R"("num_key_value_heads": 2)", R"("num_key_value_heads": 4)",
                             "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 32], but the config"},
                        Case{R"("num_key_value_heads": 2)", R"("num_key_value_heads": 3)",
                             "field 'num_key_value_heads' (3) does not divide 'num_attention_heads' (8)"},
                        Case{R"("intermediate_size": 64)", R"("intermediate_size": 96)",
                             "'model.layers.0.mlp.gate_proj.weight' has shape [64, 32]"},
                        Case{R"("num_hidden_layers": 4)", R"("num_hidden_layers": 3)",
                             "extra tensor 'model.layers.3.input_layernorm.weight'"},
                        Case{R"("tie_word_embeddings": false)", R"("tie_word_embeddings": true)",
                             "'lm_head.weight' differs from 'model.embed_tokens.weight' but the config ties them"},
                        // More layers than the file holds: one line, found before laying out 10^6 layers.
                        Case{R"("num_hidden_layers": 4)", R"("num_hidden_layers": 1000000)",
                             "(1 problem):\n  " + d.file("hf") +
                                 "/model.safetensors: the config gives num_hidden_layers 1000000, but the weights "
                                 "hold layers 0 to 3"},
                        // Every tensor's shape wrong: the first 20 problems, then how many more.
                        Case{R"("hidden_size": 32)", R"("hidden_size": 40)", "\n  ... and "}}) {
    SCOPED_TRACE(c.to);
    std::string lying = config;
    const size_t at = lying.find(c.from);
    ASSERT_NE(at, std::string::npos) << config;
    lying.replace(at, c.from.size(), c.to);
    testing::write_bytes(d.file("hf/config.json"), lying);
    try {
      ckpt::shard(d.file("hf"), d.file("out"), ckpt::ShardOptions(2, 1), families);
      ADD_FAILURE() << "shard accepted " << c.to;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
      EXPECT_LT(std::count(e.what(), e.what() + std::strlen(e.what()), '\n'), 23) << e.what();
    }
    EXPECT_FALSE(fs::exists(d.file("out"))) << "a refused shard leaves no output";
  }
}

// tp that splits neither the query heads nor the K/V heads is refused naming the numbers.
TEST(LlamaCheckpoint, TpThatCannotSplitTheHeadsIsRefused) {
  const auto families = parallel::models::model_families();
  TempDir d;
  parallel::ModelConfig m = tiny_llama();
  m.heads = 12;
  m.kv_heads = 4;
  m.hidden = 48;
  write_model(d.file("hf"), m, DType::F32, 0);
  try {
    ckpt::shard(d.file("hf"), d.file("out"), ckpt::ShardOptions(8, 1), families);
    ADD_FAILURE() << "tp 8 accepted for 12 heads";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("12"), std::string::npos) << w;
    EXPECT_NE(w.find("tp 8"), std::string::npos) << w;
    // The source is named; the checkpoint's model has no name of its own to print.
    EXPECT_EQ(w.rfind(d.file("hf"), 0), 0u) << w;
    EXPECT_EQ(w.find("model ''"), std::string::npos) << w;
  }
  m.heads = 8;
  m.kv_heads = 8;
  m.hidden = 48;
  write_model(d.file("hf6"), m, DType::F32, 0);
  try {
    ckpt::shard(d.file("hf6"), d.file("out6"), ckpt::ShardOptions(6, 1), families);
    ADD_FAILURE() << "tp 6 accepted for 8 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8 attention heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
