#include "launcher/worker.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/tcp/tcp_transport.h"
#include "launcher/client.h"
#include "launcher/coordinator.h"
#include "launcher/mpi_boot.h"
#include "launcher/root_cause.h"
#include "launcher/slurm.h"
#include "runtime/cpu_rotation.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace tessera::launcher {

namespace pb = tessera::launcher::proto;
using namespace std::chrono_literals;

const char* bootstrap_mode_name(BootstrapMode m) {
  switch (m) {
    case BootstrapMode::Single:
      return "single process";
    case BootstrapMode::TesseraRun:
      return "tessera run";
    case BootstrapMode::Mpi:
      return "mpirun";
    case BootstrapMode::Slurm:
      return "srun";
  }
  return "?";
}

namespace {

// Process-wide state behind the WorkerContext. Never destroyed: the watch and
// heartbeat threads may still run while static destructors do at exit.
struct Runtime {
  std::mutex mu;
  bool initialized = false;
  bool shut = false;
  std::atomic<bool> leaving{false};  // aborts no longer end the process
  BootstrapMode mode = BootstrapMode::Single;
  World world;
  std::string host;
  std::shared_ptr<CoordinatorClient> client;
  std::unique_ptr<Coordinator> coordinator;  // rank 0 under mpirun, or alone
  std::unique_ptr<Heartbeater> heartbeat;
  std::unique_ptr<EventWatcher> watcher;
  std::weak_ptr<collectives::Communicator> comm;
  std::unique_ptr<CpuRotation> rotation;              // moves the main thread; stopped by shutdown()
  std::chrono::milliseconds barrier_timeout{120000};  // WorkerOptions::store_timeout
};

Runtime& rt() {
  static Runtime* r = new Runtime;
  return *r;
}

int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || x < 0) throw InvalidArgument(detail::concat(name, "='", v, "' is not a non-negative integer"));
  return x;
}

