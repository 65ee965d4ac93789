// Hugging Face GPT-2 checkpoint naming and shapes (GPT2LMHeadModel).
//
// Canonical names (what gpt2_tensor_names returns and write/export should use):
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
#include <string>
#include <utility>
#include <vector>

#include "parallel/checkpoint/safetensors.h"

namespace tessera::parallel::checkpoint {

struct Gpt2Config {
  int64_t vocab = 0, n_positions = 0, hidden = 0, layers = 0, heads = 0;
  bool operator==(const Gpt2Config&) const = default;
};
std::string gpt2_config_str(const Gpt2Config& c);  // "vocab=50257 n_positions=1024 hidden=768 layers=12 heads=12"

// Infers vocab and hidden from wte, n_positions from wpe, layers from the
// h.N indices (which must be 0..L-1). Heads cannot be seen in the shapes:
// heads_hint > 0 is used as given (must divide hidden); otherwise the file's
// metadata "n_head" when present, otherwise hidden / 64 (GPT-2's head size).
// Throws FormatError naming the file when wte/wpe are missing or not 2-d.
// Does not check the other tensors: call check_gpt2 for that.
Gpt2Config infer_gpt2_config(const TensorSource& src, int64_t heads_hint);

std::vector<std::string> gpt2_tensor_names(const Gpt2Config& c);
// Shape of a canonical name under `c`; throws InvalidArgument for a name that is not a GPT-2 tensor.
Shape gpt2_tensor_shape(const Gpt2Config& c, const std::string& name);

// Every problem of `src` against `c`, one line each, naming the tensor and the
// file: "missing", "extra", "shape [a, b] expected [c, d]", "dtype I64 is not
// a float type". Empty when the file is a valid GPT-2 checkpoint for `c`.
std::vector<std::string> gpt2_problems(const TensorSource& src, const Gpt2Config& c);
// Throws FormatError listing gpt2_problems when there are any.
void check_gpt2(const TensorSource& src, const Gpt2Config& c);

// The name under which canonical `name` is stored in `src` (with or without
// the "transformer." prefix); throws InvalidArgument when neither is present.
std::string gpt2_stored_name(const TensorSource& src, const std::string& name);
// Reads canonical `name` from `src` into `dst` (same shape; converts dtype).
void read_gpt2_tensor(const TensorSource& src, const std::string& name, Tensor& dst);

// Checks that `tensors` are exactly gpt2_tensor_names(c) with the right shapes
// (any order; float dtypes), then writes them with metadata {"format": "pt"}
// plus the config (n_embd, n_head, n_layer, n_positions, vocab_size) and
// `extra_metadata`. Throws InvalidArgument listing every problem.
void write_gpt2_safetensors(const std::string& path, const Gpt2Config& c,
                            const std::vector<std::pair<std::string, Tensor>>& tensors,
                            const std::map<std::string, std::string>& extra_metadata = {});

}  // namespace tessera::parallel::checkpoint
