#include "parallel/models/gpt/hf.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "parallel/models/hf_config.h"
#include "runtime/files.h"
#include "runtime/library_text.h"

namespace tessera::parallel::models::gpt {

using checkpoint::SafetensorsEntry;
using checkpoint::write_safetensors;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "transformer.";

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Parses "h.<digits>.<rest>"; returns false when `s` does not have that form.
bool parse_layer(const std::string& s, int64_t* layer, std::string* rest) {
  if (!starts_with(s, "h.")) return false;
  size_t i = 2, j = i;
  while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
  if (j == i || j - i > 9 || j >= s.size() || s[j] != '.') return false;
  if (s[i] == '0' && j - i > 1) return false;  // "h.01." is not a layer index
  *layer = std::stoll(s.substr(i, j - i));
  *rest = s.substr(j + 1);
  return true;
}

// The layers held by the tensors under prefix `p` (layers_held: no gaps).
int64_t gpt2_layers_held(const TensorSource& src, const std::string& p) {
  std::set<int64_t> indices;
  for (const std::string& n : src.names()) {
    int64_t layer;
    std::string rest;
    if (starts_with(n, p) && parse_layer(n.substr(p.size()), &layer, &rest)) indices.insert(layer);
  }
  return layers_held(src.path(), indices);
}

// Shape of a per-layer tensor by the part after "h.N."; empty optional-like
// flag when unknown.
bool layer_shape(const ModelConfig& c, const std::string& rest, Shape* out) {
  const int64_t C = c.hidden;
  const int64_t F = c.ffn_hidden;
  if (rest == "ln_1.weight" || rest == "ln_1.bias" || rest == "ln_2.weight" || rest == "ln_2.bias" ||
      rest == "attn.c_proj.bias" || rest == "mlp.c_proj.bias") {
    *out = {C};
  } else if (rest == "attn.c_attn.weight") {
    *out = {C, 3 * C};
  } else if (rest == "attn.c_attn.bias") {
    *out = {3 * C};
  } else if (rest == "attn.c_proj.weight") {
    *out = {C, C};
  } else if (rest == "mlp.c_fc.weight") {
    *out = {C, F};
  } else if (rest == "mlp.c_fc.bias") {
    *out = {F};
  } else if (rest == "mlp.c_proj.weight") {
    *out = {F, C};
  } else {
    return false;
  }
  return true;
}

const char* const kLayerParts[] = {"ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
                                   "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
                                   "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

// "" or "transformer.", whichever the file uses for wte.
std::string stored_prefix(const TensorSource& src) {
  if (src.contains(std::string(kPrefix) + "wte.weight")) return kPrefix;
  if (src.contains("wte.weight")) return "";
  throw FormatError(src.path() +
                    ": no tensor 'transformer.wte.weight' (nor 'wte.weight'): not a Hugging Face GPT-2 checkpoint");
}

// Canonical name -> name without "transformer." (or empty when not prefixed).
std::string strip(const std::string& canonical) {
  return starts_with(canonical, kPrefix) ? canonical.substr(std::strlen(kPrefix)) : std::string();
}

}  // namespace

std::string gpt2_config_str(const ModelConfig& c) {
  return detail::concat("vocab=", c.vocab, " n_positions=", c.max_seq, " hidden=", c.hidden, " layers=", c.layers,
                        " heads=", c.heads);
}

static ModelConfig infer_from_tensors(const TensorSource& src, int64_t heads_hint) {
  const std::string p = stored_prefix(src);
  const std::string& file = src.path();
  auto shape2 = [&](const std::string& n) {
    if (!src.contains(p + n)) throw FormatError(detail::concat(file, ": tensor '", p + n, "' is missing"));
    const Shape& s = src.entry(p + n).shape;
    if (s.size() != 2) {
      throw FormatError(detail::concat(file, ": tensor '", p + n, "' has shape ", shape_str(s), ", expected 2-d"));
    }
    return s;
  };
  Shape wte = shape2("wte.weight"), wpe = shape2("wpe.weight");
  for (int64_t d : {wte[0], wte[1], wpe[0]})
    if (d > (int64_t{1} << 30))
      throw FormatError(detail::concat(file, ": tensor '", p, "wte.weight' or 'wpe.weight' is too large (", d, ")"));
  ModelConfig c = gpt2_config(wte[0], wpe[0], wte[1], 0, 1);
  c.layers = static_cast<int>(gpt2_layers_held(src, p));
  if (c.vocab <= 0 || c.hidden <= 0 || c.max_seq <= 0) {
    throw FormatError(detail::concat(file, ": tensor '", p, c.vocab <= 0 ? "wte" : "wpe", ".weight' has shape ",
                                     shape_str(c.vocab <= 0 || c.hidden <= 0 ? wte : wpe),
                                     "; a GPT-2 needs at least one vocabulary row, position and hidden unit"));
  }
  if (heads_hint > 0) {
    TESSERA_ARG_CHECK(c.hidden % heads_hint == 0, "GPT-2 heads ", heads_hint, " do not divide the hidden size ",
                      c.hidden, " of ", file);
    c.heads = static_cast<int>(heads_hint);
  } else {
    auto it = src.metadata().find("n_head");
    if (it != src.metadata().end()) {
      int64_t h = 0;
      try {
        h = std::stoll(it->second);
      } catch (const std::exception&) {
      }
      if (h <= 0 || c.hidden % h != 0) {
        throw FormatError(
            detail::concat(file, ": metadata n_head '", it->second, "' does not divide hidden ", c.hidden));
      }
      c.heads = static_cast<int>(h);
    } else if (c.hidden % 64 == 0 && c.hidden > 0) {
      c.heads = c.hidden / 64;
    } else {
      throw FormatError(detail::concat(file, ": hidden size ", c.hidden,
                                       " is not a multiple of 64 and the file has no n_head metadata; give the number "
                                       "of heads explicitly"));
    }
  }
  c.kv_heads = c.heads;
  return c;
}

std::vector<std::string> gpt2_tensor_names(const ModelConfig& c) {
  std::vector<std::string> out = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int64_t l = 0; l < c.layers; ++l) {
    for (const char* part : kLayerParts) out.push_back(detail::concat("transformer.h.", l, ".", part));
  }
  out.push_back("transformer.ln_f.weight");
  out.push_back("transformer.ln_f.bias");
  return out;
}

