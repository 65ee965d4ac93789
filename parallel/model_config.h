// ModelConfig: the architecture figures of a decoder-only transformer that
// the planner needs (sizes only, no weights), with presets from the public
// model cards and papers, and custom models from JSON files.
//
// Two families: "gpt" (GPT-2/GPT-3: LayerNorm with bias, biases on every
// linear, GELU MLP of two matrices, learned positions, LM head tied to the
// token embedding) and "llama" (RMSNorm, no biases, SwiGLU MLP of three
// matrices, rotary positions, grouped-query attention, untied LM head).
// A plain value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::parallel {

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

  bool gated_mlp() const { return family == "llama"; }
  bool has_bias() const { return family == "gpt"; }
  bool tied_embeddings() const { return family == "gpt"; }
  bool learned_positions() const { return family == "gpt"; }
  int kv_dim() const { return hidden / heads * kv_heads; }

  // Parameter counts (exact, from the shapes).
  int64_t layer_params() const;
  // Of a layer's parameters, those TP splits (column- and row-parallel
  // matrices, column-parallel biases); the rest (norms, row-parallel biases)
  // is replicated on every TP rank.
  int64_t layer_params_tp_sharded() const;
  int64_t embedding_params() const;  // token (+ learned position) embedding
  int64_t head_params() const;       // final norm + untied LM head (0 matrix when tied)
  int64_t total_params() const;

  // Throws InvalidArgument naming the problem (heads not dividing hidden, ...).
  void validate() const;

  // "gpt2-124m", ..., "llama2-70b"; throws InvalidArgument naming the presets.
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // JSON object with layers, hidden, heads, vocab, ffn_hidden (default 4*hidden),
  // max_seq, and optionally name, family, kv_heads. Unknown fields, malformed
  // JSON and bad values throw FormatError naming the file.
  static ModelConfig from_json_file(const std::string& path);
  static ModelConfig from_json_text(const std::string& text, const std::string& source);
  // A preset name, or a JSON file path (contains '/' or ends in .json).
  static ModelConfig load(const std::string& preset_or_file);
};

}  // namespace tessera::parallel
