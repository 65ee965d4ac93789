// Placeholder until the TCP transport lands (owned by the tcp/mpi helper).
#include "collectives/tcp/tcp_transport.h"

namespace tessera::coll::tcp {

std::unique_ptr<Transport> create_transport(std::shared_ptr<Store>, int, int, const CommOptions&) {
  throw InvalidArgument("tcp transport not built yet");
}

}  // namespace tessera::coll::tcp
