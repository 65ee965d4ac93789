#include "parallel/models/families.h"

#include "parallel/models/gpt/hf.h"
#include "parallel/models/gpt/trainer_state.h"
#include "parallel/models/hf_config.h"
#include "parallel/models/hf_io.h"
#include "parallel/models/llama/hf.h"
#include "runtime/error.h"

namespace tessera::parallel::models {

std::unique_ptr<checkpoint::ModelLayout> model_layout(const ModelConfig& cfg) {
  if (cfg.family == "gpt") return std::make_unique<gpt::GptLayout>(cfg);
  if (cfg.family == "llama") return std::make_unique<llama::LlamaLayout>(cfg);
  throw InvalidArgument(
      detail::concat(cfg.label(), ": the checkpoint tools have no layout for family '", cfg.family, "' yet"));
}

checkpoint::ModelFamilies model_families() {
  checkpoint::ModelFamilies f;
  f.layout = [](const std::string& model_json, const std::string& where) {
    const ModelConfig cfg = ModelConfig::from_json_text(model_json, where + " (the manifest's model)");
    try {
      return model_layout(cfg);
    } catch (const InvalidArgument& e) {
      throw FormatError(detail::concat(where, ": ", e.what()));
    }
  };
  f.from_hf = [](const checkpoint::TensorSource& src, int64_t heads_hint) {
    // config.json, when there is one, names the family; a GPT-2 file without one is read from its shapes.
    if (const ModelConfig c = hf_model_config(src.path(), src, heads_hint); c.family == "llama") {
      TESSERA_ARG_CHECK(heads_hint <= 0 || heads_hint == c.heads, "--heads ", heads_hint, " disagrees with ",
                        src.path(), "'s config, whose num_attention_heads is ", c.heads);
      check_hf_tensors(src, c);
      checkpoint::HfModel out;
      out.layout = std::make_unique<llama::LlamaLayout>(c);
      for (const auto& p : out.layout->tensors(1, 0)) out.stored[p.name] = p.name;
      return out;
    }
    gpt::HfGpt2 m = gpt::open_hf_gpt2(src, heads_hint);
    checkpoint::HfModel out;
    out.layout = std::move(m.layout);
    out.stored = std::move(m.stored);
    return out;
  };
  f.relayout_state = [](const std::string& state, const checkpoint::Layout& l, const std::string& where) {
    return gpt::relayout_trainer_state(state, l.tp, l.dp, l.pp, where);
  };
  return f;
}

}  // namespace tessera::parallel::models