// "HOST:PORT" or "[V6]:PORT" -> HOST.
std::string host_of_address(const std::string& address) {
  std::string h = address.substr(0, address.rfind(':'));
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  return h;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// The job was aborted: end this process now. Runs on the watch or heartbeat
// thread (or the launcher watch; then with_mpi_abort is false: MPI_Abort
// needs the mpirun that is gone).
void on_job_abort(const std::string& why, bool with_mpi_abort = true, int mpi_code = kAbortedExitCode) {
  Runtime& r = rt();
  if (r.leaving.load()) return;
  spdlog::error("job aborted: {}", why);
  std::shared_ptr<collectives::Communicator> comm;
  {
    std::lock_guard<std::mutex> l(r.mu);
    comm = r.comm.lock();
  }
  if (comm) {
    try {
      comm->abort(why);
    } catch (const std::exception& e) {
      spdlog::debug("communicator abort: {}", e.what());
    }
  }
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  if (r.mode == BootstrapMode::Mpi && with_mpi_abort)
    mpi_abort_or_exit(mpi_code);  // from this thread: MPI_THREAD_MULTIPLE; the root cause's code
  _exit(kAbortedExitCode);
}

// Under mpirun: OpenMPI 4.1 leaves a rank running when mpirun (or the node's
// orted) is SIGKILLed, and a rank inside MPI_Abort when mpirun is gone may
// never return (both seen by the fault-injection suite). A detached thread
// checks every 500 ms that the rank's parent is still the launcher that
// started it and ends the job's process otherwise. Stops once the rank is
// leaving; it only touches the never-destroyed Runtime.
//
// And the rank's own children: OpenMPI makes each rank lead a process group
// but signals only the ranks, so a rank that dies leaves its children
// running (a data loader, a shell's sleep). A sentinel process, forked into
// the rank's group, SIGKILLs the group once the rank is gone, as `tessera
// run`'s keeper does (launcher/spawn.cc). Only for a rank that leads its
// group: never a group it does not own (a shell's job).
void start_group_sentinel() {
  if (getpgrp() != getpid()) return;
  const pid_t rank = getpid();
  const pid_t pid = fork();
  if (pid != 0) return;  // the rank (or a failed fork: no sentinel)
  // Only async-signal-safe calls: the rank has other threads.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, nullptr);  // a SIGTERM to the group must not end the sentinel first
  if (syscall(SYS_close_range, 0U, ~0U, 0) != 0)
    for (int fd = 0; fd < 4096; ++fd) close(fd);
  const timespec tick{0, 200L * 1000 * 1000};
  while (getppid() == rank) nanosleep(&tick, nullptr);
  kill(0, SIGKILL);  // the whole group, the sentinel last
  _exit(0);
}

void watch_launcher() {
  start_group_sentinel();
  const pid_t launcher = getppid();
  if (launcher <= 1) return;  // already orphaned: nothing to watch
  std::thread([launcher] {
    while (!rt().leaving.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (getppid() != launcher && !rt().leaving.load())
        on_job_abort(detail::concat("the launcher (mpirun or orted, pid ", launcher, ") died"),
                     /*with_mpi_abort=*/false);
    }
  }).detach();
}

// Under mpirun: rank 0 hosts the coordinator; its address and token reach
// the others by broadcast. MPI itself is collectives/mpi/mpi_env.h's,
// loaded now (launcher/mpi_boot.h).
void bootstrap_mpi(Runtime& r, const WorkerOptions& opt, std::string& address, std::string& token) {
  const collectives::mpi::BootApi& mpi = mpi_boot();
  mpi.init();
  const int rank = mpi.world_rank(), size = mpi.world_size();
  if (rank != r.world.rank || size != r.world.size)
    throw Error(detail::concat("MPI says rank ", rank, " of ", size, " but the environment says ", r.world.rank, " of ",
                               r.world.size));
  r.world.node_rank = mpi.node_index();
  std::string msg;
  if (rank == 0) {
    try {
      // One host: stay on loopback. Several: listen everywhere, advertise our name.
      bool one_host = r.world.local_size == r.world.size;
      // Several hosts: the address of the interface OpenMPI's own out-of-band
      // channel uses (tcp::advertised_address), not the host name, which
      // may resolve nowhere or to loopback (Debian's 127.0.1.1).
      std::string adv = one_host ? "127.0.0.1" : env_or("TESSERA_COORDINATOR_HOST", "");
      if (adv.empty()) adv = collectives::tcp::advertised_address(true);
      CoordinatorOptions co;
      co.address = one_host ? "127.0.0.1:0" : "0.0.0.0:0";
      co.token = make_job_token();
      co.num_nodes = 0;
      co.world_size = size;
      co.heartbeat_timeout =
          std::chrono::milliseconds(env_int("TESSERA_HEARTBEAT_TIMEOUT_MS", opt.mpi_heartbeat_timeout.count()));
      r.coordinator = std::make_unique<Coordinator>(co);
      msg = adv + ":" + std::to_string(r.coordinator->port()) + "\n" + co.token;
    } catch (const std::exception& e) {
      msg.clear();  // the others learn of the failure from an empty message
      spdlog::error("cannot start the coordinator: {}", e.what());
    }
  }
  msg = mpi.broadcast_string(msg, 0);
  auto nl = msg.find('\n');
  if (nl == std::string::npos) throw Error("mpirun bootstrap: rank 0 could not start the coordinator");
  address = msg.substr(0, nl);
  token = msg.substr(nl + 1);
}

// Under srun: no MPI to broadcast over, so every rank computes the same
// coordinator address from Slurm's variables (launcher/slurm.h) and rank 0
// serves it; the others' first call waits for it to come up.
void bootstrap_slurm(Runtime& r, const WorkerOptions& opt, std::string& address, std::string& token) {
  const SlurmStep step = read_slurm_step(r.world);
  r.world = step.world;
  address = step.coordinator;
  token = step.token;
  if (r.world.rank != 0) return;
  CoordinatorOptions co;
  co.address = step.listen;
  co.token = token;
  co.num_nodes = 0;
  co.world_size = r.world.size;
  co.heartbeat_timeout =
      std::chrono::milliseconds(env_int("TESSERA_HEARTBEAT_TIMEOUT_MS", opt.mpi_heartbeat_timeout.count()));
  try {
    r.coordinator = std::make_unique<Coordinator>(co);
  } catch (const std::exception& e) {
    throw Error(detail::concat("srun bootstrap: rank 0 cannot serve the coordinator on ", step.listen, ": ", e.what(),
                               " (set TESSERA_COORDINATOR_PORT to a free port)"));
  }
}

// The CPU rotation. A worker that `tessera run` bound to one CPU
// (TESSERA_BOUND_CPUS lists the CPUs it bound the node's workers to) rotates
// its main thread over those CPUs; its other threads stay on its own.
std::unique_ptr<CpuRotation> start_cpu_rotation(const World& world) {
  const std::string bound = env_or("TESSERA_BOUND_CPUS");
  if (bound.empty() || current_cpu_mask().size() != 1) return maybe_start_cpu_rotation(world);
  std::vector<int> cpus;
  for (size_t b = 0; b < bound.size();) {
    size_t e = bound.find(',', b);
    if (e == std::string::npos) e = bound.size();
    cpus.push_back(std::atoi(bound.substr(b, e - b).c_str()));
    b = e + 1;
  }
  const CpuRotationPlan plan = plan_cpu_rotation(world, cpus, env_or("TESSERA_CPU_ROTATION"));
  spdlog::debug("CPU rotation {}: {} (the CPUs tessera run bound its workers to: {})", plan.enabled ? "on" : "off",
                plan.reason, bound);
  if (!plan.enabled) return nullptr;
  return std::make_unique<CpuRotation>(world.local_rank, plan.cpus, plan.period);
}

}  // namespace

