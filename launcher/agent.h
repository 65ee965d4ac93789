// The node agent behind `tessera run`: rendezvous with the other nodes,
// spawn this node's workers with torchrun-style environments, relay their
// output with a rank prefix, supervise them and stop the whole job when one
// fails (or restart it in a new round).
//
// Process model: every worker is the leader of its own process group and
// carries PR_SET_PDEATHSIG=SIGKILL, so signals reach its children and nothing
// outlives the agent. The agent runs one event loop (poll over a signalfd,
// the workers' pipes and an eventfd that the heartbeat and watch threads
// write on an abort); on node 0 the same process hosts the coordinator.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace tessera::launcher {

struct RunOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string coordinator;  // host:port; empty: 127.0.0.1 and a free port (one node only)
  int max_restarts = 0;
  // MASTER_PORT: the port node 0 keeps free for rank 0's own store (a
  // torch.distributed TCPStore); 0: a free one. Never the coordinator's.
  int master_port = 0;
  std::string log_dir;  // empty: no per-rank files
  std::chrono::milliseconds heartbeat_timeout{10000};
  std::chrono::milliseconds rdzv_timeout{300000};
  // Time between SIGTERM and SIGKILL when stopping workers.
  std::chrono::milliseconds kill_grace{2000};
  std::vector<std::string> command;  // PROGRAM ARGS...
  // "[<rank>] " before every relayed line (output_relay.h); off for
  // `tessera bench -r N`, whose ranks run as this job's workers.
  bool prefix_output = true;
};

// Runs the job; returns the launcher's exit code: 0 when every worker of the
// last round exited 0, the root-cause worker's code (128+signal when killed)
// on failure, 1 when the cause has no exit code (heartbeat loss), 128+signal
// when the launcher itself was interrupted. Throws InvalidArgument on bad
// options (exit 2).
int run_job(const RunOptions& options);

}  // namespace tessera::launcher
