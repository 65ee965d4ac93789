#include "parallel/models/gpt/gpt_model.h"

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

namespace tessera::parallel::models::gpt {

using parallel::layers::ensure_buffer;
using parallel::layers::ensure_f32_buffer;

namespace {
// Query rows per causal attention block.
constexpr int64_t kAttnBlock = 64;
}  // namespace

using parallel::layers::Init;
using parallel::layers::make_parameter;
using parallel::layers::Parameter;

void validate_gpt(const ModelConfig& cfg, int tp) {
  TESSERA_ARG_CHECK(cfg.family == "gpt", "GptModel holds the gpt family, not '", cfg.family, "'");
  const ModelConfig& c = cfg;
  TESSERA_ARG_CHECK(c.vocab > 0 && c.max_seq > 0 && c.hidden > 0 && c.layers > 0 && c.heads > 0 && c.ffn_hidden > 0,
                    "model sizes must be positive (vocab ", c.vocab, ", seq ", c.max_seq, ", hidden ", c.hidden,
                    ", layers ", c.layers, ", heads ", c.heads, ", ffn_hidden ", c.ffn_hidden, ")");
  TESSERA_ARG_CHECK(c.hidden % c.heads == 0, "--hidden ", c.hidden, " is not a multiple of --heads ", c.heads);
  TESSERA_ARG_CHECK(c.heads % tp == 0, "--heads ", c.heads, " does not divide over --tp ", tp,
                    " (attention is split by heads)");
  TESSERA_ARG_CHECK(c.kv_heads == c.heads && c.head_size() * c.heads == c.hidden && c.tied_embeddings(),
                    "the gpt family has kv_heads = heads, head_dim = hidden / heads and a tied LM head");
}

struct GptModel::Block {
  Block(int64_t i, const ModelConfig& cfg, const parallel::layers::ParallelState& ps)
      : qkv("transformer.h." + std::to_string(i) + ".attn.c_attn", cfg.hidden, int64_t{3} * cfg.hidden, 3, ps, 0.02f),
        proj("transformer.h." + std::to_string(i) + ".attn.c_proj", cfg.hidden, cfg.hidden, ps,
             0.02f / std::sqrt(2.0f * cfg.layers)),
        fc("transformer.h." + std::to_string(i) + ".mlp.c_fc", cfg.hidden, cfg.ffn_hidden, 1, ps, 0.02f),
        mproj("transformer.h." + std::to_string(i) + ".mlp.c_proj", cfg.ffn_hidden, cfg.hidden, ps,
              0.02f / std::sqrt(2.0f * cfg.layers)) {
    const std::string p = "transformer.h." + std::to_string(i);
    auto ln = [&](const std::string& n, Init init) {
      Parameter q = make_parameter(p + n, {cfg.hidden}, -1, 1, ps.tp_size, ps.tp_rank, init, 0, false);
      q.sp_partial = ps.sp();
      return q;
    };
    ln1_w = ln(".ln_1.weight", Init::Ones);
    ln1_b = ln(".ln_1.bias", Init::Zeros);
    ln2_w = ln(".ln_2.weight", Init::Ones);
    ln2_b = ln(".ln_2.bias", Init::Zeros);
    for (Parameter* q : params()) q->layer = static_cast<int>(i);
  }
  // Every parameter of the block, in a fixed order (slots alias them by position).
  std::vector<Parameter*> params() {
    return {&ln1_w, &ln1_b, &qkv.weight(), &qkv.bias(), &proj.weight(),  &proj.bias(),
            &ln2_w, &ln2_b, &fc.weight(),  &fc.bias(),  &mproj.weight(), &mproj.bias()};
  }
  Parameter ln1_w, ln1_b, ln2_w, ln2_b;
  parallel::layers::ColumnParallelLinear qkv;
  parallel::layers::RowParallelLinear proj;
  parallel::layers::ColumnParallelLinear fc;
  parallel::layers::RowParallelLinear mproj;
  // Saved activations: x_in [Nl, C] is the block's input (the residual stream).
  Tensor x_in, ln1_out, ln1_mean, ln1_rstd, qkv_out, probs, attn_y, x_mid, ln2_out, ln2_mean, ln2_rstd, fc_pre, fc_act;
};

// One micro-batch's activations: the stage's blocks (slot 0: the model's
// own; later slots: copies whose Parameters alias slot 0's) and the head's.
struct GptModel::Slot {
  std::vector<Block*> blocks;
  std::vector<std::unique_ptr<Block>> own;
  Tensor x_out, hf, hf_full, lnf_mean, lnf_rstd, logits, loss, tokens;
  int64_t batch = 0, seq = 0;
  bool have_grad = false;
};

GptModel::GptModel(const ModelConfig& cfg, const parallel::layers::ParallelState& ps, const std::vector<int>& stages,
                   int chunk, int chunks)
    : cfg_(cfg), ps_(ps) {
  complete_model_config(cfg_);
  validate_gpt(cfg_, ps.tp_size);
  TESSERA_ARG_CHECK(ps.pp_size >= 1 && ps.pp_rank >= 0 && ps.pp_rank < ps.pp_size, "bad pipeline stage ", ps.pp_rank,
                    " of ", ps.pp_size);
  TESSERA_ARG_CHECK(chunks >= 1 && chunk >= 0 && chunk < chunks, "bad model chunk ", chunk, " of ", chunks);
  stages_ = parallel::pipeline::resolve_stages(stages, cfg_.layers, ps.pp_size * chunks);
  vstage_ = chunk * ps.pp_size + ps.pp_rank;
  embed_ = vstage_ == 0;
  head_ = vstage_ == ps.pp_size * chunks - 1;
  first_layer_ = parallel::pipeline::stage_first_layer(stages_, vstage_);
  if (has_embedding() || has_head())
    wte_ = std::make_unique<parallel::layers::VocabParallelEmbedding>("transformer.wte.weight", cfg_.vocab, cfg_.hidden,
                                                                      ps, 0.02f);
  wpe_ = make_parameter("transformer.wpe.weight", {cfg_.max_seq, cfg_.hidden}, -1, 1, ps.tp_size, ps.tp_rank,
                        Init::Normal, 0.02f, true);
  wpe_.sp_partial = ps.sp();
  lnf_w_ =
      make_parameter("transformer.ln_f.weight", {cfg_.hidden}, -1, 1, ps.tp_size, ps.tp_rank, Init::Ones, 0, false);
  lnf_b_ = make_parameter("transformer.ln_f.bias", {cfg_.hidden}, -1, 1, ps.tp_size, ps.tp_rank, Init::Zeros, 0, false);
  lnf_w_.sp_partial = lnf_b_.sp_partial = ps.sp();
  lnf_w_.layer = lnf_b_.layer = parallel::layers::kHeadLayer;
  for (int64_t i = 0; i < stages_[static_cast<size_t>(vstage_)]; ++i)
    blocks_.push_back(std::make_unique<Block>(first_layer_ + i, cfg_, ps));
}

GptModel::Slot& GptModel::slot(int i) {
  return parallel::layers::activation_slot(slots_, blocks_, i, [&](size_t l) {
    return std::make_unique<Block>(first_layer_ + static_cast<int64_t>(l), cfg_, ps_);
  });
}

Parameter* GptModel::wte() { return wte_ ? &wte_->weight() : nullptr; }

GptModel::~GptModel() = default;

std::vector<Parameter> GptModel::parameter_layout(const ModelConfig& cfg, int tp, int tp_rank) {
  return layout_of<GptModel>(cfg, tp, tp_rank);
}

std::vector<Parameter*> GptModel::parameters() {
  std::vector<Parameter*> v;
  if (wte_) v.push_back(&wte_->weight());
  if (has_embedding()) v.push_back(&wpe_);
  for (auto& b : blocks_)
    for (Parameter* p : b->params()) v.push_back(p);
  if (has_head()) {
    v.push_back(&lnf_w_);
    v.push_back(&lnf_b_);
  }
  return v;
}

std::vector<Parameter*> GptModel::parameters_in_grad_order() {
  std::vector<Parameter*> v;
  if (has_head()) v = {&lnf_w_, &lnf_b_};
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    Block& b = **it;
    for (Parameter* p : {&b.mproj.weight(), &b.mproj.bias(), &b.fc.weight(), &b.fc.bias(), &b.ln2_w, &b.ln2_b,
                         &b.proj.weight(), &b.proj.bias(), &b.qkv.weight(), &b.qkv.bias(), &b.ln1_w, &b.ln1_b})
      v.push_back(p);
  }
  if (has_embedding()) v.push_back(&wpe_);
  // Last also on the last stage: the tied copy's gradient is final only once
  // summed with the first stage's (the trainer reports it after that).
  if (wte_) v.push_back(&wte_->weight());
  return v;
}