void WorkerContext::barrier(const std::string& name) const {
  if (world.size == 1) return;  // alone: nobody to wait for, with or without a coordinator
  TESSERA_CHECK(client != nullptr, "barrier of a world of ", world.size, " before init_worker");
  client->barrier(name, world.rank, world.size, rt().barrier_timeout);
}

WorkerContext init_worker(const WorkerOptions& opt) {
  Runtime& r = rt();
  {
    std::lock_guard<std::mutex> l(r.mu);
    if (r.initialized) throw Error("init_worker called twice in one process");
    r.initialized = true;
  }
  WorkerContext ctx;
  r.barrier_timeout = opt.store_timeout;
  ctx.world = discover_world();
  ctx.host = env_or("TESSERA_HOST", host_name());
  r.world = ctx.world;
  r.host = ctx.host;
  // tessera run prefixes every line of a worker with its rank already.
  const bool prefixed_by_launcher = ctx.world.source == WorldSource::Tessera;
  init_logging(!prefixed_by_launcher && (ctx.world.size > 1 || ctx.world.source != WorldSource::Single) ? ctx.world.rank
                                                                                                        : -1);

  // Local ranks take turns on the host's CPUs (runtime/cpu_rotation.h).
  if (opt.cpu_rotation) r.rotation = start_cpu_rotation(ctx.world);

  std::string address, token, dial;  // dial: where the client connects, when not `address`
  std::chrono::milliseconds interval{2000};
  const std::string coord = env_or("TESSERA_COORDINATOR", "");
  if (!coord.empty()) {
    r.mode = BootstrapMode::TesseraRun;
    address = coord;
    // On the coordinator's own host: its Unix socket (no loopback TCP).
    dial = env_or("TESSERA_COORDINATOR_LOCAL", "");
    token = env_or("TESSERA_JOB_TOKEN", "");
    if (token.empty()) throw Error("TESSERA_COORDINATOR is set but TESSERA_JOB_TOKEN is not");
    ctx.restart_count = static_cast<int>(env_int("TESSERA_RESTART_COUNT", env_int("TORCHELASTIC_RESTART_COUNT", 0)));
    interval = std::chrono::milliseconds(std::max<int64_t>(10, env_int("TESSERA_HEARTBEAT_MS", 2000)));
  } else if (ctx.world.source == WorldSource::OpenMPI) {
    r.mode = BootstrapMode::Mpi;
    bootstrap_mpi(r, opt, address, token);
    ctx.world.node_rank = r.world.node_rank;
    auto timeout = env_int("TESSERA_HEARTBEAT_TIMEOUT_MS", opt.mpi_heartbeat_timeout.count());
    interval = std::chrono::milliseconds(std::clamp<int64_t>(timeout / 5, 10, 2000));
  } else if (ctx.world.source == WorldSource::Slurm && ctx.world.size > 1) {
    r.mode = BootstrapMode::Slurm;
    bootstrap_slurm(r, opt, address, token);
    ctx.world = r.world;
    auto timeout = env_int("TESSERA_HEARTBEAT_TIMEOUT_MS", opt.mpi_heartbeat_timeout.count());
    interval = std::chrono::milliseconds(std::clamp<int64_t>(timeout / 5, 10, 2000));
  } else {
    TESSERA_ARG_CHECK(ctx.world.size == 1, "a world of ", ctx.world.size, " ranks from ",
                      world_source_name(ctx.world.source), " needs a store: launch with `tessera run`, mpirun or srun");
    r.mode = BootstrapMode::Single;
    CoordinatorOptions co;
    co.token = make_job_token();
    co.num_nodes = 0;
    co.world_size = 1;
    r.coordinator = std::make_unique<Coordinator>(co);
    address = "127.0.0.1:" + std::to_string(r.coordinator->port());
    token = co.token;
  }
  ctx.mode = r.mode;
  auto connect = [&](const std::string& to) {
    r.client = std::make_shared<CoordinatorClient>(to, token);
    r.client->set_round(ctx.restart_count);
    ctx.client = r.client;
    ctx.store = std::make_shared<GrpcStore>(r.client);
  };
  connect(dial.empty() ? address : dial);
  ctx.reach = {host_of_address(address)};

  if (r.mode == BootstrapMode::Mpi) watch_launcher();
  if (r.mode != BootstrapMode::Single) {
    pb::HeartbeatRequest beat;
    beat.set_role(pb::WORKER);
    beat.set_id(ctx.world.rank);
    beat.set_node_rank(ctx.world.node_rank);
    beat.set_host(ctx.host);
    // A first beat in this thread: a wrong token or a dead coordinator fails
    // init, not a background thread. The Unix socket first, when given: it
    // is reachable only from the launcher's network namespace (a program may
    // have entered another), so TCP after it. A failure names every address
    // tried and the variable it came from (the user may have set it by hand).
    struct Try {
      const char* var;
      std::string to;
      std::chrono::seconds timeout;
    };
    std::vector<Try> tries;
    if (!dial.empty()) tries.push_back({"TESSERA_COORDINATOR_LOCAL", dial, 3s});
    tries.push_back({"TESSERA_COORDINATOR", address, 10s});
    pb::HeartbeatReply rep;
    std::string failed;  // "VAR=ADDR: cannot reach the coordinator: why" of each address tried
    bool reached = false;
    for (size_t i = 0; i < tries.size() && !reached; ++i) {
      if (i > 0) connect(tries[i].to);
      try {
        rep = r.client->heartbeat(beat, tries[i].timeout);
        reached = true;
      } catch (const AbortedError&) {
        throw;
      } catch (const std::exception& e) {
        if (r.mode != BootstrapMode::TesseraRun) throw;
        failed += detail::concat(failed.empty() ? "" : "; ", tries[i].var, "=", tries[i].to,
                                 ": cannot reach the coordinator: ", e.what());
        spdlog::debug("{}", failed);
      }
    }
    if (!reached)
      throw Error(failed +
                  " (`tessera run` sets them for its workers; check the addresses, or unset "
                  "TESSERA_COORDINATOR to run alone)");
    if (rep.aborted()) throw AbortedError("the job was aborted before this worker joined");
    r.heartbeat = std::make_unique<Heartbeater>(
        r.client, beat, interval, std::max(10000ms, 5 * interval),
        /*stop_on_abort=*/true, [](const std::string& why) { on_job_abort(why); },
        /*first_beat_sent=*/true);
    pb::WatchRequest wr;
    wr.set_role(pb::WORKER);
    wr.set_id(ctx.world.rank);
    r.watcher = std::make_unique<EventWatcher>(r.client, wr, [](const pb::JobEvent& ev) {
      on_job_abort(describe_cause(ev.cause()), true, exit_code_of(ev.cause()));
    });
  }

  if (opt.create_communicator) {
    // The job's store as it is: Communicator::create keys it
    // tessera/comm/<name>/<generation>/ itself.
    // Across hosts, TCP endpoints use the interface that reaches the coordinator.
    collectives::CommOptions comm = opt.comm;
    if (comm.reach.empty()) comm.reach = ctx.reach;
    ctx.world_comm = collectives::Communicator::create(ctx.store, ctx.world.rank, ctx.world.size, std::move(comm));
    std::lock_guard<std::mutex> l(r.mu);
    r.comm = ctx.world_comm;
  }
  spdlog::debug("joined as rank {} of {} ({})", ctx.world.rank, ctx.world.size, bootstrap_mode_name(ctx.mode));
  return ctx;
}

