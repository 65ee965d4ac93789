#include "parallel/optim/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "runtime/bf16.h"
#include "runtime/device.h"
#include "runtime/kernels.h"
#include "runtime/random.h"
#include "runtime/sim_clock.h"

namespace tessera::parallel::optim {

namespace {
double compute_s(const Device* d) { return d ? d->clock().totals().compute_s : 0; }
double modeled(const std::shared_ptr<collectives::Communicator>& c) { return c ? c->last_modeled_seconds() : 0; }
}  // namespace

DistributedOptimizer::DistributedOptimizer(const parallel::layers::ParallelState& ps,
                                           std::vector<parallel::layers::Parameter*> params, AdamWConfig config,
                                           const std::vector<const parallel::layers::Parameter*>& copies)
    : ps_(ps), cfg_(config), params_(std::move(params)) {
  TESSERA_ARG_CHECK(!params_.empty(), "optimizer: no parameters");
  TESSERA_ARG_CHECK(cfg_.bucket_elems > 0, "optimizer: bucket size must be > 0");
  for (DType t : {cfg_.param_dtype, cfg_.grad_dtype})
    TESSERA_ARG_CHECK(t == DType::F32 || t == DType::BF16, "optimizer: parameters and gradients in f32 or bf16, not ",
                      dtype_name(t));
  const int dp = ps_.dp_size;
  // Buckets in gradient order; each padded to a multiple of dp so ZeRO-1
  // gives every rank an equal slice of it.
  Bucket cur;
  auto close = [&]() {
    if (cur.num_params == 0) return;
    int64_t used = total_ - cur.offset;
    cur.size = (used + dp - 1) / dp * dp;
    total_ = cur.offset + cur.size;
    buckets_.push_back(cur);
    cur = Bucket{};
    cur.offset = total_;
  };
  std::vector<int64_t> offsets;
  for (size_t i = 0; i < params_.size(); ++i) {
    parallel::layers::Parameter* p = params_[i];
    p->index = static_cast<int>(i);
    offsets.push_back(total_);
    total_ += p->numel();
    bucket_of_.push_back(static_cast<int>(buckets_.size()));
    ++cur.num_params;
    if (total_ - cur.offset >= cfg_.bucket_elems) close();
  }
  close();
  ready_.assign(params_.size(), false);

  if (ps_.sp()) {
    int64_t stage = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      const parallel::layers::Parameter* p = params_[i];
      if (!p->sp_partial) continue;
      Bucket& b = buckets_[bucket_of_[i]];
      if (!b.sp_runs.empty() && b.sp_runs.back().first + b.sp_runs.back().second == offsets[i])
        b.sp_runs.back().second += p->numel();  // adjacent: one run
      else
        b.sp_runs.emplace_back(offsets[i], p->numel());
      b.sp_elems += p->numel();
    }
    for (const Bucket& b : buckets_)
      if (b.sp_runs.size() > 1) stage = std::max(stage, b.sp_elems);
    if (stage > 0) sp_stage_ = Tensor::container({stage}, cfg_.grad_dtype, ps_.device);
  }

  values_ = Tensor::container({total_}, cfg_.param_dtype, ps_.device);
  grads_ = Tensor::container({total_}, cfg_.grad_dtype, ps_.device);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->offset = offsets[i];
    params_[i]->value = values() + offsets[i];
    params_[i]->grad = grads() + offsets[i];
  }

  // What this rank updates: everything (plain DP) or its slice of every bucket (ZeRO-1).
  const bool shard = cfg_.zero1 && dp > 1;
  int64_t state = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = buckets_[b];
    int64_t lo = bk.offset, hi = bk.offset + bk.size;
    if (shard) {
      lo = bk.offset + ps_.dp_rank * shard_size(bk);
      hi = lo + shard_size(bk);
    }
    shard_offset_.push_back(state);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (bucket_of_[i] != static_cast<int>(b)) continue;
      const parallel::layers::Parameter* p = params_[i];
      int64_t s = std::max(lo, p->offset), e = std::min(hi, p->offset + p->numel());
      if (s >= e) continue;
      const bool copy = std::find(copies.begin(), copies.end(), p) != copies.end();
      bool count = p->tp_replica() == 0 && !copy;  // each element once over TP
      segments_.push_back({state + (s - lo), e - s, p->decay, count});
      segment_src_.push_back(s);
      segment_param_.push_back(static_cast<int>(i));
    }
    state += hi - lo;
  }
  m_ = Tensor::empty({state}, DType::F32, ps_.device);
  v_ = Tensor::empty({state}, DType::F32, ps_.device);
  if (shard) {
    shard_grads_ = Tensor::container({state}, cfg_.grad_dtype, ps_.device);
  }
  const bool bf16_params = cfg_.param_dtype == DType::BF16;
  if (bf16_params && cfg_.master_weights) masters_ = Tensor::empty({state}, DType::F32, ps_.device);
  if (bf16_params && shard) gather_stage_ = Tensor::empty({state}, DType::BF16, ps_.device);
}

