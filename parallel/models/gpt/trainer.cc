#include "parallel/models/gpt/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "parallel/checkpoint/safetensors.h"
#include "parallel/models/hf_config.h"
#include "parallel/models/hf_io.h"
#include "runtime/device.h"
#include "runtime/kernels.h"
#include "runtime/random.h"
#include "runtime/sim_clock.h"

namespace tessera::parallel::models::gpt {

void TrainOptions::normalize() {
  complete_model_config(model);
  validate_layout(model, tp);
  TESSERA_ARG_CHECK(tp >= 1 && dp >= 1 && pp >= 1, "--tp, --dp and --pp must be >= 1");
  // Bounds that keep the products below (ranks, rows per step) from overflowing.
  TESSERA_ARG_CHECK(int64_t{tp} * dp * pp <= (int64_t{1} << 24), "--tp ", tp, " x --dp ", dp, " x --pp ", pp,
                    " is more than 2^24 ranks");
  TESSERA_ARG_CHECK(pp <= model.layers, "--pp ", pp, " is more than the model's ", model.layers,
                    " layers (each stage needs a whole layer)");
  TESSERA_ARG_CHECK(virtual_stages >= 1, "--virtual-stages must be >= 1");
  TESSERA_ARG_CHECK(int64_t{pp} * virtual_stages <= model.layers, "--pp ", pp, " x --virtual-stages ", virtual_stages,
                    " is more than the model's ", model.layers, " layers (each virtual stage needs a whole layer)");
  TESSERA_ARG_CHECK(stages.empty() || static_cast<int64_t>(stages.size()) == int64_t{pp} * virtual_stages,
                    "--stages has ", stages.size(), " entries but --pp x --virtual-stages is ", pp * virtual_stages);
  stages = parallel::pipeline::resolve_stages(stages, model.layers, pp * virtual_stages);
  TESSERA_ARG_CHECK(micro_batch <= (int64_t{1} << 24), "--micro-batch ", micro_batch, " is more than 2^24 sequences");
  TESSERA_ARG_CHECK(seq >= 1 && seq <= model.max_seq, "--seq ", seq, " must be in [1, ", model.max_seq,
                    "] (the model's context)");
  TESSERA_ARG_CHECK(model.vocab >= parallel::data::ByteDataset::kVocab, "--vocab ", model.vocab,
                    " is smaller than the 256 byte values of the corpus");
  TESSERA_ARG_CHECK(micro_batch >= 1, "--micro-batch must be >= 1");
  if (global_batch <= 0) global_batch = micro_batch * dp;
  TESSERA_ARG_CHECK(global_batch % (micro_batch * dp) == 0, "--global-batch ", global_batch,
                    " must be a multiple of --micro-batch x --dp = ", micro_batch * dp);
  TESSERA_ARG_CHECK(!sequence_parallel || (micro_batch * seq) % tp == 0,
                    "sequence parallelism needs micro-batch x seq (", micro_batch * seq, ") divisible by --tp ", tp);
  TESSERA_ARG_CHECK(pp == 1 || micro_batches() <= (int64_t{1} << 20), "--global-batch ", global_batch,
                    " makes more than 2^20 micro-batches per step");
  parallel::pipeline::check_schedule(schedule, pp, static_cast<int>(micro_batches()), virtual_stages);
  TESSERA_ARG_CHECK(steps >= 0, "--steps must be >= 0");
  TESSERA_ARG_CHECK(lr > 0 && std::isfinite(lr), "--lr must be > 0");
  if (min_lr < 0) min_lr = lr / 10;
  if (warmup < 0) warmup = std::min<int64_t>(steps / 10, 100);
  adamw.lr.max_lr = lr;
  adamw.lr.min_lr = min_lr;
  adamw.lr.warmup = warmup;
  adamw.lr.decay_steps = steps;
  TESSERA_ARG_CHECK(precision == DType::F32 || precision == DType::BF16, "--precision ", dtype_name(precision),
                    " (expected fp32 or bf16)");
  const bool bf16 = precision == DType::BF16;
  TESSERA_ARG_CHECK(bf16 || (master_weights && !fp32_grads && !stochastic_rounding),
                    "--no-master-weights, --accumulate-allreduce-grads-in-fp32 and --stochastic-rounding need "
                    "--precision bf16");
  adamw.param_dtype = precision;
  adamw.grad_dtype = bf16 && !fp32_grads ? DType::BF16 : DType::F32;
  adamw.master_weights = master_weights;
  adamw.stochastic_rounding = stochastic_rounding;
  adamw.rounding_seed = splitmix64(seed ^ 0x5352u);  // "SR": not the initialisation's key
}

Trainer::Trainer(TrainOptions opts, const parallel::layers::ParallelState& ps,
                 std::shared_ptr<const parallel::data::ByteDataset> dataset)
    : opts_(std::move(opts)), ps_(ps), data_(std::move(dataset)) {
  opts_.normalize();
  TESSERA_ARG_CHECK(ps.tp_size == opts_.tp && ps.dp_size == opts_.dp && ps.pp_size == opts_.pp, "parallel state tp ",
                    ps.tp_size, " dp ", ps.dp_size, " pp ", ps.pp_size, " does not match the options tp ", opts_.tp,
                    " dp ", opts_.dp, " pp ", opts_.pp);
  TESSERA_ARG_CHECK(data_ != nullptr, "Trainer needs a dataset");
  TESSERA_ARG_CHECK(ps.device != nullptr, "Trainer needs the rank's device");
  // Before the model allocates anything: its buffers take the activation dtype.
  ps.device->set_precision(opts_.precision, opts_.adamw.grad_dtype);
  // A model whose weights alone cannot fit is refused before its layers are
  // laid out (10^9 layers took 10 GB of host memory on the way to the same
  // device out-of-memory error): this rank holds at least its stage's
  // floor(layers / pp) layers' TP shards, 2 bytes each at the least.
  const uint64_t capacity = ps.device->memory_stats().capacity;
  const int64_t stage_layers = opts_.model.layers / std::max(1, opts_.pp);                    // floor: the fewest
  const int64_t layer_shard = opts_.model.layer_params_tp_sharded() / std::max(1, opts_.tp);  // floor
  const double at_least = static_cast<double>(stage_layers) * static_cast<double>(layer_shard) * 2.0;
  if (capacity > 0 && at_least > static_cast<double>(capacity))
    throw DeviceOutOfMemory(ps.device->name(), at_least >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(at_least), 0,
                            capacity);
  const int v = opts_.virtual_stages;
  for (int c = 0; c < v; ++c) chunks_.push_back(make_causal_lm(opts_.model, ps, opts_.stages, c, v));
  model_ = chunks_[0].get();
  // Gradient order: the later chunks finish first; the tied wte last of all.
  std::vector<parallel::layers::Parameter*> order;
  parallel::layers::Parameter* wte = tied_wte();
  for (int c = v - 1; c >= 0; --c)
    for (parallel::layers::Parameter* p : chunks_[static_cast<size_t>(c)]->parameters_in_grad_order())
      if (p != wte) order.push_back(p);
  if (wte) order.push_back(wte);
  // The last stage's copy of wte is the first stage's again: counted once in the norm.
  std::vector<const parallel::layers::Parameter*> copies;
  if (ps.pp_size > 1 && wte && !chunks_[0]->has_embedding()) copies.push_back(wte);
  opt_ = std::make_unique<parallel::optim::DistributedOptimizer>(ps, order, opts_.adamw, copies);
  if (ps.pp_size > 1) pipe_ = std::make_unique<parallel::pipeline::PipelineExecutor>(ps, v);
  const int64_t mb = opts_.micro_batch, s = opts_.seq;
  rows_.resize(mb * (s + 1));
  inputs_.resize(mb * s);
  targets_.resize(mb * s);
}

Trainer::~Trainer() = default;

void Trainer::init_random() {
  for (auto& c : chunks_) c->init(opts_.seed);
  opt_->values_changed();
}

void Trainer::load_hf(const std::string& path) {
  auto src = parallel::checkpoint::open_safetensors(path);
  const ModelConfig& m = opts_.model;
  check_hf_tensors(*src, m);
  for (parallel::layers::Parameter* p : parameters()) {  // the tied copy has the embedding's name
    Tensor full = Tensor::empty(p->full_shape, DType::F32);
    read_hf_tensor(*src, m, p->name, full);
    parallel::layers::load_shard(*p, full.data<float>());
  }
  opt_->values_changed();
}

void Trainer::export_hf(const std::string& path, uint64_t max_shard_bytes, DType dtype) {
  TESSERA_ARG_CHECK(dtype == DType::F32 || dtype == DType::BF16, "export: weights as ", dtype_name(dtype),
                    " (F32 or BF16)");
  const ModelConfig& m = opts_.model;
  const int p = ps_.pp_size;
  // Each stage's TP rank 0 of DP rank 0 assembles its whole tensors; with
  // pp > 1 they go to stage 0's over the PP group, in Hugging Face order.
  const bool stage_lead = ps_.tp_rank == 0 && ps_.dp_rank == 0;
  const parallel::layers::Parameter* copy = tied_copy();  // the first stage's wte is exported
  std::map<std::string, Tensor> mine;
  std::vector<float> gathered;
  for (parallel::layers::Parameter* prm : parameters()) {
    if (prm == copy) continue;
    Tensor full = stage_lead ? Tensor::empty(prm->full_shape, DType::F32) : Tensor();
    if (prm->tp_sharded()) {
      gathered.resize(static_cast<size_t>(prm->numel()) * ps_.tp_size);
      ps_.tp_all_gather(prm->value, gathered.data(), prm->numel());
      if (stage_lead) {
        for (int r = 0; r < ps_.tp_size; ++r) {
          parallel::layers::Parameter shard = *prm;
          shard.tp_rank = r;
          shard.value = gathered.data() + static_cast<size_t>(r) * prm->numel();
          parallel::layers::store_shard(shard, full.data<float>());
        }
      }
    } else if (stage_lead) {
      parallel::layers::store_shard(*prm, full.data<float>());
    }
    if (stage_lead) mine.emplace(prm->name, full);
  }
  if (!stage_lead) return;
  // The pipeline rank holding a tensor: the embeddings are on virtual stage
  // 0, the final norm and head on the last, layer l's on the virtual stage
  // whose layers hold it; virtual stage vs is on rank vs mod pp.
  const std::vector<int>& st = opts_.stages;
  auto owner = [&](const parallel::layers::Parameter& t) {
    if (t.layer == parallel::layers::kEmbeddingLayer) return 0;
    if (t.layer == parallel::layers::kHeadLayer) return static_cast<int>(st.size() - 1) % p;
    return parallel::pipeline::stage_of_layer(st, t.layer) % p;
  };
  constexpr uint32_t kExportTag = 0x4558;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const parallel::layers::Parameter& l : parallel::models::parameter_layout(m, ps_.tp_size, 0)) {
    const int from = p > 1 ? owner(l) : 0;
    if (ps_.pp_rank == 0) {
      if (from == 0) {
        auto it = mine.find(l.name);
        TESSERA_CHECK(it != mine.end(), "stage 0 does not hold ", l.name);
        tensors.emplace_back(l.name, it->second);
      } else {
        Tensor full = Tensor::empty(l.full_shape, DType::F32);
        ps_.pp->recv(full.data<float>(), static_cast<size_t>(full.numel()), DType::F32, from, kExportTag);
        tensors.emplace_back(l.name, full);
      }
    } else if (from == ps_.pp_rank) {
      const Tensor& t = mine.at(l.name);
      ps_.pp->send(t.data<float>(), static_cast<size_t>(t.numel()), DType::F32, 0, kExportTag);
    }
  }
  if (ps_.global_rank() != 0) return;
  if (dtype != DType::F32)
    for (auto& [name, t] : tensors) {
      Tensor c = Tensor::empty(t.shape(), dtype);
      convert(t.data<float>(), DType::F32, c.raw_data(), dtype, static_cast<size_t>(t.numel()));
      t = c;
    }
  write_hf_model(path, m, tensors, max_shard_bytes, torch_dtype_name(dtype));
}

