// Root causes as `tessera run` reports them: the exit report an agent sends
// for a reaped worker, the cause it falls back to when the coordinator is
// gone, the launcher's exit code for a cause, and the failure summary it
// prints (docs/launcher.md, "Failure semantics"). Pure functions: no I/O.
#pragma once

#include <deque>
#include <string>

#include "launcher/proto/coordinator.pb.h"

namespace tessera::launcher {

// The ExitReport for a worker reaped with waitpid status `wait_status`;
// after_stop: the agent was already stopping its workers (a consequence).
proto::ExitReport exit_report(int rank, int node_rank, const std::string& host, int wait_status,
                              const std::deque<std::string>& tail, bool after_stop);

// The cause this node saw itself: a worker that did not exit 0.
proto::RootCause local_exit_cause(int rank, int node_rank, const std::string& host, int wait_status,
                                  const std::deque<std::string>& tail);

// No worker of this node failed and the coordinator is gone: the abort
// reason the watch or heartbeat thread got ("unknown" when empty).
proto::RootCause unknown_cause(const std::string& abort_reason);

// The launcher got signal `sig` (the cause it sends to the coordinator).
proto::RootCause interrupt_cause(int node_rank, const std::string& host, int sig);

// 128+signal when the cause was killed by a signal, its exit code when it has
// a non-zero one, else 1.
int exit_code_of(const proto::RootCause& c);

// The same for a waitpid status: its exit code, 128+signal when killed, 1
// otherwise (`tessera bench -r`, and the cause's own figures come from it).
int exit_code_of_status(int wait_status);

// "tessera run: job failed ..." with the cause's rank, node, host, exit,
// output tail and (when this node has it) the path of its full log.
std::string failure_summary(int round, const proto::RootCause& c, const std::string& log_dir, int node_rank);

// How many processes the kernel's OOM killer has killed in this process's
// memory cgroup: `oom_kill` of memory.events (cgroup v2) or of
// memory.oom_control (v1); -1 when neither can be read.
long oom_kill_count();

// Why a child ended by SIGKILL that this launcher did not send, given
// oom_kill_count() from before it was started: "killed by SIGKILL: the
// kernel's OOM killer chose it (...)" when the counter grew, else "killed
// by SIGKILL (not by this launcher)" plus "; OOM kills cannot be read here"
// when the counter is unknown.
std::string explain_sigkill(long oom_kills_before);

}  // namespace tessera::launcher
