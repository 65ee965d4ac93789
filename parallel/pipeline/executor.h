// PipelineExecutor: runs one stage's schedule (parallel/pipeline/schedule.h)
// for one step, moving activations and their gradients between neighbouring
// stages over ParallelState's pipeline links (a communicator per direction
// and neighbour, never the DP communicator).
//
// Communication (Megatron-core's p2p_communication): chunk c of rank r is
// virtual stage vs = c p + r of p v; a forward receives its input from vs - 1
// (rank r - 1, or rank p - 1's chunk c - 1 when r is 0) unless vs is first,
// and sends its output to vs + 1 unless last; a backward receives the output
// gradient from vs + 1 unless last and sends its input gradient to vs - 1
// unless first. Sends are asynchronous (Communicator::send_async on the
// link's own communicator) and receives block right before the op that needs
// them, so a stage only ever waits for data its op depends on: a valid
// schedule (every op's inputs produced by ops earlier in their stages'
// orders) cannot deadlock. Every wait has the communicator's timeout, so a
// dead or stuck stage ends the step with a CollectiveError naming the peer.
// Messages on a link come in the order both ends' schedules give (the same
// micro-batch and chunk sequence on every rank), which the transports check
// by size.
//
// Buffers: outputs and input gradients are copied, with the send time, into
// one send buffer per (chunk, micro-batch) and direction, allocated in the
// first step and reused. All sends are waited for before run() returns.
//
// Timeline: run() also keeps each rank's pipeline on the emulated clock.
// Every message carries its sender's simulated send time (two floats after
// the activation); a receive moves this rank's time to
// max(now, sent + modeled link time), and the gap is a wait span (the
// bubble). An op lasts the Device's modeled compute time it charged plus its
// blocking TP communication. spans() holds the last run()'s forward,
// backward and wait spans from the step's start, each also on the wall
// clock (a wait there: the time blocked in the receive). The waits are
// charged to the Device's clock as idle time; the link transfers they
// contain are charged by the communicators as comm time too, so the step's
// modeled time subtracts p2p_modeled_s() (a transfer that arrived while this
// rank was busy cost it nothing).
//
// Activation slots: a forward takes the lowest free slot of its chunk, its
// backward frees it, so a chunk uses at most max_in_flight slots (1F1B: p -
// stage, GPipe: m).
//
// One executor per rank, used by one thread; the ParallelState and the
// StageModule must outlive run().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/layers/parallel_state.h"
#include "parallel/pipeline/schedule.h"
#include "runtime/tensor.h"

namespace tessera::parallel::pipeline {

// The compute of one rank's chunks, driven by the executor.
class StageModule {
 public:
  virtual ~StageModule() = default;
  // Elements of the activation (and of its gradient) passed for one micro-batch.
  virtual int64_t activation_elems() const = 0;
  // Forward of `micro` through `chunk` into activation slot `slot` (of that
  // chunk). `in` is the previous virtual stage's output (nullptr on the
  // first). Returns this chunk's output (nullptr on the last virtual stage),
  // valid until the slot's backward.
  virtual const float* forward(int chunk, int micro, int slot, const float* in) = 0;
  // Backward of `micro` through `chunk` (in `slot`). `dout` is the next
  // virtual stage's gradient (nullptr on the last). Returns the gradient of
  // the chunk's input (nullptr on the first virtual stage), valid until the
  // next backward.
  virtual const float* backward(int chunk, int micro, int slot, const float* dout) = 0;
};

// One span of the last run() on the emulated clock (seconds from its start),
// and on the wall clock (seconds since the Unix epoch). A receive that had
// to wait is a kWait span (idle until the peer sent: the bubble) and/or a
// kTransfer span (the rest of the modeled link transfer). kSend and kRecv
// are instants (dur 0): the send of an op's output (activation after a
// forward, input gradient after a backward) and the moment a receive's data
// is there.
struct PipeSpan {
  enum Kind { kForward = 0, kBackward = 1, kWait = 2, kSend = 3, kRecv = 4, kTransfer = 5 };
  Kind kind;
  int micro, chunk;  // of the op (a wait, send or receive: of the op it serves)
  double start, dur;
  double tp_s = 0;  // of an op's dur: its blocking TP collectives
  double wall_start = 0, wall_dur = 0;
};

class PipelineExecutor {
 public:
  // v: model chunks per rank (virtual stages; 1 without interleaving).
  PipelineExecutor(const parallel::layers::ParallelState& ps, int v = 1);

  // Runs `ops` (this rank's schedule for m micro-batches). With forward_only
  // (evaluation: `ops` has no backward) a forward's slot is free again at
  // once.
  void run(const std::vector<PipeOp>& ops, int m, StageModule& module, bool forward_only = false);

  const std::vector<PipeSpan>& spans() const { return spans_; }
  // Of the last run(): the modeled seconds the pipeline links charged to
  // this rank's clock (sends and receives). Its bubble is read from the
  // trace (trace.h, trace_bubbles).
  double p2p_modeled_s() const { return p2p_s_; }

 private:
  const parallel::layers::ParallelState& ps_;
  int v_;
  Tensor act_in_, grad_in_;                 // receive buffers, reused across steps
  std::vector<Tensor> grad_out_, act_out_;  // send buffers (see above), reused across steps
  std::vector<std::shared_ptr<collectives::Work>> sends_;
  std::vector<PipeSpan> spans_;
  double now_ = 0, wait_s_ = 0, p2p_s_ = 0;
};

}  // namespace tessera::parallel::pipeline
