// Random GPT-2-shaped tensors and files for the checkpoint tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/hf_gpt2.h"
#include "runtime/tensor.h"

namespace tessera::testing {

// Every tensor of a GPT-2 of config `c`, N(0, stddev) from `seed`, stored as `dtype`.
inline std::vector<std::pair<std::string, Tensor>> random_gpt2_tensors(const parallel::checkpoint::Gpt2Config& c,
                                                                       DType dtype, uint32_t seed, float stddev = 1.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.f, stddev);
  std::vector<std::pair<std::string, Tensor>> t;
  for (const std::string& name : parallel::checkpoint::gpt2_tensor_names(c)) {
    Shape s = parallel::checkpoint::gpt2_tensor_shape(c, name);
    std::vector<float> v(static_cast<size_t>(shape_numel(s)));
    for (float& x : v) x = nd(gen);
    t.emplace_back(name, Tensor::from_vector(v, s, DType::F32).to(dtype));
  }
  return t;
}

// A Hugging Face GPT-2 safetensors file of those tensors.
inline void write_random_gpt2(const std::string& path, const parallel::checkpoint::Gpt2Config& c, DType dtype,
                              uint32_t seed, float stddev = 1.f) {
  parallel::checkpoint::write_gpt2_safetensors(path, c, random_gpt2_tensors(c, dtype, seed, stddev));
}

}  // namespace tessera::testing
