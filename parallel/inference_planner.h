// Inference planner: a model served by TP groups (and DP replicas over the
// remaining cores) on a topology, for a batch of prompts: per TP degree,
// what fits in HBM (weights and the KV cache) and what prefill and decode
// cost. docs/planner.md ("Inference") gives every formula; in short:
//   - weights per core: the TP shard of every matrix (K/V projections
//     replicated when tp > kv_heads, as training does), norms and position
//     embeddings replicated;
//   - KV cache per core: layers x 2 x (local K/V heads) x head size x bytes
//     per token of every sequence's context (prompt + generated);
//   - time to first token (prefill): the prompt's forward FLOPs at the
//     device's sustained peak, or its weight bytes at HBM bandwidth if more,
//     plus two TP all-reduces of the prompt's activations per layer;
//   - time per output token (decode, at the mean context): weight and KV
//     bytes at HBM bandwidth (or the FLOPs, if more), plus two TP all-reduces
//     of one token's activations per layer, each costed as the collectives
//     cost it on the TP group's cores (collectives/coll_cost.h);
//   - throughput: replicas x batch / time per output token.
// Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
};

struct InferencePlan {
  int tp = 1, replicas = 1;
  double weight_bytes = 0;        // per core
  double kv_bytes_per_token = 0;  // per core, all layers, one token of one sequence
  double kv_bytes = 0;            // per core: batch x (prompt + generate) tokens
  double usable_bytes = 0;        // per core
  int64_t max_cached_tokens = 0;  // batch x context that fits beside the weights (0: the weights do not fit)
  bool fits = false;
  double prefill_compute_s = 0, prefill_memory_s = 0, prefill_comm_s = 0, ttft_s = 0;
  double decode_compute_s = 0, decode_memory_s = 0, decode_comm_s = 0, tpot_s = 0;
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

}  // namespace tessera::parallel
