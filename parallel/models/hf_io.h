// Hugging Face model files for any family: which tensors a model's
// safetensors must hold (the family's own parameter layout at tp 1: names
// and full shapes, so the file and the model cannot disagree), reading one
// into a model tensor, and writing a model directory transformers loads
// (config.json plus model.safetensors, or the sharded form above a size).
// Pure functions of their arguments and the files; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/safetensors.h"
#include "parallel/model_config.h"

namespace tessera::parallel::models {

// Every problem of `src` against model `m`, one line each naming the tensor
// and its file: missing, extra, a shape that disagrees with m (naming the
// config field that gives it), a non-float dtype, an lm_head.weight that
// differs from the tied embedding. Buffers transformers ignores are
// accepted (GPT-2's attn.bias / attn.masked_bias, Llama's rotary_emb.inv_freq).
std::vector<std::string> hf_tensor_problems(const parallel::checkpoint::TensorSource& src, const ModelConfig& m);
// Throws FormatError listing them when there are any.
void check_hf_tensors(const parallel::checkpoint::TensorSource& src, const ModelConfig& m);

// Reads model tensor `name` (the model's Parameter name) into `dst` (its
// full shape; the dtype converted).
void read_hf_tensor(const parallel::checkpoint::TensorSource& src, const ModelConfig& m, const std::string& name,
                    Tensor& dst);

// The architecture of a Hugging Face model path (directory, file, index):
// its config.json when there is one (the source of truth, checked against
// the tensors by check_hf_tensors), else what the file itself records
// (GPT-2: shapes plus metadata n_head, or hidden / 64; the Llama family
// needs its config.json). FormatError naming the path.
ModelConfig hf_model_config(const std::string& path, const parallel::checkpoint::TensorSource& src,
                            int64_t heads_hint = 0);

// Writes `tensors` (the full model, every name of the layout exactly once;
// float dtypes, kept as given) for transformers: to `out`. When `out` ends
// in .safetensors, that one file (as tessera always wrote for GPT-2); else
// the directory `out` (created; must be empty or absent) with config.json
// and model.safetensors, or model-0000K-of-0000N.safetensors plus
// model.safetensors.index.json when the tensors exceed max_shard_bytes
// (0: no limit). InvalidArgument naming what is missing or misshapen.
// Whether `out` names one file for write_hf_model: a path ending in
// .safetensors, or an existing non-directory (a device or FIFO, written
// through); any other path is a model directory.
bool hf_export_is_file(const std::string& out);

void write_hf_model(const std::string& out, const ModelConfig& m,
                    const std::vector<std::pair<std::string, Tensor>>& tensors, uint64_t max_shard_bytes,
                    const std::string& torch_dtype);

}  // namespace tessera::parallel::models
