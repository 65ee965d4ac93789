// One round of this node's workers under `tessera run`: spawn them
// (spawn.h), relay their output (output_relay.h), reap them, report every
// exit to the coordinator, and stop all of them when one fails, the job is
// aborted or the launcher gets a signal.
//
// Stopping: SIGTERM and SIGCONT to every worker's process group, SIGKILL
// after --kill-grace (and again every second while one lives). A signal to
// the launcher is forwarded as itself first; a second one skips the grace.
// A non-zero exit is reported before the others are stopped; exits after
// that are reported as consequences (after_stop). An interrupt is sent to the
// coordinator as an abort once the workers are gone.
//
// Threads: run() is the agent's event loop on the main thread (the thread
// that forks must outlive the workers, see spawn.h): one poll() over the
// signalfd, the abort eventfd and the workers' pipes. The only state other
// threads touch is behind `abort_reason` and the eventfd they write.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "launcher/agent.h"
#include "launcher/output_relay.h"
#include "launcher/proto/coordinator.pb.h"
#include "launcher/spawn.h"

namespace tessera::launcher {

class CoordinatorClient;

// What ended a round on this node.
enum class RoundEnd { Success, Failed, Interrupted };

struct WorkerProcess {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;
  int status = 0;  // waitpid status once exited
  OutputRelay output;
  bool after_stop = false;  // exited after this node began stopping the workers
};

struct SupervisorSetup {
  const RunOptions* options = nullptr;
  std::string program;
  WorkerEnv job_env;  // the job-wide fields; rank fields are set per worker
  std::string host;
  int sig_fd = -1;    // signalfd of SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT (blocked)
  int abort_fd = -1;  // eventfd written on a job abort
  int stdin_fd = -1;  // /dev/null
  CoordinatorClient* client = nullptr;
  std::function<std::string()> abort_reason;  // for the log
  // Set by the heartbeat thread when the coordinator became unreachable: no
  // call to it can succeed any more, so none is tried (optional).
  const std::atomic<bool>* coordinator_lost = nullptr;
};

class RoundSupervisor {
 public:
  explicit RoundSupervisor(SupervisorSetup setup) : s_(std::move(setup)) {}

  // Runs round `round` with this node's ranks from `layout`; returns when
  // every worker exited and its pipes are drained. Throws Error when a
  // worker cannot be started or a log file cannot be written.
  RoundEnd run(int round, const proto::JoinReply& layout);

  // The signal that interrupted the launcher during the last round (0: none).
  int interrupted() const { return interrupted_; }

  // The job-wide environment fields (the agent fills in what node 0 shares).
  WorkerEnv& job_env() { return s_.job_env; }

  // The workers of the last round, with their exit statuses and output tails.
  const std::vector<WorkerProcess>& workers() const { return workers_; }

 private:
  void signal_all(int sig);

  SupervisorSetup s_;
  std::vector<WorkerProcess> workers_;
  int interrupted_ = 0;
};

}  // namespace tessera::launcher
