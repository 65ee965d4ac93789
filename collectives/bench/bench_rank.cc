// One rank of `tessera bench` (bench_rank.h).
#include "collectives/bench/bench_rank.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "collectives/communicator.h"
#include "collectives/mpi/mpi_backend.h"
#include "collectives/mpi/mpi_env.h"
#include "runtime/device.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/log.h"
#include "runtime/shm_memory.h"
#include "runtime/topology.h"

namespace tessera::collectives::bench {
std::string make_temp_dir() {
  // tessera-bench-<pid>[-<job id>]-XXXXXX: a later bench removes the ones
  // whose creator died (a parent killed by SIGKILL cannot remove its own).
  const std::string tmp = temp_directory();
  remove_stale_temps(tmp, "tessera-bench-");
  std::string job;
  for (char c : env_or("TESSERA_JOB_ID").substr(0, 32))
    job += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ? c : '_';
  std::string tmpl = tmp + "/tessera-bench-" + std::to_string(::getpid()) + (job.empty() ? "" : "-" + job) + "-XXXXXX";
  return make_owned_temp_dir(std::move(tmpl));
}

NetModel topology_model(const std::string& spec, int nranks) {
  if (spec.empty()) return NetModel{};  // the communicator's default ring
  Topology t = Topology::load(spec);
  if (t.num_cores() > nranks) t = t.first_cores(nranks);
  return t.net_model();
}

namespace {

// Local rank i runs on CPU i mod n of the process's affinity mask (n CPUs),
// as mpirun binds its ranks for the MPI column (--bind-to core up to 2
// ranks; with more ranks than CPUs, --bind-to core:overload-allowed is one of
// the settings measured): two floating ranks that the scheduler puts on one
// core spin against each other, and with more ranks than CPUs, pinned pairs
// hand their core to each other. The 4-rank 8-byte all-reduce on 2 CPUs took
// 1.42-1.51 us bound, 1.42-2.71 floating. TESSERA_BIND=0 (as for `tessera
// run`'s binding; TESSERA_BENCH_BIND=0, its older name, too) leaves them
// floating; under mpirun, mpirun's binding stays.
void bind_to_cpu(const World& w) {
  if (w.local_size < 2 || mpi::under_mpirun() || env_or("TESSERA_BIND") == "0" || env_or("TESSERA_BENCH_BIND") == "0")
    return;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  int seen = 0;
  const int want = w.local_rank % CPU_COUNT(&set);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set) || seen++ != want) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
      spdlog::warn("bench: cannot bind to CPU {}: {}", c, std::strerror(errno));
    return;
  }
}

}  // namespace

