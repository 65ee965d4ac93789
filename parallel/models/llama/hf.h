// Hugging Face's config.json for the Llama family (LlamaForCausalLM, and
// MistralForCausalLM, which is the same network) to and from ModelConfig:
// the one place that knows these keys.
//
// Read: hidden_size, intermediate_size, num_attention_heads,
// num_key_value_heads (default: the heads), num_hidden_layers, vocab_size,
// max_position_embeddings, rms_norm_eps, rope_theta, rope_scaling (Llama
// 3.1's {"rope_type"|"type": "llama3", factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings}; "default" or null:
// none), tie_word_embeddings (default false), head_dim (default
// hidden_size / heads), attention_bias (default false). What tessera would
// compute differently is refused, naming the file and the field: a
// hidden_act other than silu, mlp_bias, a rope_scaling type other than
// llama3, a Mistral sliding_window shorter than the context.
// Pure functions; thread-safe.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/model_config.h"
#include "parallel/models/hf_config.h"

namespace tessera::parallel::models::llama {

// `text` is config.json's content, `source` its path (for messages).
// Throws FormatError "config.json PATH: field 'x' ...".
ModelConfig config_from_hf(const std::string& text, const std::string& source);

// config.json that transformers' LlamaForCausalLM loads as it is
// (architectures, model_type "llama", every field above, torch_dtype).
std::string config_to_hf(const ModelConfig& m, const std::string& torch_dtype);

// The __metadata__ key of a single Llama file that holds its config.json.
constexpr const char* kConfigMetadataKey = "config";

// "llama layers=2 hidden=64 heads=4 kv_heads=2 head_dim=16 ffn=96 vocab=256 ctx=32 untied"
std::string config_str(const ModelConfig& m);

// The Llama family's layout as the checkpoint layer takes it (LlamaModel's
// parameter_layout); its model description is ModelConfig::to_json, its
// consolidated directory's config.json the one LlamaForCausalLM loads.
class LlamaLayout : public checkpoint::ModelLayout {
 public:
  // The name is cosmetic (a file's path, a preset's name): the model the checkpoint records is its architecture.
  explicit LlamaLayout(ModelConfig c) : c_(std::move(c)) { c_.name.clear(); }
  std::string model_json() const override { return c_.to_json(); }
  std::string describe() const override { return config_str(c_); }
  int64_t layers() const override { return c_.layers; }
  std::vector<parallel::layers::Parameter> tensors(int tp, int tp_rank) const override;
  // A single consolidated file carries its config.json in "config" (a
  // directory has it beside the tensors): --init and shard read it back.
  std::map<std::string, std::string> file_metadata(DType weights) const override {
    return {{"format", "pt"}, {kConfigMetadataKey, config_to_hf(c_, torch_dtype_name(weights))}};
  }
  std::vector<std::pair<std::string, std::string>> hf_files(DType weights) const override {
    return {{"config.json", config_to_hf(c_, torch_dtype_name(weights))}};
  }

 private:
  ModelConfig c_;
};

}  // namespace tessera::parallel::models::llama
