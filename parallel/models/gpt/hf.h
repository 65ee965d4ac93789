// GPT-2 and Hugging Face: tensor names and shapes (GPT2LMHeadModel),
// config.json <-> ModelConfig, and the model's layout as the checkpoint
// layer takes it (checkpoint::ModelLayout). The one place that knows
// GPT-2's Hugging Face names.
//
// Canonical names (what gpt2_tensor_names returns and write/export use):
//   transformer.wte.weight [V, C]       transformer.wpe.weight [T, C]
//   transformer.h.N.ln_1.{weight,bias} [C]     transformer.h.N.ln_2.{weight,bias} [C]
//   transformer.h.N.attn.c_attn.weight [C, 3C]  .bias [3C]   (Conv1D: stored [in, out])
//   transformer.h.N.attn.c_proj.weight [C, C]   .bias [C]
//   transformer.h.N.mlp.c_fc.weight   [C, 4C]   .bias [4C]
//   transformer.h.N.mlp.c_proj.weight [4C, C]   .bias [C]
//   transformer.ln_f.{weight,bias} [C]
// The LM head is tied to wte, so lm_head.weight is not written.
//
// Reading is lenient the way transformers' from_pretrained is: files saved
// from GPT2Model carry the names without "transformer." (e.g. the original
// openai-community/gpt2 model.safetensors); the causal-mask buffers
// h.N.attn.bias / h.N.attn.masked_bias and a tied lm_head.weight [V, C] are
// ignored. Anything else unexpected is an error. All functions are pure and
// thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/safetensors.h"
#include "parallel/model_config.h"
#include "parallel/models/gpt/gpt_model.h"
#include "parallel/models/hf_config.h"

namespace tessera::parallel::models::gpt {

using checkpoint::TensorSource;

// A GPT-2 ModelConfig (family gpt, ffn_hidden 4 x hidden, kv_heads = heads).
ModelConfig gpt2_config(int64_t vocab, int64_t n_positions, int64_t hidden, int64_t layers, int64_t heads);
// "vocab=50257 n_positions=1024 hidden=768 layers=12 heads=12"
std::string gpt2_config_str(const ModelConfig& c);

// Hugging Face's config.json of GPT2LMHeadModel for `c` (model_type gpt2).
std::string hf_config_json(const ModelConfig& c, const std::string& torch_dtype = "float32");
// A config.json's GPT-2 fields (vocab_size, n_positions, n_embd, n_layer,
// n_head, layer_norm_epsilon, tie_word_embeddings); FormatError naming the
// file and the field for a missing or bad one, or a model_type other than gpt2.
ModelConfig config_from_hf_json(const std::string& text, const std::string& where);
// The config.json beside a Hugging Face file or in its directory, when there is one.
std::string hf_config_path(const std::string& source_path);

// The architecture of `src`: from the config.json beside it when present
// (checked against the tensors by check_gpt2; heads_hint > 0 that
// disagrees is InvalidArgument naming both), else inferred: vocab and
// hidden from wte, n_positions from wpe, layers from the h.N indices
// (0..L-1); heads are not visible in the shapes: heads_hint when > 0 (must
// divide hidden), else metadata "n_head", else hidden / 64 (GPT-2's head
// size). FormatError naming the file when wte/wpe are missing or not 2-d.
ModelConfig infer_gpt2_config(const TensorSource& src, int64_t heads_hint);

// Whether the architecture of `src` records its head count (config.json beside it, or metadata n_head).
bool gpt2_file_records_heads(const TensorSource& src);

std::vector<std::string> gpt2_tensor_names(const ModelConfig& c);
// Shape of a canonical name under `c`; InvalidArgument for a name that is not a GPT-2 tensor.
Shape gpt2_tensor_shape(const ModelConfig& c, const std::string& name);

// Every problem of `src` against `c`, one line each, naming the tensor and the
// file: "missing", "extra", "shape [a, b] expected [c, d]", "dtype I64 is not
// a float type". Empty when the file is a valid GPT-2 checkpoint for `c`.
std::vector<std::string> gpt2_problems(const TensorSource& src, const ModelConfig& c);
// Throws FormatError listing gpt2_problems when there are any.
void check_gpt2(const TensorSource& src, const ModelConfig& c);

// The name under which canonical `name` is stored in `src` (with or without
// the "transformer." prefix); InvalidArgument when neither is present.
std::string gpt2_stored_name(const TensorSource& src, const std::string& name);
// Reads canonical `name` from `src` into `dst` (same shape; converts dtype).
void read_gpt2_tensor(const TensorSource& src, const std::string& name, Tensor& dst);

// The __metadata__ of a GPT-2 file: format=pt (transformers refuses files
// without it) and n_embd, n_head, n_layer, n_positions, vocab_size.
std::map<std::string, std::string> gpt2_file_metadata(const ModelConfig& c);
// Checks that `tensors` are exactly gpt2_tensor_names(c) with the right shapes
// (any order; float dtypes), then writes them in canonical order with
// gpt2_file_metadata(c) and `extra_metadata`. InvalidArgument listing every problem.
void write_gpt2_safetensors(const std::string& path, const ModelConfig& c,
                            const std::vector<std::pair<std::string, Tensor>>& tensors,
                            const std::map<std::string, std::string>& extra_metadata = {});

// Every GPT parameter TP rank `tp_rank` of `tp` holds (all stages),
// unbound, in Hugging Face order: GptModel::parameter_layout of `c`.
// InvalidArgument when heads do not divide over tp.
std::vector<parallel::layers::Parameter> gpt_layout(const ModelConfig& c, int tp, int tp_rank);

// GPT's layout as the checkpoint layer takes it; its model description is
// the planner's model JSON (ModelConfig::to_json).
class GptLayout : public checkpoint::ModelLayout {
 public:
  // The name is cosmetic (a file's path, a preset's name): the model the checkpoint records is its architecture.
  explicit GptLayout(ModelConfig c) : c_(std::move(c)) { c_.name.clear(); }
  const ModelConfig& config() const { return c_; }
  std::string model_json() const override { return c_.to_json(); }
  std::string describe() const override { return "gpt " + gpt2_config_str(c_); }
  int64_t layers() const override { return c_.layers; }
  std::vector<parallel::layers::Parameter> tensors(int tp, int tp_rank) const override {
    return gpt_layout(c_, tp, tp_rank);
  }
  std::map<std::string, std::string> file_metadata(DType /*weights*/) const override { return gpt2_file_metadata(c_); }
  std::vector<std::pair<std::string, std::string>> hf_files(DType weights) const override {
    return {{"config.json", hf_config_json(c_, torch_dtype_name(weights))}};
  }

 private:
  ModelConfig c_;
};

// A Hugging Face GPT-2 file as the checkpoint layer reads it: its layout
// and each canonical name's stored name (check_gpt2 first).
struct HfGpt2 {
  std::unique_ptr<GptLayout> layout;
  std::map<std::string, std::string> stored;
};
HfGpt2 open_hf_gpt2(const TensorSource& src, int64_t heads_hint);

}  // namespace tessera::parallel::models::gpt
