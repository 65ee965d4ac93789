// Where each GPT-2 tensor lives under tensor and pipeline parallelism: the
// layout `tessera ckpt shard` writes and a TP rank of train_gpt holds.
//
// gpt2_tp_parameters builds the same tensor-parallel layers GptModel builds
// (ColumnParallelLinear for c_attn with 3 chunks and c_fc, RowParallelLinear
// for the two c_proj, VocabParallelEmbedding for wte, replicated LayerNorms
// and wpe), so split_dim/chunks/shape come from the layers' own code.
// tests/checkpoint/ckpt_tool_test.cc checks the result equals
// GptModel::parameters() for several tp sizes. The Parameters returned are
// unbound (value == nullptr): descriptors only. Pure; thread-safe.
#pragma once

#include <vector>

#include "parallel/checkpoint/hf_gpt2.h"
#include "parallel/layers/parameter.h"

namespace tessera::parallel::checkpoint {

// Every GPT-2 parameter of TP rank `tp_rank` of `tp`, in Hugging Face order
// (GptModel::parameters() order). Throws InvalidArgument when heads do not
// divide over tp.
std::vector<parallel::layers::Parameter> gpt2_tp_parameters(const Gpt2Config& c, int tp, int tp_rank);

// Pipeline stage of canonical tensor `name` when `c.layers` layers are split
// over `pp` stages: stage s holds layers [s*L/pp, (s+1)*L/pp) (integer
// division, so stage sizes differ by at most one); wte and wpe are on stage
// 0, ln_f on stage pp-1.
int gpt2_pp_stage(const Gpt2Config& c, int pp, const std::string& name);
// First layer of stage s (s in [0, pp]; s == pp gives c.layers).
int64_t gpt2_stage_first_layer(const Gpt2Config& c, int pp, int s);

}  // namespace tessera::parallel::checkpoint
