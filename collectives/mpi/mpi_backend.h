// MPI backend: a Communicator that hands whole collectives to MPI (the
// process must run under mpirun; MPI is initialised on first use). Used to
// compare tessera's algorithms with the MPI library's.
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace tessera::coll::mpi {

// rank/size must match MPI_COMM_WORLD's (or the group being split from).
std::shared_ptr<Communicator> create_communicator(int rank, int size, const CommOptions& options);

}  // namespace tessera::coll::mpi
