#include "parallel/models/causal_lm.h"

#include <cstring>
#include <limits>
#include <set>

#include "parallel/layers/buffer.h"
#include "parallel/layers/embedding.h"
#include "parallel/layers/kv_cache.h"
#include "parallel/models/gpt/gpt_model.h"
#include "parallel/models/llama/llama_model.h"
#include "runtime/error.h"
#include "runtime/kernels.h"

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

int64_t CausalLM::check_cached_inputs(const parallel::layers::ParallelState& ps, parallel::layers::KvCache& cache,
                                      const int32_t* tokens, const std::vector<int>& slots,
                                      const std::vector<int64_t>& lens, CachedBuffers& b) const {
  const ModelConfig& cfg = config();
  TESSERA_ARG_CHECK(has_embedding() && has_head(), "forward_cached runs the whole model (pp 1), not a pipeline stage");
  TESSERA_ARG_CHECK(!ps.sp(), "forward_cached runs without sequence parallelism");
  TESSERA_ARG_CHECK(!slots.empty() && slots.size() == lens.size(), "forward_cached: ", slots.size(),
                    " cache slots for ", lens.size(), " sequences");
  TESSERA_ARG_CHECK(cache.layers() == num_layers() && cache.kv_width() == kv_cache_width(cfg, ps.tp_size),
                    "forward_cached: a KV cache of ", cache.layers(), " layers x ", cache.kv_width(),
                    " for a model of ", num_layers(), " x ", kv_cache_width(cfg, ps.tp_size));
  b.positions.clear();
  b.last_rows.clear();
  std::set<int> seen;
  int64_t row = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int slot = slots[i];
    TESSERA_ARG_CHECK(slot >= 0 && slot < cache.slots() && seen.insert(slot).second, "sequence ", i, ": cache slot ",
                      slot, " is not one of the cache's ", cache.slots(), " or is taken twice");
    const int64_t n = lens[i], past = cache.length(slot);
    TESSERA_ARG_CHECK(n >= 1, "sequence ", i, ": ", n, " new tokens");
    TESSERA_ARG_CHECK(past + n <= cfg.max_seq, "sequence ", i, ": ", past, " cached + ", n, " new tokens = ", past + n,
                      " exceed model '", cfg.name, "''s context of ", cfg.max_seq);
    TESSERA_ARG_CHECK(past + n <= cache.capacity(slot), "sequence ", i, ": ", past, " cached + ", n,
                      " new tokens exceed its KV cache slot of ", cache.capacity(slot), " tokens");
    for (int64_t j = 0; j < n; ++j, ++row) {
      const int32_t t = tokens[row];
      TESSERA_ARG_CHECK(t >= 0 && t < cfg.vocab, "sequence ", i, ": token id ", t, " out of the vocabulary [0, ",
                        cfg.vocab, ")");
      b.positions.push_back(past + j);
    }
    b.last_rows.push_back(row - 1);
  }
  return row;
}

const float* CausalLM::cached_head_rows(const parallel::layers::ParallelState& ps, const float* x, int64_t n,
                                        bool all_rows, CachedBuffers& b, int64_t* rows) const {
  const int64_t c = config().hidden;
  *rows = all_rows ? n : static_cast<int64_t>(b.last_rows.size());
  if (all_rows) return x;
  float* sel = parallel::layers::ensure_buffer(b.head_in, ps.device, *rows * c);
  for (int64_t r = 0; r < *rows; ++r)
    std::memcpy(sel + r * c, x + b.last_rows[static_cast<size_t>(r)] * c, sizeof(float) * static_cast<size_t>(c));
  return sel;
}

const float* CausalLM::cached_logits(const parallel::layers::ParallelState& ps,
                                     parallel::layers::VocabParallelEmbedding& head, const float* normed, int64_t rows,
                                     CachedBuffers& b) const {
  const int64_t shard = vocab_shard(config(), ps.tp_size), vv = head.vocab_valid(), c = config().hidden;
  float* logits = parallel::layers::ensure_buffer(b.logits, ps.device, rows * shard);
  if (vv > 0)
    kern::gemm(ps.device, false, true, rows, vv, c, 1.f, normed, c, head.weight().value, c, 0.f, logits, shard);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = vv; j < shard; ++j) logits[r * shard + j] = -std::numeric_limits<float>::infinity();
  return logits;
}

std::string model_differences(const ModelConfig& a, const ModelConfig& b, const std::string& a_name,
                              const std::string& b_name) {
  std::string diff;
  auto cmp = [&](const char* what, int64_t x, int64_t y) {
    if (x != y) diff += detail::concat("\n  ", what, ": ", a_name, " has ", x, ", ", b_name, " ", y);
  };
  cmp("vocab", a.vocab, b.vocab);
  cmp("context (max_seq)", a.max_seq, b.max_seq);
  cmp("hidden", a.hidden, b.hidden);
  cmp("layers", a.layers, b.layers);
  cmp("heads", a.heads, b.heads);
  cmp("kv_heads", a.kv_heads, b.kv_heads);
  cmp("ffn_hidden", a.ffn_hidden, b.ffn_hidden);
  cmp("head size", a.head_size(), b.head_size());
  cmp("tied embeddings", a.tied_embeddings(), b.tied_embeddings());
  if (a.family != b.family)
    diff += detail::concat("\n  family: ", a_name, " has ", a.family, ", ", b_name, " ", b.family);
  return diff;
}

int64_t vocab_shard(const ModelConfig& cfg, int tp) { return (cfg.vocab + tp - 1) / tp; }

int64_t kv_cache_width(const ModelConfig& cfg, int tp) {
  ModelConfig c = cfg;
  complete_model_config(c);
  return std::max(1, c.kv_heads / tp) * static_cast<int64_t>(c.head_size());
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
    // In 64 bits: 4 x a hidden size above 2^29 does not fit an int (it wrapped
    // negative, and the message said a positive flag was not).
    const int64_t f =
        cfg.family == "llama" ? ((int64_t{8} * cfg.hidden + 2) / 3 + 63) / 64 * 64 : int64_t{4} * cfg.hidden;
    TESSERA_ARG_CHECK(f <= std::numeric_limits<int>::max(), "hidden ", cfg.hidden, " is too large: its MLP width ", f,
                      " (", cfg.family == "llama" ? "8/3" : "4", " x hidden) exceeds ",
                      std::numeric_limits<int>::max());
    cfg.ffn_hidden = static_cast<int>(f);
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
