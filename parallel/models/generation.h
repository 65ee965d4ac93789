// Generation (inference) on one TP group: prefill, then decode with a KV
// cache on each rank's emulated device, for a batch of prompts of different
// lengths without padding (each sequence at its own position), greedy or
// seeded temperature / top-k / top-p sampling, and requests that join and
// leave the running batch between decode steps (continuous batching).
// docs/inference.md describes it; the inference planner
// (parallel/inference_planner.h) predicts the emulated clock's figures.
//
// Every TP rank makes the same calls with the same arguments (collective
// over ps.tp). Each step's logits are all-gathered over TP so every rank
// holds the whole vocabulary's and samples the same token: the tokens do
// not depend on the layout. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/layers/parallel_state.h"
#include "parallel/models/causal_lm.h"
#include "runtime/tensor.h"

namespace tessera::parallel::models {

// Hugging Face generate()'s choices: greedy (do_sample false), or sampling
// with its warpers in its order: logits / temperature, the top_k largest
// (0: all), the smallest set whose probability reaches top_p (1: all).
struct SamplingOptions {
  bool greedy = true;
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
};

// The token for full logits [vocab]: the greedy argmax (the lowest id among
// equal logits), or a draw from the warped distribution with a uniform
// number keyed by (seed, request, step) alone (counter-based: the same on
// every rank, layout and batch). scratch: reused between calls.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& o, uint64_t request, int64_t step,
                     std::vector<std::pair<float, int32_t>>& scratch);

// The model's parameters bound for inference: every value in one buffer on
// the device (counted at `dtype`'s size, F32 or BF16), no gradients. Load
// the values after construction (load_shard, Checkpoint::read_f32), then
// call finish() to round them for BF16.
class InferenceWeights {
 public:
  InferenceWeights(CausalLM& model, Device* device, DType dtype);
  void finish();
  uint64_t bytes() const { return bytes_; }

 private:
  CausalLM& model_;
  DType dtype_;
  uint64_t bytes_ = 0;
  Tensor buffer_;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 1;
  int64_t arrival_step = 0;  // the decode step before which it joins (0: the first forward)
};

// One forward pass of the batch: the requests it advanced (prefilled or
// decoded) and the token each got.
struct GenerationStep {
  int64_t step = 0;
  int batch = 0;     // sequences in the forward
  int prefills = 0;  // of them, prompts joining
  std::vector<int> requests;
  std::vector<int32_t> tokens;
  double wall_s = 0, emulated_s = 0;
};

struct GenerationResult {
  std::vector<std::vector<int32_t>> tokens;  // per request, the new tokens
  std::vector<GenerationStep> steps;         // tokens of each step kept
  std::vector<int64_t> first_step;           // per request, the step of its first token
  uint64_t kv_cache_bytes = 0;               // this rank's cache, as the device counts it
  std::vector<int64_t> slot_capacity;        // tokens of each cache slot
  // Time to first token: the first step (prefill); per output token: the
  // mean of the later steps. Wall and emulated (this rank's SimClock) seconds.
  double ttft_wall_s() const { return steps.empty() ? 0 : steps.front().wall_s; }
  double ttft_emulated_s() const { return steps.empty() ? 0 : steps.front().emulated_s; }
  double tpot_wall_s() const;
  double tpot_emulated_s() const;
};

// Runs the requests to completion with at most max_batch sequences at once
// (0: all of them; each cache slot holds the longest prompt + new tokens
// among the requests it may serve). A request joins at the first step at or
// after its arrival with a free slot; its prompt is prefilled in the same
// forward as the running sequences' decode tokens; it leaves after
// max_new_tokens. on_step (may be empty) sees each step as it completes
// (streaming). InvalidArgument naming the request for an empty prompt, a
// token outside the vocabulary, a prompt + new tokens longer than the
// model's context, or a KV cache the device cannot hold (its size and the
// device's free bytes).
GenerationResult generate(CausalLM& model, const parallel::layers::ParallelState& ps,
                          const std::vector<GenerationRequest>& requests, const SamplingOptions& sampling,
                          int max_batch = 0, const std::function<void(const GenerationStep&)>& on_step = {});

// The model an --init path holds: a tessera checkpoint (its manifest's
// model, checked against the tensors the manifest lists) or a Hugging Face
// file or directory (its config.json, or a GPT-2 file's own shapes, checked
// against the tensors). *checkpoint says which. FormatError naming the path.
ModelConfig init_model_config(const std::string& path, bool* checkpoint);
// Loads this rank's shards of every bound parameter of `model` (whose
// config is init_model_config's) from `path`: a checkpoint saved under any
// layout (resharded as it is read, after every file's size and SHA-256 is
// checked, collectively over `world`; nullptr alone) or Hugging Face files.
void load_init_weights(CausalLM& model, const std::string& path, collectives::Communicator* world);

// Gathers forward_cached's logit shards over TP into full logits [rows, vocab].
void gather_logits(const parallel::layers::ParallelState& ps, const ModelConfig& cfg, const float* shard, int64_t rows,
                   std::vector<float>& gathered, std::vector<float>& full);

}  // namespace tessera::parallel::models
