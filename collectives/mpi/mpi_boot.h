// The MPI bootstrap (mpi_env.h) as a table of functions, for a program that
// should load MPI only when it runs under mpirun: the launcher's worker
// (launcher/mpi_boot.h). Loading libmpi and what it pulls in (open-rte,
// open-pal, hwloc, libevent, libudev) costs every process ~1.5 ms of CPU at
// start, which `tessera run`'s 128 workers on 2 cores pay for nothing.
//
// mpi_env.cc defines tessera_mpi_boot_api(); it is built twice: into
// tessera_coll_mpi (a binary that links MPI anyway) and into the module
// libtessera_mpi_boot.so (MPI linked there only), which launcher/mpi_boot.cc
// dlopens when the binary has no MPI of its own. Either way the table's
// functions are mpi_env.h's, with one state per process.
#pragma once

#include <string>

#include "collectives/mpi/mpi_env.h"

namespace tessera::collectives::mpi {

// Bumped when the table changes: the module and its loader are built
// together, but a stale module on LD_LIBRARY_PATH must be refused, not called.
inline constexpr int kBootApiVersion = 1;

struct BootApi {
  int version;
  ThreadLevel (*init)();
  int (*world_rank)();
  int (*world_size)();
  int (*node_index)();
  std::string (*broadcast_string)(const std::string& value, int root);
  void (*barrier)();
  void (*abort)(int code);  // does not return
  void (*finalize)();
};

}  // namespace tessera::collectives::mpi

// The table; the module's only exported symbol.
extern "C" const tessera::collectives::mpi::BootApi* tessera_mpi_boot_api();
