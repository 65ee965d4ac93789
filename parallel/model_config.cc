#include "parallel/model_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/library_text.h"

namespace tessera::parallel {

int64_t ModelConfig::layer_params() const {
  const int64_t h = hidden;
  int64_t p = layer_params_tp_sharded();
  if (has_bias()) p += 2 * h;                 // attention output and MLP output biases (row-parallel, replicated)
  if (!has_bias() && attention_bias) p += h;  // the attention output's bias (row-parallel, replicated)
  p += int64_t{has_bias() ? 2 : 1} * 2 * h;   // two norms: LayerNorm weight+bias, RMSNorm weight
  return p;
}

double ModelConfig::layer_params_per_rank(int tp) const {
  const double h = hidden, kv = kv_dim();
  const double kv_proj = 2 * h * kv + ((has_bias() || attention_bias) ? 2 * kv : 0);
  const double sharded = static_cast<double>(layer_params_tp_sharded()) - kv_proj;
  const double replicated = static_cast<double>(layer_params() - layer_params_tp_sharded());
  return sharded / tp + kv_proj / std::min(tp, kv_heads) + replicated;
}

int64_t ModelConfig::layer_params_tp_sharded() const {
  const int64_t h = hidden, f = ffn_hidden, q = q_dim(), kv = kv_dim();
  int64_t p = h * (q + 2 * kv) + q * h + (gated_mlp() ? 3 : 2) * h * f;  // QKV, output, MLP matrices
  if (has_bias()) p += (q + 2 * kv) + f;                                 // column-parallel biases
  if (!has_bias() && attention_bias) p += q + 2 * kv;
  return p;
}

int64_t ModelConfig::embedding_params() const {
  return static_cast<int64_t>(vocab) * hidden + (learned_positions() ? static_cast<int64_t>(max_seq) * hidden : 0);
}

int64_t ModelConfig::head_params() const {
  int64_t p = (has_bias() ? 2 : 1) * static_cast<int64_t>(hidden);  // final norm
  if (!tied_embeddings()) p += static_cast<int64_t>(vocab) * hidden;
  return p;
}

int64_t ModelConfig::total_params() const { return layers * layer_params() + embedding_params() + head_params(); }

void ModelConfig::validate() const {
  TESSERA_ARG_CHECK(family == "gpt" || family == "llama", label(), ": family must be gpt or llama, not '", family, "'");
  TESSERA_ARG_CHECK(layers > 0 && hidden > 0 && heads > 0 && kv_heads > 0 && ffn_hidden > 0 && vocab > 0 && max_seq > 0,
                    label(), ": layers, hidden, heads, kv_heads, ffn_hidden, vocab and max_seq must be positive");
  TESSERA_ARG_CHECK(head_dim > 0 || hidden % heads == 0, label(), ": ", heads, " heads do not divide hidden size ",
                    hidden);
  TESSERA_ARG_CHECK(head_dim >= 0, label(), ": head_dim must be positive");
  TESSERA_ARG_CHECK(heads % kv_heads == 0, label(), ": ", kv_heads, " kv_heads do not divide ", heads, " heads");
  TESSERA_ARG_CHECK(family == "llama" || (kv_heads == heads && head_size() * heads == hidden && !attention_bias),
                    label(),
                    ": the gpt family has kv_heads = heads, head_dim = hidden / heads and no "
                    "attention_bias flag");
  TESSERA_ARG_CHECK(family == "llama" || tied_embeddings(), label(), ": the gpt family ties its LM head");
  TESSERA_ARG_CHECK(family != "llama" || head_size() % 2 == 0, label(),
                    ": rotary embeddings need an even "
                    "head size, not ",
                    head_size());
  TESSERA_ARG_CHECK(norm_eps > 0 && norm_eps < 1, label(), ": norm_eps must be in (0, 1), not ", norm_eps);
  TESSERA_ARG_CHECK(rope_theta > 1, label(), ": rope_theta must exceed 1, not ", rope_theta);
  TESSERA_ARG_CHECK(rope_scaling.type.empty() || rope_scaling.type == "llama3", label(),
                    ": rope_scaling type must be llama3 (or none), not '", rope_scaling.type, "'");
  TESSERA_ARG_CHECK(rope_scaling.type.empty() || (rope_scaling.factor >= 1 && rope_scaling.low_freq_factor > 0 &&
                                                  rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
                                                  rope_scaling.original_max_position_embeddings > 0),
                    label(),
                    ": rope_scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and a positive "
                    "original_max_position_embeddings");
}

namespace {

ModelConfig make(const char* name, const char* family, int l, int h, int a, int kv, int f, int v, int s,
                 double theta = 1e4) {
  ModelConfig m;
  m.rope_theta = theta;
  m.name = name;
  m.family = family;
  m.layers = l;
  m.hidden = h;
  m.heads = a;
  m.kv_heads = kv;
  m.ffn_hidden = f;
  m.vocab = v;
  m.max_seq = s;
  return m;
}

// GPT-2: Radford et al. 2019 and the released configs (vocab 50257, context 1024).
// GPT-3: Brown et al. 2020, Table 2.1 (context 2048); the 1.3B row lists 24
// heads of 128 for d_model 2048, which is inconsistent; we use 16 heads of
// 128 as Megatron-LM's 1.3B config does. 13B uses d_model 5120 (the table's
// 5140 is a typo: 40 heads x 128).
// Llama 2: Touvron et al. 2023 and the released params.json (vocab 32000,
// context 4096, SwiGLU sizes 11008 / 13824 / 28672, 70B with 8 KV heads).
// Llama 3: Meta-Llama-3-8B and -70B config.json (vocab 128256, context 8192,
// rope_theta 500000, 8 KV heads, intermediate 14336 / 28672).
// Mistral 7B: Mistral-7B-v0.1 config.json (vocab 32000, 8 KV heads,
// intermediate 14336, max_position_embeddings 32768, rope_theta 10000).
// Every Llama-family preset: rms_norm_eps 1e-5, untied head.
const std::vector<ModelConfig>& presets() {
  static const std::vector<ModelConfig> p = {
      make("gpt2-124m", "gpt", 12, 768, 12, 12, 3072, 50257, 1024),
      make("gpt2-355m", "gpt", 24, 1024, 16, 16, 4096, 50257, 1024),
      make("gpt2-774m", "gpt", 36, 1280, 20, 20, 5120, 50257, 1024),
      make("gpt2-1.5b", "gpt", 48, 1600, 25, 25, 6400, 50257, 1024),
      make("gpt3-1.3b", "gpt", 24, 2048, 16, 16, 8192, 50257, 2048),
      make("gpt3-2.7b", "gpt", 32, 2560, 32, 32, 10240, 50257, 2048),
      make("gpt3-6.7b", "gpt", 32, 4096, 32, 32, 16384, 50257, 2048),
      make("gpt3-13b", "gpt", 40, 5120, 40, 40, 20480, 50257, 2048),
      make("gpt3-175b", "gpt", 96, 12288, 96, 96, 49152, 50257, 2048),
      make("llama2-7b", "llama", 32, 4096, 32, 32, 11008, 32000, 4096),
      make("llama2-13b", "llama", 40, 5120, 40, 40, 13824, 32000, 4096),
      make("llama2-70b", "llama", 80, 8192, 64, 8, 28672, 32000, 4096),
      make("llama3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 8192, 5e5),
      make("llama3-70b", "llama", 80, 8192, 64, 8, 28672, 128256, 8192, 5e5),
      make("mistral-7b", "llama", 32, 4096, 32, 8, 14336, 32000, 32768),
  };
  return p;
}

using nlohmann::json;

[[noreturn]] void bad_file(const std::string& source, const std::string& what) {
  throw FormatError("model file '" + source + "': " + what);
}

int get_int(const json& j, const char* key, const std::string& source) {
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > (1LL << 30))
    bad_file(source, std::string("field '") + key + "' must be a positive integer");
  return static_cast<int>(v.get<long long>());
}

double get_num(const json& j, const char* key, const std::string& source) {
  const json& v = j.at(key);
  if (!v.is_number() || !(v.get<double>() > 0))
    bad_file(source, std::string("field '") + key + "' must be a positive number");
  return v.get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& source) {
  const json& v = j.at(key);
  if (!v.is_boolean()) bad_file(source, std::string("field '") + key + "' must be true or false");
  return v.get<bool>();
}

}  // namespace

std::vector<std::string> ModelConfig::preset_names() {
  std::vector<std::string> n;
  for (const auto& m : presets()) n.push_back(m.name);
  return n;
}

ModelConfig ModelConfig::preset(const std::string& name) {
  for (const auto& m : presets())
    if (m.name == name) return m;
  std::string list;
  for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
  throw InvalidArgument("unknown model preset '" + name + "' (presets: " + list + "; or a JSON file path)");
}

ModelConfig ModelConfig::load(const std::string& s) { return names_input_file(s) ? from_json_file(s) : preset(s); }

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  return from_json_text(read_input_file(path, "model file"), path);
}

