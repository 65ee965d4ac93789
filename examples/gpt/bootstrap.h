// Joining the job for train_gpt: the one place that knows how a worker finds
// its peers. It creates this rank's Device (so the collectives charge its
// clock with modeled communication time) and hands over to the launcher's
// worker bootstrap (launcher/worker.h): `tessera run`, plain `mpirun`, or
// alone.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "parallel/mesh.h"
#include "runtime/device.h"
#include "runtime/topology.h"
#include "runtime/world.h"

namespace tessera::gpt {

struct Job {
  World world;
  Device* device = nullptr;                         // this rank's emulated core
  std::shared_ptr<collectives::Communicator> comm;  // world communicator; null when alone
};

// Creates the Device (preset `device_preset`), joins, runs body, leaves.
// Returns body's exit code; an exception from body is logged, reported to
// the launcher as the job's root cause and becomes exit code 1. With `net`
// (and `nodes`, world rank -> node of net) every communicator charges its
// collectives on the links its group spans there (train_gpt --topology);
// otherwise each group is its own ring (NetModel's default).
int run_job(const std::string& device_preset, const std::function<int(const Job&)>& body,
            const NetModel& net = NetModel(), const std::vector<int>& nodes = {});

// A job's ranks placed on a topology, for run_job's `net` and `nodes`.
struct RankPlacement {
  NetModel net;
  std::vector<int> nodes;  // world rank -> node of net; empty: each group its own ring
};
// The `world` ranks of `mesh` on `topology` (a preset or file, cut to its
// first `world` cores) as `tessera plan` places them; nothing for "" or
// emulated:N. Throws what Topology::load throws for a bad topology.
RankPlacement place_ranks(const std::string& topology, const TopologyOptions& options, const parallel::Mesh& mesh,
                          int world);

}  // namespace tessera::gpt