double Trainer::forward_rows(const int32_t* rows, int64_t nrows, int64_t seq, bool train, float grad_scale) {
  for (int64_t r = 0; r < nrows; ++r) {
    std::memcpy(inputs_.data() + r * seq, rows + r * (seq + 1), sizeof(int32_t) * seq);
    std::memcpy(targets_.data() + r * seq, rows + r * (seq + 1) + 1, sizeof(int32_t) * seq);
  }
  return model_->forward(inputs_.data(), targets_.data(), nrows, seq, train, grad_scale);
}

// This rank's chunks of the model under the executor: micro-batch i is rows
// [dp_rank * per_rank + i * mb, + mb) of the step's global batch.
class Trainer::Stage final : public parallel::pipeline::StageModule {
 public:
  Stage(Trainer& t, std::function<void(int64_t, int32_t*)> rows, bool train, float scale, int64_t m)
      : t_(t), rows_(std::move(rows)), train_(train), scale_(scale), m_(m) {}
  int64_t activation_elems() const override { return t_.model_->activation_elems(t_.opts_.micro_batch, t_.opts_.seq); }
  const float* forward(int chunk, int micro, int slot, const float* in) override {
    const int64_t mb = t_.opts_.micro_batch, s = t_.opts_.seq;
    CausalLM& model = *t_.chunks_[static_cast<size_t>(chunk)];
    if (model.has_embedding() || model.has_head()) {
      rows_(micro, t_.rows_.data());
      for (int64_t r = 0; r < mb; ++r) {
        std::memcpy(t_.inputs_.data() + r * s, t_.rows_.data() + r * (s + 1), sizeof(int32_t) * s);
        std::memcpy(t_.targets_.data() + r * s, t_.rows_.data() + r * (s + 1) + 1, sizeof(int32_t) * s);
      }
    }
    const float* out = nullptr;
    loss += model.forward_stage(slot, t_.inputs_.data(), t_.targets_.data(), in, mb, s, train_, scale_, &out);
    if (on_forward && model.has_head()) on_forward(micro, model);
    return out;
  }
  const float* backward(int chunk, int micro, int slot, const float* dout) override {
    // A chunk's last backward (micro-batch m - 1 in every schedule) finishes
    // its gradients: report them to the optimizer (DP buckets), all but the
    // tied embedding's (reported after the embedding-group sum).
    const bool last = micro + 1 == m_;
    parallel::layers::Parameter* wte = t_.tied_wte();
    auto on_ready = [this, wte](parallel::layers::Parameter* p) {
      if (p != wte) t_.opt_->grad_ready(p);
    };
    return t_.chunks_[static_cast<size_t>(chunk)]->backward_stage(
        slot, dout,
        last ? std::function<void(parallel::layers::Parameter*)>(on_ready)
             : std::function<void(parallel::layers::Parameter*)>());
  }
  double loss = 0;
  std::function<void(int, CausalLM&)> on_forward;  // after a forward of the last virtual stage

