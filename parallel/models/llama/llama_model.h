// LlamaModel: Hugging Face's LlamaForCausalLM exactly (token embedding,
// pre-RMSNorm blocks with eps = cfg.norm_eps, causal grouped-query attention
// with rotary embeddings (rope_theta, Llama 3's rope_scaling), SwiGLU MLP
// down(silu(gate(x)) * up(x)), final RMSNorm, LM head untied unless
// cfg.tied_embeddings(), no biases unless cfg.attention_bias (q, k, v, o),
// no dropout), tensor parallel as Megatron-LM / NxD: q, k, v, gate and up
// column-parallel (by heads / by ffn), o and down row-parallel, weights in
// nn.Linear's [out, in] layout, vocab-parallel embedding, head and
// cross-entropy, optional sequence parallelism (RMSNorm weights sp_partial).
//
// K/V heads over TP: with tp <= kv_heads each rank holds kv_heads / tp of
// them (tp must divide kv_heads); with tp > kv_heads (tp a multiple of
// kv_heads) each K/V head is replicated onto the tp / kv_heads consecutive
// TP ranks whose query heads read it (k_proj/v_proj Parameters with
// tp_parts = kv_heads), and their gradients are summed over exactly those
// ranks (ps.kv, make_parallel_state's kv_replicas = tp / kv_heads) inside
// backward, before on_ready. Anything else is refused naming heads,
// kv_heads and tp.
//
// Memory, slots and pipeline stages as GptModel (parallel/models/gpt/
// gpt_model.h): every activation in Device buffers allocated on first use and
// reused; embedding on virtual stage 0, final norm + head on the last; with
// tied embeddings the last stage holds a copy of model.embed_tokens.weight
// (tied_embedding(); the trainer sums the two copies' gradients over
// ps.embed); untied: lm_head.weight is a vocab-parallel [V, C] Parameter on
// the last stage and tied_embedding() is nullptr. The rotary cos/sin tables
// ([max_seq, head_dim] each) are built once per model on its device.
//
// Clock: every kernel charges the device. Per layer, with N = batch x seq
// tokens, Nl = N / tp under SP (else N), C hidden, hl = heads / tp and
// kvl = max(1, kv_heads / tp) local heads of head_dim d, F = ffn_hidden / tp,
// and GEMM(m, n, k, acc) = cost::gemm:
//  forward:
//   rmsnorm_forward(Nl, C)
//   [attention_bias: broadcast_rows(N, hl d)] gemm(N, hl d, C, bias)      q_proj
//   [broadcast_rows(N, kvl d)] gemm(N, kvl d, C, bias)                    k_proj
//   [broadcast_rows(N, kvl d)] gemm(N, kvl d, C, bias)                    v_proj
//   rope(N, hl, d); rope(N, kvl, d)
//   gqa_attention_forward(batch, hl, kvl, seq, d)
//   o_proj: gemm(N, C, hl d, false) then add_rows(Nl, C, bias)  (tp 1 with a bias: add_rows first, gemm accumulating)
//   rmsnorm_forward(Nl, C)
//   gemm(N, F, C, false) gate_proj; gemm(N, F, C, false) up_proj
//   swiglu_forward(N F)
//   down_proj: gemm(N, C, F, false); add_rows(Nl, C, false)
//  backward:
//   down_proj: gemm(C, F, N, true) dW; gemm(N, F, C, false) dx
//   swiglu_backward(N F)
//   up_proj: gemm(F, C, N, true) dW; gemm(N, C, F, false) dx
//   gate_proj: gemm(F, C, N, true) dW; gemm(N, C, F, true) dx
//   rmsnorm_backward(Nl, C)
//   o_proj: [bias_grad(Nl or N, C)] gemm(C, hl d, N, true) dW; gemm(N, hl d, C, false) dx
//   gqa_attention_backward(batch, hl, kvl, seq, d)
//   rope(N, hl, d); rope(N, kvl, d)
//   q_proj: gemm(hl d, C, N, true) [bias_grad(N, hl d)]; gemm(N, C, hl d, false)
//   k_proj: gemm(kvl d, C, N, true) [bias_grad]; gemm(N, C, kvl d, true)
//   v_proj: gemm(kvl d, C, N, true) [bias_grad]; gemm(N, C, kvl d, true)
//   rmsnorm_backward(Nl, C)
//   (tp > kv_heads: k_proj and v_proj first sum their output gradient,
//   N x kvl d, over ps.kv for the weight gradient: one all-reduce each)
// and outside the layers: embedding_forward(N, C) / embedding_backward(N, C)
// on the first stage; rmsnorm_forward(Nl, C), gemm(N, Vl, C, false) logits,
// cross_entropy(N, Vl, grad) on the last, backward gemm(N, C, Vl, false) dx,
// gemm(Vl, C, N, true) dW, rmsnorm_backward(Nl, C) (Vl: this rank's
// vocabulary rows). Collectives charge the interconnect themselves.
//
// Not thread-safe. The ParallelState must outlive the model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "parallel/layers/embedding.h"
#include "parallel/layers/linear.h"
#include "parallel/layers/parallel_state.h"
#include "parallel/layers/rotary.h"
#include "parallel/model_config.h"
#include "parallel/models/causal_lm.h"

