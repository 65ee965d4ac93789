// train_gpt's model flags: --model (a planner preset or model JSON, or a
// Hugging Face config.json or model directory), --family and the size flags
// (docs/training.md, "The model").
#pragma once

#include <functional>
#include <string>

#include "parallel/models/gpt/trainer.h"

namespace tessera::gpt {

// Fills t.model. With `model` non-empty, the model it names (its context
// caps --seq unless --seq was given); size flags the user gave (`given`)
// must agree with it, else InvalidArgument naming the flag, both values and
// the source. Without, the family `family` with the sizes of the flags.
// FormatError for a file that does not parse.
void apply_model_flags(parallel::models::gpt::TrainOptions& t, const std::string& model, const std::string& family,
                       const std::function<bool(const char*)>& given);

// Every model flag the user gave (`given`) must agree with `source`, the
// model of a file or checkpoint named `where`: InvalidArgument "--heads 8
// does not match WHERE, which has 4". `flags` holds the flags' values.
void agree_model_flags(const parallel::ModelConfig& flags, const parallel::ModelConfig& source,
                       const std::string& where, const std::function<bool(const char*)>& given);

// The model a --model argument names: a directory holding config.json, a
// file named config.json (Hugging Face), a preset name or a planner model
// JSON file (parallel/model_config.h).
parallel::ModelConfig resolve_model_arg(const std::string& model);

}  // namespace tessera::gpt
