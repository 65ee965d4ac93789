// ParallelState: one rank's place in a (data x tensor) parallel layout and
// the communicators of its groups, as NxD's parallel_state / Megatron's mpu.
//
// Ranks are laid out as NxD and Megatron-LM do (parallel/mesh.h): TP
// fastest, then DP, then PP: global = tp_rank + dp_rank * TP + pp_rank * TP * DP.
// The TP group of a rank is the TP ranks with its dp_rank and pp_rank; its DP
// group the DP ranks with its tp_rank and pp_rank; its PP group (the stages
// activations pass through) the PP ranks with its tp_rank and dp_rank.
//
// Ownership: the state shares the communicators; the Device is borrowed and
// must outlive it. Collective helpers below are no-ops for groups of one and
// must be called by every member of the group in the same order (one thread).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/communicator.h"

namespace tessera {
class Device;
}

namespace tessera::parallel::layers {

struct ParallelState {
  Device* device = nullptr;
  int tp_size = 1, tp_rank = 0;
  int dp_size = 1, dp_rank = 0;
  int pp_size = 1, pp_rank = 0;
  // Sequence parallelism (Korthikanti et al.): LayerNorms, residual adds and
  // embeddings work on rows / tp of the activations; TP all-reduces become
  // reduce-scatter + all-gather pairs.
  bool sequence_parallel = false;
  std::shared_ptr<collectives::Communicator> world, tp, dp, pp;  // tp/dp/pp null when of size 1
  // Megatron's embedding group: the first and the last stage of this rank's
  // PP group (same tp_rank and dp_rank), which hold the two copies of the tied
  // token embedding and sum their gradients. Null unless pp_size > 1 and this
  // rank is on the first or last stage.
  std::shared_ptr<collectives::Communicator> embed;
  // Pipeline links (pp_size > 1): a two-member communicator per direction
  // between neighbouring stages, the sender its rank 0, so an asynchronous
  // send never queues behind a receive (Communicator::send_async). The
  // stages form a ring (stage pp-1's next is stage 0, for interleaved
  // schedules): act_next sends activations to the next stage, act_prev
  // receives them from the previous one, grad_prev sends gradients to the
  // previous stage, grad_next receives them from the next. With pp_size == 2
  // the two neighbours are one rank, on separate communicators.
  std::shared_ptr<collectives::Communicator> act_next, act_prev, grad_prev, grad_next;
  // Grouped-query attention with tp > kv_heads: each K/V head is held by
  // kv_replicas = tp / kv_heads consecutive TP ranks (TP rank r in group
  // r / kv_replicas), whose K/V projection gradients are summed over `kv`.
  // Null (and kv_replicas 1) otherwise.
  int kv_replicas = 1;
  std::shared_ptr<collectives::Communicator> kv;
  // bf16 all-gathers pack their send buffer here (grown once, reused).
  mutable std::vector<uint16_t> gather_stage;

  bool sp() const { return sequence_parallel && tp_size > 1; }
  int global_rank() const;  // through parallel/mesh.h (TP fastest, then DP, then PP)
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp_size - 1; }

  // ---- TP collectives on activation buffers (no-ops for tp_size == 1) ----
  // Under bf16 activations (device->act_dtype(), runtime/kernels.h) the
  // buffers hold bf16 values in float containers: sums are taken in fp32
  // and rounded once to bf16 (to nearest even), which is what the
  // communicator does with a bf16 reduction (it widens to fp32 on the wire
  // and rounds the result); all-gathers send the 16-bit values.
  void tp_all_reduce(float* buf, int64_t n) const;
  // fp32 data whatever the precision (the loss's sums, the gradient norm).
  void tp_all_reduce_f32(float* buf, int64_t n) const;
  // send: n elements; recv: tp_size * n.
  void tp_all_gather(const float* send, float* recv, int64_t n) const;
  // send: tp_size * n; recv: n (this rank's block, summed).
  void tp_reduce_scatter(const float* send, float* recv, int64_t n) const;
  void tp_all_reduce_max(float* buf, int64_t n) const;
  // recv = sum of send over the kv group (a copy when kv_replicas == 1); recv may equal send.
  void kv_all_reduce(const float* send, float* recv, int64_t n) const;
};

// A single-process state (tp = dp = pp = 1).
ParallelState serial_state(Device* device);

// Builds the TP, DP and PP groups of parallel::Mesh({.tp, .dp, .pp}) from the
// world communicator (collective over world; world->size() must equal
// tp * dp * pp). kv_replicas > 1 (a divisor of tp) also builds the kv
// groups of kv_replicas consecutive TP ranks (split from the TP group).
// Throws InvalidArgument otherwise.
ParallelState make_parallel_state(const std::shared_ptr<collectives::Communicator>& world, int tp, int dp,
                                  Device* device, bool sequence_parallel, int pp = 1, int kv_replicas = 1);

}  // namespace tessera::parallel::layers