void GptModel::init(uint64_t seed) {
  for (Parameter* p : parameters()) parallel::layers::init_parameter(*p, seed);
}

const float* GptModel::token_losses() const {
  TESSERA_CHECK(has_head() && !slots_.empty(), "token_losses: no forward on the last stage yet");
  return slots_[static_cast<size_t>(last_slot_)]->loss.data<float>();
}

void GptModel::attention_forward(Block& b, int64_t batch, int64_t seq) {
  Device* dev = ps_.device;
  const int64_t cl = b.qkv.out_local() / 3, hd = cfg_.hidden / cfg_.heads, hl = cl / hd, ld = 3 * cl;
  const int64_t n = batch * seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* qkv = b.qkv_out.data<float>();
  float* probs = ensure_buffer(b.probs, dev, batch * hl * seq * seq);
  float* y = ensure_buffer(b.attn_y, dev, n * cl);
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t h = 0; h < hl; ++h) {
      const float* q = qkv + bi * seq * ld + h * hd;
      const float* k = q + cl;
      const float* v = q + 2 * cl;
      float* p = probs + (bi * hl + h) * seq * seq;
      float* y_h = y + bi * seq * cl + h * hd;
      // Causal: row block [r0, r0 + rows) only sees keys [0, r0 + rows), so
      // the blocks above the diagonal are never computed (about half the work).
      for (int64_t r0 = 0; r0 < seq; r0 += kAttnBlock) {
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(false, true, rows, cols, hd, 1.f, q + r0 * ld, ld, k, ld, 0.f, p + r0 * seq, seq);
      }
      kern::causal_softmax_forward(p, seq, seq, scale);
      kern::round_activations(dev, p, seq * seq);  // bf16 probabilities into P V (and kept for the backward)
      for (int64_t r0 = 0; r0 < seq; r0 += kAttnBlock) {
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(false, false, rows, hd, cols, 1.f, p + r0 * seq, seq, v, ld, 0.f, y_h + r0 * cl, cl);
      }
    }
  }
  kern::round_activations(dev, y, n * cl);
  // One fused attention kernel on the device (the blocked GEMMs above are the CPU's way to compute it).
  kern::charge(dev, cost::attention_forward(batch, hl, seq, hd));
}

