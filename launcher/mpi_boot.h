// The worker's MPI, loaded on first use (collectives/mpi/mpi_boot.h): the
// binary's own tessera_coll_mpi when it links it, else the module
// libtessera_mpi_boot.so, dlopened. Only the worker's mpirun bootstrap calls
// it, so a worker started by `tessera run`, srun or alone never loads libmpi.
#pragma once

#include "collectives/mpi/mpi_boot.h"

namespace tessera::launcher {

// The table; loads it on the first call (thread-safe). Throws Error, naming
// the paths tried and dlopen's reasons, when the module cannot be loaded.
const collectives::mpi::BootApi& mpi_boot();

// mpi_boot().abort(code) when MPI is loaded (it is after a bootstrap under
// mpirun), else _exit(code).
[[noreturn]] void mpi_abort_or_exit(int code);

}  // namespace tessera::launcher
