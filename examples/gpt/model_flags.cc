#include "examples/gpt/model_flags.h"

#include <algorithm>
#include <filesystem>

#include "parallel/models/hf_config.h"
#include "runtime/error.h"

namespace tessera::gpt {

namespace fs = std::filesystem;

parallel::ModelConfig resolve_model_arg(const std::string& model) { return parallel::models::load_model(model); }

void agree_model_flags(const parallel::ModelConfig& flags, const parallel::ModelConfig& source,
                       const std::string& where, const std::function<bool(const char*)>& given) {
  auto agree = [&](const char* flag, auto value, auto theirs) {
    TESSERA_ARG_CHECK(!given(flag) || value == theirs, flag, " ", value, " does not match ", where, ", which has ",
                      theirs);
  };
  agree("--family", flags.family, source.family);
  agree("--layers", flags.layers, source.layers);
  agree("--hidden", flags.hidden, source.hidden);
  agree("--heads", flags.heads, source.heads);
  agree("--kv-heads", flags.kv_heads, source.kv_heads);
  agree("--ffn-hidden", flags.ffn_hidden, source.ffn_hidden);
  agree("--vocab", flags.vocab, source.vocab);
  agree("--rope-theta", flags.rope_theta, source.rope_theta);
  if (given("--tie-embeddings"))
    TESSERA_ARG_CHECK(source.tied_embeddings(), "--tie-embeddings does not match ", where, ", whose LM head is untied");
}

void apply_model_flags(parallel::models::gpt::TrainOptions& t, const std::string& model, const std::string& family,
                       const std::function<bool(const char*)>& given) {
  if (model.empty()) {
    t.model.family = family;
    return;
  }
  parallel::ModelConfig m = resolve_model_arg(model);
  parallel::ModelConfig flags = t.model;
  flags.family = family;
  agree_model_flags(flags, m, "--model " + model, given);
  if (!given("--seq")) t.seq = std::min<int64_t>(t.seq, m.max_seq);
  t.model = m;
}

}  // namespace tessera::gpt
