// ModelConfig's Llama fields and presets, and the Llama family's
// config.json mapping (parallel/models/llama/hf.h, parallel/models/hf_config.h).
#include "parallel/model_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "parallel/models/causal_lm.h"
#include "parallel/models/hf_config.h"
#include "parallel/models/llama/hf.h"
#include "runtime/error.h"

namespace tessera::parallel {
namespace {

// A layer's parameters on one TP rank, by hand for Llama 3 8B (h 4096, 32
// heads of 128, 8 K/V heads, MLP 14336): QKV 4096 x 6144, O 4096 x 4096,
// MLP 3 x 4096 x 14336 are TP-split; of them the K/V projections
// (2 x 4096 x 1024 = 8,388,608) only over min(tp, 8) ranks; the two norms
// (8192) are on every rank. At tp 16 each K/V head sits on 2 ranks (the
// training plan counted them split 16 ways: 2 x 4096 x 1024 / 16 short).
TEST(ModelConfig, LayerParamsPerRankReplicateKvHeadsPastKvHeads) {
  const ModelConfig m = ModelConfig::preset("llama3-8b");
  EXPECT_EQ(m.layer_params_tp_sharded(), 218103808);
  EXPECT_DOUBLE_EQ(m.layer_params_per_rank(8), 209715200.0 / 8 + 8388608.0 / 8 + 8192);    // 27,271,168
  EXPECT_DOUBLE_EQ(m.layer_params_per_rank(16), 209715200.0 / 16 + 8388608.0 / 8 + 8192);  // 14,163,968
  // GPT-2 (K/V heads = heads): QKV 768 x 2304 + 2304, O 768 x 768, MLP
  // 768 x 3072 + 3072 and 3072 x 768 split over tp = 7,083,264 / 4; the two
  // row-parallel biases and two norms (4,608) on every rank.
  EXPECT_DOUBLE_EQ(ModelConfig::preset("gpt2-124m").layer_params_per_rank(4), 7083264.0 / 4 + 4608);
}

// Against the released checkpoints' parameter counts (the model cards), and
// by hand: Llama 3 8B = V h (embedding) + 32 (2 h^2 + 2 h kv + 3 h f + 2 h) + h + V h
// with h 4096, kv 1024 (8 heads of 128), f 14336, V 128256.
TEST(ModelConfig, LlamaPresetsParameterCounts) {
  EXPECT_EQ(ModelConfig::preset("llama3-8b").total_params(), 8030261248);    // Meta-Llama-3-8B
  EXPECT_EQ(ModelConfig::preset("llama3-70b").total_params(), 70553706496);  // Meta-Llama-3-70B
  EXPECT_EQ(ModelConfig::preset("mistral-7b").total_params(), 7241732096);   // Mistral-7B-v0.1
  const int64_t h = 4096, kv = 1024, f = 14336, v = 128256;
  EXPECT_EQ(ModelConfig::preset("llama3-8b").total_params(),
            v * h + 32 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h + v * h);
  EXPECT_EQ(ModelConfig::preset("llama3-8b").rope_theta, 500000.0);
  EXPECT_FALSE(ModelConfig::preset("llama3-8b").tied_embeddings());
  EXPECT_TRUE(ModelConfig::preset("gpt2-124m").tied_embeddings());
}

TEST(ModelConfig, HeadDimAndAttentionBiasCount) {
  ModelConfig m = ModelConfig::from_json_text(
      R"({"family": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32, "vocab": 100,
          "ffn_hidden": 96, "max_seq": 16, "attention_bias": true, "tie_embeddings": true})",
      "m.json");
  EXPECT_EQ(m.q_dim(), 128);
  EXPECT_EQ(m.kv_dim(), 64);
  // per layer: q 64x128 + k, v 64x64 each + o 128x64 + 3 x 64x96 + q/k/v/o biases 128+64+64+64 + 2 norms of 64
  const int64_t layer = 64 * 128 + 2 * 64 * 64 + 128 * 64 + 3 * 64 * 96 + (128 + 64 + 64 + 64) + 2 * 64;
  EXPECT_EQ(m.layer_params(), layer);
  EXPECT_EQ(m.total_params(), int64_t{100} * 64 + 2 * layer + 64);  // tied: no separate head matrix
}

TEST(ModelConfig, RopeScalingJsonAndErrors) {
  ModelConfig m = ModelConfig::from_json_text(
      R"({"family": "llama", "layers": 1, "hidden": 64, "heads": 4, "vocab": 100, "max_seq": 16,
          "rope_theta": 500000, "rope_scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
          "high_freq_factor": 4, "original_max_position_embeddings": 8192}})",
      "m.json");
  EXPECT_EQ(m.rope_scaling.type, "llama3");
  EXPECT_EQ(m.rope_scaling.factor, 8);
  EXPECT_EQ(m.rope_scaling.original_max_position_embeddings, 8192);
  auto err = [](const std::string& text, const std::string& needle) {
    try {
      ModelConfig::from_json_text(text, "m.json");
      ADD_FAILURE() << text;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string base =
      R"({"family": "llama", "layers": 1, "hidden": 64, "heads": 4, "vocab": 100, "max_seq": 16, )";
  err(base + R"("rope_scaling": {"type": "yarn", "factor": 2, "original_max_position_embeddings": 8}})",
      "rope_scaling type must be llama3");
  err(base + R"("rope_scaling": {"type": "llama3", "scale": 2}})", "unknown field 'rope_scaling.scale'");
  err(base + R"("tie_embeddings": 1})", "'tie_embeddings' must be true or false");
  err(base + R"("kv_heads": 3})", "3 kv_heads do not divide 4 heads");
  err(R"({"layers": 1, "hidden": 64, "heads": 4, "vocab": 100, "max_seq": 16, "kv_heads": 2})",
      "the gpt family has kv_heads = heads");
}

// Llama-3.1-8B's config.json as released (tokens ids and the like dropped).
constexpr const char* kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 128256})";

