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
// mistaken for the peer.
struct ShmOptions {
  // How messages name local rank i (its rank in the enclosing group); empty: i.
  std::vector<int> labels;
  // The group's ranks outnumber the CPUs they may run on together
  // (HostMap::crowded, from the ranks' affinity masks): waits do not spin.
  bool oversubscribed = false;
  // The group is one host's part of a group spanning hosts
  // (RoutedTransport): brief waits yield for the long window even when
  // oversubscribed, since they often cover a host-mate's step across hosts.
  bool part_of_wider_group = false;
};
std::unique_ptr<Transport> create_transport(const std::shared_ptr<Store>& store, int rank, int size,
                                            const CommOptions& options, ShmOptions shm = {});

}  // namespace tessera::collectives::shm