int run_rank(const RankOptions& a, const BenchConfig& cfg, const JoinJob& join) {
  // Under a launcher (`tessera run`), join its job: its store, heartbeats,
  // abort on a failed peer.
  std::optional<JoinedJob> job;
  if (join) job = join();
  const World w = job ? job->world : discover_world();
  if (a.nworkers > 0 && w.size > 1 && a.nworkers != w.size)
    throw InvalidArgument("-r " + std::to_string(a.nworkers) + " does not match the launcher's world size " +
                          std::to_string(w.size));
  init_logging(w.size > 1 ? w.rank : -1);
  bind_to_cpu(w);
  const TransportKind kind = parse_transport(a.transport);
  // --compare mpi, started by `tessera bench -r N`: the front-end already ran
  // MPI's side (tessera_mpi_peer) and left its figures in this file, so this
  // process starts no MPI at all.
  const std::string figures = env_or("TESSERA_BENCH_MPI_FIGURES");
  const bool compare_in_process = a.compare == "mpi" && figures.empty();
  const bool want_mpi = kind == TransportKind::Mpi || compare_in_process;
  const bool in_mpirun = mpi::under_mpirun();
  if (want_mpi || in_mpirun) {
    mpi::install();
    mpi::init();
  }
  if (want_mpi && !in_mpirun && w.size > 1)
    throw InvalidArgument(
        "--transport mpi and --compare mpi need the ranks started by mpirun "
        "(use -r N, or mpirun -np N tessera bench ...)");
  if (cfg.root < 0 || cfg.root >= w.size)
    throw InvalidArgument("--root " + std::to_string(cfg.root) + " is not a rank of " + std::to_string(w.size));

  // The store the shm and tcp transports rendezvous through.
  std::shared_ptr<Store> store;
  std::string own_dir;  // created here, removed at the end
  if (kind != TransportKind::Mpi && job) {
    store = std::make_shared<PrefixStore>(job->store, "bench/");
  } else if (kind != TransportKind::Mpi) {
    // Ranks meet in their launcher's job (above); alone, in a fresh temporary directory.
    if (w.size > 1)
      throw InvalidArgument(detail::concat("rank ", w.rank, " of ", w.size,
                                           " has no job to join: start the ranks with -r N, tessera run, mpirun or "
                                           "srun"));
    own_dir = make_temp_dir();
    store = std::make_shared<PrefixStore>(make_file_store(own_dir), "bench/");
  }

  CommOptions opts;
  opts.transport = kind;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  opts.name = "bench";
  opts.algo = a.algo;
  opts.net = topology_model(a.topology, w.size);
  if (job) opts.reach = job->reach;
  auto comm = Communicator::create(store, w.rank, w.size, opts);
  std::shared_ptr<Communicator> compare;
  if (compare_in_process) {
    CommOptions o = opts;
    o.transport = TransportKind::Mpi;
    o.name = "bench-mpi";
    compare = Communicator::create(nullptr, w.rank, w.size, o);
  }

  // Buffers: from a shared-memory arena for shm, so peers read them in place.
  const size_t need = bytes_needed(cfg, w.size);
  std::unique_ptr<DeviceMemory> arena;
  void* sbuf = nullptr;
  void* rbuf = nullptr;
  if ((kind == TransportKind::Shm || kind == TransportKind::Auto) && need > 0) {
    const size_t rounded = (need + 4095) / 4096 * 4096;
    arena = make_shm_memory(2 * rounded + (1 << 20));
    sbuf = arena->allocate(rounded);
    rbuf = arena->allocate(rounded);
    if (!sbuf || !rbuf) throw Error("bench: shared-memory arena could not hold the buffers");
    std::memset(sbuf, 0, rounded);  // pre-fault
    std::memset(rbuf, 0, rounded);
  }

  Report rep;
  rep.op = bench_op_name(cfg.op);
  rep.ranks = w.size;
  rep.transport = comm->transport();
  rep.algo = a.algo;
  rep.dtype = dtype_name(cfg.dtype);
  rep.redop = op_reduces(cfg.op) ? reduce_op_name(cfg.redop) : "none";
  rep.compare = a.compare;
  rep.rows = run_bench(*comm, cfg, compare.get(), sbuf, rbuf);
  if (a.compare == "mpi" && w.rank == 0) {
    if (compare_in_process) {
      rep.compare_settings = "MPI's collectives in these same processes (mpirun's settings), interleaved by size";
    } else {
      apply_compare_figures(rep, read_compare_figures(figures), w.size, cfg.op);
      rep.compare_settings = env_or("TESSERA_BENCH_MPI_SETTINGS");
    }
  }

  if (a.baseline) {
    size_t bytes = std::max<size_t>(need, 1 << 20);
    const int reps = static_cast<int>(std::clamp<size_t>((size_t{512} << 20) / bytes, 4, 1000));  // 512 MiB
    if (w.rank == 0) rep.memcpy_gbps = measure_memcpy_gbps(bytes, reps);
    if (w.size > 1) rep.memcpy_all_gbps = measure_memcpy_all_gbps(*comm, bytes, reps);
    auto tcp = measure_tcp_loopback(*comm, bytes, reps);
    rep.tcp_loopback_gbps = tcp.bidir_gbps;
    rep.tcp_loopback_unidir_gbps = tcp.unidir_gbps;
  }

  if (w.rank == 0) {
    std::cout << format_table(rep) << std::flush;
    if (!a.json.empty()) write_file_atomic(a.json, to_json(rep).dump(2) + "\n");  // a device or FIFO: written through
    if (!a.plot.empty()) plot_png(rep, a.plot);
  }
  comm->barrier();
  if (arena) {
    arena->free(sbuf, 0);
    arena->free(rbuf, 0);
  }
  compare.reset();
  comm.reset();
  if (!own_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(own_dir, ec);
  }
  if (job && job->leave) job->leave();
  if (mpi::initialized()) mpi::finalize();
  return rep.total_wrong() > 0 ? 1 : 0;
}

}  // namespace tessera::collectives::bench
