#include "parallel/layers/parallel_state.h"

#include <algorithm>

#include "runtime/error.h"

namespace tessera::par {

MeshCoord mesh_coord(int global_rank, int tp_size, int dp_size) {
  TESSERA_CHECK(tp_size > 0 && dp_size > 0 && global_rank >= 0 && global_rank < tp_size * dp_size, "rank ",
                global_rank, " tp ", tp_size, " dp ", dp_size);
  return {global_rank % tp_size, global_rank / tp_size};
}

int mesh_global_rank(const MeshCoord& c, int tp_size, int /*dp_size*/) { return c.tp_rank + c.dp_rank * tp_size; }

void ParallelState::tp_all_reduce(float* buf, int64_t n) const {
  if (tp_size == 1 || n == 0) return;
  tp->all_reduce(buf, buf, static_cast<size_t>(n), DType::F32, coll::ReduceOp::Sum);
}

void ParallelState::tp_all_reduce_max(float* buf, int64_t n) const {
  if (tp_size == 1 || n == 0) return;
  tp->all_reduce(buf, buf, static_cast<size_t>(n), DType::F32, coll::ReduceOp::Max);
}

void ParallelState::tp_all_gather(const float* send, float* recv, int64_t n) const {
  if (tp_size == 1) {
    if (recv != send) std::copy(send, send + n, recv);
    return;
  }
  tp->all_gather(send, recv, static_cast<size_t>(n), DType::F32);
}

void ParallelState::tp_reduce_scatter(const float* send, float* recv, int64_t n) const {
  if (tp_size == 1) {
    if (recv != send) std::copy(send, send + n, recv);
    return;
  }
  tp->reduce_scatter(send, recv, static_cast<size_t>(n), DType::F32, coll::ReduceOp::Sum);
}

ParallelState serial_state(Device* device) {
  ParallelState s;
  s.device = device;
  return s;
}

ParallelState make_parallel_state(std::shared_ptr<coll::Communicator> world, int tp, int dp, Device* device,
                                  bool sequence_parallel) {
  TESSERA_ARG_CHECK(world != nullptr, "make_parallel_state: no world communicator");
  TESSERA_ARG_CHECK(tp >= 1 && dp >= 1, "tp and dp must be >= 1 (got tp ", tp, ", dp ", dp, ")");
  TESSERA_ARG_CHECK(world->size() == tp * dp, "world size ", world->size(), " != tp ", tp, " x dp ", dp,
                    " (launch tp*dp processes)");
  ParallelState s;
  s.device = device;
  s.world = world;
  s.tp_size = tp;
  s.dp_size = dp;
  MeshCoord c = mesh_coord(world->rank(), tp, dp);
  s.tp_rank = c.tp_rank;
  s.dp_rank = c.dp_rank;
  s.sequence_parallel = sequence_parallel;
  // split() is collective over world: every rank makes both calls in this order.
  auto tp_comm = world->split(c.dp_rank, c.tp_rank, "tp" + std::to_string(c.dp_rank));
  auto dp_comm = world->split(c.tp_rank, c.dp_rank, "dp" + std::to_string(c.tp_rank));
  if (tp > 1) s.tp = tp_comm;
  if (dp > 1) s.dp = dp_comm;
  return s;
}

}  // namespace tessera::par
