// PipelineExecutor: runs one stage's schedule (parallel/pipeline/schedule.h)
// for one step, moving activations and their gradients between neighbouring
// stages over the PP communicator (ParallelState::pp, a communicator of its
// own: pipeline traffic never queues behind the DP buckets).
//
// Communication of an op on stage s of p (Megatron-core's p2p_communication):
// a forward receives its input from s - 1 (unless s is first) and sends its
// output to s + 1 (unless last); a backward receives the output gradient from
// s + 1 (unless last) and sends the input gradient to s - 1 (unless first). A
// send is issued right before the next op's receive: when both are with the
// same peer they become one sendrecv (send_forward_recv_backward and
// send_backward_recv_forward), which is what keeps 1F1B's steady state from
// deadlocking; otherwise the send goes first. Every wait has the
// communicator's timeout, so a dead or stuck stage ends the step with a
// CollectiveError naming the peer.
//
// Activation slots: a forward takes the lowest free slot, its backward frees
// it, so a stage uses max_in_flight(ops) slots (1F1B: at most p, GPipe: m).
//
// One executor per rank, used by one thread; the ParallelState and the
// StageModule must outlive run().
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/layers/parallel_state.h"
#include "parallel/pipeline/schedule.h"
#include "runtime/tensor.h"

namespace tessera::parallel::pipeline {

// The compute of one stage, driven by the executor.
class StageModule {
 public:
  virtual ~StageModule() = default;
  // Elements of the activation (and of its gradient) passed for one micro-batch.
  virtual int64_t activation_elems() const = 0;
  // Forward of `micro` into activation slot `slot`. `in` is the previous
  // stage's output (nullptr on the first stage). Returns this stage's output
  // (nullptr on the last), valid until the slot's backward.
  virtual const float* forward(int micro, int slot, const float* in) = 0;
  // Backward of `micro` (in `slot`). `dout` is the next stage's gradient
  // (nullptr on the last stage). Returns the gradient of this stage's input
  // (nullptr on the first), valid until the next backward.
  virtual const float* backward(int micro, int slot, const float* dout) = 0;
};

class PipelineExecutor {
 public:
  explicit PipelineExecutor(const parallel::layers::ParallelState& ps) : ps_(ps) {}

  // Runs `ops` (this stage's schedule for m micro-batches). With
  // forward_only (evaluation: `ops` has no backward) a forward's slot is
  // free again as soon as its output is sent.
  void run(const std::vector<PipeOp>& ops, StageModule& module, bool forward_only = false);

 private:
  const parallel::layers::ParallelState& ps_;
  Tensor act_in_, grad_in_;  // receive buffers, reused across steps
};

}  // namespace tessera::parallel::pipeline
