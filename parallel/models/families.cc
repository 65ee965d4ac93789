#include "parallel/models/families.h"

#include "parallel/models/gpt/hf.h"
#include "parallel/models/gpt/trainer_state.h"
#include "runtime/error.h"

namespace tessera::parallel::models {

std::unique_ptr<checkpoint::ModelLayout> model_layout(const ModelConfig& cfg) {
  if (cfg.family == "gpt") return std::make_unique<gpt::GptLayout>(cfg);
  throw InvalidArgument(
      detail::concat("model '", cfg.name, "': the checkpoint tools have no layout for family '", cfg.family, "' yet"));
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