void GptModel::attention_backward(Block& b, int64_t batch, int64_t seq) {
  Device* dev = ps_.device;
  const int64_t cl = b.qkv.out_local() / 3, hd = cfg_.hidden / cfg_.heads, hl = cl / hd, ld = 3 * cl;
  const int64_t n = batch * seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qkv = b.qkv_out.data<float>();
  const float* probs = b.probs.data<float>();
  const float* dy = dattn_.data<float>();
  float* dqkv = ensure_buffer(dqkv_, dev, n * ld);
  float* dp = ensure_buffer(dprobs_, dev, seq * seq);
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t h = 0; h < hl; ++h) {
      const int64_t off = bi * seq * ld + h * hd;
      const float* q = qkv + off;
      const float* k = q + cl;
      const float* v = q + 2 * cl;
      const float* p = probs + (bi * hl + h) * seq * seq;
      const float* dyh = dy + bi * seq * cl + h * hd;
      float* dq = dqkv + off;
      float* dk = dq + cl;
      float* dv = dq + 2 * cl;
      // Row blocks as in the forward. dV and dK sum over row blocks: the last
      // block covers every key, so it goes first with beta = 0.
      const int64_t last = (seq - 1) / kAttnBlock * kAttnBlock;
      for (int64_t r0 = 0; r0 < seq; r0 += kAttnBlock) {  // dP = dY V^T
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(false, true, rows, cols, hd, 1.f, dyh + r0 * cl, cl, v, ld, 0.f, dp + r0 * seq, seq);
      }
      for (int64_t r0 = last; r0 >= 0; r0 -= kAttnBlock) {  // dV = P^T dY
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(true, false, cols, hd, rows, 1.f, p + r0 * seq, seq, dyh + r0 * cl, cl, r0 == last ? 0.f : 1.f,
                       dv, ld);
      }
      kern::causal_softmax_backward(p, dp, seq, seq, scale);  // dP -> dS
      kern::round_activations(dev, dp, seq * seq);            // bf16 dS into dQ and dK
      for (int64_t r0 = 0; r0 < seq; r0 += kAttnBlock) {      // dQ = dS K
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(false, false, rows, hd, cols, 1.f, dp + r0 * seq, seq, k, ld, 0.f, dq + r0 * ld, ld);
      }
      for (int64_t r0 = last; r0 >= 0; r0 -= kAttnBlock) {  // dK = dS^T Q
        const int64_t rows = std::min(kAttnBlock, seq - r0), cols = r0 + rows;
        kern::gemm_raw(true, false, cols, hd, rows, 1.f, dp + r0 * seq, seq, q + r0 * ld, ld, r0 == last ? 0.f : 1.f,
                       dk, ld);
      }
    }
  }
  kern::round_activations(dev, dqkv, n * ld);  // dQ, dK, dV summed in fp32, stored once
  kern::charge(dev, cost::attention_backward(batch, hl, seq, hd));
}

