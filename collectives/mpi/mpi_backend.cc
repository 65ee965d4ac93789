// The MPI-free half of the MPI backend: a registration point, so that only
// binaries that want MPI link it (the implementation is mpi_comm.cc, in the
// library tessera_coll_mpi).
#include "collectives/mpi/mpi_backend.h"

#include <atomic>

namespace tessera::collectives::mpi {
namespace {
std::atomic<Factory> g_factory{nullptr};
}

void set_factory(Factory factory) { g_factory.store(factory); }

std::shared_ptr<Communicator> create_communicator(int rank, int size, const CommOptions& options) {
  Factory f = g_factory.load();
  if (!f)
    throw InvalidArgument(
        "this program was built without the MPI backend (link tessera_coll_mpi and call mpi::install())");
  return f(rank, size, options);
}

}  // namespace tessera::collectives::mpi
