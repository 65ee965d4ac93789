// The model families as the checkpoint layer takes them
// (checkpoint::ModelFamilies): which family a recorded model description
// belongs to, its layout, its Hugging Face reading, its trainer state. The
// one dispatch on ModelConfig::family for the checkpoint tools; each family
// adds itself here. Pure; thread-safe.
#pragma once

#include <memory>
#include <string>

#include "parallel/checkpoint/ckpt_tool.h"
#include "parallel/model_config.h"

namespace tessera::parallel::models {

// The layout of `cfg` (family gpt; InvalidArgument naming a family that
// has none yet).
std::unique_ptr<checkpoint::ModelLayout> model_layout(const ModelConfig& cfg);
// Every family's hooks: layouts from a manifest's model JSON, Hugging Face
// files (GPT-2 today), trainer states.
checkpoint::ModelFamilies model_families();

}  // namespace tessera::parallel::models