double GptModel::forward_stage(int si, const int32_t* inputs, const int32_t* targets, const float* act_in,
                               int64_t batch, int64_t seq, bool want_grad, float grad_scale, const float** act_out) {
  check_stage_inputs(ps_, vstage_, inputs, targets, act_in, batch, seq);
  const int64_t n = batch * seq, c = cfg_.hidden;
  Device* dev = ps_.device;
  const int64_t nl = local_rows(n);
  const auto eps = static_cast<float>(cfg_.norm_eps);
  Slot& s = slot(si);
  last_slot_ = si;
  s.batch = batch;
  s.seq = seq;
  s.have_grad = want_grad;

  float* x = ensure_buffer(s.blocks[0]->x_in, dev, nl * c);
  if (has_embedding()) {
    // Keep our own copy of the inputs: backward needs them after the caller moved on.
    if (!s.tokens.defined() || s.tokens.numel() < n) s.tokens = Tensor::empty({n}, DType::I32, dev);
    int32_t* tok = s.tokens.data<int32_t>();
    std::memcpy(tok, inputs, sizeof(int32_t) * n);
    // Embeddings: token (vocab-parallel) + position (replicated).
    wte_->forward(tok, n, x);
    const int64_t row0 = ps_.sp() ? ps_.tp_rank * nl : 0;
    for (int64_t r = 0; r < nl; ++r) {
      const float* pe = wpe_.value + ((row0 + r) % seq) * c;
      float* xr = x + r * c;
      for (int64_t j = 0; j < c; ++j) xr[j] += pe[j];
    }
    kern::round_activations(dev, x, nl * c);
    kern::charge(dev, cost::position_add(nl, c));
  } else {
    // The received activation (a device would receive it in place: not charged).
    std::memcpy(x, act_in, sizeof(float) * nl * c);
  }

  for (size_t l = 0; l < s.blocks.size(); ++l) {
    Block& b = *s.blocks[l];
    const float* xin = b.x_in.data<float>();
    float* ln1 = ensure_buffer(b.ln1_out, dev, nl * c);
    kern::layernorm_forward(dev, xin, b.ln1_w.value, b.ln1_b.value, ln1, ensure_f32_buffer(b.ln1_mean, dev, nl),
                            ensure_f32_buffer(b.ln1_rstd, dev, nl), nl, c, eps);
    b.qkv.forward(ln1, n, ensure_buffer(b.qkv_out, dev, n * b.qkv.out_local()));
    attention_forward(b, batch, seq);
    float* xm = ensure_buffer(b.x_mid, dev, nl * c);
    b.proj.forward(b.attn_y.data<float>(), n, xin, xm);
    float* ln2 = ensure_buffer(b.ln2_out, dev, nl * c);
    kern::layernorm_forward(dev, xm, b.ln2_w.value, b.ln2_b.value, ln2, ensure_f32_buffer(b.ln2_mean, dev, nl),
                            ensure_f32_buffer(b.ln2_rstd, dev, nl), nl, c, eps);
    const int64_t f = b.fc.out_local();
    float* pre = ensure_buffer(b.fc_pre, dev, n * f);
    b.fc.forward(ln2, n, pre);
    float* act = ensure_buffer(b.fc_act, dev, n * f);
    kern::gelu_forward(dev, pre, act, n * f);
    Tensor& out = (l + 1 < s.blocks.size()) ? s.blocks[l + 1]->x_in : s.x_out;
    b.mproj.forward(act, n, xm, ensure_buffer(out, dev, nl * c));
  }
  if (!has_head()) {
    if (act_out) *act_out = s.x_out.data<float>();
    return 0;
  }
  if (act_out) *act_out = nullptr;

  // Final LayerNorm and the tied, vocab-parallel LM head.
  float* hf = ensure_buffer(s.hf, dev, nl * c);
  kern::layernorm_forward(dev, s.x_out.data<float>(), lnf_w_.value, lnf_b_.value, hf,
                          ensure_f32_buffer(s.lnf_mean, dev, nl), ensure_f32_buffer(s.lnf_rstd, dev, nl), nl, c, eps);
  float* hfull = hf;
  if (ps_.sp()) {
    hfull = ensure_buffer(s.hf_full, dev, n * c);
    ps_.tp_all_gather(hf, hfull, nl * c);
  }
  const int64_t vv = wte_->vocab_valid();
  float* logits = ensure_buffer(s.logits, dev, n * std::max<int64_t>(vv, 1));
  kern::gemm(dev, false, true, n, vv, c, 1.f, hfull, c, wte_->weight().value, c, 0.f, logits, vv);
  float* loss = ensure_f32_buffer(s.loss, dev, n);
  parallel::layers::vocab_parallel_cross_entropy(ps_, logits, n, vv, vv, wte_->vocab_start(), targets, want_grad,
                                                 grad_scale, loss, ensure_f32_buffer(ce_scratch_, dev, 3 * n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += loss[i];
  return total;
}

const float* GptModel::backward_stage(int si, const float* grad_out, const std::function<void(Parameter*)>& on_ready) {
  TESSERA_CHECK(si >= 0 && si < static_cast<int>(slots_.size()) && slots_[static_cast<size_t>(si)]->have_grad,
                "backward needs a forward(..., want_grad = true) of the same slot first");
  TESSERA_CHECK(has_head() || grad_out != nullptr, "backward_stage: virtual stage ", vstage_,
                " needs the next stage's gradient");
  Slot& s = *slots_[static_cast<size_t>(si)];
  s.have_grad = false;
  auto ready = [&](Parameter& p) {
    if (on_ready) on_ready(&p);
  };
  Device* dev = ps_.device;
  const int64_t n = s.batch * s.seq, c = cfg_.hidden, nl = local_rows(n);
  float* dres = ensure_buffer(dres_, dev, nl * c);

  if (has_head()) {
    const int64_t vv = wte_->vocab_valid();
    const float* hfull = ps_.sp() ? s.hf_full.data<float>() : s.hf.data<float>();
    const float* dlogits = s.logits.data<float>();
    Parameter& wte = wte_->weight();
    float* dhf_full = ensure_buffer(dhf_full_, dev, n * c);
    kern::gemm(dev, false, false, n, c, vv, 1.f, dlogits, vv, wte.value, c, 0.f, dhf_full, c);
    kern::gemm_grad(dev, true, false, vv, c, n, 1.f, dlogits, vv, hfull, c, 1.f, wte.grad, c);
    float* dhf = dhf_full;
    if (ps_.sp()) {
      dhf = ensure_buffer(dhf_, dev, nl * c);
      ps_.tp_reduce_scatter(dhf_full, dhf, nl * c);
    } else {
      ps_.tp_all_reduce(dhf_full, n * c);
    }
    std::memset(dres, 0, sizeof(float) * nl * c);
    kern::layernorm_backward(dev, dhf, s.x_out.data<float>(), lnf_w_.value, s.lnf_mean.data<float>(),
                             s.lnf_rstd.data<float>(), dres, lnf_w_.grad, lnf_b_.grad, nl, c);
    ready(lnf_w_);
    ready(lnf_b_);
  } else {
    std::memcpy(dres, grad_out, sizeof(float) * nl * c);
  }

  float* dln = ensure_buffer(dln_, dev, nl * c);
  for (size_t l = s.blocks.size(); l-- > 0;) {
    Block& b = *s.blocks[l];
    Block& own = *blocks_[l];  // whose Parameters the optimizer knows
    const int64_t f = b.fc.out_local();
    float* dfc = ensure_buffer(dfc_, dev, n * f);
    b.mproj.backward(dres, n, dfc);
    ready(own.mproj.weight());
    ready(own.mproj.bias());
    kern::gelu_backward(dev, dfc, b.fc_pre.data<float>(), dfc, n * f);
    b.fc.backward(dfc, n, dln);
    ready(own.fc.weight());
    ready(own.fc.bias());
    kern::layernorm_backward(dev, dln, b.x_mid.data<float>(), b.ln2_w.value, b.ln2_mean.data<float>(),
                             b.ln2_rstd.data<float>(), dres, b.ln2_w.grad, b.ln2_b.grad, nl, c);
    ready(own.ln2_w);
    ready(own.ln2_b);
    float* dattn = ensure_buffer(dattn_, dev, n * b.proj.in_local());
    b.proj.backward(dres, n, dattn);
    ready(own.proj.weight());
    ready(own.proj.bias());
    attention_backward(b, s.batch, s.seq);
    b.qkv.backward(dqkv_.data<float>(), n, dln);
    ready(own.qkv.weight());
    ready(own.qkv.bias());
    kern::layernorm_backward(dev, dln, b.x_in.data<float>(), b.ln1_w.value, b.ln1_mean.data<float>(),
                             b.ln1_rstd.data<float>(), dres, b.ln1_w.grad, b.ln1_b.grad, nl, c);
    ready(own.ln1_w);
    ready(own.ln1_b);
  }
  if (!has_embedding()) return dres;

  const int64_t row0 = ps_.sp() ? ps_.tp_rank * nl : 0;
  for (int64_t r = 0; r < nl; ++r) {
    float* g = wpe_.grad + ((row0 + r) % s.seq) * c;
    const float* d = dres + r * c;
    for (int64_t j = 0; j < c; ++j) g[j] += d[j];
  }
  kern::round_grads(dev, wpe_.grad, wpe_.numel());
  kern::charge(dev, cost::position_add(nl, c));
  ready(wpe_);
  wte_->backward(s.tokens.data<int32_t>(), n, dres);
  ready(wte_->weight());
  return nullptr;
}

const float* GptModel::forward_cached(parallel::layers::KvCache& cache, const int32_t* tokens,
                                      const std::vector<int>& slots, const std::vector<int64_t>& lens, bool all_rows) {
  CachedBuffers& cb = cached_;
  const int64_t n = check_cached_inputs(ps_, cache, tokens, slots, lens, cb), c = cfg_.hidden;
  Device* dev = ps_.device;
  const auto eps = static_cast<float>(cfg_.norm_eps);
  float* x = ensure_buffer(cb.x, dev, n * c);
  wte_->forward(tokens, n, x);
  for (int64_t r = 0; r < n; ++r) {  // each row at its own position
    const float* pe = wpe_.value + cb.positions[static_cast<size_t>(r)] * c;
    float* xr = x + r * c;
    for (int64_t j = 0; j < c; ++j) xr[j] += pe[j];
  }
  kern::round_activations(dev, x, n * c);
  kern::charge(dev, cost::position_add(n, c));

  float* mean = ensure_f32_buffer(cb.mean, dev, n);
  float* rstd = ensure_f32_buffer(cb.rstd, dev, n);
  float* ln = ensure_buffer(cb.ln, dev, n * c);
  float* xm = ensure_buffer(cb.xm, dev, n * c);
  const int64_t hd = cfg_.head_size();
  int64_t ctx = 0;
  for (size_t i = 0; i < slots.size(); ++i) ctx = std::max(ctx, cache.length(slots[i]) + lens[i]);
  float* scores = ensure_buffer(cb.scores, dev, parallel::layers::kCachedAttentionBlock * ctx);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = *blocks_[l];
    const int64_t cl = b.qkv.out_local() / 3, f = b.fc.out_local();
    kern::layernorm_forward(dev, x, b.ln1_w.value, b.ln1_b.value, ln, mean, rstd, n, c, eps);
    float* qkv = ensure_buffer(cb.q, dev, n * 3 * cl);
    b.qkv.forward(ln, n, qkv);
    float* y = ensure_buffer(cb.y, dev, n * cl);
    const parallel::layers::AttentionShape shape{1, 1, cl / hd, cl / hd, hd, 3 * cl, 3 * cl, cl};
    parallel::layers::cached_attention_forward(dev, shape, qkv, qkv + cl, qkv + 2 * cl, cache, static_cast<int64_t>(l),
                                               slots, lens, scores, y);
    b.proj.forward(y, n, x, xm);
    kern::layernorm_forward(dev, xm, b.ln2_w.value, b.ln2_b.value, ln, mean, rstd, n, c, eps);
    float* pre = ensure_buffer(cb.up, dev, n * f);
    b.fc.forward(ln, n, pre);
    float* act = ensure_buffer(cb.act, dev, n * f);
    kern::gelu_forward(dev, pre, act, n * f);
    b.mproj.forward(act, n, xm, x);
  }
  for (size_t i = 0; i < slots.size(); ++i) cache.advance(slots[i], lens[i]);

  // Final LayerNorm of the rows whose logits are wanted (selecting them is an index, not a kernel), tied head.
  int64_t rows = 0;
  const float* h = cached_head_rows(ps_, x, n, all_rows, cb, &rows);
  float* hn = ensure_buffer(cb.head_norm, dev, rows * c);
  kern::layernorm_forward(dev, h, lnf_w_.value, lnf_b_.value, hn, mean, rstd, rows, c, eps);
  return cached_logits(ps_, *wte_, hn, rows, cb);
}

}  // namespace tessera::parallel::models::gpt