 private:
  Trainer& t_;
  std::function<void(int64_t, int32_t*)> rows_;
  bool train_;
  float scale_;
  int64_t m_;
};

parallel::layers::Parameter* Trainer::tied_wte() {
  for (auto& c : chunks_)
    if (c->tied_embedding()) return c->tied_embedding();
  return nullptr;
}

parallel::layers::Parameter* Trainer::tied_copy() {
  return ps_.pp_size > 1 && ps_.pp_rank == ps_.pp_size - 1 ? tied_wte() : nullptr;
}

std::vector<parallel::layers::Parameter*> Trainer::parameters() {
  std::vector<parallel::layers::Parameter*> v;
  for (auto& c : chunks_)
    for (parallel::layers::Parameter* p : c->parameters()) v.push_back(p);
  return v;
}

double Trainer::pipeline_step(float scale) {
  const int64_t g = opts_.global_batch, mb = opts_.micro_batch, s = opts_.seq;
  const int64_t per_rank = g / ps_.dp_size;
  const int m = static_cast<int>(opts_.micro_batches());
  Stage stage(
      *this,
      [&](int64_t i, int32_t* rows) {
        data_->batch(parallel::data::Split::kTrain, step_ - 1, g, s, ps_.dp_rank * per_rank + i * mb, mb, rows);
      },
      true, scale, m);
  pipe_->run(parallel::pipeline::schedule_ops(opts_.schedule, ps_.pp_size, m, ps_.pp_rank, opts_.virtual_stages), m,
             stage);
  reduce_tied_embedding();
  return stage.loss;
}