std::string ModelConfig::to_json() const {
  json j = {
      {"name", name},       {"family", family},     {"layers", layers},         {"hidden", hidden},
      {"heads", heads},     {"kv_heads", kv_heads}, {"ffn_hidden", ffn_hidden}, {"vocab", vocab},
      {"max_seq", max_seq}, {"norm_eps", norm_eps}, {"rope_theta", rope_theta}, {"attention_bias", attention_bias}};
  if (head_dim > 0) j["head_dim"] = head_dim;  // 0: hidden / heads (from_json_text takes positive values only)
  if (tie_embeddings) j["tie_embeddings"] = *tie_embeddings;
  if (!hf_extra.empty()) j["hf_extra"] = json::parse(hf_extra);
  if (rope_scaling.type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"type", rope_scaling.type},
                         {"factor", rope_scaling.factor},
                         {"low_freq_factor", rope_scaling.low_freq_factor},
                         {"high_freq_factor", rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
  return j.dump();
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // syntax, or a number out of range
    bad_file(source, "malformed JSON: " + json_library_text(e));
  }
  if (!j.is_object()) bad_file(source, std::string("expected a JSON object, found ") + j.type_name());
  static const std::set<std::string> allowed = {
      "name",    "family",   "layers",   "hidden",     "heads",        "kv_heads",       "vocab",          "ffn_hidden",
      "max_seq", "head_dim", "norm_eps", "rope_theta", "rope_scaling", "tie_embeddings", "attention_bias", "hf_extra"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!allowed.count(it.key()))
      bad_file(source, "unknown field '" + it.key() +
                           "' (allowed: name, family, layers, hidden, heads, kv_heads, vocab, ffn_hidden, max_seq, "
                           "head_dim, norm_eps, rope_theta, rope_scaling, tie_embeddings, attention_bias, hf_extra)");
  for (const char* k : {"layers", "hidden", "heads", "vocab", "max_seq"})
    if (!j.contains(k)) bad_file(source, std::string("missing field '") + k + "'");
  ModelConfig m;
  if (j.contains("name")) {
    if (!j["name"].is_string()) bad_file(source, "field 'name' must be a string");
    m.name = j["name"].get<std::string>();
  } else {
    m.name = source;
  }
  if (j.contains("family")) {
    if (!j["family"].is_string()) bad_file(source, "field 'family' must be a string");
    m.family = j["family"].get<std::string>();
  }
  m.layers = get_int(j, "layers", source);
  m.hidden = get_int(j, "hidden", source);
  m.heads = get_int(j, "heads", source);
  m.vocab = get_int(j, "vocab", source);
  m.max_seq = get_int(j, "max_seq", source);
  m.kv_heads = j.contains("kv_heads") ? get_int(j, "kv_heads", source) : m.heads;
  m.ffn_hidden = j.contains("ffn_hidden") ? get_int(j, "ffn_hidden", source) : 4 * m.hidden;
  if (j.contains("head_dim")) m.head_dim = get_int(j, "head_dim", source);
  if (j.contains("norm_eps")) m.norm_eps = get_num(j, "norm_eps", source);
  if (j.contains("rope_theta")) m.rope_theta = get_num(j, "rope_theta", source);
  if (j.contains("tie_embeddings")) m.tie_embeddings = get_bool(j, "tie_embeddings", source);
  if (j.contains("attention_bias")) m.attention_bias = get_bool(j, "attention_bias", source);
  if (j.contains("hf_extra")) {
    if (!j["hf_extra"].is_object()) bad_file(source, "field 'hf_extra' must be an object");
    if (!j["hf_extra"].empty()) m.hf_extra = j["hf_extra"].dump();
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& r = j["rope_scaling"];
    if (!r.is_object()) bad_file(source, "field 'rope_scaling' must be an object or null");
    static const std::set<std::string> rs = {"type", "factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings"};
    for (auto it = r.begin(); it != r.end(); ++it)
      if (!rs.count(it.key()))
        bad_file(source, "unknown field 'rope_scaling." + it.key() +
                             "' (allowed: type, factor, low_freq_factor, high_freq_factor, "
                             "original_max_position_embeddings)");
    if (!r.contains("type") || !r["type"].is_string()) bad_file(source, "field 'rope_scaling.type' must be a string");
    m.rope_scaling.type = r["type"].get<std::string>();
    if (r.contains("factor")) m.rope_scaling.factor = get_num(r, "factor", source);
    if (r.contains("low_freq_factor")) m.rope_scaling.low_freq_factor = get_num(r, "low_freq_factor", source);
    if (r.contains("high_freq_factor")) m.rope_scaling.high_freq_factor = get_num(r, "high_freq_factor", source);
    if (r.contains("original_max_position_embeddings"))
      m.rope_scaling.original_max_position_embeddings = get_int(r, "original_max_position_embeddings", source);
  }
  try {
    m.validate();
  } catch (const InvalidArgument& e) {
    bad_file(source, e.what());
  }
  return m;
}

}  // namespace tessera::parallel
