#include "parallel/cost_model.h"

#include <algorithm>
#include <cmath>

#include "parallel/pipeline/partition.h"
#include "runtime/error.h"

namespace tessera::parallel {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  throw InvalidArgument("bad recompute '" + s + "' (expected none, selective or full)");
}

// ---- formulas -------------------------------------------------------------------------

double layer_forward_flops(const ModelConfig& m, double batch, int seq) {
  const double h = m.hidden, f = m.ffn_hidden, kv = m.kv_dim(), s = seq;
  // 2 FLOPs per multiply-add: QKV, attention output, MLP matrices
  // (GPT: 2 b s (3h^2 + h^2 + 8h^2) = 24 b s h^2), plus Q K^T and attention
  // over V (2 b s^2 h each).
  double matmuls = 2.0 * batch * s * (h * (h + 2 * kv) + h * h + (m.gated_mlp() ? 3 : 2) * h * f);
  double scores = 4.0 * batch * s * s * h;
  return matmuls + scores;
}

namespace {
double attention_score_flops(const ModelConfig& m, double batch, int seq) {
  return 4.0 * batch * static_cast<double>(seq) * seq * m.hidden;
}
double logit_flops(const ModelConfig& m, double batch, int seq) {
  return 2.0 * batch * seq * static_cast<double>(m.hidden) * m.vocab;
}
}  // namespace

double step_flops(const ModelConfig& m, double batch, int seq, Recompute r) {
  // Backward costs twice the forward; full recompute runs each layer's forward
  // once more (not the LM head), selective recompute only the attention scores.
  const double L = m.layers;
  const double layer = layer_forward_flops(m, batch, seq), logits = logit_flops(m, batch, seq);
  switch (r) {
    case Recompute::None:
      return 3 * (L * layer + logits);
    case Recompute::Selective:
      return 3 * (L * layer + logits) + L * attention_score_flops(m, batch, seq);
    case Recompute::Full:
      return 4 * L * layer + 3 * logits;
  }
  return 0;
}

double layer_activation_bytes(const ModelConfig& m, int seq, int b, int tp, bool sp, Recompute r, bool fp32) {
  const double s = seq, h = m.hidden, f = m.ffn_hidden, kv = m.kv_dim(), a = m.heads, t = tp;
  const double sbh = s * b * h;
  const double scale = fp32 ? 2.0 : 1.0;
  if (r == Recompute::Full) return scale * 2 * sbh / (sp ? t : 1.0);  // the layer input only
  // Korthikanti et al. 2022, section 4.1, in bytes for 16-bit activations:
  //   not split by TP: two norm inputs 4sbh, QKV input 2sbh, MLP input 2sbh,
  //     two dropout masks 2sbh (GPT only; Llama has no dropout)          -> 10 sbh
  //   split by TP: Q, K, V 2sbh + 2sb*kv*2, output-projection input 2sbh,
  //     MLP inner 2sbf each for GELU input and output (3 for SwiGLU)     -> 24 sbh for GPT
  //   attention scores: softmax output 2as^2b, its dropout mask as^2b and
  //     dropout output 2as^2b                                            -> 5 a s^2 b
  const double replicated = (m.has_bias() ? 10 : 8) * sbh;
  const double split = 2 * sbh + 4 * s * b * kv + 2 * sbh + (m.gated_mlp() ? 6 : 4) * s * b * f;
  const double scores = (r == Recompute::Selective) ? 0.0 : 5 * a * s * s * b;
  double bytes = sp ? (replicated + split + scores) / t : replicated + (split + scores) / t;
  return scale * bytes;
}

StateBytes state_bytes_per_param(bool fp32, bool zero1, int dp) {
  const double d = zero1 ? dp : 1;
  if (fp32) return {4, 4, 8 / d};  // weights, grads, Adam m and v
  return {2, 2, 12 / d};           // bf16 weights and grads; fp32 master, m, v
}

int in_flight(int stage, int pp, int v, int m) {
  if (pp <= 1) return 1;  // gradient accumulation: one micro-batch at a time
  if (v <= 1) return std::min(m, pp - stage);
  // Megatron's interleaved schedule warms up 2(p - stage - 1) + (v - 1)p chunks
  // and holds one more in the steady state.
  return std::min(m * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1);
}

