// Worker bootstrap: the one call a tessera program makes to join its job.
//
// init_worker() discovers the world (runtime/world.h), connects a store and
// builds the world communicator:
//  - under `tessera run` (TESSERA_COORDINATOR set): a GrpcStore on the
//    launcher's coordinator;
//  - under plain `mpirun -np N` (OpenMPI variables, no TESSERA_COORDINATOR):
//    MPI is loaded (launcher/mpi_boot.h: no libmpi at start otherwise) and
//    initialised through collectives/mpi/mpi_env.h (the tree's one MPI
//    bootstrap, MPI_THREAD_MULTIPLE), rank 0 hosts a coordinator in-process
//    and broadcasts its address and a fresh token; everyone connects to it;
//  - under srun (Slurm's variables, a step of several tasks): every rank
//    derives the same coordinator address from them (launcher/slurm.h),
//    rank 0 serves it and the others connect, waiting for it to come up;
//  - alone (no launcher): a coordinator in-process on loopback (its
//    GrpcStore), world of one, no heartbeat or watch thread.
// With a coordinator it also starts a heartbeat thread and a watch thread.
// When the job is aborted (another rank failed, a heartbeat was lost, the
// launcher was interrupted) the watch thread logs the root cause, aborts the
// world communicator and ends the process at once: _exit(kAbortedExitCode),
// or mpi::abort() (MPI_Abort from the watch thread) under mpirun. A worker's
// own fatal error goes to the coordinator through report_fatal() (run_worker()
// does it for exceptions), so the launcher names it as the root cause.
//
// Lifetime and threads: one WorkerContext per process (a second init_worker
// throws); call it from the main thread, and shutdown() before returning from
// main. The background threads only touch the communicator through abort(),
// which is thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "runtime/world.h"

namespace tessera::launcher {

class CoordinatorClient;

// Exit code of a worker ended because the job was aborted elsewhere.
inline constexpr int kAbortedExitCode = 1;

enum class BootstrapMode { Single, TesseraRun, Mpi, Slurm };
const char* bootstrap_mode_name(BootstrapMode m);

struct WorkerOptions {
  // Build world_comm (needs the collectives' Communicator implementation).
  bool create_communicator = true;
  collectives::CommOptions comm;
  // Timeout of barrier(); generous, since a first barrier waits for the
  // slowest rank's start-up.
  std::chrono::milliseconds store_timeout{120000};
  // Heartbeat timeout of the in-process coordinator under mpirun
  // and srun (TESSERA_HEARTBEAT_TIMEOUT_MS overrides); tessera run sets its own.
  std::chrono::milliseconds mpi_heartbeat_timeout{10000};
  // Start the CPU rotation (runtime/cpu_rotation.h) when it applies; a
  // program that places its threads itself (the bench) turns it off.
  bool cpu_rotation = true;
};

struct WorkerContext {
  World world;
  BootstrapMode mode = BootstrapMode::Single;
  std::string host;
  int restart_count = 0;  // rendezvous round under tessera run
  std::shared_ptr<collectives::Store> store;
  std::shared_ptr<collectives::Communicator> world_comm;  // null unless create_communicator
  std::shared_ptr<CoordinatorClient> client;              // null when Single
  // The coordinator's host, which every host of the job reaches: pass it as
  // CommOptions::reach to communicators built on `store` by hand, so across
  // hosts their TCP endpoints use the interface that reaches it.
  std::vector<std::string> reach;

  // A barrier over the whole world through the coordinator (not the
  // communicator): usable before and without collectives. Names let several
  // barriers be in flight; each name is reusable. A world of one returns at
  // once, coordinator or not (also a default-constructed context). Throws
  // TimeoutError after WorkerOptions::store_timeout (120 s by default),
  // AbortedError when the job was aborted.
  void barrier(const std::string& name = "tessera/barrier") const;
};

// Throws Error (or TimeoutError) when the job cannot be joined.
WorkerContext init_worker(const WorkerOptions& options = {});

// Reports this worker's fatal error to the coordinator as the job's root
// cause (no-op when alone). A non-zero exit_code is the code this worker
// exits with: under mpirun every rank that hears of the abort then calls
// MPI_Abort with it, so the job's exit code is the failed rank's whichever
// abort reaches mpirun first. Never throws.
void report_fatal(const WorkerContext& ctx, const std::string& reason, int exit_code = 0);

// Leaves the job cleanly: stops heartbeats and the watch, destroys the
// communicator; under mpirun waits for every rank, stops rank 0's
// coordinator and finalizes MPI (unless the program initialised MPI itself
// before init_worker). Idempotent.
void shutdown(WorkerContext& ctx);

// init_worker + body + shutdown. An exception from body is logged, reported
// as the root cause, and turns into exit code 1. Returns body's exit code.
int run_worker(const WorkerOptions& options, const std::function<int(WorkerContext&)>& body);

}  // namespace tessera::launcher
