// One rank of `tessera bench`: finds its peers, builds the communicators,
// runs the sweep (bench.h), prints the table and writes the files.
//
// How the rank came to be is the front-end's business (launcher/bench_cli.cc:
// flags, spawning ranks, mpirun). What this library needs from a job
// launcher reaches it through JoinJob, so it never includes launcher code:
// - joined (JoinJob returns a job: ranks of `tessera run`, which is also how
//   `tessera bench -r N` runs them, mpirun or srun, joined through the
//   launcher's worker bootstrap): the job's world and store; the shm and tcp
//   transports rendezvous in the store under "bench/";
// - alone: a store in a fresh temporary directory (several ranks without a
//   job to join are refused).
//
// Threads: run_rank() runs on the calling thread and must be called by every
// rank of the world (it issues collectives).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/bench/bench.h"
#include "collectives/store.h"
#include "runtime/netmodel.h"
#include "runtime/world.h"

namespace tessera::collectives::bench {

// A job this rank joined through its launcher.
struct JoinedJob {
  World world;
  std::shared_ptr<Store> store;    // shared by every rank of the job
  std::vector<std::string> reach;  // CommOptions::reach: hosts every host reaches (the coordinator)
  std::function<void()> leave;     // called once when the run ends cleanly (may be empty)
};
// Joins the job this process was launched into, or returns nullopt when
// there is no launcher to join. Throws when a launcher is there but cannot
// be joined.
using JoinJob = std::function<std::optional<JoinedJob>()>;

// The flags of a rank (the sweep itself is the BenchConfig).
struct RankOptions {
  int nworkers = 0;  // -r as given (0: not given); must match the world size
  std::string transport = "auto", algo, topology, json, plot, compare;
  bool baseline = false;
  double timeout_s = 120;
};

// Runs one rank; returns 1 when --check found wrong elements, else 0.
// Throws InvalidArgument for options that do not fit the world.
int run_rank(const RankOptions& a, const BenchConfig& cfg, const JoinJob& join);

// The network model of --topology (a preset or a JSON file) for `nranks`
// ranks; the communicator's default ring when `spec` is empty. Throws
// InvalidArgument or FormatError naming the preset or the file.
NetModel topology_model(const std::string& spec, int nranks);

// A fresh directory for a FileStore ($TMPDIR/tessera-bench-<pid>[-<TESSERA_JOB_ID>]-XXXXXX;
// runtime/files.h), after removing those that dead processes left.
std::string make_temp_dir();

}  // namespace tessera::collectives::bench