void DistributedOptimizer::values_changed() {
  if (cfg_.param_dtype != DType::BF16) return;
  bf16::round_inplace(values(), total_);
  if (!masters_.defined()) return;
  float* ms = masters_.data<float>();
  for (size_t s = 0; s < segments_.size(); ++s)
    std::memcpy(ms + segments_[s].offset, values() + segment_src_[s], sizeof(float) * segments_[s].size);
}

void DistributedOptimizer::for_each_master_run(const std::function<void(int64_t, int64_t, float*)>& fn) {
  if (!masters_.defined()) return;
  float* ms = masters_.data<float>();
  for (size_t s = 0; s < segments_.size(); ++s) fn(segment_src_[s], segments_[s].size, ms + segments_[s].offset);
}

void DistributedOptimizer::store_bf16(size_t s, const float* x, int64_t step) {
  const int64_t src = segment_src_[s], n = segments_[s].size;
  float* out = values() + src;
  if (!cfg_.stochastic_rounding) {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16::round_nearest(x[i]);
    return;
  }
  // The segment is elements [lo, lo + n) of its parameter's shard; each run
  // of the shard maps local indices to the full tensor's.
  const parallel::layers::Parameter& p = *params_[static_cast<size_t>(segment_param_[s])];
  const int64_t lo = src - p.offset;
  const uint64_t key =
      splitmix64(splitmix64(cfg_.rounding_seed ^ parallel::layers::hash_name(p.name)) + static_cast<uint64_t>(step));
  parallel::layers::for_each_shard_run(p, [&](int64_t local, int64_t full, int64_t count) {
    const int64_t b = std::max(local, lo), e = std::min(local + count, lo + n);
    for (int64_t j = b; j < e; ++j) {
      // Padding (full < 0) holds zeros, which no rounding moves.
      const uint64_t r = splitmix64(key + static_cast<uint64_t>(full < 0 ? 0 : full + (j - local)));
      out[j - lo] = bf16::round_stochastic(x[j - lo], static_cast<uint32_t>(r >> 48));
    }
  });
}

DistributedOptimizer::~DistributedOptimizer() {
  // Outstanding reductions write into our buffers: let them finish first.
  for (auto& b : buckets_) {
    if (b.work) {
      try {
        b.work->wait();
      } catch (const std::exception&) {
      }
    }
  }
}

int64_t DistributedOptimizer::optimizer_state_bytes() const {
  return static_cast<int64_t>(m_.nbytes() + v_.nbytes() + (masters_.defined() ? masters_.nbytes() : 0));
}

void DistributedOptimizer::for_each_moment_run(
    const std::function<void(int64_t, int64_t, const float*, const float*)>& fn) const {
  const float* m = m_.data<float>();
  const float* v = v_.data<float>();
  for (size_t s = 0; s < segments_.size(); ++s)
    fn(segment_src_[s], segments_[s].size, m + segments_[s].offset, v + segments_[s].offset);
}

void DistributedOptimizer::for_each_moment_run_mutable(
    const std::function<void(int64_t, int64_t, float*, float*)>& fn) {
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  for (size_t s = 0; s < segments_.size(); ++s)
    fn(segment_src_[s], segments_[s].size, m + segments_[s].offset, v + segments_[s].offset);
}

