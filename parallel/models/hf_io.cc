#include "parallel/models/hf_io.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "parallel/models/causal_lm.h"
#include "parallel/models/gpt/hf.h"
#include "parallel/models/hf_config.h"
#include "parallel/models/llama/hf.h"
#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::parallel::models {

namespace fs = std::filesystem;
using parallel::checkpoint::SafetensorsEntry;
using parallel::checkpoint::TensorSource;

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

// The Llama family's tensors transformers ignores when loading: the rotary
// inverse frequencies older checkpoints saved as buffers.
bool llama_ignorable(const std::string& n) {
  return starts_with(n, "model.layers.") && ends_with(n, ".self_attn.rotary_emb.inv_freq");
}

constexpr const char* kLlamaEmbedding = "model.embed_tokens.weight";
constexpr const char* kLmHead = "lm_head.weight";

// How many decoder layers the file holds: one more than the highest N of a
// "model.layers.N." tensor (0 when there is none); FormatError for a gap.
int64_t llama_layers_held(const TensorSource& src) {
  const std::string prefix = "model.layers.";
  std::set<int64_t> indices;
  for (const std::string& n : src.names()) {
    if (!starts_with(n, prefix)) continue;
    size_t j = prefix.size();
    while (j < n.size() && j - prefix.size() < 10 && n[j] >= '0' && n[j] <= '9') ++j;
    if (j == prefix.size() || j >= n.size() || n[j] != '.') continue;
    indices.insert(std::stoll(n.substr(prefix.size(), j - prefix.size())));
  }
  return layers_held(src.path(), indices);
}

// The llama family, checked against the model's own layout at tp 1.
std::vector<std::string> llama_problems(const TensorSource& src, const ModelConfig& m) {
  // A config giving more layers than the file holds is one problem, found
  // before laying the model out (a config claiming 10^6 layers would
  // otherwise list 9 x 10^6 missing tensors).
  int64_t held = 0;
  try {
    held = llama_layers_held(src);
  } catch (const FormatError& e) {
    return {e.what()};
  }
  if (m.layers > held)
    return {detail::concat(src.path(), ": the config gives num_hidden_layers ", m.layers, ", but the weights hold ",
                           held == 0 ? std::string("no layer") : detail::concat("layers 0 to ", held - 1))};
  std::vector<std::string> problems;
  std::set<std::string> expected;
  for (const parallel::layers::Parameter& p : parameter_layout(m, 1, 0)) {
    expected.insert(p.name);
    if (!src.contains(p.name)) {
      problems.push_back(detail::concat(src.path(), ": tensor '", p.name, "' is missing"));
      continue;
    }
    const SafetensorsEntry& e = src.entry(p.name);
    if (e.shape != p.full_shape)
      problems.push_back(detail::concat(src.file_of(p.name), ": tensor '", p.name, "' has shape ", shape_str(e.shape),
                                        ", but the config (hidden_size ", m.hidden, ", num_attention_heads ", m.heads,
                                        ", num_key_value_heads ", m.kv_heads, ", head_dim ", m.head_size(),
                                        ", intermediate_size ", m.ffn_hidden, ", vocab_size ", m.vocab, ") gives ",
                                        shape_str(p.full_shape)));
    if (!is_floating(e.dtype))
      problems.push_back(detail::concat(src.file_of(p.name), ": tensor '", p.name, "' has dtype ",
                                        dtype_safetensors_name(e.dtype), ", expected F32, BF16 or F16"));
  }
  for (const std::string& n : src.names()) {
    if (expected.count(n) || llama_ignorable(n)) continue;
    if (n == kLmHead && m.tied_embeddings() && src.contains(kLlamaEmbedding)) {
      const Tensor a = src.get(n), b = src.get(kLlamaEmbedding);
      const bool same = a.shape() == b.shape() && a.to_float_vector() == b.to_float_vector();
      if (!same)
        problems.push_back(detail::concat(src.file_of(n), ": tensor 'lm_head.weight' differs from '", kLlamaEmbedding,
                                          "' but the config ties them (tie_word_embeddings)"));
      continue;
    }
    int64_t layer = -1;
    if (starts_with(n, "model.layers.")) layer = std::atoll(n.c_str() + std::strlen("model.layers."));
    problems.push_back(detail::concat(src.file_of(n), ": extra tensor '", n, "' (",
                                      dtype_safetensors_name(src.entry(n).dtype), shape_str(src.entry(n).shape), ")",
                                      layer >= m.layers ? detail::concat(": num_hidden_layers is ", m.layers) : "",
                                      " is not part of the model"));
  }
  return problems;
}

}  // namespace

std::vector<std::string> hf_tensor_problems(const TensorSource& src, const ModelConfig& m) {
  if (m.family == "gpt") return gpt::gpt2_problems(src, m);
  return llama_problems(src, m);
}

