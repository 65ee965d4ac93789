// MPI process environment for tools that run under mpirun (tessera bench).
//
// install() registers the MPI Communicator factory with mpi_backend.h.
// init() initialises MPI once (MPI_THREAD_SERIALIZED; MPI calls come from
// one thread at a time) and registers MPI_Finalize at exit; safe to call
// repeatedly. Everything else needs init() first and is called by every rank.
#pragma once

#include <string>

namespace tessera::coll::mpi {

void install();
void init();
bool initialized();
bool under_mpirun();  // OMPI_COMM_WORLD_RANK / PMI_RANK / PMIX_RANK is set
int world_rank();
int world_size();
// Rank 0's `value` on every rank (MPI_Bcast); used to share a store directory.
std::string broadcast_string(const std::string& value);
void finalize();

}  // namespace tessera::coll::mpi