void DistributedOptimizer::zero_grad() {
  std::memset(grads(), 0, sizeof(float) * total_);
  kern::charge(ps_.device, cost::in_dtype(cost::fill(total_), cfg_.grad_dtype), cfg_.grad_dtype);
  for (auto& b : buckets_) {
    b.pending = b.num_params;
    b.launched = false;
    b.work.reset();
  }
  ready_.assign(params_.size(), false);
}

void DistributedOptimizer::reduce_sp_partials(Bucket& b) {
  if (b.sp_runs.empty()) return;
  float* g = grads();
  // Summed in fp32 and, for bf16 gradients, rounded once (as a bf16 reduction).
  auto reduce = [&](float* x, int64_t n) {
    ps_.tp_all_reduce_f32(x, n);
    if (cfg_.grad_dtype == DType::BF16) bf16::round_inplace(x, n);
  };
  if (b.sp_runs.size() == 1) {
    reduce(g + b.sp_runs[0].first, b.sp_runs[0].second);
    return;
  }
  float* stage = sp_stage_.data<float>();
  int64_t at = 0;
  for (const auto& [off, n] : b.sp_runs) {
    std::memcpy(stage + at, g + off, sizeof(float) * n);
    at += n;
  }
  reduce(stage, at);
  at = 0;
  for (const auto& [off, n] : b.sp_runs) {
    std::memcpy(g + off, stage + at, sizeof(float) * n);
    at += n;
  }
}

void DistributedOptimizer::launch(Bucket& b) {
  b.launched = true;
  reduce_sp_partials(b);
  if (ps_.dp_size == 1) return;
  float* g = grads() + b.offset;
  b.launch_wall_s = wall_now();
  if (cfg_.zero1) {
    size_t idx = &b - buckets_.data();
    b.work = ps_.dp->reduce_scatter_async(g, shard_grads_.data<float>() + shard_offset_[idx],
                                          static_cast<size_t>(shard_size(b)), DType::F32, collectives::ReduceOp::Sum);
  } else {
    b.work = ps_.dp->all_reduce_async(g, g, static_cast<size_t>(b.size), DType::F32, collectives::ReduceOp::Sum);
  }
}

void DistributedOptimizer::grad_ready(parallel::layers::Parameter* p) {
  TESSERA_CHECK(p->index >= 0 && p->index < static_cast<int>(params_.size()) && params_[p->index] == p,
                "grad_ready for a parameter this optimizer does not own: ", p->name);
  TESSERA_CHECK(!ready_[p->index], "grad_ready called twice in a step for ", p->name);
  ready_[p->index] = true;
  Bucket& b = buckets_[bucket_of_[p->index]];
  if (--b.pending == 0) launch(b);
}

