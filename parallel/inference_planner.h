// Inference planner: a model served by TP groups (and DP replicas over the
// remaining cores) on a topology, for a batch of prompts: per TP degree,
// what fits in HBM (weights and the KV cache) and what prefill and decode
// cost. docs/planner.md ("Inference") gives every formula; in short:
//   - weights per core: the TP shard of every matrix (K/V projections
//     replicated when tp > kv_heads, as training does), norms and position
//     embeddings replicated;
//   - KV cache per core: layers x 2 x (local K/V heads) x head size x bytes
//     per token of every sequence's context (prompt + generated);
//   - time to first token (prefill) and per output token (the mean decode
//     step): the sum of every kernel and collective the models' KV-cache
//     forward (CausalLM::forward_cached) and generate() charge on TP rank 0,
//     with the emulated cores' costs (runtime/kernel_cost.h: launch +
//     roofline; collectives/coll_cost.h on the TP group's cores): one cost
//     source, so `generate` on the emulated cores logs these figures;
//   - beside them the roofline bounds that explain them: prefill's FLOPs at
//     the sustained peak or its weight bytes at HBM bandwidth, decode's
//     weight and KV bytes at HBM bandwidth, and the TP all-reduces;
//   - throughput: replicas x batch / time per output token.
// Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "collectives/coll_cost.h"
#include "parallel/model_config.h"
#include "runtime/dtype.h"
#include "runtime/topology.h"

namespace tessera::parallel {

struct InferenceConfig {
  int batch = 1;     // sequences decoded together by one replica
  int prompt = 0;    // tokens per prompt
  int generate = 0;  // new tokens per sequence
  DType dtype = DType::BF16;
  int tp = 0;                    // 0: every TP degree that splits the model
  double memory_fraction = 0.9;  // of HBM usable
  // Per-sequence prompt lengths (padding-free batches); empty: `batch` prompts of `prompt` tokens.
  std::vector<int> prompts;
};

struct InferencePlan {
  int tp = 1, replicas = 1;
  double weight_bytes = 0;        // per core
  double kv_bytes_per_token = 0;  // per core, all layers, one token of one sequence
  double kv_bytes = 0;            // per core: batch x (prompt + generate) tokens
  double usable_bytes = 0;        // per core
  int64_t max_cached_tokens = 0;  // batch x context that fits beside the weights (0: the weights do not fit)
  bool fits = false;
  // Roofline bounds (the explanation): FLOPs at the sustained peak, bytes at HBM bandwidth.
  double prefill_compute_s = 0, prefill_memory_s = 0, decode_compute_s = 0, decode_memory_s = 0;
  // TP collectives of the prefill and of the mean decode step (in ttft_s / tpot_s).
  double prefill_comm_s = 0, decode_comm_s = 0;
  // The kernel and collective sums: the first step, and the mean of the decode steps.
  double ttft_s = 0, tpot_s = 0;
  double allreduce_token_s = 0;  // one TP all-reduce of one decode step's activations
  int tp_group_chips = 1;        // chips the TP group spans
  int tp_ring_max_hops = 0;      // the group's slowest ring step, in hops
  double tokens_per_s = 0;       // all replicas, steady decode
};

// One plan per TP degree (powers of two dividing the cores that the model's
// heads allow, or cfg.tp), best first: fitting plans by time per output
// token, then the rest. Throws InvalidArgument for an empty workload, a
// context longer than the model's, or a pinned tp that cannot split it.
std::vector<InferencePlan> plan_inference(const ModelConfig& model, const Topology& topo, const InferenceConfig& cfg);

// What one TP degree's time per output token is made of on a topology, each
// part by what sets it (docs/planner.md, "Inference"): the kernels (the
// device: weight and KV bytes at HBM bandwidth, FLOPs, launches), the TP
// collectives' hop latencies (the same collectives costed with every link
// made infinitely fast: what the hops alone cost) and the rest of the
// collectives (bytes at link bandwidth). The three sum to plan.tpot_s.
// Computed by plan_inference at cfg.tp = tp; throws as it does.
struct DecodeTerms {
  InferencePlan plan;
  double kernels_s = 0, latency_s = 0, bandwidth_s = 0;
};
DecodeTerms decode_terms(const ModelConfig& model, const Topology& topo, const InferenceConfig& cfg, int tp);

// One KV-cache forward (CausalLM::forward_cached plus the logits'
// all-gather) of sequences given as (cached tokens, new tokens), on TP rank
// 0 of `tp` ranks of `device` at `dtype`, its TP group costed by `tp_group`:
// the kernels' seconds and the collectives'.
struct ForwardCost {
  double compute_s = 0, comm_s = 0;
  double total_s() const { return compute_s + comm_s; }
};
ForwardCost cached_forward_cost(const ModelConfig& model, const DeviceSpec& device, DType dtype,
                                const collectives::GroupCostModel& tp_group, int tp,
                                const std::vector<std::pair<int64_t, int64_t>>& sequences);
// The same from the batch's totals, which are all the cost depends on:
// sequences, new tokens, attention scores (sum of len x past + len(len+1)/2)
// and K/V rows read (sum of past + len).
struct BatchTotals {
  int64_t sequences = 0, tokens = 0, scores = 0, kv_rows = 0;
};
ForwardCost cached_forward_cost(const ModelConfig& model, const DeviceSpec& device, DType dtype,
                                const collectives::GroupCostModel& tp_group, int tp, const BatchTotals& batch);
// The TP group of rank 0 as plan_inference costs it: every group its own
// ring on emulated:N topologies (as the emulated cores without --topology),
// else the topology's cores in the planner's placement.
collectives::GroupCostModel inference_tp_group(const ModelConfig& model, const Topology& topo, int tp);

}  // namespace tessera::parallel