Shape gpt2_tensor_shape(const ModelConfig& c, const std::string& name) {
  const std::string s = strip(name);
  if (s == "wte.weight") return {c.vocab, c.hidden};
  if (s == "wpe.weight") return {c.max_seq, c.hidden};
  if (s == "ln_f.weight" || s == "ln_f.bias") return {c.hidden};
  int64_t layer;
  std::string rest;
  Shape out;
  if (parse_layer(s, &layer, &rest) && layer < c.layers && layer_shape(c, rest, &out)) return out;
  throw InvalidArgument(detail::concat("'", name, "' is not a GPT-2 tensor name for ", gpt2_config_str(c)));
}

std::string gpt2_stored_name(const TensorSource& src, const std::string& name) {
  if (src.contains(name)) return name;
  std::string s = strip(name);
  if (!s.empty() && src.contains(s)) return s;
  throw InvalidArgument(detail::concat("tensor '", name, "' is not in ", src.path()));
}

void read_gpt2_tensor(const TensorSource& src, const std::string& name, Tensor& dst) {
  src.read_into(gpt2_stored_name(src, name), dst);
}

std::vector<std::string> gpt2_problems(const TensorSource& src, const ModelConfig& c) {
  std::vector<std::string> problems;
  const std::string& file = src.path();
  std::string p;
  try {
    p = stored_prefix(src);
  } catch (const FormatError& e) {
    return {e.what()};
  }
  // More layers in the config than in the file: one problem, found before
  // laying the model out (n_layer 10^6 would list 12 x 10^6 missing tensors).
  int64_t held = 0;
  try {
    held = gpt2_layers_held(src, p);
  } catch (const FormatError& e) {
    return {e.what()};
  }
  if (c.layers > held)
    return {detail::concat(file, ": the config gives n_layer ", c.layers, ", but the weights hold ",
                           held == 0 ? std::string("no layer") : detail::concat("layers 0 to ", held - 1))};
  std::set<std::string> expected;
  for (const std::string& canon : gpt2_tensor_names(c)) {
    const std::string stored = p.empty() ? strip(canon) : canon;
    expected.insert(stored);
    if (!src.contains(stored)) {
      problems.push_back(detail::concat(file, ": tensor '", stored, "' is missing"));
      continue;
    }
    const SafetensorsEntry& e = src.entry(stored);
    const Shape want = gpt2_tensor_shape(c, canon);
    if (e.shape != want) {
      problems.push_back(detail::concat(src.file_of(stored), ": tensor '", stored, "' has shape ", shape_str(e.shape),
                                        ", expected ", shape_str(want), " for ", gpt2_config_str(c)));
    }
    if (!is_floating(e.dtype)) {
      problems.push_back(detail::concat(src.file_of(stored), ": tensor '", stored, "' has dtype ",
                                        dtype_safetensors_name(e.dtype), ", expected F32, BF16 or F16"));
    }
  }
  for (const std::string& n : src.names()) {
    if (expected.count(n)) continue;
    int64_t layer;
    std::string rest;
    // transformers ignores the causal-mask buffers some GPT-2 files carry.
    if (starts_with(n, p) && parse_layer(n.substr(p.size()), &layer, &rest) && layer < c.layers &&
        (rest == "attn.bias" || rest == "attn.masked_bias")) {
      continue;
    }
    if (n == "lm_head.weight") {
      // Tied to wte: fine when it is the same matrix, an error when it is not (it would be lost).
      const std::string wte = p + "wte.weight";
      const SafetensorsEntry& e = src.entry(n);
      bool same = false;
      if (src.contains(wte)) {
        const SafetensorsEntry& w = src.entry(wte);
        if (e.shape == w.shape) {
          Tensor a = src.get(n), b = src.get(wte);
          same = a.dtype() == b.dtype() ? std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0
                                        : a.to_float_vector() == b.to_float_vector();
        }
      }
      if (!same) {
        problems.push_back(detail::concat(src.file_of(n), ": tensor 'lm_head.weight' differs from '", wte,
                                          "'; tessera ties the LM head to the token embedding"));
      }
      continue;
    }
    problems.push_back(detail::concat(src.file_of(n), ": extra tensor '", n, "' (",
                                      dtype_safetensors_name(src.entry(n).dtype), shape_str(src.entry(n).shape),
                                      ") is not part of GPT-2 with ", gpt2_config_str(c)));
  }
  return problems;
}