namespace tessera::parallel::models::llama {

class LlamaModel : public CausalLM {
 public:
  // stages: layers per (virtual) pipeline stage (ps.pp_size x chunks entries;
  // empty: parallel/pipeline/partition.h's rule); this model is chunk `chunk` of `chunks`.
  // Throws InvalidArgument for a config that is not llama, or heads/kv_heads tp cannot split.
  LlamaModel(const ModelConfig& cfg, const parallel::layers::ParallelState& ps, const std::vector<int>& stages = {},
             int chunk = 0, int chunks = 1);
  ~LlamaModel() override;

  // Checks cfg (family llama, ModelConfig::validate) against tp: heads % tp,
  // kv_heads % tp or tp % kv_heads, ffn_hidden % tp. Throws InvalidArgument naming the numbers.
  static void validate(const ModelConfig& cfg, int tp);
  // TP ranks holding each K/V head: tp / kv_heads when tp > kv_heads, else 1.
  static int kv_replicas(const ModelConfig& cfg, int tp);

  const ModelConfig& config() const override { return cfg_; }
  std::vector<parallel::layers::Parameter*> parameters() override;
  std::vector<parallel::layers::Parameter*> parameters_in_grad_order() override;
  const std::vector<int>& stages() const override { return stages_; }
  int64_t first_layer() const override { return first_layer_; }
  int64_t num_layers() const override { return static_cast<int64_t>(blocks_.size()); }
  bool has_embedding() const override { return embed_; }
  bool has_head() const override { return head_; }
  parallel::layers::Parameter* tied_embedding() override;
  void init(uint64_t seed) override;
  const float* token_losses() const override;

  // Every parameter TP rank `tp_rank` of `tp` holds (all stages), unbound, in
  // parameters() order. Throws InvalidArgument like the constructor. Pure; thread-safe.
  static std::vector<parallel::layers::Parameter> parameter_layout(const ModelConfig& cfg, int tp, int tp_rank);

  int64_t activation_elems(int64_t batch, int64_t seq) const override { return local_rows(batch * seq) * cfg_.hidden; }
  double forward_stage(int slot, const int32_t* inputs, const int32_t* targets, const float* act_in, int64_t batch,
                       int64_t seq, bool want_grad, float grad_scale, const float** act_out) override;
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
  int64_t local_rows(int64_t rows) const { return ps_.sp() ? rows / ps_.tp_size : rows; }

  ModelConfig cfg_;
  const parallel::layers::ParallelState& ps_;
  std::vector<int> stages_;
  int64_t first_layer_ = 0;
  int vstage_ = 0;
  bool embed_ = true, head_ = true;
  int64_t hl_ = 0, kvl_ = 0, hd_ = 0;  // local query heads, local K/V heads, head size
  // Token embedding (first stage, and the last when tied); untied head (last stage).
  std::unique_ptr<parallel::layers::VocabParallelEmbedding> embed_tokens_, lm_head_;
  parallel::layers::Parameter norm_w_;
  std::unique_ptr<parallel::layers::RotaryEmbedding> rope_;
  std::vector<std::unique_ptr<Block>> blocks_;  // slot 0's: they own the parameters
  std::vector<std::unique_ptr<Slot>> slots_;
  int last_slot_ = 0;
  CachedBuffers cached_;  // forward_cached's

  // Scratch shared by the slots (grown on demand, then reused).
  Tensor ce_scratch_, dres_, dln_, dx_full_, dhf_full_, dhf_, dq_, dk_, dv_, dattn_, dgate_, dup_, dprobs_;
};

}  // namespace tessera::parallel::models::llama
