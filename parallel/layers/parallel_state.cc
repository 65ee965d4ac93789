#include "parallel/layers/parallel_state.h"

#include <algorithm>

#include "parallel/mesh.h"
#include "runtime/bf16.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/kernels.h"

namespace tessera::parallel::layers {

int ParallelState::global_rank() const {
  parallel::MeshCoord c;
  c.tp = tp_rank;
  c.dp = dp_rank;
  c.pp = pp_rank;
  return parallel::Mesh({.tp = tp_size, .dp = dp_size, .pp = pp_size}).rank(c);
}

void ParallelState::tp_all_reduce_f32(float* buf, int64_t n) const {
  if (tp_size == 1 || n == 0) return;
  tp->all_reduce(buf, buf, static_cast<size_t>(n), DType::F32, collectives::ReduceOp::Sum);
}

void ParallelState::tp_all_reduce(float* buf, int64_t n) const {
  if (tp_size == 1 || n == 0) return;
  tp_all_reduce_f32(buf, n);
  kern::round_activations(device, buf, n);
}

void ParallelState::tp_all_reduce_max(float* buf, int64_t n) const {
  if (tp_size == 1 || n == 0) return;
  tp->all_reduce(buf, buf, static_cast<size_t>(n), DType::F32, collectives::ReduceOp::Max);
}

void ParallelState::tp_all_gather(const float* send, float* recv, int64_t n) const {
  if (tp_size == 1) {
    if (recv != send) std::copy(send, send + n, recv);
    return;
  }
  if (device == nullptr || device->act_dtype() != DType::BF16) {
    tp->all_gather(send, recv, static_cast<size_t>(n), DType::F32);
    return;
  }
  // 16-bit values on the wire: pack, gather into the first half of recv's bytes, widen in place.
  if (gather_stage.size() < static_cast<size_t>(n)) gather_stage.resize(static_cast<size_t>(n));
  bf16::pack(send, gather_stage.data(), n);
  tp->all_gather(gather_stage.data(), recv, static_cast<size_t>(n), DType::BF16);
  bf16::unpack_inplace(recv, n * tp_size);
}

void ParallelState::tp_reduce_scatter(const float* send, float* recv, int64_t n) const {
  if (tp_size == 1) {
    if (recv != send) std::copy(send, send + n, recv);
    return;
  }
  tp->reduce_scatter(send, recv, static_cast<size_t>(n), DType::F32, collectives::ReduceOp::Sum);
  kern::round_activations(device, recv, n);
}

void ParallelState::kv_all_reduce(const float* send, float* recv, int64_t n) const {
  if (kv_replicas == 1 || n == 0) {
    if (recv != send) std::copy(send, send + n, recv);
    return;
  }
  TESSERA_CHECK(kv != nullptr && kv->size() == kv_replicas, "kv group of ", kv_replicas,
                " TP ranks missing (make_parallel_state's kv_replicas)");
  kv->all_reduce(send, recv, static_cast<size_t>(n), DType::F32, collectives::ReduceOp::Sum);
  kern::round_activations(device, recv, n);
}

ParallelState serial_state(Device* device) {
  ParallelState s;
  s.device = device;
  return s;
}

ParallelState make_parallel_state(const std::shared_ptr<collectives::Communicator>& world, int tp, int dp,
                                  Device* device, bool sequence_parallel, int pp, int kv_replicas) {
  TESSERA_ARG_CHECK(world != nullptr, "make_parallel_state: no world communicator");
  TESSERA_ARG_CHECK(tp >= 1 && dp >= 1 && pp >= 1, "tp, dp and pp must be >= 1 (got tp ", tp, ", dp ", dp, ", pp ", pp,
                    ")");
  TESSERA_ARG_CHECK(world->size() == tp * dp * pp, "world size ", world->size(), " != tp ", tp, " x dp ", dp, " x pp ",
                    pp, " (launch tp*dp*pp processes)");
  TESSERA_ARG_CHECK(kv_replicas >= 1 && tp % kv_replicas == 0, "kv_replicas ", kv_replicas, " does not divide tp ", tp,
                    " (each K/V head is replicated onto tp / kv_heads TP ranks)");
  ParallelState s;
  s.device = device;
  s.world = world;
  s.tp_size = tp;
  s.dp_size = dp;
  s.pp_size = pp;
  const parallel::Mesh mesh({.tp = tp, .dp = dp, .pp = pp});
  const int me = world->rank();
  const parallel::MeshCoord c = mesh.coord(me);
  s.tp_rank = c.tp;
  s.dp_rank = c.dp;
  s.pp_rank = c.pp;
  s.sequence_parallel = sequence_parallel;
  // One communicator per group, colored by the group's lowest world rank and
  // ordered by the mesh's group order. split() is collective over world:
  // every rank makes the three calls in this order.
  const std::vector<int> tp_group = mesh.tp_group(me), dp_group = mesh.dp_group(me), pp_group = mesh.pp_group(me);
  TESSERA_CHECK(tp_group[c.tp] == me && dp_group[c.dp] == me && pp_group[c.pp] == me, "mesh group order");
  const std::string stage = pp > 1 ? "_pp" + std::to_string(c.pp) : "";  // pp = 1: the names as before
  auto tp_comm = world->split(tp_group.front(), c.tp, "tp" + std::to_string(c.dp) + stage);
  auto dp_comm = world->split(dp_group.front(), c.dp, "dp" + std::to_string(c.tp) + stage);
  auto pp_comm = world->split(pp_group.front(), c.pp, "pp" + std::to_string(c.tp) + "_dp" + std::to_string(c.dp));
  if (tp > 1) s.tp = tp_comm;
  if (kv_replicas > 1) {
    // A fifth split, from the TP group (collective over it; the same on every rank).
    s.kv_replicas = kv_replicas;
    s.kv = tp_comm->split(c.tp / kv_replicas, c.tp % kv_replicas,
                          "kv" + std::to_string(c.tp / kv_replicas) + "_dp" + std::to_string(c.dp) + stage);
  }
  if (dp > 1) s.dp = dp_comm;
  if (pp > 1) {
    s.pp = pp_comm;
    // The embedding group: a fourth split, made only when pp > 1 (the same on every rank).
    const bool ends = c.pp == 0 || c.pp == pp - 1;
    s.embed =
        world->split(ends ? pp_group.front() : -1, c.pp, "embed" + std::to_string(c.tp) + "_dp" + std::to_string(c.dp));
    // Links: for each direction and stage i, the pair (sender, receiver) =
    // (i, i + 1) for activations, (i + 1, i) for gradients (mod pp), split
    // from the PP communicator (collective over it, same order everywhere).
    const std::string group = "_tp" + std::to_string(c.tp) + "_dp" + std::to_string(c.dp);
    for (int dir = 0; dir < 2; ++dir) {
      for (int i = 0; i < pp; ++i) {
        const int a = dir == 0 ? i : (i + 1) % pp, b = dir == 0 ? (i + 1) % pp : i;  // sender, receiver
        const bool member = c.pp == a || c.pp == b;
        auto link = pp_comm->split(member ? 0 : -1, c.pp == a ? 0 : 1,
                                   (dir == 0 ? "act" : "grad") + std::to_string(a) + "to" + std::to_string(b) + group);
        if (dir == 0 && c.pp == a) s.act_next = link;
        if (dir == 0 && c.pp == b) s.act_prev = link;
        if (dir == 1 && c.pp == a) s.grad_prev = link;
        if (dir == 1 && c.pp == b) s.grad_next = link;
      }
    }
  }
  return s;
}

}  // namespace tessera::parallel::layers