void Trainer::reduce_tied_embedding() {
  parallel::layers::Parameter* wte = tied_wte();
  if (wte == nullptr) return;
  marks_.wall_embed0 = wall_now();
  marks_.embed_s = 0;
  if (ps_.embed) {
    ps_.embed->all_reduce(wte->grad, wte->grad, static_cast<size_t>(wte->numel()), DType::F32,
                          collectives::ReduceOp::Sum);
    kern::round_grads(ps_.device, wte->grad, wte->numel());  // a bf16 sum: fp32 on the wire, rounded once
    marks_.embed_s = ps_.embed->last_modeled_seconds();
  }
  marks_.wall_embed1 = wall_now();
  opt_->grad_ready(wte);
}

double Trainer::pipeline_eval(int64_t micro, const std::function<int64_t(int64_t, int32_t*)>& fill) {
  std::vector<int64_t> real(static_cast<size_t>(micro));
  Stage stage(
      *this, [&](int64_t i, int32_t* rows) { real[static_cast<size_t>(i)] = fill(i, rows); }, false, 0.f, micro);
  double sum = 0;
  stage.on_forward = [&](int i, CausalLM& head) {
    const float* tl = head.token_losses();
    for (int64_t k = 0; k < real[static_cast<size_t>(i)] * opts_.seq; ++k) sum += tl[k];
  };
  // Micro-batch by micro-batch, each through this rank's chunks in order.
  std::vector<parallel::pipeline::PipeOp> ops;
  for (int i = 0; i < micro; ++i)
    for (int c = 0; c < opts_.virtual_stages; ++c) ops.push_back({parallel::pipeline::PipeOp::kForward, i, c});
  pipe_->run(ops, static_cast<int>(micro), stage, /*forward_only=*/true);
  return sum;
}

