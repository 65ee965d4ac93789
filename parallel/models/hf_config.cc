#include "parallel/models/hf_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "parallel/models/llama/hf.h"
#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::parallel::models {

namespace fs = std::filesystem;

namespace {
// A config.json is a few KiB; anything this large is not one.
constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;
constexpr const char* kConfigName = "config.json";

using nlohmann::json;

[[noreturn]] void bad_field(const std::string& file, const std::string& field, const std::string& what) {
  throw FormatError("config.json " + file + ": field '" + field + "' " + what);
}

int positive_int(const json& j, const std::string& file, const char* key, const int* fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback == nullptr) bad_field(file, key, "is missing (a GPT-2 config.json has it)");
    return *fallback;
  }
  if (!it->is_number_integer() || it->get<long long>() < 1 || it->get<long long>() > (1LL << 30))
    bad_field(file, key, "must be a positive integer, not " + it->dump());
  return static_cast<int>(it->get<long long>());
}

// GPT2LMHeadModel's config.json (transformers' GPT2Config; defaults where a
// key is absent): vocab_size, n_positions, n_embd, n_layer, n_head, n_inner
// (null: 4 n_embd), layer_norm_epsilon. tessera computes the tanh GELU
// ("gelu_new") with scaled, unscaled-by-layer attention: other settings are
// refused by field.
ModelConfig gpt2_from_hf(const json& j, const std::string& file) {
  ModelConfig m;
  m.family = "gpt";
  m.name = file;
  const int n_positions = 1024;
  m.vocab = positive_int(j, file, "vocab_size", nullptr);
  m.max_seq = positive_int(j, file, "n_positions", &n_positions);
  m.hidden = positive_int(j, file, "n_embd", nullptr);
  m.layers = positive_int(j, file, "n_layer", nullptr);
  m.heads = m.kv_heads = positive_int(j, file, "n_head", nullptr);
  const int inner = 4 * m.hidden;
  m.ffn_hidden = positive_int(j, file, "n_inner", &inner);
  if (m.hidden % m.heads != 0)
    bad_field(file, "n_head",
              "(" + std::to_string(m.heads) + ") does not divide 'n_embd' (" + std::to_string(m.hidden) + ")");
  if (auto it = j.find("layer_norm_epsilon"); it != j.end()) {
    if (!it->is_number() || !(it->get<double>() > 0))
      bad_field(file, "layer_norm_epsilon", "must be a positive number");
    m.norm_eps = it->get<double>();
  }
  if (auto it = j.find("activation_function"); it != j.end() && (!it->is_string() || *it != "gelu_new"))
    bad_field(file, "activation_function", "is " + it->dump() + "; tessera's GPT-2 computes gelu_new (tanh GELU)");
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (auto it = j.find(key); it != j.end() && *it == true)
      bad_field(file, key, "is true; tessera does not compute it");
  if (auto it = j.find("scale_attn_weights"); it != j.end() && *it == false)
    bad_field(file, "scale_attn_weights", "is false; tessera scales attention by 1/sqrt(head size)");
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && *it == false)
    bad_field(file, "tie_word_embeddings", "is false; GPT-2's LM head is tied to wte");
  try {
    m.validate();
  } catch (const InvalidArgument& e) {
    throw FormatError("config.json " + file + ": " + e.what());
  }
  return m;
}

std::string gpt2_to_hf(const ModelConfig& m, const std::string& torch_dtype) {
  json j;
  j["architectures"] = json::array({"GPT2LMHeadModel"});
  j["model_type"] = "gpt2";
  j["vocab_size"] = m.vocab;
  j["n_positions"] = m.max_seq;
  j["n_ctx"] = m.max_seq;
  j["n_embd"] = m.hidden;
  j["n_layer"] = m.layers;
  j["n_head"] = m.heads;
  j["n_inner"] = m.ffn_hidden;
  j["layer_norm_epsilon"] = m.norm_eps;
  j["activation_function"] = "gelu_new";
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["initializer_range"] = 0.02;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = true;
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}
}  // namespace

std::optional<std::string> hf_config_path(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (p.filename() == kConfigName && fs::exists(p, ec)) return path;
  if (fs::is_directory(p, ec)) {
    const fs::path c = p / kConfigName;
    if (fs::exists(c, ec)) return c.string();
    return std::nullopt;
  }
  const fs::path beside = p.parent_path().empty() ? fs::path(kConfigName) : p.parent_path() / kConfigName;
  if (fs::exists(beside, ec)) return beside.string();
  return std::nullopt;
}

ModelConfig model_from_hf_config(const std::string& file) {
  const std::string text = read_regular_file(file, kMaxConfigBytes);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw FormatError("config.json " + file + ": not valid JSON (at byte " + std::to_string(e.byte) + ")");
  }
  if (!j.is_object()) throw FormatError("config.json " + file + ": expected a JSON object");
  auto it = j.find("model_type");
  if (it == j.end() || !it->is_string())
    throw FormatError("config.json " + file + ": field 'model_type' is missing or not a string");
  const std::string type = it->get<std::string>();
  if (type == "llama" || type == "mistral") return llama::config_from_hf(text, file);
  if (type == "gpt2") return gpt2_from_hf(j, file);
  throw FormatError("config.json " + file + ": model_type '" + type +
                    "' is not a family tessera trains (gpt2, llama, mistral)");
}

std::optional<ModelConfig> hf_config_of(const std::string& path) {
  auto c = hf_config_path(path);
  if (!c) return std::nullopt;
  return model_from_hf_config(*c);
}

std::string hf_config_text(const ModelConfig& m, const std::string& torch_dtype) {
  if (m.family == "llama") return llama::config_to_hf(m, torch_dtype);
  if (m.family == "gpt") return gpt2_to_hf(m, torch_dtype);
  throw InvalidArgument("hf_config_text: family '" + m.family + "' has no config.json writer");
}

}  // namespace tessera::parallel::models