std::vector<int> partition_layers(int layers, int pp, bool balanced, double head_layers) {
  TESSERA_ARG_CHECK(pp >= 1 && pp <= layers, "pp=", pp, " cannot split ", layers, " layers");
  // The one partition rule (NxD's: even, leftover layers to the later stages).
  auto spread = [](int n, int parts) { return pipeline::stage_layers(n, parts); };
  if (!balanced || pp == 1) return spread(layers, pp);
  int best_last = 1;
  double best_cost = 1e300;
  for (int last = 1; last <= layers - (pp - 1); ++last) {
    int others = layers - last;
    double cost = std::max(std::ceil(static_cast<double>(others) / (pp - 1)), last + head_layers);
    if (cost <= best_cost + 1e-9) {  // on a tie the larger last stage: closer to the others
      best_cost = cost;
      best_last = last;
    }
  }
  std::vector<int> v = spread(layers - best_last, pp - 1);
  v.push_back(best_last);
  return v;
}

// ---- CostModel ------------------------------------------------------------------------

CostModel::CostModel(const ModelConfig& model, const DeviceSpec& device, const TrainingConfig& train)
    : model_(model), device_(device), train_(train) {
  model_.validate();
  TESSERA_ARG_CHECK(train.global_batch >= 1, "--global-batch must be positive");
  TESSERA_ARG_CHECK(train.seq >= 1, "--seq must be positive");
  TESSERA_ARG_CHECK(train.seq <= model.max_seq, "--seq ", train.seq, " exceeds the model's max_seq ", model.max_seq);
  TESSERA_ARG_CHECK(train.efficiency > 0 && train.efficiency <= 1, "--efficiency must be in (0, 1]");
  TESSERA_ARG_CHECK(train.memory_fraction > 0 && train.memory_fraction <= 1, "--memory-fraction must be in (0, 1]");
  TESSERA_ARG_CHECK(device.peak_flops_bf16 > 0 && device.hbm_bytes > 0, "device '", device.name,
                    "' needs peak FLOP/s and HBM capacity");
}

double CostModel::memory_capacity() const { return static_cast<double>(device_.hbm_bytes) * train_.memory_fraction; }

double CostModel::head_layers() const {
  return logit_flops(model_, 1, train_.seq) / layer_forward_flops(model_, 1, train_.seq);
}

