// GptModel: GPT-2 exactly (learned positions, pre-LayerNorm blocks with eps
// 1e-5, causal multi-head attention, 4x MLP with tanh-GELU, final LayerNorm,
// LM head tied to the token embedding, no dropout), tensor parallel as
// Megatron-LM: fused QKV column-parallel split by heads, attention output
// and MLP down projections row-parallel, vocab-parallel embedding and
// cross-entropy, optional sequence parallelism.
//
// fp32 throughout; forward and backward are explicit (no autograd). Every
// activation lives in buffers allocated once on the rank's Device and reused
// across steps. Parameter names are Hugging Face GPT-2's.
//
// Use: construct, bind the parameters (DistributedOptimizer or ParamBinder),
// init(seed) or load; then per micro-batch forward() and backward().
// Not thread-safe. The ParallelState must outlive the model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "parallel/layers/embedding.h"
#include "parallel/layers/linear.h"
#include "parallel/layers/parallel_state.h"

namespace tessera::parallel::models::gpt {

struct GptConfig {
  int64_t vocab = 256;
  int64_t seq = 256;  // context length (wpe rows)
  int64_t hidden = 384;
  int64_t layers = 6;
  int64_t heads = 6;
  float ln_eps = 1e-5f;

  // Throws InvalidArgument naming the offending value.
  void validate(int tp) const;
  int64_t num_params() const;  // of the full (unsharded) model, wte counted once
  // 6 x params + 12 x layers x seq x hidden (training FLOPs per token, as the issue counts).
  double train_flops_per_token() const;
};

class GptModel {
 public:
  GptModel(const GptConfig& cfg, const parallel::layers::ParallelState& ps);
  ~GptModel();

  const GptConfig& config() const { return cfg_; }
  // Every parameter in Hugging Face order.
  std::vector<parallel::layers::Parameter*> parameters();
  // Every parameter TP rank `tp_rank` of `tp` holds, in parameters() order,
  // unbound (value == nullptr): name, full shape, shard shape, split dim and
  // chunks as this model's layers build them. The checkpoint layout
  // (parallel/checkpoint/gpt2_layout.h) is this. Throws InvalidArgument like
  // the constructor. Pure; thread-safe.
  static std::vector<parallel::layers::Parameter> parameter_layout(const GptConfig& cfg, int tp, int tp_rank);
  // The order backward finishes their gradients (the optimizer's layout order).
  std::vector<parallel::layers::Parameter*> parameters_in_grad_order();
  // Initialises every bound parameter like GPT-2 (N(0, 0.02), residual
  // projections N(0, 0.02 / sqrt(2 layers)), LayerNorm 1/0, biases 0),
  // identical for every layout.
  void init(uint64_t seed);

  // inputs, targets: [batch, seq] token ids (seq <= cfg.seq). Runs the forward
  // pass and returns the sum of the per-token losses of this rank's batch
  // (identical on TP ranks). With want_grad, also prepares backward() for the
  // gradient of grad_scale x that sum.
  double forward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq, bool want_grad,
                 float grad_scale);
  // Accumulates parameter gradients. on_ready (may be empty) is called once
  // per parameter as its gradient for this micro-batch becomes final.
  void backward(const std::function<void(parallel::layers::Parameter*)>& on_ready);
  // Per-token losses of the last forward, [batch * seq] row-major.
  const float* token_losses() const;

 private:
  struct Block;
  void attention_forward(Block& b, int64_t batch, int64_t seq);
  void attention_backward(Block& b, int64_t batch, int64_t seq);
  int64_t local_rows(int64_t rows) const { return ps_.sp() ? rows / ps_.tp_size : rows; }

  GptConfig cfg_;
  const parallel::layers::ParallelState& ps_;
  std::unique_ptr<parallel::layers::VocabParallelEmbedding> wte_;
  parallel::layers::Parameter wpe_, lnf_w_, lnf_b_;
  std::vector<std::unique_ptr<Block>> blocks_;

  int64_t batch_ = 0, seq_ = 0;
  const int32_t* inputs_ = nullptr;
  bool have_grad_ = false;
  // Activations and scratch (grown on demand, then reused).
  Tensor x_final_, hf_, hf_full_, lnf_mean_, lnf_rstd_, logits_, loss_, ce_scratch_;
  Tensor dres_, dln_, dhf_full_, dhf_, dqkv_, dattn_, dfc_, dprobs_;
  Tensor tokens_in_;
};

}  // namespace tessera::parallel::models::gpt
