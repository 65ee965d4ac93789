// Where each GPT-2 tensor lives under tensor and pipeline parallelism: the
// layout `tessera ckpt shard` writes and a TP rank of train_gpt holds.
//
// gpt2_tp_parameters is GptModel::parameter_layout (parallel/models/gpt): the
// model's own layers give every tensor's name, full shape, shard shape,
// split dim and chunks, so the checkpoint and the model cannot disagree.
// Stages follow parallel/pipeline/partition.h (stage_layers, or an explicit
// partition). The Parameters returned are unbound (value == nullptr):
// descriptors only. Pure; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "parallel/checkpoint/hf_gpt2.h"
#include "parallel/layers/parameter.h"

namespace tessera::parallel::checkpoint {

// Every GPT-2 parameter of TP rank `tp_rank` of `tp`, in Hugging Face order
// (GptModel::parameters() order). Throws InvalidArgument when heads do not
// divide over tp.
std::vector<parallel::layers::Parameter> gpt2_tp_parameters(const Gpt2Config& c, int tp, int tp_rank);

// Layers per stage for `c.layers` layers over `pp` stages: `stages` when
// given (checked: pp positive entries summing to c.layers), else
// pipeline::stage_layers. Throws InvalidArgument.
std::vector<int> gpt2_stages(const Gpt2Config& c, int pp, const std::vector<int>& stages = {});

// Pipeline stage of canonical tensor `name` under the partition `stages`
// (gpt2_stages): transformer.h.N on the stage holding layer N, wte and wpe
// on stage 0, ln_f on the last stage.
int gpt2_pp_stage(const std::vector<int>& stages, const std::string& name);

}  // namespace tessera::parallel::checkpoint