void check_gpt2(const TensorSource& src, const ModelConfig& c) {
  std::vector<std::string> problems = gpt2_problems(src, c);
  if (problems.empty()) return;
  throw_problems(src.path() + ": not a GPT-2 checkpoint for " + gpt2_config_str(c), problems);
}

void write_gpt2_safetensors(const std::string& path, const ModelConfig& c,
                            const std::vector<std::pair<std::string, Tensor>>& tensors,
                            const std::map<std::string, std::string>& extra_metadata) {
  std::map<std::string, const Tensor*> given;
  std::vector<std::string> problems;
  for (const auto& [n, t] : tensors) {
    if (!given.emplace(n, &t).second) problems.push_back(detail::concat("tensor '", n, "' given twice"));
  }
  std::vector<std::pair<std::string, Tensor>> ordered;
  for (const std::string& n : gpt2_tensor_names(c)) {
    auto it = given.find(n);
    if (it == given.end()) {
      problems.push_back(detail::concat("tensor '", n, "' is missing"));
      continue;
    }
    const Tensor& t = *it->second;
    Shape want = gpt2_tensor_shape(c, n);
    if (!t.defined() || t.shape() != want || !is_floating(t.dtype())) {
      problems.push_back(detail::concat("tensor '", n, "' is ", t.defined() ? t.str() : std::string("undefined"),
                                        ", expected a float tensor of shape ", shape_str(want)));
    }
    ordered.emplace_back(n, t);
    given.erase(it);
  }
  for (const auto& kv : given) problems.push_back(detail::concat("extra tensor '", kv.first, "'"));
  if (!problems.empty()) {
    std::ostringstream os;
    os << "write_gpt2_safetensors(" << path << ") for " << gpt2_config_str(c) << ":";
    for (const std::string& pr : problems) os << "\n  " << pr;
    throw InvalidArgument(os.str());
  }
  std::map<std::string, std::string> md = extra_metadata;
  for (const auto& [k, v] : gpt2_file_metadata(c)) md[k] = v;
  write_safetensors(path, ordered, md);
}

