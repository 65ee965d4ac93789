// Full values for a model's tensors keyed by name alone (the same in every
// layout), away from init so no gradient is tiny: matrices N(0, 0.3), norm
// gains (names with "norm" or GPT-2's "ln_") 1 + N(0, 0.3), biases N(0, 0.1).
// Shared by tests/llama/model_test.cc and tests/inference/generation_test.cc,
// with the tiny Llama both run.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "parallel/layers/parameter.h"
#include "parallel/model_config.h"

namespace tessera::test {

inline uint32_t name_seed(const std::string& s) {  // FNV-1a
  uint32_t h = 2166136261u;
  for (unsigned char ch : s) h = (h ^ ch) * 16777619u;
  return h;
}

inline std::vector<float> full_value(const parallel::layers::Parameter& p) {
  std::mt19937 g(name_seed(p.name));
  const bool norm = p.name.find("norm") != std::string::npos || p.name.find("ln_") != std::string::npos;
  const bool bias = p.name.find(".bias") != std::string::npos;
  std::normal_distribution<float> d(0.f, bias ? 0.1f : 0.3f);
  std::vector<float> v(static_cast<size_t>(shape_numel(p.full_shape)));
  for (auto& x : v) x = (norm && !bias ? 1.f : 0.f) + d(g);
  return v;
}

// A tiny Llama: 8 heads over `kv_heads`, width 32, ffn 48, vocabulary 50 (not
// a multiple of 4: the last TP rank's vocabulary shard is padded), context 16,
// llama3 rope scaling.
inline parallel::ModelConfig tiny_llama(int kv_heads, bool tied, bool bias, int layers = 2) {
  parallel::ModelConfig c;
  c.name = "tiny-llama";
  c.family = "llama";
  c.layers = layers;
  c.hidden = 32;
  c.heads = 8;
  c.kv_heads = kv_heads;
  c.ffn_hidden = 48;
  c.vocab = 50;
  c.max_seq = 16;
  c.norm_eps = 1e-5;
  c.rope_theta = 500;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 4;
  c.rope_scaling.original_max_position_embeddings = 8;
  c.tie_embeddings = tied;
  c.attention_bias = bias;
  return c;
}

}  // namespace tessera::test
