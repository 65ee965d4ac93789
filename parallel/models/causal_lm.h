// CausalLM: what the trainer, the pipeline executor and the checkpoint code
// need of a decoder-only language model, whatever its family (gpt/, llama/).
//
// A model is one pipeline (virtual) stage of one TP rank: it owns its
// Parameters (bound later by the DistributedOptimizer or a ParamBinder),
// keeps every activation in Device buffers allocated on first use and reused
// (no device allocation in steady state), runs explicit forward and backward
// passes, and charges the emulated clock through runtime/kernels.h and its
// cost functions. Several micro-batches can be in flight, each in its own
// activation slot (slots alias slot 0's parameters).
//
// Not thread-safe. The ParallelState passed at construction must outlive the model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/layers/parallel_state.h"
#include "parallel/layers/parameter.h"
#include "parallel/model_config.h"
#include "runtime/tensor.h"

namespace tessera::parallel::layers {
class KvCache;
class VocabParallelEmbedding;
}  // namespace tessera::parallel::layers

namespace tessera::parallel::models {

class CausalLM {
 public:
  virtual ~CausalLM() = default;

  virtual const ModelConfig& config() const = 0;
  // Every parameter this stage holds, in Hugging Face order.
  virtual std::vector<parallel::layers::Parameter*> parameters() = 0;
  // The order backward finishes their gradients (the optimizer's layout order).
  virtual std::vector<parallel::layers::Parameter*> parameters_in_grad_order() = 0;
  // Layers per (virtual) stage and this stage's layers [first_layer, first_layer + num_layers).
  virtual const std::vector<int>& stages() const = 0;
  virtual int64_t first_layer() const = 0;
  virtual int64_t num_layers() const = 0;
  virtual bool has_embedding() const = 0;
  virtual bool has_head() const = 0;
  // With tied embeddings: the token embedding (first stage) or its tied copy
  // (last stage), whose gradients the trainer sums over ps.embed; nullptr on
  // the stages in between and for untied models.
  virtual parallel::layers::Parameter* tied_embedding() = 0;
  // Initialises every bound parameter from a counter-based generator keyed
  // by (seed, name, full index): identical for every layout.
  virtual void init(uint64_t seed) = 0;

  // Whole model (pp == 1). inputs, targets: [batch, seq] token ids. Returns
  // the sum of the per-token losses (identical on TP ranks); with want_grad
  // prepares backward() for the gradient of grad_scale x that sum.
  double forward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq, bool want_grad,
                 float grad_scale) {
    return forward_stage(0, inputs, targets, nullptr, batch, seq, want_grad, grad_scale, nullptr);
  }
  // Accumulates parameter gradients; on_ready (may be empty) is called once
  // per parameter as its gradient for this micro-batch becomes final.
  void backward(const std::function<void(parallel::layers::Parameter*)>& on_ready) {
    backward_stage(0, nullptr, on_ready);
  }
  // Per-token losses of the last forward on the last stage, [batch * seq].
  virtual const float* token_losses() const = 0;

  // ---- pipeline stages ----
  // Elements of the activation passed between stages for batch x seq tokens.
  virtual int64_t activation_elems(int64_t batch, int64_t seq) const = 0;
  // Forward of one micro-batch in activation slot `slot`: inputs (first
  // stage) and targets (last stage) are token ids; act_in the previous
  // stage's output. Returns the last stage's loss sum (0 elsewhere); *act_out
  // gets this stage's output (nullptr on the last), valid until the slot's next forward.
  virtual double forward_stage(int slot, const int32_t* inputs, const int32_t* targets, const float* act_in,
                               int64_t batch, int64_t seq, bool want_grad, float grad_scale, const float** act_out) = 0;
  // Backward of the micro-batch in `slot`; grad_out is the next stage's
  // gradient (ignored on the last stage). Returns the gradient of this
  // stage's input (nullptr on the first stage).
  virtual const float* backward_stage(int slot, const float* grad_out,
                                      const std::function<void(parallel::layers::Parameter*)>& on_ready) = 0;
  virtual int num_slots() const = 0;

  // ---- inference: a forward pass against a KV cache (docs/inference.md) ----
  // The whole model (pp == 1), no sequence parallelism, bound parameters
  // (no gradients needed). Sequence i, in KV-cache slot slots[i], brings
  // lens[i] new tokens, the sequences one after the other in `tokens`
  // (padding-free), at positions [cache.length(slots[i]), + lens[i]): the
  // prompt (prefill) or the last sampled token (decode), each sequence at
  // its own position. Their K and V rows join the cache, which is advanced.
  // Returns this TP rank's shard of the logits, [rows, vocab_shard(cfg,
  // tp)] row-major (columns past the vocabulary, the last shard's padding,
  // are -inf): rows are the last new token of each sequence, or every new
  // token with all_rows. Valid until the next call. Charges the same kernels
  // and collectives the inference planner sums (parallel/inference_planner.h).
  // InvalidArgument naming the sequence for a token outside the vocabulary,
  // a context past the model's, or a cache slot too small.
  virtual const float* forward_cached(parallel::layers::KvCache& cache, const int32_t* tokens,
                                      const std::vector<int>& slots, const std::vector<int64_t>& lens,
                                      bool all_rows) = 0;