void report_fatal(const WorkerContext& ctx, const std::string& reason, int exit_code) {
  Runtime& r = rt();
  r.leaving = true;  // this process ends on its own terms, not by its own abort echo
  if (!r.client || r.mode == BootstrapMode::Single) return;
  try {
    pb::RootCause c;
    c.set_rank(ctx.world.rank);
    c.set_node_rank(ctx.world.node_rank);
    c.set_host(ctx.host);
    c.set_reason(reason);
    if (exit_code != 0) {
      c.set_has_exit(true);
      c.set_exit_code(exit_code);
    }
    r.client->abort(c);
  } catch (const std::exception& e) {
    spdlog::warn("could not report the failure to the coordinator: {}", e.what());
  }
}

void shutdown(WorkerContext& ctx) {
  Runtime& r = rt();
  {
    std::lock_guard<std::mutex> l(r.mu);
    if (r.shut || !r.initialized) return;
    r.shut = true;
    r.comm.reset();
  }
  ctx.world_comm.reset();
  r.rotation.reset();
  if (r.heartbeat) r.heartbeat->stop(/*leaving=*/true);
  if (r.mode == BootstrapMode::Mpi) {
    // Two barriers: the first while the watch still guards against a peer
    // failing; the second so rank 0 stops the coordinator only after every
    // watch is closed (otherwise a closing stream would look like a failure).
    const collectives::mpi::BootApi& mpi = mpi_boot();  // loaded by the bootstrap
    mpi.barrier();
    r.leaving = true;
    if (r.watcher) r.watcher->stop();
    mpi.barrier();
    if (r.coordinator) r.coordinator->shutdown();
    mpi.finalize();  // only if mpi.init() initialised it
  } else if (r.mode == BootstrapMode::Slurm) {
    // As under mpirun, over the coordinator's barriers: rank 0 stops serving
    // only after every rank closed its watch. A rank that failed (leaving
    // already) does not wait: the job is being aborted.
    const bool clean = !r.leaving.load();
    if (clean) {
      try {
        r.client->barrier("tessera/leave/1", ctx.world.rank, ctx.world.size, r.barrier_timeout);
      } catch (const std::exception& e) {
        spdlog::warn("leaving the job: {}", e.what());
      }
    }
    r.leaving = true;
    if (r.watcher) r.watcher->stop();
    if (clean) {
      try {
        r.client->barrier("tessera/leave/2", ctx.world.rank, ctx.world.size, r.barrier_timeout);
      } catch (const std::exception& e) {
        spdlog::debug("leaving the job: {}", e.what());
      }
    }
    if (r.coordinator) r.coordinator->shutdown();
  } else {
    r.leaving = true;
    if (r.watcher) r.watcher->stop();
    if (r.coordinator) r.coordinator->shutdown();
  }
}

