// DistributedOptimizer: flat parameter/gradient buffers, data-parallel
// gradient reduction in buckets overlapped with backward, optional ZeRO-1,
// clipping by the true global gradient norm, and AdamW.
//
// Layout: the Parameters are given in the order backward finishes their
// gradients; their values and gradients become views into two flat fp32
// buffers on the Device in that order, cut into buckets of about
// `bucket_elems` (each padded to a multiple of dp), so a bucket is complete
// as soon as backward has passed through it.
//
// Per step (all ranks of the job, one thread each):
//   zero_grad(); for each micro-batch { forward; backward } where, on the
//   last micro-batch only, the model calls grad_ready(p) once per Parameter
//   as its gradient becomes final; then step().
// grad_ready sums sequence-parallel partial gradients over TP (blocking) and,
// when a bucket is complete, launches its DP reduction asynchronously:
// all_reduce (plain DP) or reduce_scatter into this rank's shard (ZeRO-1).
// step() waits for them, computes the global norm over every shard (TP
// sharded parameters counted once per TP rank, replicated ones once, summed
// over DP shards, TP and pipeline stages; copies counted once), scales
// gradients by min(1, clip / norm), applies AdamW (decoupled weight decay,
// none on parameters with decay == false) to the full buffer (plain DP) or to
// this rank's shard of every bucket (ZeRO-1, which then all-gathers the
// updated values per bucket). Gradients must be pre-scaled so that their DP
// sum is the gradient of the global mean loss.
//
// The Parameters and ParallelState must outlive the optimizer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "parallel/layers/parallel_state.h"
#include "parallel/layers/parameter.h"
#include "parallel/optim/lr_schedule.h"

namespace tessera::parallel::optim {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double clip_norm = 1.0;  // <= 0: no clipping
  LrSchedule lr;
  bool zero1 = false;
  int64_t bucket_elems = 1 << 20;  // ~4 MiB of fp32 per bucket
  // Mixed precision (docs/training.md, "bf16"): the parameters are held as
  // param_dtype and their gradients as grad_dtype (BF16: bf16 values in
  // float containers, charged 2 bytes each). With bf16 parameters and
  // master_weights, the update runs on fp32 copies of what this rank
  // updates (sharded over DP under ZeRO-1, as the moments are) and each
  // updated value is rounded to bf16; without, on the bf16 values
  // themselves, each result rounded (pure bf16). The moments stay fp32.
  DType param_dtype = DType::F32, grad_dtype = DType::F32;
  bool master_weights = true;
  // Those roundings stochastic (runtime/bf16.h round_stochastic), from a
  // counter-based generator keyed by (rounding_seed, step, tensor name,
  // element index in the full tensor): the same draws in every layout.
  bool stochastic_rounding = false;
  uint64_t rounding_seed = 0;
};

// One DP collective of a step, for timelines (parallel/pipeline/trace.h).
struct CommRecord {
  enum Kind { kAllReduce, kReduceScatter, kAllGather };
  Kind kind;
  int bucket;
  int64_t elems;         // of the bucket
  double modeled_s;      // on the emulated interconnect (Work::modeled_seconds)
  double launch_wall_s;  // when it was issued, seconds since the Unix epoch
};

struct StepStats {
  double grad_norm = 0;  // before clipping
  double lr = 0;
  double clip_coef = 1;
  // Wall seconds this rank blocked on the gradient reductions after backward:
  // communication backward did not hide, plus waiting for slower DP peers.
  double wait_s = 0;
  // For timelines: the DP reductions (in issue order), then the ZeRO-1
  // all-gathers; the modeled seconds of the gradient norm (its kernels and
  // small all-reduces) and of the AdamW update's kernels.
  std::vector<CommRecord> comm;
  double norm_modeled_s = 0, update_modeled_s = 0;
};

