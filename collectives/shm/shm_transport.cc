// Placeholder: the shared-memory transport lands in the next commits.
#include "collectives/shm/shm_transport.h"

namespace tessera::coll::shm {
std::unique_ptr<Transport> create_transport(std::shared_ptr<Store>, int, int, const CommOptions&) {
  throw InvalidArgument("shm transport not built yet");
}
}  // namespace tessera::coll::shm