StepStats DistributedOptimizer::step(int64_t step) {
  TESSERA_ARG_CHECK(step >= 1, "optimizer step counts from 1");
  // Parameters the model never reported (unused in this step) are reduced now, in order.
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) grad_ready(params_[i]);
  StepStats st;
  const bool shard = cfg_.zero1 && ps_.dp_size > 1;
  st.comm.reserve(buckets_.size() * (shard ? 2 : 1));
  Stopwatch wait_sw;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (b.work) {
      b.work->wait();
      // A bf16 gradient's DP sum: the communicator's bf16 reduction (fp32
      // sums on the wire, rounded once at the end) on the containers.
      if (cfg_.grad_dtype == DType::BF16) {
        if (shard) {
          bf16::round_inplace(shard_grads_.data<float>() + shard_offset_[i], shard_size(b));
        } else {
          bf16::round_inplace(grads() + b.offset, b.size);
        }
      }
      st.comm.push_back({shard ? CommRecord::kReduceScatter : CommRecord::kAllReduce, static_cast<int>(i), b.size,
                         b.work->modeled_seconds(), b.launch_wall_s});
    }
    b.work.reset();
  }
  const double wait_s = wait_sw.seconds();
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  auto grad_of = [&](size_t s) {
    return shard ? shard_grads_.data<float>() + segments_[s].offset : grads() + segment_src_[s];
  };

  // Global norm: every element of every shard exactly once.
  // The norm and the update each run as one multi-tensor kernel over this
  // rank's segments (as apex/Megatron's fused optimizers): charged once.
  const double norm0 = compute_s(ps_.device);
  double local = 0;
  int64_t normed = 0, updated = 0;
  for (size_t s = 0; s < segments_.size(); ++s) {
    updated += segments_[s].size;
    if (!segments_[s].count_in_norm) continue;
    local += kern::sum_squares(nullptr, grad_of(s), segments_[s].size);
    normed += segments_[s].size;
  }
  kern::charge(ps_.device, cost::sum_squares(normed), DType::F32);
  float sq = static_cast<float>(local);
  double norm_comm = 0;
  if (shard) {
    ps_.dp->all_reduce(&sq, &sq, 1, DType::F32, collectives::ReduceOp::Sum);
    norm_comm += modeled(ps_.dp);
  }
  if (ps_.tp_size > 1) {
    ps_.tp_all_reduce_f32(&sq, 1);
    norm_comm += modeled(ps_.tp);
  }
  if (ps_.pp_size > 1) {
    ps_.pp->all_reduce(&sq, &sq, 1, DType::F32, collectives::ReduceOp::Sum);
    norm_comm += modeled(ps_.pp);
  }
  st.norm_modeled_s = compute_s(ps_.device) - norm0 + norm_comm;
  st.wait_s = wait_s;
  st.grad_norm = std::sqrt(static_cast<double>(sq));
  st.clip_coef = 1.0;
  if (cfg_.clip_norm > 0 && st.grad_norm > cfg_.clip_norm) st.clip_coef = cfg_.clip_norm / (st.grad_norm + 1e-6);
  st.lr = cfg_.lr.at(step);

  const float bias1 = static_cast<float>(1.0 - std::pow(cfg_.beta1, static_cast<double>(step)));
  const float bias2 = static_cast<float>(1.0 - std::pow(cfg_.beta2, static_cast<double>(step)));
  const double update0 = compute_s(ps_.device);
  const bool bf16_params = cfg_.param_dtype == DType::BF16;
  for (size_t s = 0; s < segments_.size(); ++s) {
    const Segment& sg = segments_[s];
    // fp32 arithmetic on the master (or, in pure bf16, on the bf16 value
    // itself), then rounded back into the bf16 parameter.
    float* x = masters_.defined() ? masters_.data<float>() + sg.offset : values() + segment_src_[s];
    kern::adamw_update(nullptr, x, grad_of(s), m + sg.offset, v + sg.offset, sg.size, static_cast<float>(st.lr),
                       static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.eps),
                       sg.decay ? static_cast<float>(cfg_.weight_decay) : 0.f, bias1, bias2,
                       static_cast<float>(st.clip_coef));
    if (bf16_params) store_bf16(s, x, step);
  }
  kern::charge(ps_.device, cost::adamw(updated), DType::F32);

  st.update_modeled_s = compute_s(ps_.device) - update0;
  if (shard) {
    // Every rank updated its slice of each bucket; gather the slices back.
    auto& works = gather_works_;
    works.clear();
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const Bucket& bk = buckets_[b];
      const int64_t ss = shard_size(bk);
      // In place: this rank's slice already sits at its slot of the bucket.
      const float* mine = values() + bk.offset + ps_.dp_rank * ss;
      st.comm.push_back({CommRecord::kAllGather, static_cast<int>(b), bk.size, 0, wall_now()});
      if (bf16_params) {
        // 16-bit values on the wire: the slice packed, gathered into the
        // first half of the bucket's bytes, widened in place after.
        uint16_t* packed = gather_stage_.data<uint16_t>() + shard_offset_[b];
        bf16::pack(mine, packed, ss);
        works.push_back(ps_.dp->all_gather_async(packed, values() + bk.offset, static_cast<size_t>(ss), DType::BF16));
      } else {
        works.push_back(ps_.dp->all_gather_async(mine, values() + bk.offset, static_cast<size_t>(ss), DType::F32));
      }
    }
    for (size_t b = 0; b < works.size(); ++b) {
      works[b]->wait();
      if (bf16_params) bf16::unpack_inplace(values() + buckets_[b].offset, buckets_[b].size);
      st.comm[st.comm.size() - works.size() + b].modeled_s = works[b]->modeled_seconds();
    }
    works.clear();
  }
  return st;
}

}  // namespace tessera::parallel::optim
