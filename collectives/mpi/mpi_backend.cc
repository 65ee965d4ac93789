// Placeholder until the MPI backend lands (owned by the tcp/mpi helper).
#include "collectives/mpi/mpi_backend.h"

namespace tessera::coll::mpi {

std::shared_ptr<Communicator> create_communicator(int, int, const CommOptions&) {
  throw InvalidArgument("mpi backend not built yet");
}

}  // namespace tessera::coll::mpi
