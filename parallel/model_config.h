// ModelConfig: the architecture figures of a decoder-only transformer that
// the planner needs (sizes only, no weights), with presets from the public
// model cards and papers, and custom models from JSON files.
//
// Two families: "gpt" (GPT-2/GPT-3: LayerNorm with bias, biases on every
// linear, GELU MLP of two matrices, learned positions, LM head tied to the
// token embedding) and "llama" (RMSNorm, no biases, SwiGLU MLP of three
// matrices, rotary positions, grouped-query attention, untied LM head by
// default). The one description of a model in tessera: the planner, the
// models (parallel/models/<family>/) and the checkpoint tools all read it;
// each family converts it to and from its Hugging Face config.json in one
// place (parallel/models/<family>/hf_config.*). A plain value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera::parallel {

// Llama 3.1's frequency-dependent RoPE scaling (Hugging Face
// `rope_scaling` with rope_type "llama3"); type empty: none.
struct RopeScaling {
  std::string type;  // "" or "llama3"
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int original_max_position_embeddings = 0;
  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  std::string name;
  std::string family = "gpt";  // "gpt" or "llama"
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;    // grouped-query attention; = heads for multi-head attention
  int ffn_hidden = 0;  // MLP inner size (4 * hidden for GPT)
  int vocab = 0;
  int max_seq = 0;
  int head_dim = 0;         // 0: hidden / heads (Hugging Face's default)
  double norm_eps = 1e-5;   // LayerNorm eps (gpt), RMSNorm's rms_norm_eps (llama)
  double rope_theta = 1e4;  // llama: rotary base (10000 Llama 2, 500000 Llama 3)
  RopeScaling rope_scaling;
  std::optional<bool> tie_embeddings;  // unset: tied for gpt, untied for llama
  bool attention_bias = false;         // llama: biases on q, k, v and o (Hugging Face attention_bias)
  // The config.json keys tessera does not compute (bos/eos token ids, ...)
  // as a compact JSON object, "" for none: read from a Hugging Face config
  // and written back into the config.json a consolidate or export writes,
  // as transformers' save_pretrained keeps them. Not part of the architecture.
  std::string hf_extra;

  bool gated_mlp() const { return family == "llama"; }
  // Biases on every linear and LayerNorm (the GPT family).
  bool has_bias() const { return family == "gpt"; }
  bool tied_embeddings() const { return tie_embeddings.value_or(family == "gpt"); }
  bool learned_positions() const { return family == "gpt"; }
  int head_size() const { return head_dim > 0 ? head_dim : hidden / heads; }
  int q_dim() const { return head_size() * heads; }
  int kv_dim() const { return head_size() * kv_heads; }
  bool operator==(const ModelConfig&) const = default;

  // Parameter counts (exact, from the shapes).
  int64_t layer_params() const;
  // Of a layer's parameters, those TP splits (column- and row-parallel
  // matrices, column-parallel biases); the rest (norms, row-parallel biases)
  // is replicated on every TP rank.
  int64_t layer_params_tp_sharded() const;
  // A layer's parameters on one of tp ranks: the TP-split matrices / tp,
  // except the K/V projections (and their biases), split over
  // min(tp, kv_heads) ranks and replicated past that (each K/V head on
  // tp / kv_heads ranks), plus the replicated rest.
  double layer_params_per_rank(int tp) const;
  int64_t embedding_params() const;  // token (+ learned position) embedding
  int64_t head_params() const;       // final norm + untied LM head (0 matrix when tied)
  int64_t total_params() const;

  // Throws InvalidArgument naming the problem (heads not dividing hidden, ...).
  void validate() const;
  // "model 'NAME'" for messages, or "the model" when the name is empty
  // (a checkpoint's recorded model has none: its name is cosmetic).
  std::string label() const { return name.empty() ? std::string("the model") : "model '" + name + "'"; }

  // "gpt2-124m", ..., "llama3-70b", "mistral-7b"; throws InvalidArgument naming the presets.
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // JSON object with layers, hidden, heads, vocab, ffn_hidden (default 4*hidden),
  // max_seq, and optionally name, family, kv_heads, head_dim, norm_eps,
  // rope_theta, rope_scaling {type, factor, low_freq_factor,
  // high_freq_factor, original_max_position_embeddings}, tie_embeddings,
  // attention_bias. Unknown fields, malformed JSON and bad values throw
  // FormatError naming the file.
  static ModelConfig from_json_file(const std::string& path);
  // The same fields as from_json_text reads, every one written (compact,
  // keys sorted): from_json_text(to_json()) == *this.
  std::string to_json() const;
  static ModelConfig from_json_text(const std::string& text, const std::string& source);
  // A preset name, or a JSON file path (contains '/' or ends in .json).
  static ModelConfig load(const std::string& preset_or_file);
};

}  // namespace tessera::parallel
