#include "parallel/checkpoint/gpt2_layout.h"

#include "parallel/layers/embedding.h"
#include "parallel/layers/linear.h"
#include "parallel/layers/parallel_state.h"
#include "runtime/error.h"

namespace tessera::parallel::checkpoint {

std::vector<parallel::layers::Parameter> gpt2_tp_parameters(const Gpt2Config& c, int tp, int tp_rank) {
  TESSERA_ARG_CHECK(tp >= 1 && tp_rank >= 0 && tp_rank < tp, "bad tp rank ", tp_rank, " of ", tp);
  TESSERA_ARG_CHECK(c.heads > 0 && c.hidden % c.heads == 0, "hidden ", c.hidden, " is not a multiple of heads ",
                    c.heads);
  TESSERA_ARG_CHECK(c.heads % tp == 0, "heads ", c.heads, " do not divide over tp ", tp,
                    " (attention is split by heads)");
  // Layer constructors only read the sizes and ranks: no device, no communicators.
  parallel::layers::ParallelState ps;
  ps.tp_size = tp;
  ps.tp_rank = tp_rank;
  auto replicated = [&](const std::string& name, Shape shape) {
    return parallel::layers::make_parameter(name, std::move(shape), -1, 1, tp, tp_rank, parallel::layers::Init::Zeros, 0, false);
  };
  std::vector<parallel::layers::Parameter> v;
  v.push_back(parallel::layers::VocabParallelEmbedding("transformer.wte.weight", c.vocab, c.hidden, ps, 0.02f).weight());
  v.push_back(replicated("transformer.wpe.weight", {c.n_positions, c.hidden}));
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i);
    parallel::layers::ColumnParallelLinear qkv(p + ".attn.c_attn", c.hidden, 3 * c.hidden, 3, ps, 0.02f);
    parallel::layers::RowParallelLinear proj(p + ".attn.c_proj", c.hidden, c.hidden, ps, 0.02f);
    parallel::layers::ColumnParallelLinear fc(p + ".mlp.c_fc", c.hidden, 4 * c.hidden, 1, ps, 0.02f);
    parallel::layers::RowParallelLinear mproj(p + ".mlp.c_proj", 4 * c.hidden, c.hidden, ps, 0.02f);
    v.push_back(replicated(p + ".ln_1.weight", {c.hidden}));
    v.push_back(replicated(p + ".ln_1.bias", {c.hidden}));
    v.push_back(qkv.weight());
    v.push_back(qkv.bias());
    v.push_back(proj.weight());
    v.push_back(proj.bias());
    v.push_back(replicated(p + ".ln_2.weight", {c.hidden}));
    v.push_back(replicated(p + ".ln_2.bias", {c.hidden}));
    v.push_back(fc.weight());
    v.push_back(fc.bias());
    v.push_back(mproj.weight());
    v.push_back(mproj.bias());
  }
  v.push_back(replicated("transformer.ln_f.weight", {c.hidden}));
  v.push_back(replicated("transformer.ln_f.bias", {c.hidden}));
  return v;
}

int64_t gpt2_stage_first_layer(const Gpt2Config& c, int pp, int s) { return s * c.layers / pp; }

int gpt2_pp_stage(const Gpt2Config& c, int pp, const std::string& name) {
  const std::string h = "transformer.h.";
  if (name.rfind(h, 0) == 0) {
    int64_t layer = std::stoll(name.substr(h.size()));
    for (int s = 0; s < pp; ++s)
      if (layer < gpt2_stage_first_layer(c, pp, s + 1)) return s;
    TESSERA_ARG_CHECK(false, name, ": layer ", layer, " out of range");
  }
  if (name.rfind("transformer.ln_f.", 0) == 0) return pp - 1;
  return 0;  // wte, wpe
}

}  // namespace tessera::parallel::checkpoint
