#include "parallel/inference_planner.h"

#include <algorithm>
#include <cmath>

#include "collectives/coll_cost.h"
#include "parallel/cost_model.h"
#include "parallel/mesh.h"
#include "runtime/error.h"
#include "runtime/kernel_cost.h"

namespace tessera::parallel {

namespace {

// Whether tp splits the heads (and the K/V heads, or replicates them).
bool splits(const ModelConfig& m, int tp) {
  return m.heads % tp == 0 && (m.kv_heads % tp == 0 || tp % m.kv_heads == 0);
}

// Parameters one TP rank of tp holds (docs/planner.md, "Inference").
double rank_params(const ModelConfig& m, int tp) {
  const double h = m.hidden;
  const double layer = m.layer_params_per_rank(tp);        // K/V replicated past kv_heads, as training holds them
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

// A collective as the TP group's communicator runs it (ParallelState skips groups of one).
double coll_seconds(collectives::CollKind kind, int64_t count, DType dt, const collectives::GroupCostModel& g) {
  if (g.size <= 1 || count <= 0) return 0;
  if (g.nodes.empty()) {  // a group too large for the exact model: NetModel's closed forms (as the training planner)
    const double n =
        static_cast<double>(count) * (kind != collectives::CollKind::AllGather || dt == DType::F32 ? 4 : 2);
    if (kind == collectives::CollKind::AllReduce) return g.net.torus_allreduce_time(n);
    return g.net.torus_allgather_time(n * g.size);
  }
  return collectives::predict(kind, static_cast<size_t>(count), dt, g).seconds;
}

// The prompts of cfg, one per sequence.
std::vector<int> prompts_of(const InferenceConfig& cfg) {
  std::vector<int> prompts = cfg.prompts;
  if (prompts.empty()) prompts.assign(static_cast<size_t>(std::max(cfg.batch, 0)), cfg.prompt);
  return prompts;
}

// The mean decode step (one token per sequence, each at its own context) of cfg's prompts over `g`.
ForwardCost mean_decode_cost(const ModelConfig& m, const DeviceSpec& dev, const InferenceConfig& cfg,
                             const std::vector<int>& prompts, const collectives::GroupCostModel& g, int tp) {
  const int steps = std::max(1, cfg.generate - 1);  // one hypothetical step when only one token is generated
  // Step k: every sequence adds one token after prompt + k - 1 cached ones,
  // so the totals are closed forms of the prompts' sum (O(1) a step: a loop
  // over the batch made --batch 10^7 take 90 s).
  const auto b = static_cast<int64_t>(prompts.size());
  int64_t prompt_sum = 0;
  for (int p : prompts) prompt_sum += p;
  ForwardCost mean;
  for (int k = 1; k <= steps; ++k) {
    const int64_t past = prompt_sum + b * (k - 1);
    const BatchTotals t{b, b, past + b, past + b};  // len 1: scores len*past + 1, rows past + 1
    const ForwardCost s = cached_forward_cost(m, dev, cfg.dtype, g, tp, t);
    mean.compute_s += s.compute_s;
    mean.comm_s += s.comm_s;
  }
  mean.compute_s /= steps;
  mean.comm_s /= steps;
  return mean;
}

}  // namespace

ForwardCost cached_forward_cost(const ModelConfig& model, const DeviceSpec& dev, DType dt,
                                const collectives::GroupCostModel& tp_group, int tp,
                                const std::vector<std::pair<int64_t, int64_t>>& sequences) {
  // The batch, as cached_attention_forward counts it.
  BatchTotals t;
  t.sequences = static_cast<int64_t>(sequences.size());
  for (const auto& [past, len] : sequences) {
    t.tokens += len;
    t.scores += len * past + len * (len + 1) / 2;
    t.kv_rows += past + len;
  }
  return cached_forward_cost(model, dev, dt, tp_group, tp, t);
}

ForwardCost cached_forward_cost(const ModelConfig& model, const DeviceSpec& dev, DType dt,
                                const collectives::GroupCostModel& tp_group, int tp, const BatchTotals& batch) {
  ModelConfig m = model;
  if (m.kv_heads <= 0) m.kv_heads = m.heads;
  if (m.ffn_hidden <= 0) m.ffn_hidden = 4 * m.hidden;
  using K = collectives::CollKind;
  ForwardCost out;
  auto k = [&](const cost::Kernel& x) { out.compute_s += cost::kernel_seconds(dev, cost::in_dtype(x, dt), dt); };
  auto coll = [&](K kind, int64_t count) { out.comm_s += coll_seconds(kind, count, dt, tp_group); };
  const int64_t n = batch.tokens, scores = batch.scores, kv_rows = batch.kv_rows, b = batch.sequences;
  const int64_t c = m.hidden, hd = m.head_size(), hl = m.heads / tp, kvl = std::max(1, m.kv_heads / tp);
  const int64_t qw = hl * hd, kw = kvl * hd, f = m.ffn_hidden / tp, shard = (m.vocab + tp - 1) / tp;
  const bool llama = m.family == "llama", bias = llama ? m.attention_bias : true;
  // Column-parallel: [bias broadcast] gemm; row-parallel (residual fused): the GEMM, TP all-reduce, residual (+ bias).
  auto column = [&](int64_t out_w, bool with_bias) {
    if (with_bias) k(cost::broadcast_rows(n, out_w));
    k(cost::gemm(n, out_w, c, with_bias));
  };
  auto row = [&](int64_t in_w, bool with_bias) {
    if (tp == 1) {
      if (with_bias) {
        k(cost::add_rows(n, c, true));
        k(cost::gemm(n, c, in_w, true));
      } else {
        k(cost::gemm(n, c, in_w, false));
        k(cost::add_rows(n, c, false));
      }
      return;
    }
    k(cost::gemm(n, c, in_w, false));
    coll(K::AllReduce, n * c);
    k(cost::add_rows(n, c, with_bias));
  };
  // Embedding (vocab-parallel: summed over TP), GPT's learned positions.
  k(cost::embedding_forward(n, c));
  coll(K::AllReduce, n * c);
  if (m.learned_positions()) k(cost::position_add(n, c));
  for (int l = 0; l < m.layers; ++l) {
    if (llama) {
      k(cost::rmsnorm_forward(n, c));
      column(qw, bias);
      column(kw, bias);
      column(kw, bias);
      k(cost::rope(n, hl, hd));
      k(cost::rope(n, kvl, hd));
      k(cost::cached_attention(hl, kvl, hd, n, scores, kv_rows));
      row(qw, bias);
      k(cost::rmsnorm_forward(n, c));
      column(f, false);
      column(f, false);
      k(cost::swiglu_forward(n * f));
      row(f, false);
    } else {
      k(cost::layernorm_forward(n, c));
      column(3 * qw, true);
      k(cost::cached_attention(hl, hl, hd, n, scores, kv_rows));
      row(qw, true);
      k(cost::layernorm_forward(n, c));
      column(f, true);
      k(cost::gelu_forward(n * f));
      row(f, true);
    }
  }
  // The final norm and LM head on each sequence's last row (rank 0 holds a whole shard), the logits all-gathered.
  k(llama ? cost::rmsnorm_forward(b, c) : cost::layernorm_forward(b, c));
  k(cost::gemm(b, std::min(shard, static_cast<int64_t>(m.vocab)), c, false));
  coll(K::AllGather, b * shard);
  return out;
}

collectives::GroupCostModel inference_tp_group(const ModelConfig& model, const Topology& topo, int tp) {
  const int cores = topo.num_cores();
  const int kv = kv_replicas_of(model, tp);
  if (Topology::is_emulated(topo.name())) return emulated_group_nets(tp, 1, cores / tp, kv).tp;
  return placement_group_nets(topo, Placement(topo, Mesh({.tp = tp, .dp = cores / tp, .pp = 1})), kv).tp;
}

std::vector<InferencePlan> plan_inference(const ModelConfig& m, const Topology& topo, const InferenceConfig& cfg) {
  const std::vector<int> prompts = prompts_of(cfg);
  TESSERA_ARG_CHECK(!prompts.empty() && cfg.generate >= 1 && *std::min_element(prompts.begin(), prompts.end()) >= 1,
                    "--batch, --prompt-len and --gen-len must be >= 1");
  const int longest = *std::max_element(prompts.begin(), prompts.end());
  const int context = longest + cfg.generate;
  TESSERA_ARG_CHECK(context <= m.max_seq, "prompt ", longest, " + generated ", cfg.generate, " = ", context,
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
  const double b = static_cast<double>(prompts.size()), h = m.hidden;
  double prompt_tokens = 0, prompt_squares = 0;
  for (int p : prompts) {
    prompt_tokens += p;
    prompt_squares += static_cast<double>(p) * p;
  }
  std::vector<InferencePlan> plans;
  for (int tp : tps) {
    InferencePlan p;
    p.tp = tp;
    p.replicas = cores / tp;
    p.weight_bytes = rank_params(m, tp) * es;
    const int kv_local = std::max(1, m.kv_heads / tp);
    p.kv_bytes_per_token = 2.0 * m.layers * kv_local * m.head_size() * es;
    p.kv_bytes = p.kv_bytes_per_token * (prompt_tokens + b * cfg.generate);
    p.usable_bytes = static_cast<double>(dev.hbm_bytes) * cfg.memory_fraction;
    const double room = p.usable_bytes - p.weight_bytes;
    p.max_cached_tokens = room > 0 ? static_cast<int64_t>(room / p.kv_bytes_per_token) : 0;
    p.fits = room >= p.kv_bytes;
    p.tp_group_chips = std::max(1, tp / per_chip);
    for (int i = 0; i < tp; ++i) p.tp_ring_max_hops = std::max(p.tp_ring_max_hops, net.hops_between(i, (i + 1) % tp));
    const collectives::GroupCostModel g = inference_tp_group(m, topo, tp);
    p.allreduce_token_s = coll_seconds(collectives::CollKind::AllReduce, static_cast<int64_t>(b * h), cfg.dtype, g);
    // Roofline bounds. Prefill: causal attention scores and values, 2 P^2 q per layer and sequence.
    const double mm = rank_matmul_params(m, tp), q_local = static_cast<double>(m.q_dim()) / tp;
    p.prefill_compute_s = (2 * mm * prompt_tokens + m.layers * 2.0 * prompt_squares * q_local) / peak;
    p.prefill_memory_s = p.weight_bytes / dev.hbm_bandwidth;
    // Decode at the mean context of the generation.
    const double ctx = prompt_tokens / b + (cfg.generate - 1) / 2.0;
    p.decode_compute_s = (2 * mm * b + m.layers * b * 4.0 * ctx * q_local) / peak;
    p.decode_memory_s = (p.weight_bytes + p.kv_bytes_per_token * b * ctx) / dev.hbm_bandwidth;
    // What the emulated cores charge: the prefill forward, then each decode step's (one token per sequence).
    std::vector<std::pair<int64_t, int64_t>> seqs;
    seqs.reserve(prompts.size());
    for (int pr : prompts) seqs.emplace_back(0, pr);
    const ForwardCost prefill = cached_forward_cost(m, dev, cfg.dtype, g, tp, seqs);
    p.ttft_s = prefill.total_s();
    p.prefill_comm_s = prefill.comm_s;
    const ForwardCost decode = mean_decode_cost(m, dev, cfg, prompts, g, tp);
    p.tpot_s = decode.total_s();
    p.decode_comm_s = decode.comm_s;
    p.tokens_per_s = p.replicas * b / p.tpot_s;
    plans.push_back(p);
  }
  std::stable_sort(plans.begin(), plans.end(), [](const InferencePlan& a, const InferencePlan& c) {
    if (a.fits != c.fits) return a.fits;
    return a.tpot_s < c.tpot_s;
  });
  return plans;
}

DecodeTerms decode_terms(const ModelConfig& m, const Topology& topo, const InferenceConfig& cfg, int tp) {
  InferenceConfig c = cfg;
  c.tp = tp;
  DecodeTerms t;
  t.plan = plan_inference(m, topo, c).at(0);
  // The TP group with every link infinitely fast: its collectives cost their hops' latencies alone.
  collectives::GroupCostModel g = inference_tp_group(m, topo, tp);
  std::vector<NetDim> dims = g.net.dims();
  for (NetDim& d : dims) d.bandwidth *= 1e12;
  g.net = NetModel(std::move(dims));
  g.links = collectives::LinkCosts(g.net, g.nodes);
  const double hops = mean_decode_cost(m, topo.device(), c, prompts_of(c), g, tp).comm_s;
  t.kernels_s = t.plan.tpot_s - t.plan.decode_comm_s;
  t.latency_s = std::min(hops, t.plan.decode_comm_s);
  t.bandwidth_s = t.plan.decode_comm_s - t.latency_s;
  return t;
}

}  // namespace tessera::parallel
