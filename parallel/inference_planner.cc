#include "parallel/inference_planner.h"

#include <algorithm>
#include <cmath>

#include "collectives/coll_cost.h"
#include "runtime/error.h"

namespace tessera::parallel {

namespace {

// Whether tp splits the heads (and the K/V heads, or replicates them).
bool splits(const ModelConfig& m, int tp) {
  return m.heads % tp == 0 && (m.kv_heads % tp == 0 || tp % m.kv_heads == 0);
}

// Parameters one TP rank of tp holds (docs/planner.md, "Inference").
double rank_params(const ModelConfig& m, int tp) {
  const double h = m.hidden, kv = m.kv_dim();
  // K/V projections (and their biases): split over min(tp, kv_heads) ranks, replicated past it.
  const double kv_proj = 2 * h * kv + ((m.has_bias() || m.attention_bias) ? 2 * kv : 0);
  const double sharded = static_cast<double>(m.layer_params_tp_sharded()) - kv_proj;
  const double replicated = static_cast<double>(m.layer_params() - m.layer_params_tp_sharded());
  const double layer = sharded / tp + kv_proj / std::min(tp, m.kv_heads) + replicated;
  const double tokens = static_cast<double>(m.vocab) * h;  // vocab-parallel
  const double positions = static_cast<double>(m.embedding_params()) - tokens;
  const double head = static_cast<double>(m.head_params()) - (m.tied_embeddings() ? 0 : tokens);
  return m.layers * layer + tokens / tp + positions + head + (m.tied_embeddings() ? 0 : tokens / tp);
}

// Matrix parameters a token's forward multiplies on one rank (every matrix
// once, the LM head included; the embedding lookup is not a multiply).
double rank_matmul_params(const ModelConfig& m, int tp) {
  const double h = m.hidden, kv = m.kv_dim();
  const double kv_proj = 2 * h * kv;
  const double mats = h * (m.q_dim() + 2 * kv) + static_cast<double>(m.q_dim()) * h +
                      (m.gated_mlp() ? 3 : 2) * h * m.ffn_hidden - kv_proj;
  return m.layers * (mats / tp + kv_proj / std::min(tp, m.kv_heads)) + static_cast<double>(m.vocab) * h / tp;
}

}  // namespace

std::vector<InferencePlan> plan_inference(const ModelConfig& m, const Topology& topo, const InferenceConfig& cfg) {
  TESSERA_ARG_CHECK(cfg.batch >= 1 && cfg.prompt >= 1 && cfg.generate >= 1,
                    "--batch, --prompt-len and --gen-len must be >= 1");
  const int context = cfg.prompt + cfg.generate;
  TESSERA_ARG_CHECK(context <= m.max_seq, "prompt ", cfg.prompt, " + generated ", cfg.generate, " = ", context,
                    " tokens exceed model '", m.name, "''s context of ", m.max_seq);
  const int cores = topo.num_cores();
  std::vector<int> tps;
  if (cfg.tp > 0) {
    TESSERA_ARG_CHECK(cores % cfg.tp == 0, "--tp ", cfg.tp, " does not divide the ", cores, " cores");
    TESSERA_ARG_CHECK(splits(m, cfg.tp), "--tp ", cfg.tp, " splits neither the ", m.heads, " heads and ", m.kv_heads,
                      " K/V heads of '", m.name, "' (each must divide tp or be divided by it)");
    tps.push_back(cfg.tp);
  } else {
    for (int tp = 1; tp <= cores; tp *= 2)
      if (cores % tp == 0 && splits(m, tp)) tps.push_back(tp);
  }
  const DeviceSpec& dev = topo.device();
  const double es = static_cast<double>(dtype_size(cfg.dtype));
  const double peak = dev.peak_flops(cfg.dtype) * dev.sustained_fraction;
  const NetModel net = topo.net_model();
  const int per_chip = std::max(1, topo.cores_per_chip());
  const double b = cfg.batch, h = m.hidden;
  std::vector<InferencePlan> plans;
  for (int tp : tps) {
    InferencePlan p;
    p.tp = tp;
    p.replicas = cores / tp;
    p.weight_bytes = rank_params(m, tp) * es;
    const int kv_local = std::max(1, m.kv_heads / tp);
    p.kv_bytes_per_token = 2.0 * m.layers * kv_local * m.head_size() * es;
    p.kv_bytes = p.kv_bytes_per_token * b * context;
    p.usable_bytes = static_cast<double>(dev.hbm_bytes) * cfg.memory_fraction;
    const double room = p.usable_bytes - p.weight_bytes;
    p.max_cached_tokens = room > 0 ? static_cast<int64_t>(room / p.kv_bytes_per_token) : 0;
    p.fits = room >= p.kv_bytes;
    // The TP group: the first tp cores (tp fastest, as the trainer places ranks).
    std::vector<int> nodes(static_cast<size_t>(tp));
    for (int i = 0; i < tp; ++i) nodes[static_cast<size_t>(i)] = i;
    p.tp_group_chips = std::max(1, tp / per_chip);
    for (int i = 0; i < tp; ++i) p.tp_ring_max_hops = std::max(p.tp_ring_max_hops, net.hops_between(i, (i + 1) % tp));
    const collectives::GroupCostModel g = collectives::group_cost_model(net, nodes, false);
    auto all_reduce = [&](double elems) {
      return tp == 1 ? 0.0
                     : collectives::predict(collectives::CollKind::AllReduce, static_cast<size_t>(elems), cfg.dtype, g)
                           .seconds;
    };
    const double mm = rank_matmul_params(m, tp), q_local = static_cast<double>(m.q_dim()) / tp;
    // Prefill: causal attention scores and values, 2 P^2 q per layer and sequence (half the square, two GEMMs).
    const double prefill_flops =
        2 * mm * b * cfg.prompt + m.layers * b * 2.0 * cfg.prompt * static_cast<double>(cfg.prompt) * q_local;
    p.prefill_compute_s = prefill_flops / peak;
    p.prefill_memory_s = p.weight_bytes / dev.hbm_bandwidth;
    p.prefill_comm_s = 2.0 * m.layers * all_reduce(b * cfg.prompt * h);
    p.ttft_s = std::max(p.prefill_compute_s, p.prefill_memory_s) + p.prefill_comm_s;
    // Decode at the mean context of the generation.
    const double ctx = cfg.prompt + (cfg.generate - 1) / 2.0;
    p.decode_compute_s = (2 * mm * b + m.layers * b * 4.0 * ctx * q_local) / peak;
    p.decode_memory_s = (p.weight_bytes + p.kv_bytes_per_token * b * ctx) / dev.hbm_bandwidth;
    p.allreduce_token_s = all_reduce(b * h);
    p.decode_comm_s = 2.0 * m.layers * p.allreduce_token_s;
    p.tpot_s = std::max(p.decode_compute_s, p.decode_memory_s) + p.decode_comm_s;
    p.tokens_per_s = p.replicas * b / p.tpot_s;
    plans.push_back(p);
  }
  std::stable_sort(plans.begin(), plans.end(), [](const InferencePlan& a, const InferencePlan& c) {
    if (a.fits != c.fits) return a.fits;
    return a.tpot_s < c.tpot_s;
  });
  return plans;
}

}  // namespace tessera::parallel
