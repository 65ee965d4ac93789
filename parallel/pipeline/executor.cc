#include "parallel/pipeline/executor.h"

#include <map>

#include "parallel/layers/buffer.h"
#include "runtime/error.h"

namespace tessera::parallel::pipeline {

namespace {
// One tag for every pipeline message: a sendrecv carries one tag for both of
// its halves, and the order of messages between two ranks is what matches
// them (the transports check sizes and tags, in order).
constexpr uint32_t kPipeTag = 0x5050;
uint32_t tag(int /*micro*/, bool /*backward*/) { return kPipeTag; }
}  // namespace

void PipelineExecutor::run(const std::vector<PipeOp>& ops, StageModule& module, bool forward_only) {
  const bool first = ps_.first_stage(), last = ps_.last_stage();
  const int prev = ps_.pp_rank - 1, next = ps_.pp_rank + 1;
  TESSERA_CHECK(ps_.pp_size == 1 || ps_.pp != nullptr, "pipeline of ", ps_.pp_size,
                " stages without a PP communicator");
  const int64_t n = module.activation_elems();
  float* act = parallel::layers::ensure_buffer(act_in_, ps_.device, n);
  float* grad = parallel::layers::ensure_buffer(grad_in_, ps_.device, n);

  // The send of the previous op, issued with the next receive.
  struct Pending {
    const float* buf = nullptr;
    int peer = -1;
    uint32_t tag = 0;
  } pending;
  auto flush = [&] {
    if (pending.peer < 0) return;
    ps_.pp->send(pending.buf, static_cast<size_t>(n), DType::F32, pending.peer, pending.tag);
    pending = Pending{};
  };
  // Receives n floats from `peer` into `buf`, together with the pending send when it goes to the same peer.
  auto receive = [&](float* buf, int peer, uint32_t t) {
    if (pending.peer == peer) {
      ps_.pp->sendrecv(pending.buf, static_cast<size_t>(n), peer, buf, static_cast<size_t>(n), peer, DType::F32,
                       pending.tag);
      pending = Pending{};
      return;
    }
    flush();
    ps_.pp->recv(buf, static_cast<size_t>(n), DType::F32, peer, t);
  };

  std::vector<bool> busy;
  std::map<int, int> slot_of;  // micro-batch -> slot
  for (const PipeOp& op : ops) {
    TESSERA_CHECK(op.chunk == 0, "virtual stages are not supported by this executor");
    if (op.kind == PipeOp::kForward) {
      if (!first)
        receive(act, prev, tag(op.micro, false));
      else
        flush();
      int slot = 0;
      while (slot < static_cast<int>(busy.size()) && busy[static_cast<size_t>(slot)]) ++slot;
      if (slot == static_cast<int>(busy.size())) busy.push_back(false);
      busy[static_cast<size_t>(slot)] = true;
      TESSERA_CHECK(slot_of.emplace(op.micro, slot).second, "micro-batch ", op.micro, " forwarded twice");
      const float* out = module.forward(op.micro, slot, first ? nullptr : act);
      if (!last) pending = Pending{out, next, tag(op.micro, false)};
      if (forward_only) {
        flush();  // the output lives in the slot, which the next forward may take
        busy[static_cast<size_t>(slot)] = false;
        slot_of.erase(op.micro);
      }
    } else {
      TESSERA_CHECK(!forward_only, "a backward in a forward-only run");
      if (!last)
        receive(grad, next, tag(op.micro, true));
      else
        flush();
      auto it = slot_of.find(op.micro);
      TESSERA_CHECK(it != slot_of.end(), "backward of micro-batch ", op.micro, " before its forward");
      const float* din = module.backward(op.micro, it->second, last ? nullptr : grad);
      busy[static_cast<size_t>(it->second)] = false;
      slot_of.erase(it);
      if (!first) pending = Pending{din, prev, tag(op.micro, true)};
    }
  }
  flush();
  TESSERA_CHECK(slot_of.empty(), slot_of.size(), " micro-batch(es) forwarded without a backward");
}

}  // namespace tessera::parallel::pipeline
