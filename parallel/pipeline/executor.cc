#include "parallel/pipeline/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "parallel/layers/buffer.h"
#include "runtime/device.h"
#include "runtime/error.h"

namespace tessera::parallel::pipeline {

namespace {
// One tag for every pipeline message: the order of messages on a link is
// what matches them (the transports check sizes and tags, in order).
constexpr uint32_t kPipeTag = 0x5050;

}  // namespace

PipelineExecutor::PipelineExecutor(const parallel::layers::ParallelState& ps, int v) : ps_(ps), v_(v) {
  TESSERA_ARG_CHECK(v >= 1, "virtual stages must be >= 1 (got ", v, ")");
  TESSERA_ARG_CHECK(ps.pp_size == 1 || (ps.act_next && ps.act_prev && ps.grad_prev && ps.grad_next), "a pipeline of ",
                    ps.pp_size, " stages needs the pipeline links (make_parallel_state with pp)");
}

void PipelineExecutor::run(const std::vector<PipeOp>& ops, int m, StageModule& module, bool forward_only) {
  const int p = ps_.pp_size, r = ps_.pp_rank, nv = p * v_;
  const int64_t n = module.activation_elems();
  // Every message is the n floats and, in the two floats after them, the
  // sender's simulated send time (int64 ns, bit-copied).
  const int64_t wire = n + 2;
  const size_t count = static_cast<size_t>(wire);
  float* act = parallel::layers::ensure_buffer(act_in_, ps_.device, wire);
  float* grad = parallel::layers::ensure_buffer(grad_in_, ps_.device, wire);
  // Send buffers, one per (chunk, micro-batch) and direction.
  const size_t bufs = static_cast<size_t>(m) * static_cast<size_t>(v_);
  if (act_out_.size() < bufs) act_out_.resize(bufs);
  if (grad_out_.size() < bufs) grad_out_.resize(bufs);
  sends_.clear();
  spans_.clear();
  now_ = 0;
  wait_s_ = 0;
  // What the pipeline links charge this rank's clock during the run.
  std::vector<collectives::Communicator*> links;
  for (collectives::Communicator* l :
       {ps_.act_next.get(), ps_.act_prev.get(), ps_.grad_next.get(), ps_.grad_prev.get()})
    if (l != nullptr && std::find(links.begin(), links.end(), l) == links.end()) links.push_back(l);
  auto link_seconds = [&] {
    double t = 0;
    for (collectives::Communicator* l : links) t += l->total_modeled_seconds();
    return t;
  };
  const double links0 = link_seconds();
  // Sends a copy of `data` with this rank's simulated time on `link`.
  auto send = [&](collectives::Communicator& link, Tensor& buf, const float* data, const PipeOp& op) {
    spans_.push_back({PipeSpan::kSend, op.micro, op.chunk, now_, 0, 0, wall_now(), 0});
    float* c = parallel::layers::ensure_buffer(buf, ps_.device, wire);
    std::memcpy(c, data, sizeof(float) * static_cast<size_t>(n));
    const int64_t stamp = std::llround(now_ * 1e9);
    std::memcpy(c + n, &stamp, sizeof stamp);
    sends_.push_back(link.send_async(c, count, DType::F32, 1, kPipeTag));
  };
  // Receives into `data`; waits on the emulated clock until it has arrived.
  auto receive = [&](collectives::Communicator& link, float* data, const PipeOp& op) {
    const double w0 = wall_now();
    link.recv(data, count, DType::F32, 0, kPipeTag);
    const double w1 = wall_now();
    const double transfer = link.last_modeled_seconds();
    int64_t sent = 0;
    std::memcpy(&sent, data + n, sizeof sent);
    const double sent_at = static_cast<double>(sent) * 1e-9, arrive = sent_at + transfer;
    if (arrive > now_) {
      // Idle until the peer sent (the schedule's bubble), then for the rest
      // of the link transfer (point-to-point time the formula leaves out).
      const double idle = std::max(0.0, sent_at - now_), link = arrive - std::max(now_, sent_at);
      if (idle > 0) spans_.push_back({PipeSpan::kWait, op.micro, op.chunk, now_, idle, 0, w0, w1 - w0});
      if (link > 0) spans_.push_back({PipeSpan::kTransfer, op.micro, op.chunk, now_ + idle, link, 0, w1, 0});
      wait_s_ += arrive - now_;
      now_ = arrive;
    }
    spans_.push_back({PipeSpan::kRecv, op.micro, op.chunk, now_, 0, 0, w1, 0});
  };
  // The op's modeled time: the compute it charged and its blocking TP
  // communication, the K/V groups' gradient all-reduce included (the kv
  // communicator is split from the TP one and keeps its own total).
  struct Mark {
    double clock, tp, wall;
  };
  auto op_clock = [&] {
    Mark m{ps_.device ? ps_.device->clock().totals().compute_s : 0,
           (ps_.tp ? ps_.tp->total_modeled_seconds() : 0) + (ps_.kv ? ps_.kv->total_modeled_seconds() : 0), wall_now()};
    m.clock += m.tp;
    return m;
  };
  auto ran = [&](const PipeOp& op, const Mark& before) {
    const Mark after = op_clock();
    const double d = after.clock - before.clock;
    spans_.push_back({op.kind == PipeOp::kForward ? PipeSpan::kForward : PipeSpan::kBackward, op.micro, op.chunk, now_,
                      d, after.tp - before.tp, before.wall, after.wall - before.wall});
    now_ += d;
  };

  std::vector<std::vector<bool>> busy(static_cast<size_t>(v_));
  std::map<std::pair<int, int>, int> slot_of;  // (chunk, micro) -> slot
  try {
    for (const PipeOp& op : ops) {
      TESSERA_CHECK(op.chunk >= 0 && op.chunk < v_ && op.micro >= 0 && op.micro < m, "pipeline op ", op.micro, ".",
                    op.chunk, " out of range");
      const int vs = op.chunk * p + r;
      const bool first = vs == 0, last = vs == nv - 1;
      const size_t buf = static_cast<size_t>(op.chunk) * static_cast<size_t>(m) + static_cast<size_t>(op.micro);
      if (op.kind == PipeOp::kForward) {
        if (!first) receive(*ps_.act_prev, act, op);
        auto& b = busy[static_cast<size_t>(op.chunk)];
        int slot = 0;
        while (slot < static_cast<int>(b.size()) && b[static_cast<size_t>(slot)]) ++slot;
        if (slot == static_cast<int>(b.size())) b.push_back(false);
        b[static_cast<size_t>(slot)] = true;
        TESSERA_CHECK(slot_of.emplace(std::make_pair(op.chunk, op.micro), slot).second, "micro-batch ", op.micro,
                      " of chunk ", op.chunk, " forwarded twice");
        const Mark t0 = op_clock();
        const float* out = module.forward(op.chunk, op.micro, slot, first ? nullptr : act);
        ran(op, t0);
        if (forward_only) {
          b[static_cast<size_t>(slot)] = false;
          slot_of.erase(std::make_pair(op.chunk, op.micro));
        }
        if (!last) send(*ps_.act_next, act_out_[buf], out, op);
      } else {
        TESSERA_CHECK(!forward_only, "a backward in a forward-only run");
        if (!last) receive(*ps_.grad_next, grad, op);
        auto it = slot_of.find(std::make_pair(op.chunk, op.micro));
        TESSERA_CHECK(it != slot_of.end(), "backward of micro-batch ", op.micro, " of chunk ", op.chunk,
                      " before its forward");
        const Mark t0 = op_clock();
        const float* din = module.backward(op.chunk, op.micro, it->second, last ? nullptr : grad);
        ran(op, t0);
        busy[static_cast<size_t>(op.chunk)][static_cast<size_t>(it->second)] = false;
        slot_of.erase(it);
        if (!first) send(*ps_.grad_prev, grad_out_[buf], din, op);
      }
    }
  } catch (...) {
    // The sends read our buffers: let them end (each bounded by the timeout) before unwinding.
    for (auto& w : sends_) {
      try {
        w->wait();
      } catch (const std::exception&) {
      }
    }
    sends_.clear();
    throw;
  }
  for (auto& w : sends_) w->wait();
  sends_.clear();
  p2p_s_ = link_seconds() - links0;
  if (ps_.device) ps_.device->clock().charge_idle(wait_s_);
  TESSERA_CHECK(slot_of.empty(), slot_of.size(), " micro-batch(es) forwarded without a backward");
}

}  // namespace tessera::parallel::pipeline
