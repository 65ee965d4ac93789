#include "parallel/models/llama/hf.h"

#include <nlohmann/json.hpp>
#include <set>

#include "parallel/models/hf_config.h"
#include "parallel/models/llama/llama_model.h"
#include "runtime/error.h"
#include "runtime/library_text.h"

namespace tessera::parallel::models::llama {

namespace {

using nlohmann::json;

// Defaults are transformers' LlamaConfig's, used when config.json omits a key.
constexpr double kDefaultRmsEps = 1e-6;
constexpr int kDefaultMaxPositions = 2048;
constexpr double kDefaultTheta = 10000.0;

struct Reader {
  const json& j;
  const std::string& source;

  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    throw FormatError("config.json " + source + ": field '" + field + "' " + what);
  }
  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int integer(const char* key, const int* fallback) const {
    const json* v = find(key);
    if (v == nullptr) {
      if (fallback == nullptr) bad(key, "is missing (a Llama config.json has it)");
      return *fallback;
    }
    if (!v->is_number_integer() || v->get<long long>() < 1 || v->get<long long>() > (1LL << 30))
      bad(key, "must be a positive integer, not " + v->dump());
    return static_cast<int>(v->get<long long>());
  }
  double number(const char* key, double fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !(v->get<double>() > 0)) bad(key, "must be a positive number, not " + v->dump());
    return v->get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) bad(key, "must be true or false, not " + v->dump());
    return v->get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) bad(key, "must be a string, not " + v->dump());
    return v->get<std::string>();
  }
};

}  // namespace

ModelConfig config_from_hf(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // syntax, or a number out of range (out_of_range.406)
    throw FormatError("config.json " + source + ": not valid JSON: " + json_library_text(e));
  }
  if (!j.is_object()) throw FormatError("config.json " + source + ": expected a JSON object");
  const Reader r{j, source};
  const std::string type = r.string("model_type", "llama");
  if (type != "llama" && type != "mistral")
    r.bad("model_type", "is '" + type + "'; the llama family reads model_type llama or mistral");
  ModelConfig m;
  m.family = "llama";
  m.name = r.string("_name_or_path", source);
  if (m.name.empty()) m.name = source;
  m.hidden = r.integer("hidden_size", nullptr);
  m.ffn_hidden = r.integer("intermediate_size", nullptr);
  m.layers = r.integer("num_hidden_layers", nullptr);
  m.heads = r.integer("num_attention_heads", nullptr);
  m.kv_heads = r.integer("num_key_value_heads", &m.heads);
  m.vocab = r.integer("vocab_size", nullptr);
  m.max_seq = r.integer("max_position_embeddings", &kDefaultMaxPositions);
  const int no_head_dim = 0;
  m.head_dim = r.integer("head_dim", &no_head_dim);
  if (m.head_dim == 0 && m.hidden % m.heads != 0)
    r.bad("num_attention_heads", "(" + std::to_string(m.heads) + ") does not divide 'hidden_size' (" +
                                     std::to_string(m.hidden) + ") and there is no head_dim");
  if (m.heads % m.kv_heads != 0)
    r.bad("num_key_value_heads", "(" + std::to_string(m.kv_heads) + ") does not divide 'num_attention_heads' (" +
                                     std::to_string(m.heads) + ")");
  if (m.head_dim == m.hidden / m.heads && m.hidden % m.heads == 0) m.head_dim = 0;  // the default, stated
  m.norm_eps = r.number("rms_norm_eps", kDefaultRmsEps);
  m.rope_theta = r.number("rope_theta", kDefaultTheta);
  m.tie_embeddings = r.boolean("tie_word_embeddings", false);
  m.attention_bias = r.boolean("attention_bias", false);
  if (r.boolean("mlp_bias", false)) r.bad("mlp_bias", "is true; tessera's Llama MLP has no biases");
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") r.bad("hidden_act", "is '" + act + "'; the Llama MLP tessera computes is SwiGLU (silu)");
  if (const json* sw = r.find("sliding_window")) {
    if (!sw->is_number_integer() || sw->get<long long>() < m.max_seq)
      r.bad("sliding_window", "is " + sw->dump() + ", shorter than max_position_embeddings " +
                                  std::to_string(m.max_seq) + "; tessera attends over the whole context");
  }
  if (const json* rs = r.find("rope_scaling")) {
    if (!rs->is_object()) r.bad("rope_scaling", "must be an object or null, not " + rs->dump());
    const Reader s{*rs, source};
    std::string kind = s.string("rope_type", s.string("type", ""));
    if (kind != "default") {
      if (kind != "llama3")
        r.bad("rope_scaling", "has type '" + kind + "'; tessera computes llama3 scaling (or none: \"default\")");
      m.rope_scaling.type = "llama3";
      m.rope_scaling.factor = s.number("factor", 1);
      m.rope_scaling.low_freq_factor = s.number("low_freq_factor", 1);
      m.rope_scaling.high_freq_factor = s.number("high_freq_factor", 4);
      m.rope_scaling.original_max_position_embeddings = s.integer("original_max_position_embeddings", nullptr);
    }
  }
  try {
    m.validate();
  } catch (const InvalidArgument& e) {
    throw FormatError("config.json " + source + ": " + e.what());
  }
  // Kept from the source: every key config_to_hf does not write (bos/eos
  // ids, ...), and these three whose source values win over its defaults
  // (a Mistral stays a Mistral).
  m.hf_extra =
      hf_extra_of(j, hf_config_keys(config_to_hf(m, "float32")), {"architectures", "model_type", "initializer_range"});
  return m;
}

std::string config_to_hf(const ModelConfig& m, const std::string& torch_dtype) {
  TESSERA_ARG_CHECK(m.family == "llama", "config_to_hf: model '", m.name, "' is family ", m.family, ", not llama");
  json j;
  j["architectures"] = json::array({"LlamaForCausalLM"});
  j["model_type"] = "llama";
  j["hidden_size"] = m.hidden;
  j["intermediate_size"] = m.ffn_hidden;
  j["num_hidden_layers"] = m.layers;
  j["num_attention_heads"] = m.heads;
  j["num_key_value_heads"] = m.kv_heads;
  j["head_dim"] = m.head_size();
  j["vocab_size"] = m.vocab;
  j["max_position_embeddings"] = m.max_seq;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  j["hidden_act"] = "silu";
  j["attention_bias"] = m.attention_bias;
  j["mlp_bias"] = false;
  j["tie_word_embeddings"] = m.tied_embeddings();
  j["torch_dtype"] = torch_dtype;
  j["initializer_range"] = 0.02;
  if (m.rope_scaling.type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"rope_type", m.rope_scaling.type},
                         {"factor", m.rope_scaling.factor},
                         {"low_freq_factor", m.rope_scaling.low_freq_factor},
                         {"high_freq_factor", m.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", m.rope_scaling.original_max_position_embeddings}};
  }
  add_hf_extra(j, m.hf_extra);
  return j.dump(2) + "\n";
}

std::string config_str(const ModelConfig& m) {
  return detail::concat("llama layers=", m.layers, " hidden=", m.hidden, " heads=", m.heads, " kv_heads=", m.kv_heads,
                        " head_dim=", m.head_size(), " ffn=", m.ffn_hidden, " vocab=", m.vocab, " ctx=", m.max_seq,
                        m.tied_embeddings() ? " tied" : " untied");
}

std::vector<parallel::layers::Parameter> LlamaLayout::tensors(int tp, int tp_rank) const {
  return LlamaModel::parameter_layout(c_, tp, tp_rank);
}

}  // namespace tessera::parallel::models::llama
