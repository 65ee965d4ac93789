// Internal: the Communicator built over a Transport (shm, tcp), where the
// algorithms of collectives/algorithms.{h,cc} run. Not part of the public API.
#pragma once

#include <memory>

#include "collectives/communicator.h"
#include "collectives/transport.h"

namespace tessera::collectives {

// Takes ownership of `transport`; `store` is this communicator's (prefixed) store,
// kept for split(). Options are final (env overrides already applied).
std::shared_ptr<Communicator> make_transport_communicator(std::shared_ptr<Store> store,
                                                          std::unique_ptr<Transport> transport, CommOptions options);

// Applies TESSERA_TIMEOUT_S, TESSERA_ALGO and TESSERA_TRANSPORT to `options`; throws InvalidArgument on bad values.
CommOptions apply_env_overrides(CommOptions options);

}  // namespace tessera::collectives