ModelConfig gpt2_config(int64_t vocab, int64_t n_positions, int64_t hidden, int64_t layers, int64_t heads) {
  ModelConfig c;
  c.name = "gpt2";
  c.family = "gpt";
  c.vocab = static_cast<int>(vocab);
  c.max_seq = static_cast<int>(n_positions);
  c.hidden = static_cast<int>(hidden);
  c.layers = static_cast<int>(layers);
  c.heads = static_cast<int>(heads);
  c.kv_heads = c.heads;
  c.ffn_hidden = 4 * c.hidden;
  return c;
}

std::string hf_config_json(const ModelConfig& c, const std::string& torch_dtype) {
  json j = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", c.vocab},
            {"n_positions", c.max_seq},
            {"n_ctx", c.max_seq},
            {"n_embd", c.hidden},
            {"n_layer", c.layers},
            {"n_head", c.heads},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", c.norm_eps},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", true},
            {"torch_dtype", torch_dtype}};
  if (c.ffn_hidden != 4 * c.hidden) j["n_inner"] = c.ffn_hidden;
  models::add_hf_extra(j, c.hf_extra);
  return j.dump(2) + "\n";
}

ModelConfig config_from_hf_json(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // syntax, or a number out of range (out_of_range.406)
    throw FormatError(detail::concat(where, ": not valid JSON: ", json_library_text(e)));
  }
  if (!j.is_object()) throw FormatError(detail::concat(where, ": expected a JSON object"));
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    throw FormatError(detail::concat(where, ": model_type ", j["model_type"].dump(), " is not \"gpt2\""));
  auto get = [&](const char* k, int64_t fallback) -> int64_t {
    if (!j.contains(k)) {
      if (fallback >= 0) return fallback;
      throw FormatError(detail::concat(where, ": field '", k, "' is missing"));
    }
    if (!j[k].is_number_integer() || j[k].get<int64_t>() <= 0 || j[k].get<int64_t>() > (int64_t{1} << 30))
      throw FormatError(detail::concat(where, ": field '", k, "' must be a positive integer, not ", j[k].dump()));
    return j[k].get<int64_t>();
  };
  const int64_t n_pos = j.contains("n_positions") ? get("n_positions", -1) : get("n_ctx", -1);
  ModelConfig c = gpt2_config(get("vocab_size", -1), n_pos, get("n_embd", -1), get("n_layer", -1), get("n_head", -1));
  if (j.contains("n_inner") && !j["n_inner"].is_null()) c.ffn_hidden = static_cast<int>(get("n_inner", -1));
  // What tessera's GPT-2 would compute differently (transformers' GPT2Config fields).
  if (auto it = j.find("activation_function"); it != j.end() && *it != "gelu_new")
    throw FormatError(detail::concat(where, ": field 'activation_function' is ", it->dump(),
                                     "; tessera's GPT-2 computes gelu_new (the tanh GELU)"));
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (auto it = j.find(key); it != j.end() && *it == true)
      throw FormatError(detail::concat(where, ": field '", key, "' is true; tessera does not compute it"));
  if (auto it = j.find("scale_attn_weights"); it != j.end() && *it == false)
    throw FormatError(detail::concat(where,
                                     ": field 'scale_attn_weights' is false; tessera scales attention by "
                                     "1/sqrt(head size)"));
  if (j.contains("layer_norm_epsilon")) {
    if (!j["layer_norm_epsilon"].is_number() || !(j["layer_norm_epsilon"].get<double>() > 0))
      throw FormatError(detail::concat(where, ": field 'layer_norm_epsilon' must be a positive number"));
    c.norm_eps = j["layer_norm_epsilon"].get<double>();
  }
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"] != true)
    throw FormatError(detail::concat(where, ": field 'tie_word_embeddings' is ", j["tie_word_embeddings"].dump(),
                                     "; tessera's GPT ties the LM head to the token embedding"));
  if (c.hidden % c.heads != 0)
    throw FormatError(
        detail::concat(where, ": field 'n_head' (", c.heads, ") does not divide 'n_embd' (", c.hidden, ")"));
  // Kept from the source: every key hf_config_json does not write (bos/eos ids, initializer_range, ...).
  c.hf_extra = models::hf_extra_of(j, models::hf_config_keys(hf_config_json(c)));
  return c;
}