StepRecord Trainer::step() {
  ++step_;
  Device* dev = ps_.device;
  const ClockTotals c0 = dev->clock().totals();
  Stopwatch sw;
  const int64_t g = opts_.global_batch, mb = opts_.micro_batch, s = opts_.seq;
  const int64_t per_rank = g / ps_.dp_size, micro = per_rank / mb;
  const float scale = static_cast<float>(1.0 / (static_cast<double>(g) * s));
  marks_.wall_start = wall_now();
  opt_->zero_grad();
  marks_.zero_grad_s = dev->clock().totals().compute_s - c0.compute_s;
  marks_.wall_pipe = wall_now();
  double loss = 0;
  auto on_ready = [this](parallel::layers::Parameter* p) { opt_->grad_ready(p); };
  if (pipe_) loss = pipeline_step(scale);
  for (int64_t i = 0; i < (pipe_ ? 0 : micro); ++i) {
    data_->batch(parallel::data::Split::kTrain, step_ - 1, g, s, ps_.dp_rank * per_rank + i * mb, mb, rows_.data());
    loss += forward_rows(rows_.data(), mb, s, true, scale);
    if (i + 1 == micro) {
      model_->backward(on_ready);
    } else {
      model_->backward(nullptr);
    }
  }
  marks_.wall_opt0 = wall_now();
  marks_.stats = opt_->step(step_);
  const parallel::optim::StepStats& st = marks_.stats;
  marks_.wall_opt1 = wall_now();
  // The loss and the gradient wait, summed over DP in one call.
  float sums[2] = {static_cast<float>(loss * scale), static_cast<float>(st.wait_s)};
  marks_.loss_s = 0;
  if (ps_.dp_size > 1) {
    ps_.dp->all_reduce(sums, sums, 2, DType::F32, collectives::ReduceOp::Sum);
    marks_.loss_s += ps_.dp->last_modeled_seconds();
  }
  // Only the last stage has a loss: the sum over stages gives it to all.
  if (ps_.pp_size > 1) {
    ps_.pp->all_reduce(sums, sums, 2, DType::F32, collectives::ReduceOp::Sum);
    marks_.loss_s += ps_.pp->last_modeled_seconds();
  }
  marks_.wall_end = wall_now();
  const float mean = sums[0];

  StepRecord rec;
  rec.step = step_;
  rec.loss = mean;
  rec.grad_norm = st.grad_norm;
  rec.lr = st.lr;
  rec.grad_wait_s = sums[1] / (ps_.dp_size * ps_.pp_size);
  rec.wall_s = sw.seconds();
  rec.tokens_per_s = static_cast<double>(g * s) / rec.wall_s;
  // Modeled time: kernels, then communication (blocking or not: nothing
  // overlaps on the emulated core, as the planner assumes), then waiting for
  // pipeline neighbours; the pipeline links' transfers show as waits (or
  // were hidden behind this rank's work), not as comm.
  const ClockTotals c1 = dev->clock().totals();
  rec.modeled_compute_s = c1.compute_s - c0.compute_s;
  rec.modeled_comm_s = c1.comm_s - c0.comm_s - (pipe_ ? pipe_->p2p_modeled_s() : 0.0);
  rec.modeled_idle_s = c1.idle_s - c0.idle_s;
  rec.modeled_step_s = rec.modeled_compute_s + rec.modeled_comm_s + rec.modeled_idle_s;
  if (ps_.pp_size > 1) {
    // The step lasts as long as its slowest stage: report that stage's
    // figures on every rank (after the clock was read, so uncharged).
    float mine[4] = {static_cast<float>(rec.modeled_step_s), static_cast<float>(rec.modeled_compute_s),
                     static_cast<float>(rec.modeled_comm_s), static_cast<float>(rec.modeled_idle_s)};
    std::vector<float>& all = stage_figures_;
    all.resize(4 * static_cast<size_t>(ps_.pp_size));  // allocates at the first step only
    ps_.pp->all_gather(mine, all.data(), 4, DType::F32);
    size_t slow = 0;
    for (size_t i = 1; i < static_cast<size_t>(ps_.pp_size); ++i)
      if (all[4 * i] > all[4 * slow]) slow = i;
    rec.modeled_step_s = all[4 * slow];
    rec.modeled_compute_s = all[4 * slow + 1];
    rec.modeled_comm_s = all[4 * slow + 2];
    rec.modeled_idle_s = all[4 * slow + 3];
  }
  const double peak = dev->spec().peak_flops(opts_.precision) * ps_.tp_size * ps_.dp_size * ps_.pp_size;
  if (rec.modeled_step_s > 0 && peak > 0)
    rec.mfu = train_flops_per_token(opts_.model) * static_cast<double>(g * s) / (peak * rec.modeled_step_s);
  rec.peak_mem_bytes = dev->memory_stats().peak;
  return rec;
}

