// Starting one worker process for `tessera run`.
//
// worker_environment() builds the environment a worker gets (docs/launcher.md,
// "What every worker gets"): the launcher's own environment without any
// variable tessera sets, plus tessera's and torchrun's variables.
//
// spawn_worker() starts a keeper, tessera_keeper beside the launcher's own
// executable (launcher/keeper_main.cc), with posix_spawn, and the keeper
// starts the worker (clone with CLONE_VM|CLONE_VFORK, then execve, as
// posix_spawn does). The keeper leads the worker's process group (set before
// its exec, so a signal sent right after spawn_worker returns finds the
// group), exits the way the worker did (its pid is the one the caller waits
// for and signals as -pid), and SIGKILLs the whole group when the launcher
// dies, however it dies (PR_SET_PDEATHSIG checked against getppid(), plus a
// poll). The worker carries PR_SET_PDEATHSIG=SIGKILL towards the keeper, has
// an empty signal mask, default SIGPIPE, stdin from `stdin_fd` and
// stdout/stderr on two new pipes whose read ends (non-blocking,
// close-on-exec) the caller owns. posix_spawn, unlike a fork, copies none of
// the launcher's page tables and runs none of its code in the child.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tessera::launcher {

struct WorkerEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  int restart_count = 0;
  int max_restarts = 0;
  std::string coordinator;  // host:port
  // The coordinator's address for processes on its own host
  // (TESSERA_COORDINATOR_LOCAL, "unix-abstract:NAME"); empty on other nodes.
  std::string coordinator_local;
  std::string master_addr;
  int master_port = 0;
  std::string token;
  long heartbeat_ms = 0;
  std::string host;
  std::string run_id;
  // The CPUs the launcher binds this node's workers to, one each in turn
  // ("0,1"; TESSERA_BOUND_CPUS, which the CPU rotation rotates over); empty:
  // not bound.
  std::string bound_cpus;
};

// "NAME=value" strings: the current environment minus tessera's variables, then the worker's.
std::vector<std::string> worker_environment(const WorkerEnv& w);

struct SpawnedWorker {
  pid_t pid = -1;   // the keeper: wait for it, signal its group (-pid)
  int out_fd = -1;  // read end of the worker's stdout (-1 with inherit_output)
  int err_fd = -1;  // read end of the worker's stderr (-1 with inherit_output)
};

// Throws tessera::Error when a pipe fails or the keeper cannot be started
// (the message names its path); a failed exec of the worker makes the keeper
// write "tessera run: cannot execute 'PROGRAM': why" and exit 127. With cpu >= 0 the
// worker (not the keeper) is bound to that CPU before exec.
// With inherit_output the worker writes to the caller's stdout and stderr
// (no pipes).
SpawnedWorker spawn_worker(const std::string& program, const std::vector<std::string>& args,
                           const std::vector<std::string>& env, int stdin_fd, int cpu = -1,
                           bool inherit_output = false);

// This process's executable (/proc/self/exe), and a program built beside it
// (tessera_keeper, tessera_tools, tessera_mpi_peer). Throw tessera::Error
// when /proc/self/exe cannot be read. (Here, not in launcher/cli.h: every
// worker links this library, and cli.cc's object would bring the checkpoint
// code's libcrypto into each worker's start.)
std::string own_executable();
std::string beside_own_executable(const std::string& name);

// The launcher's CPU binding of a node's `nproc` workers: local rank i on
// cpus[i mod n] of the launcher's affinity mask (n CPUs) when 2 <= nproc <= n,
// as `tessera bench` and `mpirun -np 2` bind theirs; none (empty) with one
// worker, more workers than CPUs (the kernel's scheduler places them), or
// TESSERA_BIND=0.
std::vector<int> worker_cpus(int nproc);

}  // namespace tessera::launcher
