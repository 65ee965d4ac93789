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

#include <string>

#include "parallel/model_config.h"

namespace tessera::parallel::models::llama {

// `text` is config.json's content, `source` its path (for messages).
// Throws FormatError "config.json PATH: field 'x' ...".
ModelConfig config_from_hf(const std::string& text, const std::string& source);

// config.json that transformers' LlamaForCausalLM loads as it is
// (architectures, model_type "llama", every field above, torch_dtype).
std::string config_to_hf(const ModelConfig& m, const std::string& torch_dtype);

}  // namespace tessera::parallel::models::llama
