#include "parallel/model_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/error.h"

namespace tessera::parallel {

int64_t ModelConfig::layer_params() const {
  const int64_t h = hidden;
  int64_t p = layer_params_tp_sharded();
  if (has_bias()) p += 2 * h;                // attention output and MLP output biases (row-parallel, replicated)
  p += int64_t{has_bias() ? 2 : 1} * 2 * h;  // two norms: LayerNorm weight+bias, RMSNorm weight
  return p;
}

int64_t ModelConfig::layer_params_tp_sharded() const {
  const int64_t h = hidden, f = ffn_hidden, kv = kv_dim();
  int64_t p = h * (h + 2 * kv) + h * h + (gated_mlp() ? 3 : 2) * h * f;  // QKV, output, MLP matrices
  if (has_bias()) p += (h + 2 * kv) + f;                                 // column-parallel biases
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
  TESSERA_ARG_CHECK(family == "gpt" || family == "llama", "model '", name, "': family must be gpt or llama, not '",
                    family, "'");
  TESSERA_ARG_CHECK(layers > 0 && hidden > 0 && heads > 0 && kv_heads > 0 && ffn_hidden > 0 && vocab > 0 && max_seq > 0,
                    "model '", name,
                    "': layers, hidden, heads, kv_heads, ffn_hidden, vocab and max_seq must be positive");
  TESSERA_ARG_CHECK(hidden % heads == 0, "model '", name, "': ", heads, " heads do not divide hidden size ", hidden);
  TESSERA_ARG_CHECK(heads % kv_heads == 0, "model '", name, "': ", kv_heads, " kv_heads do not divide ", heads,
                    " heads");
}

namespace {

ModelConfig make(const char* name, const char* family, int l, int h, int a, int kv, int f, int v, int s) {
  ModelConfig m;
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

ModelConfig ModelConfig::load(const std::string& s) {
  bool file = s.find('/') != std::string::npos || (s.size() > 5 && s.substr(s.size() - 5) == ".json") ||
              std::filesystem::is_regular_file(s);
  return file ? from_json_file(s) : preset(s);
}

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("cannot open model file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json_text(ss.str(), path);
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    bad_file(source, std::string("malformed JSON: ") + e.what());
  }
  if (!j.is_object()) bad_file(source, "expected a JSON object");
  static const std::set<std::string> allowed = {"name",     "family", "layers",     "hidden", "heads",
                                                "kv_heads", "vocab",  "ffn_hidden", "max_seq"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!allowed.count(it.key()))
      bad_file(source, "unknown field '" + it.key() +
                           "' (allowed: name, family, layers, hidden, heads, kv_heads, vocab, ffn_hidden, max_seq)");
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
  try {
    m.validate();
  } catch (const InvalidArgument& e) {
    bad_file(source, e.what());
  }
  return m;
}

}  // namespace tessera::parallel
