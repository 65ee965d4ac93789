// TCP transport: the Transport interface (collectives/transport.h) over
// sockets (Boost.Asio), for ranks on different hosts. Endpoints are exchanged
// through the store. Contract as in transport.h.
#pragma once

#include <memory>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "collectives/transport.h"

namespace tessera::coll::tcp {

// Collective over the group: every member calls it with stores sharing keys.
std::unique_ptr<Transport> create_transport(std::shared_ptr<Store> store, int rank, int size,
                                            const CommOptions& options);

}  // namespace tessera::coll::tcp
