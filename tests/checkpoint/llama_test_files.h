// A tiny Llama as a Hugging Face model directory, for checkpoint tests.
#pragma once

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "parallel/model_config.h"
#include "parallel/models/causal_lm.h"
#include "parallel/models/hf_io.h"
#include "runtime/tensor.h"

namespace tessera::testing {

// 8 query heads sharing 2 K/V heads, 4 layers (pp up to 4), tp up to 8.
inline parallel::ModelConfig tiny_llama() {
  parallel::ModelConfig m;
  m.name = "tiny-llama";
  m.family = "llama";
  m.layers = 4;
  m.hidden = 32;
  m.heads = 8;
  m.kv_heads = 2;
  m.ffn_hidden = 64;
  m.vocab = 77;  // 77 does not divide over tp: the last rows of the vocabulary shards are padding
  m.max_seq = 16;
  m.rope_theta = 5e5;
  return m;
}

// A Hugging Face model directory (config.json and the safetensors, sharded
// above max_shard_bytes when > 0) with distinct values in every element.
inline void write_llama_model(const std::string& dir, const parallel::ModelConfig& m, DType dtype,
                              uint64_t max_shard_bytes) {
  std::mt19937 g(11);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& p : parallel::models::parameter_layout(m, 1, 0)) {
    std::vector<float> v(static_cast<size_t>(shape_numel(p.full_shape)));
    for (auto& x : v) x = n(g);
    tensors.emplace_back(p.name, Tensor::from_vector(v, p.full_shape, DType::F32).to(dtype));
  }
  parallel::models::write_hf_model(dir, m, tensors, max_shard_bytes, dtype == DType::BF16 ? "bfloat16" : "float32");
}

}  // namespace tessera::testing
