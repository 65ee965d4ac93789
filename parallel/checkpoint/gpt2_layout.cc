#include "parallel/checkpoint/gpt2_layout.h"

#include "parallel/models/gpt/gpt_model.h"
#include "parallel/pipeline/partition.h"
#include "runtime/error.h"

namespace tessera::parallel::checkpoint {

std::vector<parallel::layers::Parameter> gpt2_tp_parameters(const Gpt2Config& c, int tp, int tp_rank) {
  TESSERA_ARG_CHECK(tp >= 1 && tp_rank >= 0 && tp_rank < tp, "bad tp rank ", tp_rank, " of ", tp);
  TESSERA_ARG_CHECK(c.heads > 0 && c.hidden % c.heads == 0, "hidden ", c.hidden, " is not a multiple of heads ",
                    c.heads);
  TESSERA_ARG_CHECK(c.heads % tp == 0, "heads ", c.heads, " do not divide over tp ", tp,
                    " (attention is split by heads)");
  ModelConfig g;
  g.family = "gpt";
  g.vocab = static_cast<int>(c.vocab);
  g.max_seq = static_cast<int>(c.n_positions);
  g.hidden = static_cast<int>(c.hidden);
  g.layers = static_cast<int>(c.layers);
  g.heads = g.kv_heads = static_cast<int>(c.heads);
  g.ffn_hidden = 4 * g.hidden;
  return models::gpt::GptModel::parameter_layout(g, tp, tp_rank);
}

std::vector<int> gpt2_stages(const Gpt2Config& c, int pp, const std::vector<int>& stages) {
  return pipeline::resolve_stages(stages, c.layers, pp);
}

int gpt2_pp_stage(const std::vector<int>& stages, const std::string& name) {
  const std::string h = "transformer.h.";
  if (name.rfind(h, 0) == 0) return pipeline::stage_of_layer(stages, std::stoll(name.substr(h.size())));
  if (name.rfind("transformer.ln_f.", 0) == 0) return static_cast<int>(stages.size()) - 1;
  return 0;  // wte, wpe
}

}  // namespace tessera::parallel::checkpoint
