// Placeholder: the transport communicator lands in the next commits.
#include "collectives/comm_impl.h"

namespace tessera::coll {
std::shared_ptr<Communicator> make_transport_communicator(std::shared_ptr<Store>, std::unique_ptr<Transport>,
                                                          CommOptions) {
  throw InvalidArgument("transport communicator not built yet");
}
}  // namespace tessera::coll