class DistributedOptimizer {
 public:
  // `copies`: parameters (among params_in_grad_order) that are copies of a
  // parameter another pipeline stage holds (the last stage's tied wte): kept
  // equal by the caller, left out of the gradient norm so it counts them once.
  DistributedOptimizer(const parallel::layers::ParallelState& ps,
                       std::vector<parallel::layers::Parameter*> params_in_grad_order, AdamWConfig config,
                       const std::vector<const parallel::layers::Parameter*>& copies = {});
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  const AdamWConfig& config() const { return cfg_; }
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  int64_t total_elems() const { return total_; }
  // Bytes of AdamW state this rank holds (moments and master weights: 2 or
  // 3 fp32 values per element of its shard, or of everything under plain DP).
  int64_t optimizer_state_bytes() const;

  void zero_grad();
  void grad_ready(parallel::layers::Parameter* p);
  // `step` counts from 1 (it selects the learning rate and bias corrections).
  StepStats step(int64_t step);

  // Flat buffers (for tests and checkpoints).
  float* values() const { return values_.data<float>(); }
  float* grads() const { return grads_.data<float>(); }
  // After the values were written from outside (initialisation, loading):
  // with bf16 parameters rounds them to bf16 (to nearest even) and, with
  // master weights, sets the masters to them.
  void values_changed();
  bool has_masters() const { return masters_.defined(); }
  // The fp32 master weights as runs, like the moments: fn(offset, n, master)
  // (nothing without master weights).
  void for_each_master_run(const std::function<void(int64_t, int64_t, float*)>& fn);
  // The AdamW moments this rank holds (all of its parameters under plain DP,
  // its slice of every bucket under ZeRO-1), as runs: fn(offset, n, m, v)
  // where [offset, offset + n) indexes values() and m[i], v[i] belong to
  // element offset + i. Padding is not included.
  void for_each_moment_run(const std::function<void(int64_t, int64_t, const float*, const float*)>& fn) const;
  // The same runs, writable (loading a checkpoint).
  void for_each_moment_run_mutable(const std::function<void(int64_t, int64_t, float*, float*)>& fn);

 private:
  struct Segment {  // a run of elements of one parameter
    int64_t offset, size;
    bool decay, count_in_norm;
  };
  struct Bucket {
    int64_t offset = 0, size = 0;  // size padded to a multiple of dp
    int num_params = 0, pending = 0;
    bool launched = false;
    std::shared_ptr<collectives::Work> work;
    double launch_wall_s = 0;
    // Sequence parallelism: runs (offset, size) of this bucket's parameters
    // whose TP ranks hold partial gradients, summed over TP in one call
    // before the bucket's DP reduction.
    std::vector<std::pair<int64_t, int64_t>> sp_runs;
    int64_t sp_elems = 0;
  };
  void launch(Bucket& b);
  void reduce_sp_partials(Bucket& b);
  int64_t shard_size(const Bucket& b) const { return b.size / ps_.dp_size; }

  const parallel::layers::ParallelState& ps_;
  AdamWConfig cfg_;
  std::vector<parallel::layers::Parameter*> params_;
  std::vector<int> bucket_of_;  // per parameter
  std::vector<bool> ready_;     // per parameter, this step
  std::vector<Bucket> buckets_;
  int64_t total_ = 0;
  Tensor values_, grads_;
  // ZeRO-1: this rank's reduced gradient shard per bucket (at shard_offset_[b]).
  Tensor shard_grads_;
  std::vector<int64_t> shard_offset_;
  Tensor m_, v_;
  Tensor masters_;                    // fp32 master weights of the segments (bf16 parameters)
  Tensor gather_stage_;               // ZeRO-1 with bf16 parameters: each bucket's packed slice
  std::vector<Segment> segments_;     // what this rank updates, offsets into its m_/v_ space
  std::vector<int64_t> segment_src_;  // offsets of those segments in the flat buffers
  std::vector<int> segment_param_;    // the parameter of each segment
  // Writes the segment's updated fp32 values `x` (n of them) into the bf16 parameters.
  void store_bf16(size_t s, const float* x, int64_t step);
  std::vector<std::shared_ptr<collectives::Work>> gather_works_;  // reused across steps
  Tensor sp_stage_;                                               // packs a bucket's sp_runs when there are several
};

}  // namespace tessera::parallel::optim
