// Shared-memory transport (the simulated NeuronLink): ranks of one host
// exchange data through shared-memory segments created once per
// communicator, pre-faulted and reused. It also offers the SharedMemoryPeers
// capability: buffers in a shared device arena (runtime/shm_memory.h) are
// read by peers in place. Contract as in collectives/transport.h.
#pragma once

#include <memory>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "collectives/transport.h"

namespace tessera::coll::shm {

// Collective over the group: every member calls it with stores sharing keys.
std::unique_ptr<Transport> create_transport(std::shared_ptr<Store> store, int rank, int size,
                                            const CommOptions& options);

}  // namespace tessera::coll::shm