void check_hf_tensors(const TensorSource& src, const ModelConfig& m) {
  if (m.family == "gpt") {
    gpt::check_gpt2(src, m);
    return;
  }
  const std::vector<std::string> problems = llama_problems(src, m);
  if (problems.empty()) return;
  throw_problems(src.path() + ": not a checkpoint of the " + m.family + " model its config describes", problems);
}

void read_hf_tensor(const TensorSource& src, const ModelConfig& m, const std::string& name, Tensor& dst) {
  if (m.family == "gpt") {
    gpt::read_gpt2_tensor(src, name, dst);
    return;
  }
  src.read_into(name, dst);
}

ModelConfig hf_model_config(const std::string& path, const TensorSource& src, int64_t heads_hint) {
  if (auto c = hf_config_of(path)) return *c;
  // A single file tessera consolidated or exported carries its config.json in its metadata.
  if (auto it = src.metadata().find(llama::kConfigMetadataKey); it != src.metadata().end())
    return llama::config_from_hf(it->second, path + " (its metadata's config)");
  if (src.contains(kLlamaEmbedding))
    throw FormatError(path +
                      ": a Llama-family checkpoint needs the config.json Hugging Face saves beside it "
                      "(num_attention_heads, num_key_value_heads, rope_theta, ... are not in the tensors)");
  ModelConfig m = gpt::infer_gpt2_config(src, heads_hint);
  m.name = path;
  complete_model_config(m);
  return m;
}

bool hf_export_is_file(const std::string& out) {
  std::error_code ec;
  const auto st = fs::status(out, ec);
  return ends_with(out, ".safetensors") || (fs::exists(st) && !fs::is_directory(st));
}

void write_hf_model(const std::string& out, const ModelConfig& m,
                    const std::vector<std::pair<std::string, Tensor>>& tensors, uint64_t max_shard_bytes,
                    const std::string& torch_dtype) {
  const bool single = hf_export_is_file(out);
  if (m.family == "gpt" && single) {
    gpt::write_gpt2_safetensors(out, m, tensors, {{"producer", "tessera train_gpt"}});
    return;
  }
  // Exactly the layout's tensors with their shapes, in its (Hugging Face) order.
  std::map<std::string, const Tensor*> given;
  std::vector<std::string> problems;
  for (const auto& [n, t] : tensors)
    if (!given.emplace(n, &t).second) problems.push_back(detail::concat("tensor '", n, "' given twice"));
  std::vector<std::pair<std::string, Tensor>> ordered;
  uint64_t bytes = 0;
  for (const parallel::layers::Parameter& p : parameter_layout(m, 1, 0)) {
    auto it = given.find(p.name);
    if (it == given.end()) {
      problems.push_back(detail::concat("tensor '", p.name, "' is missing"));
      continue;
    }
    const Tensor& t = *it->second;
    if (!t.defined() || t.shape() != p.full_shape || !is_floating(t.dtype()))
      problems.push_back(detail::concat("tensor '", p.name, "' is ", t.defined() ? t.str() : std::string("undefined"),
                                        ", expected a float tensor of shape ", shape_str(p.full_shape)));
    else
      bytes += t.nbytes();
    ordered.emplace_back(p.name, t);
    given.erase(it);
  }
  for (const auto& kv : given) problems.push_back(detail::concat("extra tensor '", kv.first, "'"));
  if (!problems.empty()) {
    std::ostringstream os;
    os << "write_hf_model(" << out << "):";
    for (const std::string& p : problems) os << "\n  " << p;
    throw InvalidArgument(os.str());
  }
  std::map<std::string, std::string> md = {{"format", "pt"}, {"producer", "tessera"}};
  if (m.family == "llama") md[llama::kConfigMetadataKey] = hf_config_text(m, torch_dtype);
  if (single) {
    parallel::checkpoint::write_safetensors(out, ordered, md);
    return;
  }
  std::error_code ec;
  if (fs::exists(out, ec)) {
    TESSERA_ARG_CHECK(fs::is_directory(out, ec), "--export ", out, " exists and is not a directory");
    TESSERA_ARG_CHECK(fs::is_empty(out, ec), "--export ", out,
                      " is a directory that is not empty (export into a new or empty directory)");
  } else {
    fs::create_directories(out, ec);
    if (ec) throw Error("--export: cannot create directory " + out + ": " + ec.message());
  }
  if (max_shard_bytes == 0 || bytes <= max_shard_bytes) {
    parallel::checkpoint::write_safetensors((fs::path(out) / "model.safetensors").string(), ordered, md);
  } else {
    parallel::checkpoint::write_sharded_safetensors(out, ordered, max_shard_bytes, md, "model");
  }
  // config.json last: a directory with it names a complete model.
  write_file_atomic((fs::path(out) / "config.json").string(), hf_config_text(m, torch_dtype));
}

}  // namespace tessera::parallel::models
