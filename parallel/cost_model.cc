#include "parallel/cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "collectives/host.h"
#include "parallel/pipeline/partition.h"
#include "runtime/error.h"
#include "runtime/kernel_cost.h"

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

const char* runtime_name(StepRuntime r) { return r == StepRuntime::MegatronLM ? "megatron-lm" : "tessera"; }

StepRuntime parse_runtime(const std::string& s) {
  if (s == "tessera") return StepRuntime::Tessera;
  if (s == "megatron-lm") return StepRuntime::MegatronLM;
  throw InvalidArgument("bad runtime '" + s + "' (expected tessera or megatron-lm)");
}

// ---- formulas -------------------------------------------------------------------------

double gemm_sustained_fraction(const DeviceSpec& device, const TrainingConfig& train) {
  // Megatron-LM's runtime runs the GEMM library of its published runs (the
  // device's megatron_sustained_fraction, when it names one); --efficiency
  // overrides either.
  if (train.efficiency > 0) return train.efficiency;
  if (train.runtime == StepRuntime::MegatronLM && device.megatron_sustained_fraction > 0)
    return device.megatron_sustained_fraction;
  return device.sustained_fraction;
}

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

int in_flight(int stage, int pp, int v, int m, pipeline::Schedule schedule) {
  if (pp <= 1) return 1;  // gradient accumulation: one micro-batch at a time
  if (schedule == pipeline::Schedule::kGpipe) return m * v;
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

// ---- groups -------------------------------------------------------------------------

// Every group, whatever its size, is the communicator's own model
// (collectives::group_cost_model): costing one is O(p), not p^2.

int kv_replicas_of(const ModelConfig& m, int tp) {
  return m.family == "llama" && tp > m.kv_heads ? tp / m.kv_heads : 1;
}

GroupNets emulated_group_nets(int tp, int pp, int dp, int kv_replicas) {
  auto ring = [](int n) {
    std::vector<int> nodes(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) nodes[static_cast<size_t>(i)] = i;
    return collectives::group_cost_model(NetModel(), nodes, /*shared_memory=*/true);
  };
  return GroupNets{ring(tp), ring(dp), ring(pp), ring(pp > 1 ? 2 : 1), ring(pp > 1 ? 2 : 1), ring(kv_replicas)};
}

GroupNets placement_group_nets(const Topology& topo, const Placement& pl, int kv_replicas) {
  const Mesh& mesh = pl.mesh();
  const NetModel net = topo.net_model();
  const bool shm = topo.num_instances() <= 1;
  // A group spanning instances has the host map its communicator would
  // (host = the node's instance, numbered in order of first member; shared
  // memory inside each, as shm+tcp), so the hierarchical algorithms are
  // candidates as in a real run (collectives/coll_cost.h).
  auto model = [&](const std::vector<int>& nodes) {
    if (shm) return collectives::group_cost_model(net, nodes, true);
    collectives::HostMap hosts;
    std::map<int, int> index;  // instance -> host index
    for (int node : nodes) {
      const std::vector<int> c = net.coords(node);
      int inst = 0;
      for (size_t i = topo.dims().size(); i-- > 0;)
        if (topo.dims()[i].level == TopoLevel::Instance) inst = inst * topo.dims()[i].net.size + c[i];
      const auto [it, fresh] = index.emplace(inst, static_cast<int>(index.size()));
      if (fresh) hosts.names.push_back("instance " + std::to_string(inst));
      hosts.host_of.push_back(it->second);
    }
    if (hosts.num_hosts() < 2) return collectives::group_cost_model(net, nodes, true);
    return collectives::group_cost_model(net, nodes, false, &hosts, 0, /*host_shared_memory=*/true);
  };
  auto group = [&](MeshAxis a) {
    std::vector<int> nodes;
    for (int i = 0; i < mesh.size(a); ++i) {
      MeshCoord c{};
      if (a == MeshAxis::TP) c.tp = i;
      if (a == MeshAxis::DP) c.dp = i;
      if (a == MeshAxis::PP) c.pp = i;
      nodes.push_back(pl.node(mesh.rank(c)));
    }
    return model(nodes);
  };
  auto pair = [&](int stage_a, int stage_b) {
    std::vector<int> nodes = {pl.node(mesh.rank({.tp = 0, .dp = 0, .pp = stage_a}))};
    if (stage_b != stage_a) nodes.push_back(pl.node(mesh.rank({.tp = 0, .dp = 0, .pp = stage_b})));
    return model(nodes);
  };
  const int p = mesh.size(MeshAxis::PP);
  std::vector<int> kv_nodes;  // rank 0's K/V group: the first kv_replicas TP ranks
  kv_nodes.reserve(static_cast<size_t>(kv_replicas));
  for (int i = 0; i < kv_replicas; ++i) kv_nodes.push_back(pl.node(mesh.rank({.tp = i, .dp = 0, .pp = 0})));
  return GroupNets{group(MeshAxis::TP),    group(MeshAxis::DP), group(MeshAxis::PP),
                   pair(0, p > 1 ? 1 : 0), pair(0, p - 1),      model(kv_nodes)};
}

// ---- the pipeline ---------------------------------------------------------------------

PipelineTimes simulate_pipeline(pipeline::Schedule schedule, int p, int m, int v,
                                const std::vector<std::vector<double>>& fwd,
                                const std::vector<std::vector<double>>& bwd, double transfer_s) {
  const int nv = p * v;
  std::vector<std::vector<pipeline::PipeOp>> ops(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) ops[static_cast<size_t>(s)] = pipeline::schedule_ops(schedule, p, m, s, v);
  // When each virtual stage's forward / backward of each micro-batch ended (< 0: not yet).
  std::vector<double> f_done(static_cast<size_t>(nv) * static_cast<size_t>(m), -1.0), b_done(f_done);
  auto at = [&](int vs, int micro) {
    return static_cast<size_t>(vs) * static_cast<size_t>(m) + static_cast<size_t>(micro);
  };
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  PipelineTimes out;
  out.end.assign(static_cast<size_t>(p), 0.0);
  out.wait.assign(static_cast<size_t>(p), 0.0);
  out.idle.assign(static_cast<size_t>(p), 0.0);
  out.link.assign(static_cast<size_t>(p), 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const size_t su = static_cast<size_t>(s);
      double& now = out.end[su];
      for (; next[su] < ops[su].size(); ++next[su]) {
        const pipeline::PipeOp& op = ops[su][next[su]];
        const int vs = op.chunk * p + s;
        const bool f = op.kind == pipeline::PipeOp::kForward;
        const bool needs = f ? vs > 0 : vs < nv - 1;
        if (needs) {
          const double sent = f ? f_done[at(vs - 1, op.micro)] : b_done[at(vs + 1, op.micro)];
          if (sent < 0) break;  // its input is not produced yet
          const double arrive = sent + transfer_s;
          if (arrive > now) {
            out.wait[su] += arrive - now;
            out.idle[su] += std::max(0.0, sent - now);
            out.link[su] += arrive - std::max(now, sent);
            now = arrive;
          }
        }
        now += (f ? fwd : bwd)[su][static_cast<size_t>(op.chunk)];
        (f ? f_done : b_done)[at(vs, op.micro)] = now;
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s)
    TESSERA_CHECK(next[static_cast<size_t>(s)] == ops[static_cast<size_t>(s)].size(), "pipeline schedule ",
                  pipeline::schedule_name(schedule), " deadlocks at stage ", s);
  return out;
}

namespace {

// One pass (forward or backward of one micro-batch through one chunk): its
// kernels and its blocking TP collectives.
struct Pass {
  double compute = 0, comm = 0;
  double total() const { return compute + comm; }
};

// Sums the kernels and collectives a rank runs, with the emulated cores' costs.
class StepCoster {
 public:
  StepCoster(const ModelConfig& m, const DeviceSpec& dev, bool fp32, const GroupNets& nets, int tp, bool sp, int64_t b,
             int64_t seq, StepRuntime runtime, bool overlap_tp_backward, bool fp16_lm_cross_entropy)
      : megatron_(runtime == StepRuntime::MegatronLM),
        overlap_tp_backward_(overlap_tp_backward),
        fp16_ce_(fp16_lm_cross_entropy),
        m_(m),
        dev_(dev),
        dt_(fp32 ? DType::F32 : DType::BF16),
        scale_(fp32 ? 1.0 : 0.5),
        nets_(nets),
        t_(tp),
        sp_(sp && tp > 1),
        b_(b),
        s_(seq) {
    n_ = b * seq;
    c_ = m.hidden;
    nl_ = sp_ ? n_ / tp : n_;
    hd_ = m.head_size();
    hl_ = m.heads / tp;
    kvl_ = std::max(1, m.kv_heads / tp);  // K/V heads of a rank (one, replicated, when tp exceeds them)
    kv_rep_ = kv_replicas_of(m, tp);
    llama_ = m.family == "llama";
    qkv_ = (m.q_dim() + 2 * m.kv_dim()) / tp;
    f_ = m.ffn_hidden / tp;
    fc_ = m.gated_mlp() ? 2 * f_ : f_;
    vv_ = (m.vocab + tp - 1) / tp;
  }

  // Kernel seconds (the emulated kernels are fp32; bf16 halves the bytes).
  double k(cost::Kernel x) const {
    x.bytes *= scale_;
    return cost::kernel_seconds(dev_, x, dt_);
  }
  // An fp32 kernel whatever the precision (the optimizer's master weights and states).
  double k32(const cost::Kernel& x) const { return cost::kernel_seconds(dev_, x, DType::F32); }
  // The optimizer step over this rank's n elements: the gradient norm and
  // AdamW in fp32, and with Megatron-LM in 16 bits its optimizer's copies
  // around Adam on the fp32 main parameters (megatron/optimizer/optimizer.py,
  // FP16OptimizerWithFP16Params, 2021; Float16OptimizerWithFloat16Params
  // after it): the 16-bit gradients to fp32 main gradients (2 + 4 bytes an
  // element), unscaled in place with the inf/nan check (4 + 4), and the
  // stepped main parameters back to 16 bits (4 + 2); one multi-tensor kernel each.
  double optimizer_step(int64_t n) const {
    double s = k32(cost::sum_squares(n)) + k32(cost::adamw(n));
    if (megatron_ && dt_ != DType::F32) {
      const double e = static_cast<double>(n);
      s += k32(cost::Kernel{0, 6.0 * e}) + k32(cost::Kernel{e, 8.0 * e}) + k32(cost::Kernel{0, 6.0 * e});
    }
    return s;
  }
  // A collective as the group's communicator runs it; ParallelState skips
  // groups of one rank and empty calls.
  double coll(collectives::CollKind kind, int64_t count, const collectives::GroupCostModel& g) const {
    if (g.size <= 1 || count <= 0) return 0;
    if (megatron_ && dt_ != DType::F32 && kind != collectives::CollKind::AllGather)  // NCCL reduces in 16 bits
      return collectives::predict(kind, static_cast<size_t>((count + 1) / 2), DType::F32, g).seconds;
    return collectives::predict(kind, static_cast<size_t>(count), dt_, g).seconds;
  }
  double tp(collectives::CollKind kind, int64_t count) const { return coll(kind, count, nets_.tp); }

  // Forward and backward of `layers` blocks, with the embedding / the head when the chunk has them.
  Pass forward(int layers, bool embed, bool head, Recompute r) const {
    (void)r;
    Pass p;  // the layers are alike: one layer's cost (computed once), times their number
    if (embed) embedding_forward(p);
    const Pass& layer = layer_forward_once();
    p.compute += layers * layer.compute;
    p.comm += layers * layer.comm;
    if (head) head_forward(p);
    return p;
  }
  Pass backward(int layers, bool embed, bool head, Recompute r) const {
    Pass p;
    if (head) head_backward(p);
    const Pass& layer = layer_backward_once(r);
    p.compute += layers * layer.compute;
    p.comm += layers * layer.comm;
    if (embed) embedding_backward(p);
    return p;
  }

  // Activation elements passed between stages per micro-batch.
  int64_t activation_elems() const { return nl_ * c_; }
  // Seconds of one activation's transfer between neighbouring stages on `link`.
  double stage_transfer(const collectives::GroupCostModel& link) const {
    const int to = link.size > 1 ? 1 : 0;
    if (!megatron_)  // fp32 elements and the sender's timestamp (two floats)
      return collectives::p2p_seconds(link, 0, to, 4.0 * static_cast<double>(activation_elems() + 2));
    // Scatter-gather: 1/t of the activation per TP rank, all-gathered over TP
    // after it arrived (already 1/t with sequence parallelism).
    const int64_t part = sp_ ? nl_ * c_ : (n_ * c_ + t_ - 1) / t_;
    const double es = dt_ == DType::F32 ? 4.0 : 2.0;
    return collectives::p2p_seconds(link, 0, to, es * static_cast<double>(part)) +
           (sp_ ? 0.0 : tp(collectives::CollKind::AllGather, part));
  }

 private:
  using K = collectives::CollKind;
  void column_forward(Pass& p, int64_t out) const {
    if (sp_) p.comm += tp(K::AllGather, nl_ * c_);
    if (m_.has_bias()) p.compute += k(cost::broadcast_rows(n_, out));
    p.compute += k(cost::gemm(n_, out, c_, m_.has_bias()));
  }
  void column_backward(Pass& p, int64_t out) const {
    // The input, gathered again for the weight gradient (Megatron-LM with sequence parallelism).
    const double gather = sp_ && megatron_ ? tp(K::AllGather, nl_ * c_) : 0.0;
    const double wgrad = k(cost::gemm(c_, out, n_, true)) + (m_.has_bias() ? k(cost::bias_grad(n_, out)) : 0.0);
    const double dgrad = k(cost::gemm(n_, c_, out, false));
    const double reduce = sp_ ? tp(K::ReduceScatter, nl_ * c_) : tp(K::AllReduce, n_ * c_);
    p.compute += wgrad + dgrad;
    if (overlap_tp_backward_) {  // only what the GEMM beside it cannot hide waits
      p.comm += std::max(0.0, gather - dgrad) + std::max(0.0, reduce - wgrad);
    } else {
      p.comm += gather + reduce;
    }
  }
  void row_forward(Pass& p, int64_t in) const {
    if (t_ == 1) {
      p.compute += k(cost::add_rows(n_, c_, m_.has_bias()));
      p.compute += k(cost::gemm(n_, c_, in, true));
      return;
    }
    p.compute += k(cost::gemm(n_, c_, in, false));
    p.comm += sp_ ? tp(K::ReduceScatter, nl_ * c_) : tp(K::AllReduce, n_ * c_);
    p.compute += k(cost::add_rows(nl_, c_, m_.has_bias()));
  }
  void row_backward(Pass& p, int64_t in) const {
    if (m_.has_bias()) p.compute += k(cost::bias_grad(nl_, c_));
    if (sp_) p.comm += tp(K::AllGather, nl_ * c_);
    p.compute += k(cost::gemm(in, c_, n_, true));
    p.compute += k(cost::gemm(n_, in, c_, false));
  }
  // ---- the Llama family: LlamaModel's kernels and collectives (parallel/models/llama/llama_model.h) ----
  bool abias() const { return m_.attention_bias; }
  // One TP reduction of the summed input gradient of column-parallel layers sharing an input.
  void input_grad_reduce(Pass& p) const { p.comm += sp_ ? tp(K::ReduceScatter, nl_ * c_) : tp(K::AllReduce, n_ * c_); }
  // nn.Linear column-parallel forward: [bias broadcast] gemm(N, out, C, bias).
  void linear_column_forward(Pass& p, int64_t out, bool bias) const {
    if (bias) p.compute += k(cost::broadcast_rows(n_, out));
    p.compute += k(cost::gemm(n_, out, c_, bias));
  }
  // Weight gradient (gemm(out, C, N) [+ bias]) and input gradient (gemm(N, C, out), accumulating unless first).
  void linear_column_backward(Pass& p, int64_t out, bool bias, bool first, bool replicated) const {
    if (replicated && kv_rep_ > 1) p.comm += coll(K::AllReduce, n_ * out, nets_.kv);
    p.compute += k(cost::gemm(out, c_, n_, true));
    if (bias) p.compute += k(cost::bias_grad(n_, out));
    p.compute += k(cost::gemm(n_, c_, out, !first));
  }
  // nn.Linear row-parallel forward and backward (`in` local inputs), the residual add fused.
  void linear_row_forward(Pass& p, int64_t in, bool bias) const {
    if (t_ == 1) {
      p.compute += k(cost::add_rows(n_, c_, bias));
      p.compute += k(cost::gemm(n_, c_, in, true));
      return;
    }
    p.compute += k(cost::gemm(n_, c_, in, false));
    p.comm += sp_ ? tp(K::ReduceScatter, nl_ * c_) : tp(K::AllReduce, n_ * c_);
    p.compute += k(cost::add_rows(nl_, c_, bias));
  }
  void linear_row_backward(Pass& p, int64_t in, bool bias) const {
    if (bias) p.compute += k(cost::bias_grad(sp_ ? nl_ : n_, c_));
    if (sp_) p.comm += tp(K::AllGather, nl_ * c_);
    p.compute += k(cost::gemm(c_, in, n_, true));
    p.compute += k(cost::gemm(n_, in, c_, false));
  }
  void llama_layer_forward(Pass& p) const {
    const int64_t qw = hl_ * hd_, kw = kvl_ * hd_;
    p.compute += k(cost::rmsnorm_forward(nl_, c_));
    if (sp_) p.comm += tp(K::AllGather, nl_ * c_);  // gathered once for q, k and v
    linear_column_forward(p, qw, abias());
    linear_column_forward(p, kw, abias());
    linear_column_forward(p, kw, abias());
    p.compute += k(cost::rope(n_, hl_, hd_)) + k(cost::rope(n_, kvl_, hd_));
    p.compute += k(cost::gqa_attention_forward(b_, hl_, kvl_, s_, hd_));
    linear_row_forward(p, qw, abias());
    p.compute += k(cost::rmsnorm_forward(nl_, c_));
    if (sp_) p.comm += tp(K::AllGather, nl_ * c_);  // once for gate and up
    linear_column_forward(p, f_, false);
    linear_column_forward(p, f_, false);
    p.compute += k(cost::swiglu_forward(n_ * f_));
    linear_row_forward(p, f_, false);
  }
  void llama_layer_backward(Pass& p) const {
    const int64_t qw = hl_ * hd_, kw = kvl_ * hd_;
    linear_row_backward(p, f_, false);  // down
    p.compute += k(cost::swiglu_backward(n_ * f_));
    linear_column_backward(p, f_, false, true, false);   // up
    linear_column_backward(p, f_, false, false, false);  // gate
    input_grad_reduce(p);
    p.compute += k(cost::rmsnorm_backward(nl_, c_));
    linear_row_backward(p, qw, abias());  // o
    p.compute += k(cost::gqa_attention_backward(b_, hl_, kvl_, s_, hd_));
    p.compute += k(cost::rope(n_, hl_, hd_)) + k(cost::rope(n_, kvl_, hd_));
    linear_column_backward(p, qw, abias(), true, false);  // q
    linear_column_backward(p, kw, abias(), false, true);  // k
    linear_column_backward(p, kw, abias(), false, true);  // v
    input_grad_reduce(p);
    p.compute += k(cost::rmsnorm_backward(nl_, c_));
  }

  void layer_forward(Pass& p) const {
    if (llama_) {
      llama_layer_forward(p);
      return;
    }
    p.compute += k(cost::layernorm_forward(nl_, c_));
    column_forward(p, qkv_);
    attention_forward(p);
    row_forward(p, c_ / t_);
    p.compute += k(cost::layernorm_forward(nl_, c_));
    column_forward(p, fc_);
    p.compute += k(cost::gelu_forward(n_ * f_));
    row_forward(p, f_);
  }
  void layer_backward(Pass& p) const {
    if (llama_) {
      llama_layer_backward(p);
      return;
    }
    row_backward(p, f_);
    p.compute += k(cost::gelu_backward(n_ * f_));
    column_backward(p, fc_);
    p.compute += k(cost::layernorm_backward(nl_, c_));
    row_backward(p, c_ / t_);
    attention_backward(p);
    column_backward(p, qkv_);
    p.compute += k(cost::layernorm_backward(nl_, c_));
  }
  // Core attention: tessera's fused causal kernel, or Megatron-LM's unfused one.
  void attention_forward(Pass& p) const {
    if (llama_) {  // what selective recompute redoes of a Llama layer
      p.compute += k(cost::gqa_attention_forward(b_, hl_, kvl_, s_, hd_));
      return;
    }
    if (!megatron_) {
      p.compute += k(cost::attention_forward(b_, hl_, s_, hd_));
      return;
    }
    const int64_t bh = b_ * hl_;
    p.compute += k(cost::batched_gemm(bh, s_, s_, hd_));  // Q K^T
    p.compute += k(cost::softmax_forward(bh * s_, s_));   // scale, mask, softmax
    p.compute += k(cost::dropout_forward(bh * s_ * s_));
    p.compute += k(cost::batched_gemm(bh, s_, hd_, s_));  // P V
  }
  void attention_backward(Pass& p) const {
    if (!megatron_) {
      p.compute += k(cost::attention_backward(b_, hl_, s_, hd_));
      return;
    }
    const int64_t bh = b_ * hl_;
    p.compute += k(cost::batched_gemm(bh, s_, s_, hd_));  // dP = dY V^T
    p.compute += k(cost::batched_gemm(bh, s_, hd_, s_));  // dV = P^T dY
    p.compute += k(cost::dropout_backward(bh * s_ * s_));
    p.compute += k(cost::softmax_backward(bh * s_, s_));
    p.compute += k(cost::batched_gemm(bh, s_, hd_, s_));  // dQ = dS K
    p.compute += k(cost::batched_gemm(bh, s_, hd_, s_));  // dK = dS^T Q
  }
  void embedding_forward(Pass& p) const {
    p.compute += k(cost::embedding_forward(n_, c_));
    p.comm += sp_ ? tp(K::ReduceScatter, nl_ * c_) : tp(K::AllReduce, n_ * c_);
    if (m_.learned_positions()) p.compute += k(cost::position_add(nl_, c_));
  }
  void embedding_backward(Pass& p) const {
    if (m_.learned_positions()) p.compute += k(cost::position_add(nl_, c_));
    if (sp_) p.comm += tp(K::AllGather, nl_ * c_);
    p.compute += k(cost::embedding_backward(n_, c_));
  }
  void head_forward(Pass& p) const {
    p.compute += k(llama_ ? cost::rmsnorm_forward(nl_, c_) : cost::layernorm_forward(nl_, c_));
    if (sp_) p.comm += tp(K::AllGather, nl_ * c_);
    p.compute += k(cost::gemm(n_, vv_, c_, false));
    p.comm += tp(K::AllReduce, n_) + tp(K::AllReduce, 2 * n_);  // row max, then sums and target logits
    if (megatron_ && !llama_) {
      for (const cost::Kernel& x : cost::megatron_cross_entropy_forward(n_, vv_, logit_bytes(), ce_bytes()))
        p.compute += k32(x);
    } else {
      p.compute += k(cost::cross_entropy(n_, vv_, true));
    }
  }
  void head_backward(Pass& p) const {
    if (megatron_ && !llama_) {
      for (const cost::Kernel& x : cost::megatron_cross_entropy_backward(n_, vv_, logit_bytes(), ce_bytes()))
        p.compute += k32(x);
    }
    p.compute += k(cost::gemm(n_, c_, vv_, false));
    p.compute += k(cost::gemm(vv_, c_, n_, true));
    p.comm += sp_ ? tp(K::ReduceScatter, nl_ * c_) : tp(K::AllReduce, n_ * c_);
    p.compute += k(llama_ ? cost::rmsnorm_backward(nl_, c_) : cost::layernorm_backward(nl_, c_));
  }

  // One layer's forward, and its backward (with what the recompute redoes),
  // costed at the first use: every stage and chunk repeats the same layer.
  const Pass& layer_forward_once() const {
    if (!fwd_done_) {
      layer_forward(fwd_);
      fwd_done_ = true;
    }
    return fwd_;
  }
  const Pass& layer_backward_once(Recompute r) const {
    const auto i = static_cast<size_t>(r);
    if (!bwd_done_[i]) {
      Pass& layer = bwd_[i];
      if (r == Recompute::Full) layer_forward(layer);
      if (r == Recompute::Selective) attention_forward(layer);
      layer_backward(layer);
      bwd_done_[i] = true;
    }
    return bwd_[i];
  }
  mutable Pass fwd_, bwd_[3];
  mutable bool fwd_done_ = false, bwd_done_[3] = {false, false, false};

  // Megatron-LM's logits and the precision of its cross entropy (an fp32
  // copy of 16-bit logits unless --fp16-lm-cross-entropy).
  int logit_bytes() const { return static_cast<int>(dtype_size(dt_)); }
  int ce_bytes() const { return fp16_ce_ ? logit_bytes() : 4; }

  bool megatron_;
  bool overlap_tp_backward_;
  bool fp16_ce_;
  const ModelConfig& m_;
  const DeviceSpec& dev_;
  DType dt_;
  double scale_;
  const GroupNets& nets_;
  int t_;
  bool sp_;
  int64_t b_, s_, n_ = 0, c_ = 0, nl_ = 0, hd_ = 0, hl_ = 0, kvl_ = 0, qkv_ = 0, f_ = 0, fc_ = 0, vv_ = 0;
  int kv_rep_ = 1;
  bool llama_ = false;
};

}  // namespace

// ---- CostModel ------------------------------------------------------------------------

CostModel::CostModel(const ModelConfig& model, const DeviceSpec& device, const TrainingConfig& train)
    : model_(model), device_(device), train_(train) {
  model_.validate();
  TESSERA_ARG_CHECK(train.global_batch >= 1, "--global-batch must be positive");
  TESSERA_ARG_CHECK(train.seq >= 1, "--seq must be positive");
  TESSERA_ARG_CHECK(train.seq <= model.max_seq, "--seq ", train.seq, " exceeds the model's max_seq ", model.max_seq);
  TESSERA_ARG_CHECK(train.efficiency <= 1, "--efficiency must be in (0, 1]");
  TESSERA_ARG_CHECK(train.bucket_elems >= 1, "the gradient bucket must hold at least one element");
  TESSERA_ARG_CHECK(!train.overlap_tp_backward || train.runtime == StepRuntime::MegatronLM,
                    "--overlap-tp-backward on needs --runtime megatron-lm (tessera's TP collectives block)");
  TESSERA_ARG_CHECK(!train.fp16_lm_cross_entropy || (train.runtime == StepRuntime::MegatronLM && !train.fp32),
                    "--fp16-lm-cross-entropy needs --runtime megatron-lm in 16 bits");
  // Both flags model Megatron-LM's GPT code; a Llama model is costed as LlamaModel runs it under either runtime.
  for (const auto& [set, flag] : {std::pair{train.overlap_tp_backward, "--overlap-tp-backward on"},
                                  std::pair{train.fp16_lm_cross_entropy, "--fp16-lm-cross-entropy"}})
    TESSERA_ARG_CHECK(!set || model.family != "llama", flag,
                      " models Megatron-LM's GPT layers; a Llama model is costed as LlamaModel runs it (leave the "
                      "flag out)");
  device_.sustained_fraction = gemm_sustained_fraction(device, train);
  TESSERA_ARG_CHECK(device_.sustained_fraction > 0 && device_.sustained_fraction <= 1, "device '", device.name,
                    "' needs a sustained fraction of peak in (0, 1]");
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
  const StateBytes sb = state_bytes_per_param(train_.fp32, c.zero1, c.dp);
  TESSERA_ARG_CHECK(p == 1 || v == 1 || c.schedule == pipeline::Schedule::kInterleaved,
                    "virtual stages need the interleaved schedule");

  // Per-rank parameters of a layer: TP-split part / t (K/V heads replicated
  // past kv_heads, as LlamaModel holds them) plus the replicated rest.
  const double layer_params = m.layer_params_per_rank(t);
  const double layer_replicated = static_cast<double>(m.layer_params() - m.layer_params_tp_sharded());
  const double vocab_rows = static_cast<double>(m.vocab) * m.hidden / t;  // vocab-parallel embedding / LM head
  const double act_layer = layer_activation_bytes(m, seq, b, t, c.sequence_parallel, c.recompute, train_.fp32);

  // Layers of each virtual stage (chunk j of stage i is virtual stage j p + i).
  std::vector<int> vstage_layers = c.stage_layers;
  if (v > 1) vstage_layers = pipeline::stage_layers(m.layers, p * v);
  auto chunk_layers = [&](int s, int ch) {
    const int vs = ch * p + s;
    return vstage_layers[static_cast<size_t>(vs)];
  };

  // Every pass of a micro-batch, from the kernels and collectives it runs.
  using K = collectives::CollKind;
  const StepCoster sc(m, device_, train_.fp32, nets, t, c.sequence_parallel, b, seq, train_.runtime,
                      train_.overlap_tp_backward, train_.fp16_lm_cross_entropy);
  std::vector<std::vector<double>> fwd(static_cast<size_t>(p)), bwd(static_cast<size_t>(p));
  std::vector<Pass> per_mb(static_cast<size_t>(p));  // all chunks' forward + backward of one micro-batch
  for (int s = 0; s < p; ++s) {
    for (int ch = 0; ch < v; ++ch) {
      const int vs = ch * p + s;
      const bool embed = vs == 0, head = vs == p * v - 1;
      const Pass f = sc.forward(chunk_layers(s, ch), embed, head, c.recompute);
      const Pass bk = sc.backward(chunk_layers(s, ch), embed, head, c.recompute);
      fwd[static_cast<size_t>(s)].push_back(f.total());
      bwd[static_cast<size_t>(s)].push_back(bk.total());
      per_mb[static_cast<size_t>(s)].compute += f.compute + bk.compute;
      per_mb[static_cast<size_t>(s)].comm += f.comm + bk.comm;
    }
  }
  // The pipeline: simulated (as the executor runs it) unless it is huge;
  // then 1F1B's closed form, (p - 1) / v slots of the slowest stage.
  PipelineTimes pipe;
  if (p == 1) {
    pipe.end = {mb * per_mb[0].total()};
    pipe.wait = pipe.idle = pipe.link = {0.0};
  } else if (2.0 * p * v * mb <= 2e4) {
    const double transfer = sc.stage_transfer(nets.link);
    pipe = simulate_pipeline(c.schedule, p, mb, v, fwd, bwd, transfer);
  } else {
    double slowest = 0;
    for (const Pass& x : per_mb) slowest = std::max(slowest, x.total());
    for (int s = 0; s < p; ++s) {
      pipe.wait.push_back(static_cast<double>(p - 1) / v * slowest);
      pipe.idle.push_back(pipe.wait.back());  // no transfers in the closed form
      pipe.link.push_back(0.0);
      pipe.end.push_back(mb * per_mb[static_cast<size_t>(s)].total() + pipe.wait.back());
    }
  }

  PlanCost out;
  out.num_micro_batches = mb;
  double worst_mem = -1, worst_time = -1;
  std::vector<double> zero_grad(static_cast<size_t>(p), 0.0);  // each stage's, before its pipeline
  // The collectives every stage runs alike, costed once: the gradient norm
  // (one float per group), the trainer's loss (two), the tied embedding's sum.
  const bool shard = c.zero1 && c.dp > 1;
  const double norm_dp = shard ? sc.coll(K::AllReduce, 1, nets.dp) : 0.0, norm_tp = sc.tp(K::AllReduce, 1);
  const double small_pp = sc.coll(K::AllReduce, 1, nets.pp) + sc.coll(K::AllReduce, 2, nets.pp);
  const double loss_dp = sc.coll(K::AllReduce, 2, nets.dp);
  const double embed_sum = p > 1 && m.tied_embeddings()
                               ? sc.coll(K::AllReduce, static_cast<int64_t>(std::llround(vocab_rows)), nets.embed)
                               : 0.0;
  // Gradient bucket size: tessera's trainer reduces buckets of bucket_elems.
  // Megatron-LM's local DDP (2021-22) reduced its contiguous gradient buffer
  // in one call after the backward pass; overlapped, Megatron-core's DDP
  // uses buckets of max(40M, 1M x dp) elements (distributed_data_parallel.py).
  auto bucket_elems = [&](int dp, int64_t params) -> int64_t {
    if (train_.runtime != StepRuntime::MegatronLM) return train_.bucket_elems;
    if (!train_.overlap_grad_reduce) return std::max<int64_t>(1, params);
    return std::max<int64_t>(40000000, int64_t{1000000} * dp);
  };
  // A bucket's reduction (all-reduce, or ZeRO-1's reduce-scatter) and,
  // with ZeRO-1, the all-gather of the updated slices after the step; its
  // sequence-parallel partial gradients summed over TP first. Memoised: the
  // stages repeat the same buckets.
  struct BucketCost {
    double tp = 0, reduce = 0, gather = 0;
  };
  std::vector<std::pair<std::pair<int64_t, int64_t>, BucketCost>> bucket_memo;
  auto bucket = [&](int64_t raw, int64_t sp_part) {
    for (const auto& [key, bc] : bucket_memo)
      if (key.first == raw && key.second == sp_part) return bc;
    BucketCost bc;
    const int64_t size = (raw + c.dp - 1) / c.dp * c.dp;  // padded to a multiple of dp
    if (c.sequence_parallel && t > 1) bc.tp = sc.tp(K::AllReduce, sp_part);
    bc.reduce = shard ? sc.coll(K::ReduceScatter, size / c.dp, nets.dp) : sc.coll(K::AllReduce, size, nets.dp);
    if (shard) bc.gather = sc.coll(K::AllGather, size / c.dp, nets.dp);
    bucket_memo.push_back({{raw, sp_part}, bc});
    return bc;
  };
  for (int s = 0; s < p; ++s) {
    const int layers = c.stage_layers[static_cast<size_t>(s)];
    const bool first = s == 0, last = s == p - 1;
    // Memory.
    double params = layers * layer_params;
    if (first) params += vocab_rows + (m.learned_positions() ? static_cast<double>(m.max_seq) * m.hidden : 0.0);
    if (last) params += (m.has_bias() ? 2.0 : 1.0) * m.hidden + ((m.tied_embeddings() && p == 1) ? 0.0 : vocab_rows);
    const int inflight = in_flight(s, p, v, mb, c.schedule);
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

    // Time of this stage's step: the pipeline (or the micro-batches one after
    // another), then the optimizer step (parallel/optim/optimizer.cc) and
    // the trainer's reductions, in the order the ranks run them.
    TimeBreakdown tb;
    const Pass& mbp = per_mb[static_cast<size_t>(s)];
    tb.compute = mb * mbp.compute;
    tb.tp_comm = mb * mbp.comm;
    tb.bubble = pipe.wait[static_cast<size_t>(s)];
    // Gradient buckets of bucket_elems in gradient order (the last one partial).
    const auto P = static_cast<int64_t>(std::llround(params));
    const int64_t E = bucket_elems(c.dp, P), nb = std::max<int64_t>(1, (P + E - 1) / E);
    zero_grad[static_cast<size_t>(s)] = sc.k(cost::fill(P));
    tb.compute += zero_grad[static_cast<size_t>(s)];
    const double sp_elems = layers * layer_replicated +
                            (first && m.learned_positions() ? static_cast<double>(m.max_seq) * m.hidden : 0.0) +
                            (last ? (m.has_bias() ? 2.0 : 1.0) * m.hidden : 0.0);
    // Every bucket but the last holds E elements: cost one, times nb - 1.
    const auto sp_part = static_cast<int64_t>(std::llround(sp_elems / static_cast<double>(nb)));
    const BucketCost full = nb > 1 ? bucket(E, sp_part) : BucketCost{}, tail = bucket(P - (nb - 1) * E, sp_part);
    const double nfull = static_cast<double>(nb - 1);
    tb.tp_comm += nfull * full.tp + tail.tp;
    double reduce = nfull * full.reduce + tail.reduce;
    if (train_.overlap_grad_reduce && c.dp > 1) {
      // The full buckets fill during the last micro-batch's backward on this
      // stage and reduce behind it; the last bucket fills as it ends.
      double window = 0;
      for (double x : bwd[static_cast<size_t>(s)]) window += x;
      reduce = tail.reduce + std::max(0.0, nfull * full.reduce - window);
    }
    tb.dp_comm += reduce + nfull * full.gather + tail.gather;
    if (first || last) tb.pp_comm += embed_sum;  // the tied embedding's two copies
    const int64_t mine = shard ? (P + c.dp - 1) / c.dp : P;
    tb.compute += sc.optimizer_step(mine);
    // The gradient norm (one float per group) and the trainer's loss (two).
    tb.dp_comm += norm_dp;
    tb.tp_comm += norm_tp;
    tb.pp_comm += small_pp;
    tb.dp_comm += loss_dp;
    tb.total = tb.compute + tb.tp_comm + tb.pp_comm + tb.bubble + tb.dp_comm;
    if (tb.total > worst_time) {
      worst_time = tb.total;
      out.time = tb;
      out.time_stage = s;
    }
  }
  // Each stage's pipeline phase as its trace track shows it: zero_grad, then
  // the pipeline, then (the drain, a bubble) until the slowest stage's ends.
  if (p > 1) {
    double phase0 = 0;
    for (int s = 0; s < p; ++s)
      phase0 = std::max(phase0, zero_grad[static_cast<size_t>(s)] + pipe.end[static_cast<size_t>(s)]);
    for (int s = 0; s < p; ++s) {
      const auto su = static_cast<size_t>(s);
      const double drain = phase0 - zero_grad[su] - pipe.end[su];
      out.stage_bubbles.push_back({pipe.end[su] - pipe.wait[su], pipe.idle[su] + drain, pipe.link[su]});
    }
  }
  const TimeBreakdown& tm = out.time;
  const double cores = static_cast<double>(t) * p * c.dp;
  out.flops_per_step = step_flops(m, static_cast<double>(train_.global_batch), seq, c.recompute);
  out.model_flops_per_step = step_flops(m, static_cast<double>(train_.global_batch), seq, Recompute::None);
  out.achieved_flops_per_device = out.flops_per_step / (tm.total * cores);
  out.mfu =
      out.model_flops_per_step / (tm.total * cores * (train_.fp32 ? device_.peak_flops_fp32 : device_.peak_flops_bf16));
  return out;
}

}  // namespace tessera::parallel
