#include "parallel/models/causal_lm.h"

#include "parallel/models/gpt/gpt_model.h"
#include "parallel/models/llama/llama_model.h"
#include "runtime/error.h"

namespace tessera::parallel::models {

void CausalLM::check_tp_rank(int tp, int tp_rank) {
  TESSERA_ARG_CHECK(tp >= 1 && tp_rank >= 0 && tp_rank < tp, "bad tp rank ", tp_rank, " of ", tp);
}

void CausalLM::check_stage_inputs(const parallel::layers::ParallelState& ps, int vstage, const int32_t* inputs,
                                  const int32_t* targets, const float* act_in, int64_t batch, int64_t seq) const {
  const ModelConfig& cfg = config();
  TESSERA_ARG_CHECK(seq >= 1 && seq <= cfg.max_seq, "sequence length ", seq, " exceeds the model context ",
                    cfg.max_seq);
  const int64_t n = batch * seq;
  TESSERA_ARG_CHECK(!ps.sp() || n % ps.tp_size == 0, "sequence parallelism needs batch*seq (", n, ") divisible by tp ",
                    ps.tp_size);
  const bool embed = has_embedding(), head = has_head();
  for (int64_t i = 0; i < n; ++i) {
    TESSERA_ARG_CHECK(!embed || (inputs[i] >= 0 && inputs[i] < cfg.vocab), "token id ", inputs[i],
                      " out of the vocabulary [0, ", cfg.vocab, ") at position ", i);
    TESSERA_ARG_CHECK(!head || (targets[i] >= 0 && targets[i] < cfg.vocab), "target id ", targets[i],
                      " out of the vocabulary [0, ", cfg.vocab, ") at position ", i);
  }
  TESSERA_ARG_CHECK(embed || act_in != nullptr, "forward_stage: virtual stage ", vstage,
                    " needs the previous stage's activation");
}

ModelConfig default_train_model() {
  ModelConfig m;
  m.name = "train_gpt";
  m.family = "gpt";
  m.vocab = 256;
  m.max_seq = 256;
  m.hidden = 384;
  m.layers = 6;
  m.heads = 6;
  return m;
}

void complete_model_config(ModelConfig& cfg) {
  if (cfg.kv_heads <= 0) cfg.kv_heads = cfg.heads;
  if (cfg.ffn_hidden <= 0) {
    if (cfg.family == "llama") {
      const int64_t f = (int64_t{8} * cfg.hidden + 2) / 3;
      cfg.ffn_hidden = static_cast<int>((f + 63) / 64 * 64);
    } else {
      cfg.ffn_hidden = 4 * cfg.hidden;
    }
  }
  cfg.validate();
}

void validate_layout(const ModelConfig& config, int tp) {
  TESSERA_ARG_CHECK(tp >= 1, "--tp must be >= 1");
  ModelConfig cfg = config;
  complete_model_config(cfg);
  if (cfg.family == "gpt") {
    gpt::validate_gpt(cfg, tp);
    return;
  }
  llama::LlamaModel::validate(cfg, tp);
}

int kv_replicas(const ModelConfig& cfg, int tp) {
  return cfg.family == "llama" ? llama::LlamaModel::kv_replicas(cfg, tp) : 1;
}

double train_flops_per_token(const ModelConfig& cfg) {
  return 6.0 * static_cast<double>(cfg.total_params()) + 12.0 * cfg.layers * cfg.max_seq * cfg.q_dim();
}

std::unique_ptr<CausalLM> make_causal_lm(const ModelConfig& cfg, const parallel::layers::ParallelState& ps,
                                         const std::vector<int>& stages, int chunk, int chunks) {
  validate_layout(cfg, ps.tp_size);
  if (cfg.family == "llama") return std::make_unique<llama::LlamaModel>(cfg, ps, stages, chunk, chunks);
  return std::make_unique<gpt::GptModel>(cfg, ps, stages, chunk, chunks);
}

std::vector<parallel::layers::Parameter> parameter_layout(const ModelConfig& cfg, int tp, int tp_rank) {
  validate_layout(cfg, tp);
  if (cfg.family == "llama") return llama::LlamaModel::parameter_layout(cfg, tp, tp_rank);
  return gpt::GptModel::parameter_layout(cfg, tp, tp_rank);
}

}  // namespace tessera::parallel::models