 protected:
  // Buffers of forward_cached (grown on demand, then reused) and its rows' positions.
  struct CachedBuffers {
    Tensor x, xm, ln, q, k, v, y, act, up, scores, head_in, head_norm, logits, mean, rstd;
    std::vector<int64_t> positions, last_rows;
  };
  // Checks forward_cached's arguments (InvalidArgument naming the sequence)
  // and fills b.positions (every new row's position) and b.last_rows (the
  // row of each sequence's last new token). Returns the rows.
  int64_t check_cached_inputs(const parallel::layers::ParallelState& ps, parallel::layers::KvCache& cache,
                              const int32_t* tokens, const std::vector<int>& slots, const std::vector<int64_t>& lens,
                              CachedBuffers& b) const;
  // The rows of x ([n, hidden]) whose logits forward_cached returns: x
  // itself with all_rows, else each sequence's last row copied into b.head_in
  // (an index on a device: not charged). *rows gets their number.
  const float* cached_head_rows(const parallel::layers::ParallelState& ps, const float* x, int64_t n, bool all_rows,
                                CachedBuffers& b, int64_t* rows) const;
  // The head of forward_cached: `normed` ([rows, hidden], final-normed) times
  // this rank's vocabulary rows of `head` into b.logits ([rows, vocab_shard]
  // with -inf padding). Charges the GEMM.
  const float* cached_logits(const parallel::layers::ParallelState& ps, parallel::layers::VocabParallelEmbedding& head,
                             const float* normed, int64_t rows, CachedBuffers& b) const;

 protected:
  // What every family's forward_stage checks before it touches a buffer:
  // seq within the context, batch x seq divisible by tp under SP, token
  // and target ids inside the vocabulary, an activation for a later stage.
  // InvalidArgument naming the value.
  void check_stage_inputs(const parallel::layers::ParallelState& ps, int vstage, const int32_t* inputs,
                          const int32_t* targets, const float* act_in, int64_t batch, int64_t seq) const;
  // Every parameter TP rank `tp_rank` of `tp` of a model of type M holds,
  // unbound: M built from sizes and ranks alone (no device, no communicators).
  template <class M>
  static std::vector<parallel::layers::Parameter> layout_of(const ModelConfig& cfg, int tp, int tp_rank) {
    check_tp_rank(tp, tp_rank);
    parallel::layers::ParallelState ps;
    ps.tp_size = tp;
    ps.tp_rank = tp_rank;
    M model(cfg, ps);
    std::vector<parallel::layers::Parameter> v;
    for (const parallel::layers::Parameter* p : model.parameters()) v.push_back(*p);
    return v;
  }

 private:
  static void check_tp_rank(int tp, int tp_rank);
};

// The trainer's default model: the small GPT-2 train_gpt trains without
// flags (vocab 256 byte tokens, context 256, 6 layers of width 384, 6 heads).
ModelConfig default_train_model();
// Fills the sizes a flag or file left 0: kv_heads = heads, ffn_hidden = 4
// hidden (gpt) or 8/3 hidden rounded up to a multiple of 64 (llama, Meta's
// SwiGLU sizing at the granularity small models use), then validate().
void complete_model_config(ModelConfig& cfg);
// Throws InvalidArgument unless the family's model can be split over `tp`
// (attention by heads; K/V heads replicated when tp exceeds them),
// naming the numbers.
void validate_layout(const ModelConfig& cfg, int tp);
// TP ranks that hold each K/V head (make_parallel_state's kv_replicas):
// tp / kv_heads for a Llama with tp > kv_heads, else 1.
int kv_replicas(const ModelConfig& cfg, int tp);
// What differs between two models, one "\n  FIELD: A_NAME has X, B_NAME Y"
// line per size, family and the tied head ("" when they agree).
std::string model_differences(const ModelConfig& a, const ModelConfig& b, const std::string& a_name,
                              const std::string& b_name);
// Logit columns each TP rank holds: ceil(vocab / tp) (the last shard padded).
int64_t vocab_shard(const ModelConfig& cfg, int tp);
// Elements per token and layer of one TP rank's K (or V) cache:
// max(1, kv_heads / tp) local K/V heads x head size.
int64_t kv_cache_width(const ModelConfig& cfg, int tp);
// Training FLOPs per token: 6 x parameters + 12 x layers x context x the
// attention width (the attention scores and values, forward and backward).
double train_flops_per_token(const ModelConfig& cfg);

// The model of `cfg.family` ("gpt" or "llama") for this rank: chunk `chunk`
// of `chunks` of pipeline stage ps.pp_rank, `stages` layers per virtual stage
// (empty: parallel/pipeline/partition.h's rule). Throws InvalidArgument for a
// config the family or the layout cannot hold, naming the numbers.
std::unique_ptr<CausalLM> make_causal_lm(const ModelConfig& cfg, const parallel::layers::ParallelState& ps,
                                         const std::vector<int>& stages = {}, int chunk = 0, int chunks = 1);

// Every parameter TP rank `tp_rank` of `tp` holds (all stages), unbound
// (value == nullptr), in Hugging Face order: the descriptors the checkpoint
// layer saves, verifies and reshards from. Pure; thread-safe.
std::vector<parallel::layers::Parameter> parameter_layout(const ModelConfig& cfg, int tp, int tp_rank);

}  // namespace tessera::parallel::models
