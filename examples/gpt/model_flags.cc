#include "examples/gpt/model_flags.h"

#include <algorithm>
#include <filesystem>

#include "parallel/models/hf_config.h"
#include "runtime/error.h"

namespace tessera::gpt {

namespace fs = std::filesystem;

parallel::ModelConfig resolve_model_arg(const std::string& model) {
  if (auto hf = parallel::models::hf_config_of(model)) return *hf;
  return parallel::ModelConfig::load(model);
}

void apply_model_flags(parallel::models::gpt::TrainOptions& t, const std::string& model, const std::string& family,
                       const std::function<bool(const char*)>& given) {
  if (model.empty()) {
    t.model.family = family;
    return;
  }
  parallel::ModelConfig m = resolve_model_arg(model);
  auto agree = [&](const char* flag, auto value, auto from_model) {
    TESSERA_ARG_CHECK(!given(flag) || value == from_model, flag, " ", value, " does not match --model ", model,
                      ", which has ", from_model);
  };
  agree("--family", family, m.family);
  agree("--layers", t.model.layers, m.layers);
  agree("--hidden", t.model.hidden, m.hidden);
  agree("--heads", t.model.heads, m.heads);
  agree("--kv-heads", t.model.kv_heads, m.kv_heads);
  agree("--ffn-hidden", t.model.ffn_hidden, m.ffn_hidden);
  agree("--vocab", t.model.vocab, m.vocab);
  agree("--rope-theta", t.model.rope_theta, m.rope_theta);
  if (given("--tie-embeddings"))
    TESSERA_ARG_CHECK(m.tied_embeddings(), "--tie-embeddings does not match --model ", model,
                      ", whose LM head is untied");
  if (!given("--seq")) t.seq = std::min<int64_t>(t.seq, m.max_seq);
  t.model = m;
}

}  // namespace tessera::gpt