std::string hf_config_path(const std::string& source_path) {
  return models::hf_config_path(source_path).value_or(std::string());
}

ModelConfig infer_gpt2_config(const TensorSource& src, int64_t heads_hint) {
  const std::string cfg = hf_config_path(src.path());
  if (cfg.empty()) return infer_from_tensors(src, heads_hint);
  ModelConfig c = config_from_hf_json(read_regular_file(cfg, 1 << 20), cfg);
  TESSERA_ARG_CHECK(heads_hint <= 0 || heads_hint == c.heads, "--heads ", heads_hint, " disagrees with ", cfg,
                    ", whose n_head is ", c.heads);
  return c;
}

bool gpt2_file_records_heads(const TensorSource& src) {
  return !hf_config_path(src.path()).empty() || src.metadata().count("n_head") > 0;
}

std::map<std::string, std::string> gpt2_file_metadata(const ModelConfig& c) {
  return {{"format", "pt"},
          {"n_embd", std::to_string(c.hidden)},
          {"n_head", std::to_string(c.heads)},
          {"n_layer", std::to_string(c.layers)},
          {"n_positions", std::to_string(c.max_seq)},
          {"vocab_size", std::to_string(c.vocab)}};
}

std::vector<parallel::layers::Parameter> gpt_layout(const ModelConfig& c, int tp, int tp_rank) {
  TESSERA_ARG_CHECK(tp >= 1 && tp_rank >= 0 && tp_rank < tp, "bad tp rank ", tp_rank, " of ", tp);
  TESSERA_ARG_CHECK(c.heads > 0 && c.hidden % c.heads == 0, "hidden ", c.hidden, " is not a multiple of heads ",
                    c.heads);
  TESSERA_ARG_CHECK(c.heads % tp == 0, "heads ", c.heads, " do not divide over tp ", tp,
                    " (attention is split by heads)");
  return GptModel::parameter_layout(c, tp, tp_rank);
}

HfGpt2 open_hf_gpt2(const TensorSource& src, int64_t heads_hint) {
  const ModelConfig c = infer_gpt2_config(src, heads_hint);
  check_gpt2(src, c);
  HfGpt2 out;
  for (const std::string& n : gpt2_tensor_names(c)) out.stored[n] = gpt2_stored_name(src, n);
  out.layout = std::make_unique<GptLayout>(c);
  return out;
}

}  // namespace tessera::parallel::models::gpt
