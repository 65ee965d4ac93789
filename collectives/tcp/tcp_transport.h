// TCP transport: the Transport interface (collectives/transport.h) over
// sockets (Boost.Asio), for ranks on different hosts. Endpoints are exchanged
// through the store. Contract as in transport.h.
#pragma once

#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "collectives/transport.h"

namespace tessera::collectives::tcp {

struct TcpOptions {
  // links[j]: connect to rank j (the relation must be symmetric over the
  // group). Empty: every peer. Calls to a peer without a link are a bug
  // (InvalidArgument).
  std::vector<bool> links;
  // The group spans hosts: advertise an address other hosts can reach (see
  // advertised address in tcp_transport.cc); otherwise loopback.
  bool spans_hosts = false;
};

// Collective over the group: every member calls it with stores sharing keys.
std::unique_ptr<Transport> create_transport(std::shared_ptr<Store> store, int rank, int size,
                                            const CommOptions& options, const TcpOptions& tcp = {});

}  // namespace tessera::collectives::tcp