std::vector<parallel::pipeline::TraceSpan> Trainer::step_trace(parallel::pipeline::TraceClock clock) const {
  using parallel::pipeline::PipeSpan;
  using parallel::pipeline::TraceSpan;
  std::vector<TraceSpan> out;
  if (!pipe_ || step_ == 0) return out;
  const bool wall = clock == parallel::pipeline::TraceClock::kWall;
  const StepMarks& k = marks_;
  auto span = [&](std::string name, const char* cat, int phase, double start, double dur) -> TraceSpan& {
    out.push_back({std::move(name), cat, phase, start, dur, false, {}});
    return out.back();
  };
  // Phase 0: zero_grad, then the pipeline.
  const double z = k.zero_grad_s;
  if (wall)
    span("zero_grad", "optimizer", 0, k.wall_start, k.wall_pipe - k.wall_start);
  else
    span("zero_grad", "optimizer", 0, 0, z);
  const bool chunks = opts_.virtual_stages > 1;
  for (const PipeSpan& p : pipe_->spans()) {
    std::string op = std::to_string(p.micro) + (chunks ? "." + std::to_string(p.chunk) : "");
    const double start = wall ? p.wall_start : z + p.start, dur = wall ? p.wall_dur : p.dur;
    if (p.kind == PipeSpan::kWait) {
      // A forward waits for its input activation, a backward for its output gradient.
      span("wait", "bubble", 0, start, dur).args = {{"micro_batch", p.micro}, {"chunk", p.chunk}};
      continue;
    }
    if (p.kind == PipeSpan::kTransfer) {
      span("link transfer", "p2p", 0, start, dur).args = {{"micro_batch", p.micro}, {"chunk", p.chunk}};
      continue;
    }
    if (p.kind == PipeSpan::kSend || p.kind == PipeSpan::kRecv) {
      TraceSpan& s = span((p.kind == PipeSpan::kSend ? "send " : "recv ") + op, "p2p", 0, start, 0);
      s.instant = true;
      s.args = {{"micro_batch", p.micro}, {"chunk", p.chunk}};
      continue;
    }
    const bool fwd = p.kind == PipeSpan::kForward;
    span((fwd ? "F" : "B") + op, fwd ? "forward" : "backward", 0, start, dur).args = {
        {"micro_batch", p.micro}, {"chunk", p.chunk}, {"tp_comm_us", p.tp_s * 1e6}};
    if (p.tp_s > 0 && !wall)  // the op's TP collectives, summed (many small calls), at its end
      span("TP collectives " + op, "tp_comm", 0, start + dur - p.tp_s, p.tp_s);
  }
  // Phase 1: after the pipeline.
  double t = 0;
  auto next = [&](std::string name, const char* cat, double dur) -> TraceSpan& {
    TraceSpan& s = span(std::move(name), cat, 1, t, dur);
    t += dur;
    return s;
  };
  if (ps_.embed) {
    if (wall)
      span("tied embedding all-reduce", "collective", 1, k.wall_embed0, k.wall_embed1 - k.wall_embed0);
    else
      next("tied embedding all-reduce", "collective", k.embed_s);
  }
  auto comm_name = [](const parallel::optim::CommRecord& c) {
    const char* kind = c.kind == parallel::optim::CommRecord::kAllReduce       ? "DP all-reduce"
                       : c.kind == parallel::optim::CommRecord::kReduceScatter ? "DP reduce-scatter"
                                                                               : "ZeRO-1 all-gather";
    return std::string(kind) + " bucket " + std::to_string(c.bucket);
  };
  auto comm_args = [](const parallel::optim::CommRecord& c) {
    return std::vector<std::pair<std::string, double>>{
        {"bucket", c.bucket}, {"elems", static_cast<double>(c.elems)}, {"modeled_us", c.modeled_s * 1e6}};
  };
  const auto& comm = k.stats.comm;
  if (wall) {
    for (const auto& c : comm) {
      TraceSpan& s = span(comm_name(c) + " issued", "dp_comm", 1, c.launch_wall_s, 0);
      s.instant = true;
      s.args = comm_args(c);
    }
    span("wait for DP gradients", "dp_comm", 1, k.wall_opt0, k.stats.wait_s);
    span("optimizer step", "optimizer", 1, k.wall_opt0 + k.stats.wait_s, k.wall_opt1 - k.wall_opt0 - k.stats.wait_s);
    span("loss all-reduce", "collective", 1, k.wall_opt1, k.wall_end - k.wall_opt1);
    return out;
  }
  for (const auto& c : comm)
    if (c.kind != parallel::optim::CommRecord::kAllGather)
      next(comm_name(c), "dp_comm", c.modeled_s).args = comm_args(c);
  next("gradient norm", "optimizer", k.stats.norm_modeled_s);
  next("AdamW update", "optimizer", k.stats.update_modeled_s);
  for (const auto& c : comm)
    if (c.kind == parallel::optim::CommRecord::kAllGather)
      next(comm_name(c), "dp_comm", c.modeled_s).args = comm_args(c);
  if (ps_.dp_size > 1 || ps_.pp_size > 1) next("loss all-reduce", "collective", k.loss_s);
  return out;
}

