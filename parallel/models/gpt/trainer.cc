#include "parallel/models/gpt/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "parallel/checkpoint/hf_gpt2.h"
#include "parallel/checkpoint/safetensors.h"
#include "runtime/device.h"
#include "runtime/sim_clock.h"

namespace tessera::parallel::models::gpt {

void TrainOptions::normalize() {
  model.validate(tp);
  TESSERA_ARG_CHECK(tp >= 1 && dp >= 1, "--tp and --dp must be >= 1");
  // Bounds that keep the products below (ranks, rows per step) from overflowing.
  TESSERA_ARG_CHECK(int64_t{tp} * dp <= (int64_t{1} << 24), "--tp ", tp, " x --dp ", dp, " is more than 2^24 ranks");
  TESSERA_ARG_CHECK(micro_batch <= (int64_t{1} << 24), "--micro-batch ", micro_batch, " is more than 2^24 sequences");
  TESSERA_ARG_CHECK(seq >= 1 && seq <= model.seq, "--seq ", seq, " must be in [1, ", model.seq,
                    "] (the model's context)");
  TESSERA_ARG_CHECK(model.vocab >= parallel::data::ByteDataset::kVocab, "--vocab ", model.vocab,
                    " is smaller than the 256 byte values of the corpus");
  TESSERA_ARG_CHECK(micro_batch >= 1, "--micro-batch must be >= 1");
  if (global_batch <= 0) global_batch = micro_batch * dp;
  TESSERA_ARG_CHECK(global_batch % (micro_batch * dp) == 0, "--global-batch ", global_batch,
                    " must be a multiple of --micro-batch x --dp = ", micro_batch * dp);
  TESSERA_ARG_CHECK(!sequence_parallel || (micro_batch * seq) % tp == 0,
                    "sequence parallelism needs micro-batch x seq (", micro_batch * seq, ") divisible by --tp ", tp);
  TESSERA_ARG_CHECK(steps >= 0, "--steps must be >= 0");
  TESSERA_ARG_CHECK(lr > 0 && std::isfinite(lr), "--lr must be > 0");
  if (min_lr < 0) min_lr = lr / 10;
  if (warmup < 0) warmup = std::min<int64_t>(steps / 10, 100);
  adamw.lr.max_lr = lr;
  adamw.lr.min_lr = min_lr;
  adamw.lr.warmup = warmup;
  adamw.lr.decay_steps = steps;
}

Trainer::Trainer(TrainOptions opts, const parallel::layers::ParallelState& ps,
                 std::shared_ptr<const parallel::data::ByteDataset> dataset)
    : opts_(std::move(opts)), ps_(ps), data_(std::move(dataset)) {
  opts_.normalize();
  TESSERA_ARG_CHECK(ps.tp_size == opts_.tp && ps.dp_size == opts_.dp, "parallel state tp ", ps.tp_size, " dp ",
                    ps.dp_size, " does not match the options tp ", opts_.tp, " dp ", opts_.dp);
  TESSERA_ARG_CHECK(data_ != nullptr, "Trainer needs a dataset");
  model_ = std::make_unique<GptModel>(opts_.model, ps);
  opt_ = std::make_unique<parallel::optim::DistributedOptimizer>(ps, model_->parameters_in_grad_order(), opts_.adamw);
  const int64_t mb = opts_.micro_batch, s = opts_.seq;
  rows_.resize(mb * (s + 1));
  inputs_.resize(mb * s);
  targets_.resize(mb * s);
}

Trainer::~Trainer() = default;

void Trainer::init_random() { model_->init(opts_.seed); }

void Trainer::load_hf(const std::string& path) {
  auto src = parallel::checkpoint::open_safetensors(path);
  const GptConfig& m = opts_.model;
  parallel::checkpoint::Gpt2Config c{m.vocab, m.seq, m.hidden, m.layers, m.heads};
  parallel::checkpoint::check_gpt2(*src, c);
  for (parallel::layers::Parameter* p : model_->parameters()) {
    Tensor full = Tensor::empty(p->full_shape, DType::F32);
    parallel::checkpoint::read_gpt2_tensor(*src, p->name, full);
    parallel::layers::load_shard(*p, full.data<float>());
  }
}

void Trainer::export_hf(const std::string& path) {
  const GptConfig& m = opts_.model;
  const bool writer = ps_.global_rank() == 0;
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<float> gathered;
  for (parallel::layers::Parameter* p : model_->parameters()) {
    Tensor full = writer ? Tensor::empty(p->full_shape, DType::F32) : Tensor();
    if (p->tp_sharded()) {
      gathered.resize(static_cast<size_t>(p->numel()) * ps_.tp_size);
      ps_.tp_all_gather(p->value, gathered.data(), p->numel());
      if (writer) {
        for (int r = 0; r < ps_.tp_size; ++r) {
          parallel::layers::Parameter shard = *p;
          shard.tp_rank = r;
          shard.value = gathered.data() + static_cast<size_t>(r) * p->numel();
          parallel::layers::store_shard(shard, full.data<float>());
        }
      }
    } else if (writer) {
      parallel::layers::store_shard(*p, full.data<float>());
    }
    if (writer) tensors.emplace_back(p->name, full);
  }
  if (writer) {
    parallel::checkpoint::write_gpt2_safetensors(
        path, parallel::checkpoint::Gpt2Config{m.vocab, m.seq, m.hidden, m.layers, m.heads}, tensors,
        {{"producer", "tessera train_gpt"}});
  }
}

double Trainer::forward_rows(const int32_t* rows, int64_t nrows, int64_t seq, bool train, float grad_scale) {
  for (int64_t r = 0; r < nrows; ++r) {
    std::memcpy(inputs_.data() + r * seq, rows + r * (seq + 1), sizeof(int32_t) * seq);
    std::memcpy(targets_.data() + r * seq, rows + r * (seq + 1) + 1, sizeof(int32_t) * seq);
  }
  return model_->forward(inputs_.data(), targets_.data(), nrows, seq, train, grad_scale);
}

StepRecord Trainer::step() {
  ++step_;
  Device* dev = ps_.device;
  const ClockTotals c0 = dev->clock().totals();
  Stopwatch sw;
  const int64_t g = opts_.global_batch, mb = opts_.micro_batch, s = opts_.seq;
  const int64_t per_rank = g / ps_.dp_size, micro = per_rank / mb;
  const float scale = static_cast<float>(1.0 / (static_cast<double>(g) * s));
  opt_->zero_grad();
  double loss = 0;
  auto on_ready = [this](parallel::layers::Parameter* p) { opt_->grad_ready(p); };
  for (int64_t i = 0; i < micro; ++i) {
    data_->batch(parallel::data::Split::kTrain, step_ - 1, g, s, ps_.dp_rank * per_rank + i * mb, mb, rows_.data());
    loss += forward_rows(rows_.data(), mb, s, true, scale);
    if (i + 1 == micro) {
      model_->backward(on_ready);
    } else {
      model_->backward(nullptr);
    }
  }
  parallel::optim::StepStats st = opt_->step(step_);
  // The loss and the gradient wait, summed over DP in one call.
  float sums[2] = {static_cast<float>(loss * scale), static_cast<float>(st.wait_s)};
  if (ps_.dp_size > 1) ps_.dp->all_reduce(sums, sums, 2, DType::F32, collectives::ReduceOp::Sum);
  const float mean = sums[0];

  StepRecord rec;
  rec.step = step_;
  rec.loss = mean;
  rec.grad_norm = st.grad_norm;
  rec.lr = st.lr;
  rec.grad_wait_s = sums[1] / ps_.dp_size;
  rec.wall_s = sw.seconds();
  rec.tokens_per_s = static_cast<double>(g * s) / rec.wall_s;
  const ClockTotals c1 = dev->clock().totals();
  rec.modeled_compute_s = c1.compute_s - c0.compute_s;
  rec.modeled_comm_s = c1.comm_s - c0.comm_s;
  rec.modeled_step_s = rec.modeled_compute_s + rec.modeled_comm_s;
  const double peak = dev->spec().peak_flops(DType::F32) * ps_.tp_size * ps_.dp_size;
  if (rec.modeled_step_s > 0 && peak > 0)
    rec.mfu = opts_.model.train_flops_per_token() * static_cast<double>(g * s) / (peak * rec.modeled_step_s);
  rec.peak_mem_bytes = dev->memory_stats().peak;
  return rec;
}

double Trainer::eval_windows(const std::vector<int32_t>& windows, int64_t count, int64_t seq) {
  TESSERA_ARG_CHECK(seq == opts_.seq, "eval windows must use the training sequence length");
  TESSERA_ARG_CHECK(static_cast<int64_t>(windows.size()) >= count * (seq + 1), "eval windows buffer too small");
  const int64_t mb = opts_.micro_batch;
  double sum = 0;
  const int64_t nb = (count + mb - 1) / mb;
  for (int64_t b = ps_.dp_rank; b < nb; b += ps_.dp_size) {
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
  return count > 0 ? total / static_cast<double>(count * seq) : std::nan("");
}

double Trainer::validation_loss(int64_t batches) {
  const int64_t g = opts_.global_batch, mb = opts_.micro_batch, s = opts_.seq;
  const int64_t per_rank = g / ps_.dp_size;
  double sum = 0;
  for (int64_t k = 0; k < batches; ++k) {
    for (int64_t i = 0; i < per_rank / mb; ++i) {
      data_->batch(parallel::data::Split::kVal, k, g, s, ps_.dp_rank * per_rank + i * mb, mb, rows_.data());
      sum += forward_rows(rows_.data(), mb, s, false, 0.f);
    }
  }
  float total = static_cast<float>(sum);
  if (ps_.dp_size > 1) ps_.dp->all_reduce(&total, &total, 1, DType::F32, collectives::ReduceOp::Sum);
  return total / static_cast<double>(batches * g * s);
}

}  // namespace tessera::parallel::models::gpt