TEST(LlamaHfConfig, ReadsTheReleasedConfig) {
  const ModelConfig m = models::llama::config_from_hf(kLlama31, "Llama-3.1-8B/config.json");
  EXPECT_EQ(m.family, "llama");
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.ffn_hidden, 14336);
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_EQ(m.max_seq, 131072);
  EXPECT_EQ(m.head_size(), 128);
  EXPECT_EQ(m.head_dim, 0);  // the default, not stated
  EXPECT_DOUBLE_EQ(m.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(m.rope_theta, 500000.0);
  EXPECT_FALSE(m.tied_embeddings());
  EXPECT_EQ(m.rope_scaling.type, "llama3");
  EXPECT_EQ(m.rope_scaling.factor, 8.0);
  EXPECT_EQ(m.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(m.rope_scaling.original_max_position_embeddings, 8192);
  // The same parameters as the Llama 3 8B preset: 3.1 changed positions, not shapes.
  EXPECT_EQ(m.total_params(), ModelConfig::preset("llama3-8b").total_params());
}

TEST(LlamaHfConfig, WrittenConfigReadsBackTheSame) {
  ModelConfig m = models::llama::config_from_hf(kLlama31, "a/config.json");
  m.tie_embeddings = true;
  m.attention_bias = true;
  m.head_dim = 64;
  const ModelConfig back = models::llama::config_from_hf(models::llama::config_to_hf(m, "float32"), "b/config.json");
  ModelConfig want = m;
  want.name = back.name;
  EXPECT_EQ(back, want);
}

TEST(LlamaHfConfig, WhatTesseraWouldComputeDifferentlyIsRefusedByField) {
  auto err = [](const std::string& from, const std::string& to, const std::string& needle) {
    std::string text = kLlama31;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    try {
      models::llama::config_from_hf(text, "m/config.json");
      ADD_FAILURE() << "accepted: " << to;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("m/config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  err(R"("hidden_act": "silu")", R"("hidden_act": "gelu")", "field 'hidden_act'");
  err(R"("mlp_bias": false)", R"("mlp_bias": true)", "field 'mlp_bias'");
  err(R"("rope_type": "llama3")", R"("rope_type": "yarn")", "field 'rope_scaling'");
  err(R"("hidden_size": 4096,)", "", "field 'hidden_size' is missing");
  err(R"("num_key_value_heads": 8)", R"("num_key_value_heads": 5)",
      "field 'num_key_value_heads' (5) does not divide 'num_attention_heads' (32)");
  err(R"("num_hidden_layers": 32)", R"("num_hidden_layers": "32")", "field 'num_hidden_layers' must be a positive");
  err(R"("model_type": "llama")", R"("model_type": "gpt_neox")", "field 'model_type'");
  err(R"("rms_norm_eps": 1e-05)", R"("rms_norm_eps": 1e-05, "sliding_window": 4096)", "field 'sliding_window'");
  err("{", "[", "not valid JSON");
  // A number no double holds fails in the parser itself (nlohmann's out_of_range, not a parse_error).
  err(R"("rms_norm_eps": 1e-05)", R"("rms_norm_eps": 1e400)", "not valid JSON: number overflow parsing '1e400'");
}

TEST(HfConfig, FindsTheConfigBesideAFileOrInADirectory) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessera_hf_config_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  EXPECT_FALSE(models::hf_config_path(dir.string()).has_value());
  EXPECT_FALSE(models::hf_config_of((dir / "model.safetensors").string()).has_value());
  std::ofstream(dir / "config.json") << kLlama31;
  EXPECT_EQ(*models::hf_config_path(dir.string()), (dir / "config.json").string());
  EXPECT_EQ(*models::hf_config_path((dir / "model.safetensors").string()), (dir / "config.json").string());
  EXPECT_EQ(models::hf_config_of(dir.string())->kv_heads, 8);
  std::ofstream(dir / "config.json") << R"({"model_type": "bert"})";
  EXPECT_THROW(models::hf_config_of(dir.string()), FormatError);
  std::filesystem::remove_all(dir);
}

TEST(ModelConfig, CompletedDefaultsForEachFamily) {
  ModelConfig m = models::default_train_model();
  models::complete_model_config(m);
  EXPECT_EQ(m.kv_heads, 6);
  EXPECT_EQ(m.ffn_hidden, 4 * 384);
  m = models::default_train_model();
  m.family = "llama";
  m.hidden = 128;
  m.heads = 4;
  models::complete_model_config(m);
  EXPECT_EQ(m.ffn_hidden, 384);  // 8/3 x 128 = 341.3, up to a multiple of 64
  EXPECT_EQ(m.kv_heads, 4);
}

}  // namespace
}  // namespace tessera::parallel
