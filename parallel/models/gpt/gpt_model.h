// GptModel: GPT-2 exactly (learned positions, pre-LayerNorm blocks with eps
// 1e-5, causal multi-head attention, 4x MLP with tanh-GELU, final LayerNorm,
// LM head tied to the token embedding, no dropout), tensor parallel as
// Megatron-LM: fused QKV column-parallel split by heads, attention output
// and MLP down projections row-parallel, vocab-parallel embedding and
// cross-entropy, optional sequence parallelism.
//
// The config is the one ModelConfig (family "gpt"; max_seq is the context,
// the wpe rows; ffn_hidden the MLP width, 4 x hidden for GPT-2; norm_eps the
// LayerNorm eps). fp32 throughout; forward and backward are explicit (no autograd). Every
// activation lives in buffers allocated once on the rank's Device and reused
// across steps. Parameter names are Hugging Face GPT-2's.
//
// Use: construct, bind the parameters (DistributedOptimizer or ParamBinder),
// init(seed) or load; then per micro-batch forward() and backward().
// Not thread-safe. The ParallelState must outlive the model.
//
// Pipeline parallelism (ps.pp_size > 1): the model holds only its stage. The
// blocks split into pp stages by parallel/pipeline/partition.h (resolve_stages:
// `stages` when given, else stage_layers); the first stage holds wte and wpe,
// the last ln_f and a copy of wte for the tied LM head (the two copies start
// equal and their gradients are summed over ps.embed before each update, so
// they stay equal). Blocks keep their global names (transformer.h.<layer>).
// With v virtual stages per rank (interleaved schedules) a rank holds v
// models, one per chunk: chunk c of rank r is virtual stage c pp + r of
// pp v, whose layers `stages` (pp v entries) gives; the embeddings belong to
// virtual stage 0, the head to the last.
// Stages run forward_stage()/backward_stage() per micro-batch under a
// schedule (parallel/pipeline/executor.h); several micro-batches can be in
// flight, each in its own activation slot. A slot is a copy of the stage's
// layers whose Parameters alias slot 0's values and gradients (bound by the
// optimizer before the first forward), created on first use and reused.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "parallel/layers/embedding.h"
#include "parallel/layers/linear.h"
#include "parallel/layers/parallel_state.h"
#include "parallel/model_config.h"
#include "parallel/models/causal_lm.h"

namespace tessera::parallel::models::gpt {

// Throws InvalidArgument naming the offending value when `cfg` is not a GPT
// this implementation holds under `tp` (family, sizes, heads over tp).
void validate_gpt(const ModelConfig& cfg, int tp);

class GptModel : public CausalLM {
 public:
  // stages: layers per (virtual) pipeline stage (ps.pp_size x chunks
  // entries; empty: stage_layers); this model is chunk `chunk` of `chunks`.
  GptModel(const ModelConfig& cfg, const parallel::layers::ParallelState& ps, const std::vector<int>& stages = {},
           int chunk = 0, int chunks = 1);
  ~GptModel() override;

  const ModelConfig& config() const override { return cfg_; }
  // Every parameter this stage holds, in Hugging Face order (the whole
  // model when pp_size == 1).
  std::vector<parallel::layers::Parameter*> parameters() override;
  // Layers per stage and this stage's layers [first_layer, first_layer + num_layers).
  const std::vector<int>& stages() const override { return stages_; }
  int64_t first_layer() const override { return first_layer_; }
  int64_t num_layers() const override { return static_cast<int64_t>(blocks_.size()); }
  bool has_embedding() const override { return embed_; }
  bool has_head() const override { return head_; }
  // The token embedding (on the first stage) or its tied copy (on the last);
  // nullptr on the stages in between.
  parallel::layers::Parameter* wte();
  parallel::layers::Parameter* tied_embedding() override { return wte(); }
  // Every parameter TP rank `tp_rank` of `tp` holds, in parameters() order,
  // unbound (value == nullptr): name, full shape, shard shape, split dim and
  // chunks as this model's layers build them. The checkpoint layout
  // (parallel/checkpoint/gpt2_layout.h) is this. Throws InvalidArgument like
  // the constructor. Pure; thread-safe.
  static std::vector<parallel::layers::Parameter> parameter_layout(const ModelConfig& cfg, int tp, int tp_rank);
  // The order backward finishes their gradients (the optimizer's layout order).
  std::vector<parallel::layers::Parameter*> parameters_in_grad_order() override;
  // Initialises every bound parameter like GPT-2 (N(0, 0.02), residual
  // projections N(0, 0.02 / sqrt(2 layers)), LayerNorm 1/0, biases 0),
  // identical for every layout.
  void init(uint64_t seed) override;

