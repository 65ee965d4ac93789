// Random GPT-2-shaped tensors and files for the checkpoint tests, and the
// `tessera ckpt` library calls with GPT-2's model families (the checkpoint
// layer takes them as an argument).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/ckpt_tool.h"
#include "parallel/models/families.h"
#include "parallel/models/gpt/hf.h"
#include "parallel/pipeline/partition.h"
#include "runtime/tensor.h"

namespace tessera::testing {

// Every tensor of a GPT-2 of config `c`, N(0, stddev) from `seed`, stored as `dtype`.
inline std::vector<std::pair<std::string, Tensor>> random_gpt2_tensors(const parallel::ModelConfig& c, DType dtype,
                                                                       uint32_t seed, float stddev = 1.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.f, stddev);
  std::vector<std::pair<std::string, Tensor>> t;
  for (const std::string& name : parallel::models::gpt::gpt2_tensor_names(c)) {
    Shape s = parallel::models::gpt::gpt2_tensor_shape(c, name);
    std::vector<float> v(static_cast<size_t>(shape_numel(s)));
    for (float& x : v) x = nd(gen);
    t.emplace_back(name, Tensor::from_vector(v, s, DType::F32).to(dtype));
  }
  return t;
}

// A Hugging Face GPT-2 safetensors file of those tensors.
inline void write_random_gpt2(const std::string& path, const parallel::ModelConfig& c, DType dtype, uint32_t seed,
                              float stddev = 1.f) {
  parallel::models::gpt::write_gpt2_safetensors(path, c, random_gpt2_tensors(c, dtype, seed, stddev));
}

}  // namespace tessera::testing

namespace tessera::parallel::checkpoint {

using namespace tessera::parallel::models::gpt;  // NOLINT(google-build-using-namespace): GPT-2's names in the tests

inline const ModelFamilies& families() {
  static const ModelFamilies f = parallel::models::model_families();
  return f;
}
inline uint64_t shard_gpt2(const std::string& src, const std::string& out, const ShardOptions& o) {
  return shard(src, out, o, families());
}
inline void consolidate_gpt2(const std::string& dir, const std::string& out, bool allow_nonfinite = false) {
  consolidate_path(dir, out, 0, false, allow_nonfinite, families());
}
inline std::vector<std::string> consolidate_gpt2_sharded(const std::string& dir, const std::string& out, uint64_t max,
                                                         bool allow_nonfinite = false) {
  return consolidate_path(dir, out, max, false, allow_nonfinite, families());
}
inline std::string reshard_gpt2(const std::string& dir, const std::string& out, const ShardOptions& o) {
  return reshard(dir, out, o, families());
}
// Every check of a checkpoint (tessera ckpt verify); its model.
inline ModelConfig verify_shard_dir(const std::string& dir) {
  const Input in = open_input(dir, families());
  return dynamic_cast<const GptLayout&>(*in.model).config();
}
inline std::vector<int> gpt2_stages(const ModelConfig& c, int pp, const std::vector<int>& stages = {}) {
  return pipeline::resolve_stages(stages, c.layers, pp);
}
inline std::vector<parallel::layers::Parameter> gpt2_tp_parameters(const ModelConfig& c, int tp, int tp_rank) {
  return gpt_layout(c, tp, tp_rank);
}
// The pipeline stage of a GPT-2 tensor under `stages`, from its descriptor's layer.
inline int gpt2_pp_stage(const std::vector<int>& stages, const std::string& name) {
  const std::string h = "transformer.h.";
  parallel::layers::Parameter p;
  p.layer = name.rfind(h, 0) == 0                     ? std::stoi(name.substr(h.size()))
            : name.rfind("transformer.ln_f.", 0) == 0 ? parallel::layers::kHeadLayer
                                                      : parallel::layers::kEmbeddingLayer;
  return stage_of(p, stages);
}
// "dp_rank_00_tp_rank_01_pp_rank_00".
inline std::string rank_stem(int dp_rank, int tp_rank, int pp_rank) {
  const std::string f = rank_file_name(dp_rank, tp_rank, pp_rank);
  return f.substr(0, f.size() - std::string(".safetensors").size());
}

}  // namespace tessera::parallel::checkpoint
