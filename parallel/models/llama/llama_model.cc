#include "parallel/models/llama/llama_model.h"

#include <cmath>
#include <cstring>

#include "parallel/layers/attention.h"
#include "parallel/layers/buffer.h"
#include "parallel/layers/cross_entropy.h"
#include "parallel/layers/kv_cache.h"
#include "parallel/layers/param_alias.h"
#include "parallel/pipeline/partition.h"
#include "runtime/device.h"
#include "runtime/kernels.h"

namespace tessera::parallel::models::llama {

using parallel::layers::ColumnParallelLinear;
using parallel::layers::ensure_buffer;
using parallel::layers::ensure_f32_buffer;
using parallel::layers::Init;
using parallel::layers::LinearOptions;
using parallel::layers::make_parameter;
using parallel::layers::Parameter;
using parallel::layers::RowParallelLinear;
using parallel::layers::WeightLayout;

void LlamaModel::validate(const ModelConfig& cfg, int tp) {
  TESSERA_ARG_CHECK(cfg.family == "llama", cfg.label(), ": LlamaModel needs family llama, not '", cfg.family, "'");
  cfg.validate();
  TESSERA_ARG_CHECK(tp >= 1, "tp must be >= 1, not ", tp);
  TESSERA_ARG_CHECK(cfg.heads % tp == 0, cfg.label(), ": ", cfg.heads, " attention heads (kv_heads ", cfg.kv_heads,
                    ") do not divide over tp ", tp, " (attention is split by heads)");
  TESSERA_ARG_CHECK(cfg.kv_heads % tp == 0 || tp % cfg.kv_heads == 0, cfg.label(), ": ", cfg.kv_heads,
                    " kv_heads (heads ", cfg.heads, ") cannot be split over tp ", tp,
                    ": tp must divide kv_heads, or be a multiple of it (each K/V head then replicated onto tp / "
                    "kv_heads ranks)");
  TESSERA_ARG_CHECK(cfg.ffn_hidden % tp == 0, cfg.label(), ": ffn_hidden ", cfg.ffn_hidden, " does not divide over tp ",
                    tp);
}

int LlamaModel::kv_replicas(const ModelConfig& cfg, int tp) {
  return cfg.kv_heads > 0 && tp > cfg.kv_heads ? tp / cfg.kv_heads : 1;
}

namespace {
// nn.Linear's [out, in] layout, Hugging Face Llama's.
LinearOptions linear_options(bool bias, int tp_parts = 0) {
  LinearOptions o;
  o.layout = WeightLayout::kLinear;
  o.bias = bias;
  o.tp_parts = tp_parts;
  return o;
}
}  // namespace

struct LlamaModel::Block {
  Block(int64_t i, const ModelConfig& cfg, const parallel::layers::ParallelState& ps)
      : prefix("model.layers." + std::to_string(i)),
        q(prefix + ".self_attn.q_proj", cfg.hidden, cfg.q_dim(), 1, ps, 0.02f, linear_options(cfg.attention_bias)),
        k(prefix + ".self_attn.k_proj", cfg.hidden, cfg.kv_dim(), 1, ps, 0.02f,
          linear_options(cfg.attention_bias, ps.tp_size > cfg.kv_heads ? cfg.kv_heads : 0)),
        v(prefix + ".self_attn.v_proj", cfg.hidden, cfg.kv_dim(), 1, ps, 0.02f,
          linear_options(cfg.attention_bias, ps.tp_size > cfg.kv_heads ? cfg.kv_heads : 0)),
        o(prefix + ".self_attn.o_proj", cfg.q_dim(), cfg.hidden, ps, 0.02f / std::sqrt(2.0f * cfg.layers),
          linear_options(cfg.attention_bias)),
        gate(prefix + ".mlp.gate_proj", cfg.hidden, cfg.ffn_hidden, 1, ps, 0.02f, linear_options(false)),
        up(prefix + ".mlp.up_proj", cfg.hidden, cfg.ffn_hidden, 1, ps, 0.02f, linear_options(false)),
        down(prefix + ".mlp.down_proj", cfg.ffn_hidden, cfg.hidden, ps, 0.02f / std::sqrt(2.0f * cfg.layers),
             linear_options(false)) {
    auto norm = [&](const std::string& n) {
      Parameter p = make_parameter(prefix + n, {cfg.hidden}, -1, 1, ps.tp_size, ps.tp_rank, Init::Ones, 0, false);
      p.sp_partial = ps.sp();
      return p;
    };
    ln1_w = norm(".input_layernorm.weight");
    ln2_w = norm(".post_attention_layernorm.weight");
    for (Parameter* p : params()) p->layer = static_cast<int>(i);
  }
  // Hugging Face's order (LlamaDecoderLayer: self_attn, mlp, the two norms);
  // slots alias them by position.
  std::vector<Parameter*> params() {
    std::vector<Parameter*> v;
    for (auto* l : {&q, &k, &this->v})
      for (Parameter* p : l->params()) v.push_back(p);
    for (Parameter* p : o.params()) v.push_back(p);
    for (auto* l : {&gate, &up})
      for (Parameter* p : l->params()) v.push_back(p);
    for (Parameter* p : down.params()) v.push_back(p);
    v.push_back(&ln1_w);
    v.push_back(&ln2_w);
    return v;
  }
  // The order backward_stage finishes them.
  std::vector<Parameter*> grad_order() {
    std::vector<Parameter*> r;
    auto add = [&](std::vector<Parameter*> ps) { r.insert(r.end(), ps.begin(), ps.end()); };
    add(down.params());
    add(up.params());
    add(gate.params());
    r.push_back(&ln2_w);
    add(o.params());
    add(q.params());
    add(k.params());
    add(v.params());
    r.push_back(&ln1_w);
    return r;
  }
  std::string prefix;
  Parameter ln1_w, ln2_w;
  ColumnParallelLinear q, k, v;
  RowParallelLinear o;
  ColumnParallelLinear gate, up;
  RowParallelLinear down;
  // Saved activations: x_in [Nl, C] is the block's input (the residual
  // stream); q_out and k_out hold q and k after the rotary embedding.
  Tensor x_in, ln1_out, ln1_rstd, q_out, k_out, v_out, probs, attn_y, x_mid, ln2_out, ln2_rstd, gate_out, up_out, act;
};

struct LlamaModel::Slot {
  std::vector<Block*> blocks;
  std::vector<std::unique_ptr<Block>> own;
  Tensor x_out, hf, hf_full, lnf_rstd, logits, loss, tokens;
  int64_t batch = 0, seq = 0;
  bool have_grad = false;
};

LlamaModel::LlamaModel(const ModelConfig& cfg, const parallel::layers::ParallelState& ps,
                       const std::vector<int>& stages, int chunk, int chunks)
    : cfg_(cfg), ps_(ps) {
  validate(cfg_, ps.tp_size);
  TESSERA_ARG_CHECK(ps.pp_size >= 1 && ps.pp_rank >= 0 && ps.pp_rank < ps.pp_size, "bad pipeline stage ", ps.pp_rank,
                    " of ", ps.pp_size);
  TESSERA_ARG_CHECK(chunks >= 1 && chunk >= 0 && chunk < chunks, "bad model chunk ", chunk, " of ", chunks);
  const int replicas = kv_replicas(cfg_, ps.tp_size);
  // A real TP group (not a layout query) needs the kv groups to sum the replicated heads' gradients.
  TESSERA_ARG_CHECK(ps.tp == nullptr || replicas == 1 || (ps.kv != nullptr && ps.kv_replicas == replicas), cfg_.label(),
                    ": ", cfg_.kv_heads, " kv_heads over tp ", ps.tp_size, " replicate each K/V head onto ", replicas,
                    " ranks, but the ParallelState has no kv group of ", replicas,
                    " (make_parallel_state(..., kv_replicas = ", replicas, "))");
  hd_ = cfg_.head_size();
  hl_ = cfg_.heads / ps.tp_size;
  kvl_ = replicas > 1 ? 1 : cfg_.kv_heads / ps.tp_size;
  stages_ = parallel::pipeline::resolve_stages(stages, cfg_.layers, ps.pp_size * chunks);
  vstage_ = chunk * ps.pp_size + ps.pp_rank;
  embed_ = vstage_ == 0;
  head_ = vstage_ == ps.pp_size * chunks - 1;
  first_layer_ = parallel::pipeline::stage_first_layer(stages_, vstage_);
  const bool tied = cfg_.tied_embeddings();
  if (has_embedding() || (has_head() && tied))
    embed_tokens_ = std::make_unique<parallel::layers::VocabParallelEmbedding>("model.embed_tokens.weight", cfg_.vocab,
                                                                               cfg_.hidden, ps, 0.02f);
  if (has_head() && !tied) {
    lm_head_ = std::make_unique<parallel::layers::VocabParallelEmbedding>("lm_head.weight", cfg_.vocab, cfg_.hidden, ps,
                                                                          0.02f);
    lm_head_->weight().layer = parallel::layers::kHeadLayer;
  }
  norm_w_ = make_parameter("model.norm.weight", {cfg_.hidden}, -1, 1, ps.tp_size, ps.tp_rank, Init::Ones, 0, false);
  norm_w_.sp_partial = ps.sp();
  norm_w_.layer = parallel::layers::kHeadLayer;
  for (int64_t i = 0; i < stages_[static_cast<size_t>(vstage_)]; ++i)
    blocks_.push_back(std::make_unique<Block>(first_layer_ + i, cfg_, ps));
}

LlamaModel::~LlamaModel() = default;

LlamaModel::Slot& LlamaModel::slot(int i) {
  return parallel::layers::activation_slot(slots_, blocks_, i, [&](size_t l) {
    return std::make_unique<Block>(first_layer_ + static_cast<int64_t>(l), cfg_, ps_);
  });
}

Parameter* LlamaModel::tied_embedding() {
  return cfg_.tied_embeddings() && embed_tokens_ ? &embed_tokens_->weight() : nullptr;
}

std::vector<Parameter> LlamaModel::parameter_layout(const ModelConfig& cfg, int tp, int tp_rank) {
  return layout_of<LlamaModel>(cfg, tp, tp_rank);
}

std::vector<Parameter*> LlamaModel::parameters() {
  std::vector<Parameter*> v;
  if (embed_tokens_) v.push_back(&embed_tokens_->weight());
  for (auto& b : blocks_)
    for (Parameter* p : b->params()) v.push_back(p);
  if (has_head()) {
    v.push_back(&norm_w_);
    if (lm_head_) v.push_back(&lm_head_->weight());
  }
  return v;
}

std::vector<Parameter*> LlamaModel::parameters_in_grad_order() {
  std::vector<Parameter*> v;
  if (lm_head_) v.push_back(&lm_head_->weight());
  if (has_head()) v.push_back(&norm_w_);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
    for (Parameter* p : (*it)->grad_order()) v.push_back(p);
  // Last also on the last stage: a tied copy's gradient is final only once
  // summed with the first stage's.
  if (embed_tokens_) v.push_back(&embed_tokens_->weight());
  return v;
}

void LlamaModel::init(uint64_t seed) {
  for (Parameter* p : parameters()) parallel::layers::init_parameter(*p, seed);
}

const float* LlamaModel::token_losses() const {
  TESSERA_CHECK(has_head() && !slots_.empty(), "token_losses: no forward on the last stage yet");
  return slots_[static_cast<size_t>(last_slot_)]->loss.data<float>();
}

double LlamaModel::forward_stage(int si, const int32_t* inputs, const int32_t* targets, const float* act_in,
                                 int64_t batch, int64_t seq, bool want_grad, float grad_scale, const float** act_out) {
  check_stage_inputs(ps_, vstage_, inputs, targets, act_in, batch, seq);
  const int64_t n = batch * seq, c = cfg_.hidden;
  Device* dev = ps_.device;
  const int64_t nl = local_rows(n);
  if (!rope_ && !blocks_.empty())  // once per model, on its device
    rope_ =
        std::make_unique<parallel::layers::RotaryEmbedding>(hd_, cfg_.max_seq, cfg_.rope_theta, cfg_.rope_scaling, dev);
  Slot& s = slot(si);
  last_slot_ = si;
  s.batch = batch;
  s.seq = seq;
  s.have_grad = want_grad;

  Tensor& x0 = s.blocks.empty() ? s.x_out : s.blocks[0]->x_in;
  float* x = ensure_buffer(x0, dev, nl * c);
  if (has_embedding()) {
    if (!s.tokens.defined() || s.tokens.numel() < n) s.tokens = Tensor::empty({n}, DType::I32, dev);
    int32_t* tok = s.tokens.data<int32_t>();
    std::memcpy(tok, inputs, sizeof(int32_t) * n);
    embed_tokens_->forward(tok, n, x);
  } else {
    // The received activation (a device would receive it in place: not charged).
    std::memcpy(x, act_in, sizeof(float) * nl * c);
  }

  const float eps = static_cast<float>(cfg_.norm_eps);
  const int64_t qw = hl_ * hd_, kw = kvl_ * hd_;
  const parallel::layers::AttentionShape shape{batch, seq, hl_, kvl_, hd_, qw, kw, qw};
  for (size_t l = 0; l < s.blocks.size(); ++l) {
    Block& b = *s.blocks[l];
    const float* xin = b.x_in.data<float>();
    float* ln1 = ensure_buffer(b.ln1_out, dev, nl * c);
    kern::rmsnorm_forward(dev, xin, b.ln1_w.value, ln1, ensure_f32_buffer(b.ln1_rstd, dev, nl), nl, c, eps);
    const float* xf = b.q.gather_input(ln1, n);
    float* q = ensure_buffer(b.q_out, dev, n * qw);
    float* k = ensure_buffer(b.k_out, dev, n * kw);
    float* v = ensure_buffer(b.v_out, dev, n * kw);
    b.q.forward_full(xf, n, q);
    b.k.forward_full(xf, n, k);
    b.v.forward_full(xf, n, v);
    rope_->forward(dev, q, qw, n, seq, hl_);
    rope_->forward(dev, k, kw, n, seq, kvl_);
    float* y = ensure_buffer(b.attn_y, dev, n * qw);
    parallel::layers::gqa_attention_forward(dev, shape, q, k, v, ensure_buffer(b.probs, dev, batch * hl_ * seq * seq),
                                            y);
    float* xm = ensure_buffer(b.x_mid, dev, nl * c);
    b.o.forward(y, n, xin, xm);
    float* ln2 = ensure_buffer(b.ln2_out, dev, nl * c);
    kern::rmsnorm_forward(dev, xm, b.ln2_w.value, ln2, ensure_f32_buffer(b.ln2_rstd, dev, nl), nl, c, eps);
    const int64_t f = b.gate.out_local();
    const float* xf2 = b.gate.gather_input(ln2, n);
    float* g = ensure_buffer(b.gate_out, dev, n * f);
    float* u = ensure_buffer(b.up_out, dev, n * f);
    b.gate.forward_full(xf2, n, g);
    b.up.forward_full(xf2, n, u);
    float* act = ensure_buffer(b.act, dev, n * f);
    kern::swiglu_forward(dev, g, u, act, n * f);
    Tensor& out = (l + 1 < s.blocks.size()) ? s.blocks[l + 1]->x_in : s.x_out;
    b.down.forward(act, n, xm, ensure_buffer(out, dev, nl * c));
  }
  if (!has_head()) {
    if (act_out) *act_out = s.x_out.data<float>();
    return 0;
  }
  if (act_out) *act_out = nullptr;

  // Final RMSNorm and the vocab-parallel LM head (untied, or the tied embedding).
  float* hf = ensure_buffer(s.hf, dev, nl * c);
  kern::rmsnorm_forward(dev, s.x_out.data<float>(), norm_w_.value, hf, ensure_f32_buffer(s.lnf_rstd, dev, nl), nl, c,
                        eps);
  float* hfull = hf;
  if (ps_.sp()) {
    hfull = ensure_buffer(s.hf_full, dev, n * c);
    ps_.tp_all_gather(hf, hfull, nl * c);
  }
  parallel::layers::VocabParallelEmbedding& head = lm_head_ ? *lm_head_ : *embed_tokens_;
  const int64_t vv = head.vocab_valid();
  float* logits = ensure_buffer(s.logits, dev, n * std::max<int64_t>(vv, 1));
  kern::gemm(dev, false, true, n, vv, c, 1.f, hfull, c, head.weight().value, c, 0.f, logits, vv);
  float* loss = ensure_f32_buffer(s.loss, dev, n);
  parallel::layers::vocab_parallel_cross_entropy(ps_, logits, n, vv, vv, head.vocab_start(), targets, want_grad,
                                                 grad_scale, loss, ensure_f32_buffer(ce_scratch_, dev, 3 * n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += loss[i];
  return total;
}

const float* LlamaModel::backward_stage(int si, const float* grad_out,
                                        const std::function<void(Parameter*)>& on_ready) {
  TESSERA_CHECK(si >= 0 && si < static_cast<int>(slots_.size()) && slots_[static_cast<size_t>(si)]->have_grad,
                "backward needs a forward(..., want_grad = true) of the same slot first");
  TESSERA_CHECK(has_head() || grad_out != nullptr, "backward_stage: virtual stage ", vstage_,
                " needs the next stage's gradient");
  Slot& s = *slots_[static_cast<size_t>(si)];
  s.have_grad = false;
  auto ready = [&](Parameter& p) {
    if (on_ready) on_ready(&p);
  };
  auto ready_all = [&](const std::vector<Parameter*>& ps) {
    for (Parameter* p : ps) ready(*p);
  };
  Device* dev = ps_.device;
  const int64_t batch = s.batch, seq = s.seq, n = batch * seq, c = cfg_.hidden, nl = local_rows(n);
  float* dres = ensure_buffer(dres_, dev, nl * c);

  if (has_head()) {
    parallel::layers::VocabParallelEmbedding& head = lm_head_ ? *lm_head_ : *embed_tokens_;
    const int64_t vv = head.vocab_valid();
    const float* hfull = ps_.sp() ? s.hf_full.data<float>() : s.hf.data<float>();
    const float* dlogits = s.logits.data<float>();
    Parameter& w = head.weight();
    float* dhf_full = ensure_buffer(dhf_full_, dev, n * c);
    kern::gemm(dev, false, false, n, c, vv, 1.f, dlogits, vv, w.value, c, 0.f, dhf_full, c);
    kern::gemm_grad(dev, true, false, vv, c, n, 1.f, dlogits, vv, hfull, c, 1.f, w.grad, c);
    if (lm_head_) ready(w);
    float* dhf = dhf_full;
    if (ps_.sp()) {
      dhf = ensure_buffer(dhf_, dev, nl * c);
      ps_.tp_reduce_scatter(dhf_full, dhf, nl * c);
    } else {
      ps_.tp_all_reduce(dhf_full, n * c);
    }
    std::memset(dres, 0, sizeof(float) * nl * c);
    kern::rmsnorm_backward(dev, dhf, s.x_out.data<float>(), norm_w_.value, s.lnf_rstd.data<float>(), dres, norm_w_.grad,
                           nl, c);
    ready(norm_w_);
  } else {
    std::memcpy(dres, grad_out, sizeof(float) * nl * c);
  }

  const int64_t qw = hl_ * hd_, kw = kvl_ * hd_;
  const parallel::layers::AttentionShape shape{batch, seq, hl_, kvl_, hd_, qw, kw, qw};
  float* dln = ensure_buffer(dln_, dev, nl * c);
  // The summed input gradient of the column-parallel layers before its TP reduction.
  float* dxf = ps_.sp() ? ensure_buffer(dx_full_, dev, n * c) : dln;
  for (size_t l = s.blocks.size(); l-- > 0;) {
    Block& b = *s.blocks[l];
    Block& own = *blocks_[l];  // whose Parameters the optimizer knows
    const int64_t f = b.gate.out_local();
    // MLP: down, SwiGLU, up and gate (one TP reduction of their input gradient).
    float* dg = ensure_buffer(dgate_, dev, n * f);
    float* du = ensure_buffer(dup_, dev, n * f);
    b.down.backward(dres, n, dg);
    ready_all(own.down.params());
    kern::swiglu_backward(dev, dg, b.gate_out.data<float>(), b.up_out.data<float>(), dg, du, n * f);
    b.up.backward_partial(du, n, dxf, false);
    ready_all(own.up.params());
    b.gate.backward_partial(dg, n, dxf, true);
    ready_all(own.gate.params());
    b.gate.reduce_input_grad(dxf, n, dln);
    kern::rmsnorm_backward(dev, dln, b.x_mid.data<float>(), b.ln2_w.value, b.ln2_rstd.data<float>(), dres, b.ln2_w.grad,
                           nl, c);
    ready(own.ln2_w);
    // Attention: o, attention, the rotary embedding's transpose, q, k, v.
    float* dattn = ensure_buffer(dattn_, dev, n * qw);
    b.o.backward(dres, n, dattn);
    ready_all(own.o.params());
    float* dq = ensure_buffer(dq_, dev, n * qw);
    float* dk = ensure_buffer(dk_, dev, n * kw);
    float* dv = ensure_buffer(dv_, dev, n * kw);
    parallel::layers::gqa_attention_backward(dev, shape, b.q_out.data<float>(), b.k_out.data<float>(),
                                             b.v_out.data<float>(), b.probs.data<float>(), dattn,
                                             ensure_buffer(dprobs_, dev, seq * seq), dq, dk, dv);
    rope_->backward(dev, dq, qw, n, seq, hl_);
    rope_->backward(dev, dk, kw, n, seq, kvl_);
    b.q.backward_partial(dq, n, dxf, false);
    ready_all(own.q.params());
    b.k.backward_partial(dk, n, dxf, true);
    ready_all(own.k.params());
    b.v.backward_partial(dv, n, dxf, true);
    ready_all(own.v.params());
    b.q.reduce_input_grad(dxf, n, dln);
    kern::rmsnorm_backward(dev, dln, b.x_in.data<float>(), b.ln1_w.value, b.ln1_rstd.data<float>(), dres, b.ln1_w.grad,
                           nl, c);
    ready(own.ln1_w);
  }
  if (!has_embedding()) return dres;
  embed_tokens_->backward(s.tokens.data<int32_t>(), n, dres);
  ready(embed_tokens_->weight());
  return nullptr;
}

const float* LlamaModel::forward_cached(parallel::layers::KvCache& cache, const int32_t* tokens,
                                        const std::vector<int>& slots, const std::vector<int64_t>& lens,
                                        bool all_rows) {
  CachedBuffers& cb = cached_;
  const int64_t n = check_cached_inputs(ps_, cache, tokens, slots, lens, cb), c = cfg_.hidden;
  Device* dev = ps_.device;
  if (!rope_)
    rope_ =
        std::make_unique<parallel::layers::RotaryEmbedding>(hd_, cfg_.max_seq, cfg_.rope_theta, cfg_.rope_scaling, dev);
  const auto eps = static_cast<float>(cfg_.norm_eps);
  float* x = ensure_buffer(cb.x, dev, n * c);
  embed_tokens_->forward(tokens, n, x);

  float* rstd = ensure_f32_buffer(cb.rstd, dev, n);
  float* ln = ensure_buffer(cb.ln, dev, n * c);
  float* xm = ensure_buffer(cb.xm, dev, n * c);
  const int64_t qw = hl_ * hd_, kw = kvl_ * hd_;
  const parallel::layers::AttentionShape shape{1, 1, hl_, kvl_, hd_, qw, kw, qw};
  int64_t ctx = 0;
  for (size_t i = 0; i < slots.size(); ++i) ctx = std::max(ctx, cache.length(slots[i]) + lens[i]);
  float* scores = ensure_buffer(cb.scores, dev, parallel::layers::kCachedAttentionBlock * ctx);
  const int64_t* pos = cb.positions.data();
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = *blocks_[l];
    const int64_t f = b.gate.out_local();
    kern::rmsnorm_forward(dev, x, b.ln1_w.value, ln, rstd, n, c, eps);
    float* q = ensure_buffer(cb.q, dev, n * qw);
    float* k = ensure_buffer(cb.k, dev, n * kw);
    float* v = ensure_buffer(cb.v, dev, n * kw);
    b.q.forward_full(ln, n, q);
    b.k.forward_full(ln, n, k);
    b.v.forward_full(ln, n, v);
    rope_->forward_at(dev, q, qw, n, pos, hl_);
    rope_->forward_at(dev, k, kw, n, pos, kvl_);
    float* y = ensure_buffer(cb.y, dev, n * qw);
    parallel::layers::cached_attention_forward(dev, shape, q, k, v, cache, static_cast<int64_t>(l), slots, lens, scores,
                                               y);
    b.o.forward(y, n, x, xm);
    kern::rmsnorm_forward(dev, xm, b.ln2_w.value, ln, rstd, n, c, eps);
    float* g = ensure_buffer(cb.act, dev, n * f);
    float* u = ensure_buffer(cb.up, dev, n * f);
    b.gate.forward_full(ln, n, g);
    b.up.forward_full(ln, n, u);
    kern::swiglu_forward(dev, g, u, g, n * f);
    b.down.forward(g, n, xm, x);
  }
  for (size_t i = 0; i < slots.size(); ++i) cache.advance(slots[i], lens[i]);

  // Final RMSNorm of the rows whose logits are wanted (selecting them is an index, not a kernel), then the head.
  int64_t rows = 0;
  const float* h = cached_head_rows(ps_, x, n, all_rows, cb, &rows);
  float* hn = ensure_buffer(cb.head_norm, dev, rows * c);
  kern::rmsnorm_forward(dev, h, norm_w_.value, hn, rstd, rows, c, eps);
  return cached_logits(ps_, lm_head_ ? *lm_head_ : *embed_tokens_, hn, rows, cb);
}

}  // namespace tessera::parallel::models::llama
