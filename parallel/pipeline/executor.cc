#include "parallel/pipeline/executor.h"

#include <cstring>
#include <map>

#include "parallel/layers/buffer.h"
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
  float* act = parallel::layers::ensure_buffer(act_in_, ps_.device, n);
  float* grad = parallel::layers::ensure_buffer(grad_in_, ps_.device, n);
  const size_t count = static_cast<size_t>(n);
  // Send buffers: input gradients per (chunk, micro); forward-only outputs per micro.
  const size_t bufs = static_cast<size_t>(m) * static_cast<size_t>(v_);
  auto& pool = forward_only ? act_out_ : grad_out_;
  if (pool.size() < bufs) pool.resize(bufs);
  sends_.clear();

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
        if (!first) ps_.act_prev->recv(act, count, DType::F32, 0, kPipeTag);
        auto& b = busy[static_cast<size_t>(op.chunk)];
        int slot = 0;
        while (slot < static_cast<int>(b.size()) && b[static_cast<size_t>(slot)]) ++slot;
        if (slot == static_cast<int>(b.size())) b.push_back(false);
        b[static_cast<size_t>(slot)] = true;
        TESSERA_CHECK(slot_of.emplace(std::make_pair(op.chunk, op.micro), slot).second, "micro-batch ", op.micro,
                      " of chunk ", op.chunk, " forwarded twice");
        const float* out = module.forward(op.chunk, op.micro, slot, first ? nullptr : act);
        if (forward_only) {
          b[static_cast<size_t>(slot)] = false;
          slot_of.erase(std::make_pair(op.chunk, op.micro));
          if (!last) {  // the slot may be reused before the send completes: send a copy
            float* c = parallel::layers::ensure_buffer(pool[buf], ps_.device, n);
            std::memcpy(c, out, sizeof(float) * count);
            out = c;
          }
        }
        if (!last) sends_.push_back(ps_.act_next->send_async(out, count, DType::F32, 1, kPipeTag));
      } else {
        TESSERA_CHECK(!forward_only, "a backward in a forward-only run");
        if (!last) ps_.grad_next->recv(grad, count, DType::F32, 0, kPipeTag);
        auto it = slot_of.find(std::make_pair(op.chunk, op.micro));
        TESSERA_CHECK(it != slot_of.end(), "backward of micro-batch ", op.micro, " of chunk ", op.chunk,
                      " before its forward");
        const float* din = module.backward(op.chunk, op.micro, it->second, last ? nullptr : grad);
        busy[static_cast<size_t>(op.chunk)][static_cast<size_t>(it->second)] = false;
        slot_of.erase(it);
        if (!first) {
          float* c = parallel::layers::ensure_buffer(pool[buf], ps_.device, n);
          std::memcpy(c, din, sizeof(float) * count);
          sends_.push_back(ps_.grad_prev->send_async(c, count, DType::F32, 1, kPipeTag));
        }
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
  TESSERA_CHECK(slot_of.empty(), slot_of.size(), " micro-batch(es) forwarded without a backward");
}

}  // namespace tessera::parallel::pipeline