PlanCost CostModel::evaluate(const PlanChoice& c, const GroupNets& nets) const {
  const ModelConfig& m = model_;
  const int t = c.tp, p = c.pp, v = c.virtual_stages, b = c.micro_batch, seq = train_.seq;
  TESSERA_ARG_CHECK(static_cast<int>(c.stage_layers.size()) == p, "stage_layers lists ", c.stage_layers.size(),
                    " stages for pp=", p);
  TESSERA_ARG_CHECK(t >= 1 && p >= 1 && c.dp >= 1 && b >= 1 && v >= 1, "plan sizes must be positive");
  TESSERA_ARG_CHECK(train_.global_batch % (static_cast<int64_t>(c.dp) * b) == 0, "dp*micro_batch = ", c.dp * b,
                    " does not divide the global batch ", train_.global_batch);
  const int mb = static_cast<int>(train_.global_batch / (static_cast<int64_t>(c.dp) * b));
  const double elem = train_.fp32 ? 4 : 2;
  const double peak = (train_.fp32 ? device_.peak_flops_fp32 : device_.peak_flops_bf16) * train_.efficiency;
  const StateBytes sb = state_bytes_per_param(train_.fp32, c.zero1, c.dp);

  // Per-rank parameters of a layer: TP-split part / t plus the replicated rest.
  const double layer_params = static_cast<double>(m.layer_params_tp_sharded()) / t +
                              static_cast<double>(m.layer_params() - m.layer_params_tp_sharded());
  const double vocab_rows = static_cast<double>(m.vocab) * m.hidden / t;  // vocab-parallel embedding / LM head
  const double act_layer = layer_activation_bytes(m, seq, b, t, c.sequence_parallel, c.recompute, train_.fp32);

  // Per micro-batch, per TP rank.
  const double layer_fwd = layer_forward_flops(m, b, seq);
  const double layer_flops = (c.recompute == Recompute::Full ? 4 : 3) * layer_fwd +
                             (c.recompute == Recompute::Selective ? attention_score_flops(m, b, seq) : 0.0);
  const double head_flops = 3 * logit_flops(m, b, seq);

  // TP: per layer 2 collectives forward, 2 backward, 2 more when the forward is
  // recomputed; each an all-reduce of the b*s*h activation, or with sequence
  // parallelism an all-gather plus a reduce-scatter of it (Korthikanti 4.2.2).
  double tp_coll = 0;
  if (t > 1) {
    const double n = elem * b * seq * m.hidden;
    tp_coll = c.sequence_parallel ? nets.tp.torus_allgather_time(n) + nets.tp.torus_reduce_scatter_time(n)
                                  : nets.tp.torus_allreduce_time(n);
  }
  const int tp_per_layer = 4 + (c.recompute == Recompute::Full ? 2 : 0);

  // PP: each stage sends one activation forward and one gradient backward per
  // micro-batch and model chunk, b*s*h/t per rank (sequence parallel, or
  // Megatron's scatter/gather otherwise), one neighbour step.
  double p2p = 0;
  if (p > 1) {
    const double n = elem * b * seq * m.hidden / t;
    for (size_t d = 0; d < nets.pp.dims().size(); ++d)
      p2p = std::max(p2p, nets.pp.step_time(static_cast<int>(d), 1, n));
  }

  PlanCost out;
  out.num_micro_batches = mb;
  double worst_mem = -1, worst_time = -1, dp_time = 0;
  TimeBreakdown slow;
  for (int s = 0; s < p; ++s) {
    const int layers = c.stage_layers[static_cast<size_t>(s)];
    const bool first = s == 0, last = s == p - 1;
    // Memory.
    double params = layers * layer_params;
    if (first) params += vocab_rows + (m.learned_positions() ? static_cast<double>(m.max_seq) * m.hidden : 0.0);
    if (last) params += (m.has_bias() ? 2.0 : 1.0) * m.hidden + ((m.tied_embeddings() && p == 1) ? 0.0 : vocab_rows);
    const int inflight = in_flight(s, p, v, mb);
    const double layers_per_unit = static_cast<double>(layers) / v;
    double act = act_layer * inflight * layers_per_unit;
    if (last) act += 4.0 * seq * b * m.vocab / t;  // fp32 logits for the cross-entropy
    if (c.recompute == Recompute::Full)            // one layer's full activations while it is recomputed
      act += layer_activation_bytes(m, seq, b, t, c.sequence_parallel, Recompute::None, train_.fp32);
    MemoryBreakdown mem{params * sb.weights, params * sb.grads, params * sb.optimizer, act, 0};
    mem.total = mem.params + mem.grads + mem.optimizer + mem.activations;
    if (mem.total > worst_mem) {
      worst_mem = mem.total;
      out.memory = mem;
      out.memory_stage = s;
    }
    // Time per micro-batch on this stage.
    TimeBreakdown tb;
    tb.compute = (layers * layer_flops + (last ? head_flops : 0.0)) / t / peak;
    tb.tp_comm = (layers * tp_per_layer + (first ? 1 : 0) + (last ? 1 : 0)) * tp_coll;
    tb.pp_comm = p > 1 ? 2.0 * v * p2p : 0.0;
    double per_mb = tb.compute + tb.tp_comm + tb.pp_comm;
    if (per_mb > worst_time) {
      worst_time = per_mb;
      slow = tb;
      out.time_stage = s;
    }
    // DP: gradients of this stage's parameters.
    if (c.dp > 1) {
      const double g = params * sb.grads, w = params * sb.weights;
      double d = c.zero1 ? nets.dp.torus_reduce_scatter_time(g) + nets.dp.torus_allgather_time(w)
                         : nets.dp.torus_allreduce_time(g);
      dp_time = std::max(dp_time, d);
    }
  }
  TimeBreakdown& tm = out.time;
  tm.compute = mb * slow.compute;
  tm.tp_comm = mb * slow.tp_comm;
  tm.pp_comm = mb * slow.pp_comm;
  // 1F1B: p - 1 micro-batch slots of fill and drain; interleaving shrinks each to 1/v.
  tm.bubble = static_cast<double>(p - 1) / v * worst_time;
  tm.dp_comm = dp_time;
  tm.total = tm.compute + tm.tp_comm + tm.pp_comm + tm.bubble + tm.dp_comm;

  const double cores = static_cast<double>(t) * p * c.dp;
  out.flops_per_step = step_flops(m, static_cast<double>(train_.global_batch), seq, c.recompute);
  out.model_flops_per_step = step_flops(m, static_cast<double>(train_.global_batch), seq, Recompute::None);
  out.achieved_flops_per_device = out.flops_per_step / (tm.total * cores);
  out.mfu =
      out.model_flops_per_step / (tm.total * cores * (train_.fp32 ? device_.peak_flops_fp32 : device_.peak_flops_bf16));
  return out;
}

}  // namespace tessera::parallel
