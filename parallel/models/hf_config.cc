#include "parallel/models/hf_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "parallel/models/gpt/hf.h"
#include "parallel/models/llama/hf.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/library_text.h"

namespace tessera::parallel::models {

namespace fs = std::filesystem;

namespace {
// A config.json is a few KiB; anything this large is not one.
constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;
constexpr const char* kConfigName = "config.json";

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
  } catch (const nlohmann::json::exception& e) {  // syntax, or a number out of range (out_of_range.406)
    throw FormatError("config.json " + file + ": not valid JSON: " + json_library_text(e));
  }
  if (!j.is_object()) throw FormatError("config.json " + file + ": expected a JSON object");
  auto it = j.find("model_type");
  if (it == j.end() || !it->is_string())
    throw FormatError("config.json " + file + ": field 'model_type' is missing or not a string");
  const std::string type = it->get<std::string>();
  if (type == "llama" || type == "mistral") return llama::config_from_hf(text, file);
  if (type == "gpt2") {
    ModelConfig m = gpt::config_from_hf_json(text, "config.json " + file);
    m.name = file;
    try {
      m.validate();
    } catch (const InvalidArgument& e) {
      throw FormatError("config.json " + file + ": " + e.what());
    }
    return m;
  }
  throw FormatError("config.json " + file + ": model_type '" + type +
                    "' is not a family tessera trains (gpt2, llama, mistral)");
}

std::optional<ModelConfig> hf_config_of(const std::string& path) {
  auto c = hf_config_path(path);
  if (!c) return std::nullopt;
  return model_from_hf_config(*c);
}

ModelConfig load_model(const std::string& arg) {
  if (auto hf = hf_config_of(arg)) return *hf;
  std::error_code ec;
  if (fs::is_directory(arg, ec))
    throw FormatError("model '" + arg + "': a directory without config.json (a Hugging Face model directory has one)");
  return ModelConfig::load(arg);
}

std::string torch_dtype_name(DType d) {
  switch (d) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    default:
      throw InvalidArgument(std::string("torch_dtype: weights stored as ") + dtype_name(d) + " are not floating point");
  }
}

std::set<std::string> hf_config_keys(const std::string& config_text) {
  std::set<std::string> keys;
  const nlohmann::json j = nlohmann::json::parse(config_text);
  for (auto it = j.begin(); it != j.end(); ++it) keys.insert(it.key());
  return keys;
}

std::string hf_extra_of(const nlohmann::json& j, const std::set<std::string>& written,
                        const std::set<std::string>& source_wins) {
  nlohmann::json extra = nlohmann::json::object();
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!written.count(it.key()) || source_wins.count(it.key())) extra[it.key()] = it.value();
  return extra.empty() ? std::string() : extra.dump();
}

void add_hf_extra(nlohmann::json& config, const std::string& hf_extra) {
  if (hf_extra.empty()) return;
  const nlohmann::json extra = nlohmann::json::parse(hf_extra);
  for (auto it = extra.begin(); it != extra.end(); ++it) config[it.key()] = it.value();
}

void throw_problems(const std::string& head, const std::vector<std::string>& problems) {
  std::ostringstream os;
  os << head << " (" << problems.size() << " problem" << (problems.size() == 1 ? "" : "s") << "):";
  for (size_t i = 0; i < problems.size() && i < kMaxListedProblems; ++i) os << "\n  " << problems[i];
  if (problems.size() > kMaxListedProblems) os << "\n  ... and " << problems.size() - kMaxListedProblems << " more";
  throw FormatError(os.str());
}

std::string hf_config_text(const ModelConfig& m, const std::string& torch_dtype) {
  if (m.family == "llama") return llama::config_to_hf(m, torch_dtype);
  if (m.family == "gpt") return gpt::hf_config_json(m, torch_dtype);
  throw InvalidArgument("hf_config_text: family '" + m.family + "' has no config.json writer");
}

int64_t layers_held(const std::string& file, const std::set<int64_t>& indices) {
  if (indices.empty()) return 0;
  const int64_t top = *indices.rbegin();
  if (static_cast<int64_t>(indices.size()) == top + 1) return top + 1;
  int64_t gap = 0;
  while (indices.count(gap)) ++gap;
  throw FormatError(detail::concat(file, ": the weights hold layer ", top, " but no tensor of layer ", gap,
                                   " (a model's layers run from 0 without gaps)"));
}

}  // namespace tessera::parallel::models
