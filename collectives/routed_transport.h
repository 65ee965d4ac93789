// Host-aware transport selection: shared memory inside a host, TCP between
// hosts, within one communicator.
//
// make_routed_transport() first exchanges host identities through the store
// (collectives/host.h), then builds
//  - Auto, every rank on this host: the shm transport over the whole group
//    (with its zero-copy SharedMemoryPeers capability);
//  - Auto, ranks on several hosts: a RoutedTransport, an shm transport over
//    this host's ranks plus a TCP transport linking this rank to the ranks of
//    the other hosts; each peer goes to the one that reaches it;
//  - Shm forced: the shm transport over the group (it refuses peers on
//    another host, naming them);
//  - Tcp forced: TCP for every link (routed, so errors name the host, when
//    the group spans hosts).
// The algorithms see one Transport either way. shared_memory() is null on a
// RoutedTransport (not every peer can map this rank's memory);
// host_shared_memory() is the shm half's, among this host's ranks.
//
// Contract as in collectives/transport.h. Threads: a sendrecv whose two
// halves take different transports runs the TCP half on a helper thread
// owned by the RoutedTransport (each underlying transport still has one
// driving thread at a time). Errors: TransportError with the peer as a rank
// of this group and the message naming the peer's host; the first failure of
// either half aborts the other, so the peers behind it fail fast too, and
// every later call fails at once. Timeouts: waits on a peer of this host take
// max(1 s, timeout / 4) longer than the timeout, so that when another host is
// lost the rank blocked on it over TCP fails first and names it (its local
// peers then fail at once, told by the abort, instead of blaming each other).
#pragma once

#include <memory>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "collectives/transport.h"

namespace tessera::collectives {

// `kind` is Auto, Shm or Tcp. Collective over the group.
std::unique_ptr<Transport> make_routed_transport(TransportKind kind, std::shared_ptr<Store> store, int rank, int size,
                                                 const CommOptions& options);

}  // namespace tessera::collectives