  // forward() / backward(): CausalLM's (the whole model when pp == 1).
  // Per-token losses of the last forward, [batch * seq] row-major.
  const float* token_losses() const override;

  // ---- pipeline stages ----
  // Elements of the activation passed between stages (and of its gradient)
  // for a micro-batch of batch x seq tokens: rows (rows / tp under SP) x hidden.
  int64_t activation_elems(int64_t batch, int64_t seq) const override { return local_rows(batch * seq) * cfg_.hidden; }
  // Forward of one micro-batch in activation slot `slot`. inputs (first
  // stage) and targets (last stage) are [batch, seq] token ids; `act_in` is
  // the previous stage's output (ignored on the first stage). Returns the sum
  // of the per-token losses on the last stage (0 elsewhere); *act_out (when
  // not null) gets this stage's output (nullptr on the last stage), valid
  // until the slot's next forward.
  double forward_stage(int slot, const int32_t* inputs, const int32_t* targets, const float* act_in, int64_t batch,
                       int64_t seq, bool want_grad, float grad_scale, const float** act_out) override;
  // Backward of the micro-batch in `slot`; `grad_out` is the gradient of this
  // stage's output from the next stage (ignored on the last stage). Returns
  // the gradient of this stage's input (nullptr on the first stage), valid
  // until the next backward_stage. on_ready as backward()'s, with slot 0's
  // Parameters.
  const float* backward_stage(int slot, const float* grad_out,
                              const std::function<void(parallel::layers::Parameter*)>& on_ready) override;
  int num_slots() const override { return static_cast<int>(slots_.size()); }
  // CausalLM's KV-cache forward (inference): the kernels of forward_stage on
  // the new rows, attention against the cache (cached_attention_forward).
  const float* forward_cached(parallel::layers::KvCache& cache, const int32_t* tokens, const std::vector<int>& slots,
                              const std::vector<int64_t>& lens, bool all_rows) override;

 private:
  struct Block;
  struct Slot;
  Slot& slot(int i);
  void attention_forward(Block& b, int64_t batch, int64_t seq);
  void attention_backward(Block& b, int64_t batch, int64_t seq);
  int64_t local_rows(int64_t rows) const { return ps_.sp() ? rows / ps_.tp_size : rows; }

  ModelConfig cfg_;
  const parallel::layers::ParallelState& ps_;
  std::vector<int> stages_;
  int64_t first_layer_ = 0;
  int vstage_ = 0;
  bool embed_ = true, head_ = true;
  std::unique_ptr<parallel::layers::VocabParallelEmbedding> wte_;  // first and last stage
  parallel::layers::Parameter wpe_, lnf_w_, lnf_b_;
  std::vector<std::unique_ptr<Block>> blocks_;  // slot 0's: they own the parameters
  std::vector<std::unique_ptr<Slot>> slots_;
  int last_slot_ = 0;
  CachedBuffers cached_;  // forward_cached's  // of the last forward (token_losses)

  // Scratch shared by the slots (grown on demand, then reused).
  Tensor ce_scratch_, dres_, dln_, dhf_full_, dhf_, dqkv_, dattn_, dfc_, dprobs_;
};

}  // namespace tessera::parallel::models::gpt
