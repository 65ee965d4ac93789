#include "examples/gpt/bootstrap.h"

#include "launcher/worker.h"
#include "runtime/shm_memory.h"

namespace tessera::gpt {

int run_job(const std::string& device_preset, const std::function<int(const Job&)>& body, const NetModel& net,
            const std::vector<int>& nodes) {
  // The rank only names the device in messages; the launcher re-reads the world.
  const World w = discover_world();
  // With peers on this host, the core's memory is a shared arena they map, so
  // gradient and activation collectives read peers' tensors in place (the
  // shm transport's direct path). The arena reserves address space only; pages
  // are backed when first touched, and the allocator reuses them.
  const DeviceSpec spec = DeviceSpec::preset(device_preset);
  Device device(spec, w.rank, w.local_size > 1 ? make_shm_memory(spec.hbm_bytes) : nullptr);
  launcher::WorkerOptions options;
  options.comm.device = &device;
  if (!net.dims().empty()) {
    options.comm.net = net;
    options.comm.world_ranks = nodes;
  }
  return launcher::run_worker(options, [&](launcher::WorkerContext& ctx) {
    Job job;
    job.world = ctx.world;
    job.device = &device;
    if (ctx.world.size > 1) job.comm = ctx.world_comm;
    return body(job);
  });
}

RankPlacement place_ranks(const std::string& topology, const TopologyOptions& options, const parallel::Mesh& mesh,
                          int world) {
  RankPlacement p;
  if (topology.empty() || Topology::is_emulated(topology)) return p;
  Topology topo = Topology::load(topology, options);
  if (topo.num_cores() != world) topo = topo.first_cores(world);
  const parallel::Placement pl(topo, mesh);
  p.nodes.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) p.nodes.push_back(pl.node(r));
  p.net = topo.net_model();
  return p;
}

}  // namespace tessera::gpt
