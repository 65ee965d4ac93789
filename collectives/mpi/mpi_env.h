// The MPI bootstrap: the one place where a tessera process starts, queries
// and ends MPI (tessera bench under mpirun, the launcher's worker under plain
// mpirun, coll_perf). Implemented in mpi_env.cc, in tessera_coll_mpi, the
// only library that links MPI; nothing else calls MPI_* directly.
//
// Thread level: init() asks for MPI_THREAD_MULTIPLE. MPI calls normally come
// from one thread (the communicator's calling thread, or the main thread
// during bootstrap), but abort() is called from other threads while that
// thread may be blocked inside MPI: the MPI backend's watchdog and the
// launcher's watch thread end the job with it. Only MULTIPLE allows an MPI
// call from a second thread then. When the library provides less, abort()
// from a thread other than the one that initialised MPI does not call
// MPI_Abort; it ends the process with _exit(code), which mpirun also treats
// as the job's failure (docs/threads.md).
//
// Lifetime: init() is idempotent and thread-safe (the first call
// initialises, later calls return the same level). If the program already
// initialised MPI itself, init() adopts it and finalize() leaves it alone.
// Nothing is registered at exit: MPI_Finalize is collective, and a rank that
// exits after an error must not wait in it for peers that are stuck in a
// collective. The owner calls finalize() on the clean path (every rank);
// a rank that exits without it makes mpirun end the job.
//
// thread_level(), world_rank(), world_size(), node_index(),
// broadcast_string() and barrier() need init() first (InternalError
// otherwise). node_index(), broadcast_string(), barrier() and finalize()
// are collective over MPI_COMM_WORLD: every rank calls them in the same
// order, from the thread that issues the rank's MPI calls.
#pragma once

#include <string>

namespace tessera::collectives::mpi {

// Registers the MPI Communicator factory with mpi_backend.h.
void install();

// MPI's thread levels, in MPI's order (MPI_THREAD_SINGLE ... _MULTIPLE).
enum class ThreadLevel { Single, Funneled, Serialized, Multiple };
const char* thread_level_name(ThreadLevel level);  // "MPI_THREAD_MULTIPLE", ...

// Initialises MPI once per process (MPI_THREAD_MULTIPLE requested) and
// returns the level the library provided. Throws Error when MPI_Init fails.
ThreadLevel init();
bool initialized();          // init() ran (and finalize() did not)
ThreadLevel thread_level();  // the level init() got
bool under_mpirun();         // OMPI_COMM_WORLD_RANK / PMI_RANK / PMIX_RANK is set
int world_rank();
int world_size();

// Index of this rank's host among the job's hosts: hosts (ranks sharing
// memory, MPI_COMM_TYPE_SHARED) numbered in the order of their lowest world
// rank. OMPI_COMM_WORLD_NODE_RANK cannot serve: it is a rank *on* its node.
int node_index();
// `root`'s `value` on every rank (any length, bytes preserved).
std::string broadcast_string(const std::string& value, int root = 0);
void barrier();
// Ends the whole job with `code` (MPI_Abort on MPI_COMM_WORLD); any thread
// (see the thread level above). Without init() it ends this process.
[[noreturn]] void abort(int code);
// MPI_Finalize, if init() initialised MPI; idempotent.
void finalize();

}  // namespace tessera::collectives::mpi
