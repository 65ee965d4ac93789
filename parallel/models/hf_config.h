// Hugging Face config.json for any family: finds the config.json that
// describes a model path and dispatches on its model_type to the family's
// one mapping (parallel/models/<family>/hf.h). Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "parallel/model_config.h"
#include "runtime/dtype.h"

namespace tessera::parallel::models {

// The config.json describing `path`: `path` itself when it is a file named
// config.json, DIR/config.json for a directory, the config.json beside a
// .safetensors file or a model.safetensors.index.json; nullopt when there is none.
std::optional<std::string> hf_config_path(const std::string& path);

// The model of config.json `file` (model_type gpt2: family gpt; llama or
// mistral: family llama). FormatError naming the file and the field.
ModelConfig model_from_hf_config(const std::string& file);

// model_from_hf_config(hf_config_path(path)) when there is a config.json.
std::optional<ModelConfig> hf_config_of(const std::string& path);

// The model a --model argument names, for every tool: a Hugging Face
// directory (or its config.json or weights) first, else a preset name or a
// model JSON file (ModelConfig::load).
ModelConfig load_model(const std::string& arg);

// The config.json text transformers loads for `m` (GPT2LMHeadModel or
// LlamaForCausalLM), with torch_dtype ("float32", "bfloat16", "float16").
std::string hf_config_text(const ModelConfig& m, const std::string& torch_dtype);

// The top-level keys of config.json text (a family's own writer's output).
std::set<std::string> hf_config_keys(const std::string& config_text);
// ModelConfig::hf_extra of config.json object `j`: its keys the family's
// writer does not write (`written`), plus those of `source_wins` it
// does, as compact JSON; "" when there are none.
std::string hf_extra_of(const nlohmann::json& j, const std::set<std::string>& written,
                        const std::set<std::string>& source_wins = {});
// `config` (a family's config.json) with every key of `hf_extra` set,
// replacing the family's own value where both have one.
void add_hf_extra(nlohmann::json& config, const std::string& hf_extra);

// Throws FormatError: `head`, how many problems there are, then each on its
// own line, at most kMaxListedProblems of them ("... and N more"): a config
// that lies about a million layers must not print a million lines.
inline constexpr size_t kMaxListedProblems = 20;
[[noreturn]] void throw_problems(const std::string& head, const std::vector<std::string>& problems);

// How many decoder layers a file holds, given the index of every per-layer
// tensor it has: one more than the highest. Throws FormatError, naming
// `file`, when a lower index has no tensor at all: one tensor named for layer
// 1000000 would otherwise make a model of a million layers to check and
// list (gigabytes, minutes), where a file's layers run from 0 without gaps.
int64_t layers_held(const std::string& file, const std::set<int64_t>& indices);

// config.json's torch_dtype for weights stored as `d`: "float32", "bfloat16"
// or "float16"; InvalidArgument for another dtype.
std::string torch_dtype_name(DType d);

}  // namespace tessera::parallel::models