int run_worker(const WorkerOptions& options, const std::function<int(WorkerContext&)>& body) {
  WorkerContext ctx;
  try {
    ctx = init_worker(options);
  } catch (const std::exception& e) {
    spdlog::error("cannot join the job: {}", e.what());
    if (rt().mode == BootstrapMode::Mpi) mpi_abort_or_exit(1);
    return 1;
  }
  int code = 0;
  try {
    code = body(ctx);
  } catch (const std::exception& e) {
    spdlog::error("fatal: {}", e.what());
    // A peer that died is the job's root cause, and under `tessera run` its
    // agent reports that exit (SIGCHLD, about 0.1 s). Reporting this
    // consequence first would win the race for the root cause (seen by the
    // fault-injection suite: a SIGTERMed rank blamed on a survivor's "peer
    // died"). So wait up to kPeerDeathGrace for the job's ABORT, which ends
    // this process through the watch thread, and report only if none comes.
    const auto* ce = dynamic_cast<const collectives::CollectiveError*>(&e);
    // Under mpirun the same: the failed rank's report carries its exit code,
    // which the ABORT then gives to MPI_Abort here (not this consequence's 1).
    if (ce && ce->kind() == collectives::CollectiveError::Kind::PeerDead &&
        (ctx.mode == BootstrapMode::TesseraRun || ctx.mode == BootstrapMode::Mpi) && ctx.world.size > 1) {
      constexpr auto kPeerDeathGrace = std::chrono::seconds(2);
      std::this_thread::sleep_for(kPeerDeathGrace);
    }
    report_fatal(ctx, std::string("fatal error: ") + e.what());
    code = 1;
  }
  if (code != 0 && ctx.mode == BootstrapMode::Mpi) {
    // Peers may be blocked waiting for this rank: end the whole job.
    report_fatal(ctx, detail::concat("exited with code ", code), code);
    mpi_abort_or_exit(code);
  }
  if (code != 0 && ctx.mode == BootstrapMode::Slurm) {
    // No agent reports this exit: tell the coordinator, so the others end.
    report_fatal(ctx, detail::concat("exited with code ", code), code);
  }
  if (code != 0) {
    rt().leaving = true;  // the launcher reports the exit; don't die of our own echo meanwhile
  }
  shutdown(ctx);
  return code;
}

}  // namespace tessera::launcher
