// Shared-memory transport (the simulated NeuronLink): ranks of one host
// exchange data through shared-memory segments created once per
// communicator, pre-faulted and reused. It also offers the SharedMemoryPeers
// capability: buffers in a shared device arena (runtime/shm_memory.h) are
// read by peers in place. Contract as in collectives/transport.h.
#pragma once

#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "collectives/transport.h"

namespace tessera::collectives::shm {

// Collective over the group: every member calls it with stores sharing keys.
// Every member must be on this host (collectives/host.h): a peer that
// publishes another host's identity is refused before anything of it is
// opened, and a mapped segment must carry the random token its owner
// published, so a process id that means another process here is never
// mistaken for the peer. `labels`, when given, make the group one host's
// part of a group spanning hosts (RoutedTransport): `labels[i]` is how
// messages name local rank i (its rank in the enclosing group), and brief
// waits yield for the long window even when ranks outnumber cores, since
// they often cover a host-mate's step across hosts. Empty: a group of its
// own; messages name rank i as i.
std::unique_ptr<Transport> create_transport(const std::shared_ptr<Store>& store, int rank, int size,
                                            const CommOptions& options, std::vector<int> labels = {});

}  // namespace tessera::collectives::shm