double Trainer::eval_windows(const std::vector<int32_t>& windows, int64_t count, int64_t seq) {
  TESSERA_ARG_CHECK(seq == opts_.seq, "eval windows must use the training sequence length");
  TESSERA_ARG_CHECK(static_cast<int64_t>(windows.size()) >= count * (seq + 1), "eval windows buffer too small");
  const int64_t mb = opts_.micro_batch;
  double sum = 0;
  const int64_t nb = (count + mb - 1) / mb;
  if (pipe_) {
    // Batch b goes to DP rank b % dp as below; every stage runs them in order.
    const int64_t mine = nb > ps_.dp_rank ? (nb - ps_.dp_rank + ps_.dp_size - 1) / ps_.dp_size : 0;
    sum = pipeline_eval(mine, [&](int64_t i, int32_t* rows) {
      const int64_t b = ps_.dp_rank + i * ps_.dp_size, first = b * mb, real = std::min(mb, count - first);
      for (int64_t r = 0; r < mb; ++r) {
        const int64_t w = first + (r < real ? r : 0);
        std::memcpy(rows + r * (seq + 1), windows.data() + w * (seq + 1), sizeof(int32_t) * (seq + 1));
      }
      return real;
    });
  }
  for (int64_t b = ps_.dp_rank; b < (pipe_ ? 0 : nb); b += ps_.dp_size) {
    const int64_t first = b * mb, real = std::min(mb, count - first);
    // Pad a short last batch with copies of its first window (their losses are not counted).
    for (int64_t r = 0; r < mb; ++r) {
      const int64_t w = first + (r < real ? r : 0);
      std::memcpy(rows_.data() + r * (seq + 1), windows.data() + w * (seq + 1), sizeof(int32_t) * (seq + 1));
    }
    forward_rows(rows_.data(), mb, seq, false, 0.f);
    const float* tl = model_->token_losses();
    for (int64_t i = 0; i < real * seq; ++i) sum += tl[i];
  }
  float total = static_cast<float>(sum);
  if (ps_.dp_size > 1) ps_.dp->all_reduce(&total, &total, 1, DType::F32, collectives::ReduceOp::Sum);
  if (ps_.pp_size > 1) ps_.pp->all_reduce(&total, &total, 1, DType::F32, collectives::ReduceOp::Sum);
  return count > 0 ? total / static_cast<double>(count * seq) : std::nan("");
}

