// Ends an MPI job the two ways tessera does, while the main thread of every
// rank is blocked inside MPI (a receive that no one matches):
//   mpirun -np 2 mpi_abort_driver thread    # rank 1's second thread: mpi::abort(7)
//   mpirun -np 2 mpi_abort_driver watchdog  # the MPI backend's watchdog (1 s timeout)
// ctest checks mpirun's exit code (7, resp. 1) and message; without the
// abort the job would hang until ctest's timeout.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "collectives/communicator.h"
#include "collectives/mpi/mpi_env.h"

using namespace tessera;
using namespace tessera::collectives;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "thread" && mode != "watchdog") {
    std::fprintf(stderr, "usage: mpi_abort_driver thread|watchdog\n");
    return 2;
  }
  mpi::install();
  mpi::init();
  CommOptions o;
  o.transport = TransportKind::Mpi;
  o.name = "stuck";
  o.timeout = mode == "watchdog" ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(600000);
  auto comm = Communicator::create(nullptr, mpi::world_rank(), mpi::world_size(), o);
  const int peer = (mpi::world_rank() + 1) % mpi::world_size();
  std::thread killer;
  if (mode == "thread" && mpi::world_rank() == 1) {
    killer = std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::fprintf(stderr, "aborting from a second thread\n");
      mpi::abort(7);
    });
  }
  int32_t x = 0;
  comm->recv(&x, 1, DType::I32, peer, 5);  // never sent
  std::fprintf(stderr, "recv returned\n");
  if (killer.joinable()) killer.join();
  return 0;
}
