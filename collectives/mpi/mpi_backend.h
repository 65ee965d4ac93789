// MPI backend: a Communicator that hands whole collectives to MPI (the
// process must run under mpirun; MPI is initialised on first use). Used to
// compare tessera's algorithms with the MPI library's.
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace tessera::collectives::mpi {

// rank/size must match MPI_COMM_WORLD's (or the group being split from).
std::shared_ptr<Communicator> create_communicator(int rank, int size, const CommOptions& options);

// Only the library tessera_coll_mpi links MPI. It registers its factory
// here (mpi::install() in collectives/mpi/mpi_env.h); without it,
// create_communicator throws InvalidArgument saying the binary has no MPI.
using Factory = std::shared_ptr<Communicator> (*)(int rank, int size, const CommOptions& options);
void set_factory(Factory factory);

}  // namespace tessera::collectives::mpi