double Trainer::validation_loss(int64_t batches) {
  const int64_t g = opts_.global_batch, mb = opts_.micro_batch, s = opts_.seq;
  const int64_t per_rank = g / ps_.dp_size;
  double sum = 0;
  const int64_t m = per_rank / mb;
  if (pipe_) {
    sum = pipeline_eval(batches * m, [&](int64_t i, int32_t* rows) {
      data_->batch(parallel::data::Split::kVal, i / m, g, s, ps_.dp_rank * per_rank + i % m * mb, mb, rows);
      return mb;
    });
  }
  for (int64_t k = 0; k < (pipe_ ? 0 : batches); ++k) {
    for (int64_t i = 0; i < m; ++i) {
      data_->batch(parallel::data::Split::kVal, k, g, s, ps_.dp_rank * per_rank + i * mb, mb, rows_.data());
      sum += forward_rows(rows_.data(), mb, s, false, 0.f);
    }
  }
  float total = static_cast<float>(sum);
  if (ps_.dp_size > 1) ps_.dp->all_reduce(&total, &total, 1, DType::F32, collectives::ReduceOp::Sum);
  if (ps_.pp_size > 1) ps_.pp->all_reduce(&total, &total, 1, DType::F32, collectives::ReduceOp::Sum);
  return total / static_cast<double>(batches * g * s);
}

}  // namespace tessera::parallel::models::gpt
