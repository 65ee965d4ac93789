#include "launcher/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "launcher/agent_options.h"
#include "launcher/client.h"
#include "launcher/coordinator.h"
#include "launcher/output_relay.h"
#include "launcher/root_cause.h"
#include "launcher/supervisor.h"
#include "runtime/error.h"

namespace tessera::launcher {

namespace pb = tessera::launcher::proto;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// The thread that reads the signalfd (it blocks the signals).
pthread_t g_signal_thread;

// A thread that existed before setup_signals() blocked the signals (a
// library's constructor may start one: OpenBLAS starts its pool at load)
// would take a process-directed SIGTERM with the default action and kill the
// launcher, or swallow a SIGCHLD. This handler runs only in such threads and
// hands the signal to the reading thread, where it stays pending for the
// signalfd. pthread_kill is async-signal-safe (POSIX.1-2008 TC2).
// A signal that reaches the reading thread itself before it blocked them is
// noted and raised again once they are blocked.
volatile sig_atomic_t g_early_signal[NSIG];
void forward_to_signal_thread(int sig) {
  if (pthread_equal(pthread_self(), g_signal_thread))
    g_early_signal[sig] = 1;
  else
    pthread_kill(g_signal_thread, sig);
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// The job across its rounds: rendezvous, one RoundSupervisor run per round,
// the node's heartbeat and the round's watch, restarts and the final report.
class Agent {
 public:
  explicit Agent(const RunOptions& o) : opt_(o) {}
  int run();

 private:
  void setup_signals();
  bool join(int round, pb::JoinReply& layout);
  void start_coordinator();
  void on_abort(const std::string& reason);
  std::string abort_reason();
  pb::RootCause root_cause(int round, const RoundSupervisor& sup);
  void wait_for_others();
  void share_job_env(WorkerEnv& env);

  const RunOptions opt_;
  std::string host_ = host_name();
  CheckedRun run_;
  std::unique_ptr<Coordinator> coordinator_;
  std::string local_coord_addr_;  // node 0: the coordinator's Unix socket ("" if none)
  PortReservation store_port_;    // node 0: MASTER_PORT, held for rank 0's store
  std::shared_ptr<CoordinatorClient> client_;
  std::unique_ptr<Heartbeater> heartbeat_;
  std::unique_ptr<EventWatcher> watcher_;
  int sig_fd_ = -1;
  int abort_fd_ = -1;
  int devnull_ = -1;
  std::mutex abort_mu_;
  std::string abort_reason_;                   // from the watch or heartbeat thread
  std::atomic<bool> coordinator_lost_{false};  // its heartbeats gave up
  int interrupted_ = 0;                        // signal that interrupted the rendezvous
};

void Agent::setup_signals() {
  // Blocked in this thread before tessera starts any thread, so gRPC's
  // threads inherit the mask and only the signalfd sees these (threads that
  // were there before get forward_to_signal_thread).
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, s);
  // Handlers first, so no thread ever has the default action; then the mask.
  g_signal_thread = pthread_self();
  struct sigaction sa {};
  sa.sa_handler = forward_to_signal_thread;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(s, &sa, nullptr);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) throw Error("sigprocmask failed");
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT})
    if (g_early_signal[s]) pthread_kill(g_signal_thread, s);  // now pending for the signalfd
  sig_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sig_fd_ < 0) throw Error(detail::concat("signalfd: ", std::strerror(errno)));
  abort_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (abort_fd_ < 0) throw Error(detail::concat("eventfd: ", std::strerror(errno)));
  devnull_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  signal(SIGPIPE, SIG_IGN);
}

void Agent::start_coordinator() {
  if (opt_.node_rank != 0) return;
  CoordinatorOptions co;
  co.address = opt_.coordinator.empty() ? "127.0.0.1:0" : opt_.coordinator;
  co.token = run_.token;
  co.num_nodes = opt_.nnodes;
  co.heartbeat_timeout = opt_.heartbeat_timeout;
  // This node's workers and this agent call over a Unix socket (an abstract
  // one: no file to clean up; its name is random, the job token still
  // guards it), the other nodes over TCP.
  co.local_address = "unix-abstract:tessera-coordinator-" + make_job_token();
  try {
    coordinator_ = std::make_unique<Coordinator>(co);
  } catch (const Error& e) {
    // An address the user gave that this host cannot listen on is a bad
    // value (exit 2 with usage), as --master-port's is.
    if (!opt_.coordinator.empty())
      throw InvalidArgument(detail::concat("--coordinator ", opt_.coordinator, ": ", e.what()));
    throw;
  }
  local_coord_addr_ = coordinator_->local_address();
  if (opt_.coordinator.empty()) {
    run_.master_addr = "127.0.0.1";
    run_.coord_addr = "127.0.0.1:" + std::to_string(coordinator_->port());
  }
  // MASTER_PORT: a port of rank 0's own, not the coordinator's (a torch
  // program's rank 0 binds its TCPStore there; docs/launcher.md says why a
  // reserved port rather than a store served by the launcher).
  store_port_ = reserve_port(run_.master_port);
  run_.master_port = store_port_.port;
}

// Every node's workers get node 0's MASTER_PORT and run id: node 0 puts them
// in the round's store (cleared each round), the others read them.
void Agent::share_job_env(WorkerEnv& env) {
  if (opt_.nnodes == 1) return;
  const std::string key = "tessera/launcher/master_port_run_id";
  if (opt_.node_rank == 0) {
    client_->set(key, std::to_string(env.master_port) + " " + env.run_id);
    return;
  }
  const std::string v = client_->get(key, opt_.rdzv_timeout);
  const auto sp = v.find(' ');
  if (sp == std::string::npos) throw Error("node 0 published a bad MASTER_PORT and run id: '" + v + "'");
  env.master_port = std::stoi(v.substr(0, sp));
  env.run_id = v.substr(sp + 1);
}

int Agent::run() {
  run_ = check_run_options(opt_);
  const std::string run_id = make_job_token().substr(0, 12);

  setup_signals();
  start_coordinator();
  const std::string& dial = local_coord_addr_.empty() ? run_.coord_addr : local_coord_addr_;
  client_ = std::make_shared<CoordinatorClient>(dial, run_.token);
  pb::HeartbeatRequest beat;
  beat.set_role(pb::NODE);
  beat.set_id(opt_.node_rank);
  beat.set_node_rank(opt_.node_rank);
  beat.set_host(host_);
  const auto interval = heartbeat_interval(opt_.heartbeat_timeout);
  // Its own client: node beats span rounds, so they carry no round.
  auto beat_client = std::make_shared<CoordinatorClient>(dial, run_.token);
  heartbeat_ = std::make_unique<Heartbeater>(beat_client, beat, interval, std::max(opt_.heartbeat_timeout, 2000ms),
                                             /*stop_on_abort=*/false, [this](const std::string& why) {
                                               // Unreachable (its host down, or this one cut off): no
                                               // call to it can succeed any more, so none is tried.
                                               coordinator_lost_ = true;
                                               on_abort("lost the coordinator at " + run_.coord_addr + ": " + why);
                                             });

  SupervisorSetup setup;
  setup.options = &opt_;
  setup.program = run_.program;
  setup.job_env.local_size = opt_.nproc_per_node;
  setup.job_env.node_rank = opt_.node_rank;
  setup.job_env.num_nodes = opt_.nnodes;
  setup.job_env.max_restarts = opt_.max_restarts;
  setup.job_env.coordinator = run_.coord_addr;
  setup.job_env.coordinator_local = local_coord_addr_;
  setup.job_env.master_addr = run_.master_addr;
  setup.job_env.master_port = run_.master_port;
  setup.job_env.token = run_.token;
  setup.job_env.heartbeat_ms = static_cast<long>(interval.count());
  setup.job_env.host = host_;
  setup.job_env.run_id = run_id;
  setup.host = host_;
  setup.sig_fd = sig_fd_;
  setup.abort_fd = abort_fd_;
  setup.stdin_fd = devnull_;
  setup.client = client_.get();
  setup.abort_reason = [this] { return abort_reason(); };
  setup.coordinator_lost = &coordinator_lost_;
  RoundSupervisor sup(std::move(setup));

  int code = 1;
  std::string log_error;  // the first --log-dir write that failed (each was reported as it happened)
  for (int round = 0;; ++round) {
    client_->set_round(-1);
    pb::JoinReply layout;
    try {
      if (!join(round, layout)) {
        std::fprintf(stderr, "tessera run: interrupted by %s during rendezvous\n", strsignal(interrupted_));
        code = 128 + interrupted_;
        break;
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "tessera run: rendezvous failed: %s\n", e.what());
      code = 1;
      break;
    }
    client_->set_round(round);
    try {
      share_job_env(sup.job_env());
    } catch (const Error& e) {
      std::fprintf(stderr, "tessera run: rendezvous failed: %s\n", e.what());
      code = 1;
      break;
    }
    {
      std::lock_guard<std::mutex> l(abort_mu_);
      abort_reason_.clear();
    }
    uint64_t drain;
    while (read(abort_fd_, &drain, sizeof drain) > 0) {
    }
    pb::WatchRequest wr;
    wr.set_role(pb::NODE);
    wr.set_id(opt_.node_rank);
    watcher_ = std::make_unique<EventWatcher>(client_, wr,
                                              [this](const pb::JobEvent& ev) { on_abort(describe_cause(ev.cause())); });
    spdlog::debug("round {}: world {} ranks, this node has ranks {}..{}", round, layout.world_size(),
                  layout.first_rank(), layout.first_rank() + opt_.nproc_per_node - 1);
    RoundEnd end = sup.run(round, layout);
    for (const WorkerProcess& w : sup.workers())
      if (log_error.empty() && !w.output.log_error().empty()) log_error = w.output.log_error();
    if (end == RoundEnd::Success) {
      try {
        client_->node_done(opt_.node_rank, true);
      } catch (const Error& e) {
        spdlog::warn("tessera run: could not tell the coordinator this node is done: {}", e.what());
      }
      // Wait for the other nodes: the job succeeds when all did, and a late
      // failure elsewhere still restarts (or fails) the whole group.
      bool all_done = opt_.nnodes == 1;
      if (!all_done) spdlog::debug("round {}: this node is done; waiting for the other nodes", round);
      bool aborted = false;
      int stop_sig = 0;  // SIGINT, SIGTERM, ... while waiting: the job is aborted, as during the round
      while (!all_done && !aborted && stop_sig == 0) {
        try {
          auto st = client_->job_state();
          all_done = st.round() == round && st.nodes_done() >= st.num_nodes();
          aborted = st.round() != round || st.aborted();
        } catch (const Error& e) {
          // After this node finished, losing node 0 means it finished too.
          spdlog::debug("job state: {}", e.what());
          all_done = opt_.node_rank != 0;
          aborted = !all_done;
        }
        if (!all_done && !aborted) {
          struct pollfd p[2] = {{abort_fd_, POLLIN, 0}, {sig_fd_, POLLIN, 0}};
          poll(p, 2, 50);
          signalfd_siginfo si;
          while (read(sig_fd_, &si, sizeof si) == sizeof si)
            if (si.ssi_signo != SIGCHLD && stop_sig == 0) stop_sig = static_cast<int>(si.ssi_signo);
        }
      }
      if (stop_sig != 0) {
        try {
          client_->abort(interrupt_cause(opt_.node_rank, host_, stop_sig));
        } catch (const Error& e) {
          spdlog::debug("abort not delivered: {}", e.what());
        }
        watcher_->stop();
        std::fprintf(stderr, "tessera run: interrupted by %s while waiting for the other nodes; job aborted\n",
                     strsignal(stop_sig));
        code = 128 + stop_sig;
        break;
      }
      if (all_done) {
        watcher_->stop();
        code = 0;
        break;
      }
      end = RoundEnd::Failed;
    }
    watcher_->stop();
    if (end == RoundEnd::Interrupted) {
      std::fprintf(stderr, "tessera run: interrupted by %s; workers stopped\n", strsignal(sup.interrupted()));
      code = 128 + sup.interrupted();
      break;
    }
    pb::RootCause cause = root_cause(round, sup);
    code = exit_code_of(cause);
    if (round < opt_.max_restarts) {
      std::fprintf(stderr, "tessera run: round %d failed: %s; restarting (%d of %d)\n", round,
                   describe_cause(cause).c_str(), round + 1, opt_.max_restarts);
      continue;
    }
    write_all(2, failure_summary(round, cause, opt_.log_dir, opt_.node_rank));
    break;
  }
  if (code == 0 && !log_error.empty()) {
    // The workers succeeded, but a log the user asked for is incomplete: a failed run (docs/errors.md).
    std::fprintf(stderr, "tessera run: the workers succeeded, but --log-dir: %s\n", log_error.c_str());
    code = 1;
  }
  heartbeat_->stop(/*leaving=*/true);
  if (coordinator_) {
    wait_for_others();
    coordinator_->shutdown();
  }
  if (store_port_.fd >= 0) close(store_port_.fd);
  return code;
}

// Joins in slices of half a second so that SIGINT/SIGTERM (blocked, read from the
// signalfd) can end a long wait for the other nodes. A node that gave up on a
// slice is withdrawn and re-joins at once; the round starts only with all.
// Returns false when interrupted.
bool Agent::join(int round, pb::JoinReply& layout) {
  const auto deadline = Clock::now() + opt_.rdzv_timeout;
  for (;;) {
    signalfd_siginfo si;
    while (read(sig_fd_, &si, sizeof si) == sizeof si) {
      int sig = static_cast<int>(si.ssi_signo);
      if (sig != SIGCHLD) {
        interrupted_ = sig;
        return false;
      }
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      layout = client_->join(opt_.node_rank, host_, opt_.nproc_per_node, round,
                             std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(500)));
      return true;
    } catch (const TimeoutError& e) {
      if (Clock::now() >= deadline)
        throw TimeoutError(
            detail::concat(e.what(), " within the --rdzv-timeout of ", opt_.rdzv_timeout.count() / 1000.0, " s"));
    }
  }
}

// Node 0 serves until the other agents had a chance to read the outcome.
void Agent::wait_for_others() {
  if (opt_.nnodes == 1) return;
  auto deadline = Clock::now() + 3s;
  while (Clock::now() < deadline) {
    try {
      auto st = client_->job_state(1s);
      if (st.nodes_left() >= opt_.nnodes) return;
    } catch (const Error&) {
      return;
    }
    std::this_thread::sleep_for(50ms);
  }
}

void Agent::on_abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(abort_mu_);
    if (abort_reason_.empty()) abort_reason_ = reason;
  }
  uint64_t one = 1;
  if (write(abort_fd_, &one, sizeof one) < 0) {
    // eventfd cannot overflow at these counts; nothing to do.
  }
}

std::string Agent::abort_reason() {
  std::lock_guard<std::mutex> l(abort_mu_);
  return abort_reason_;
}

pb::RootCause Agent::root_cause(int round, const RoundSupervisor& sup) {
  if (!coordinator_lost_) {
    try {
      auto st = client_->job_state();
      if (st.has_cause() && (st.round() == round || st.aborted())) return st.cause();
    } catch (const Error& e) {
      spdlog::debug("job state: {}", e.what());
    }
  }
  // The coordinator is gone: fall back to what this node saw. A worker that
  // failed on its own comes first, then why this agent stopped the rest
  // (e.g. it lost the coordinator), then a worker it stopped.
  auto failed = [](const WorkerProcess& w) { return !(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0); };
  for (const auto& w : sup.workers())
    if (failed(w) && !w.after_stop) return local_exit_cause(w.rank, opt_.node_rank, host_, w.status, w.output.tail());
  if (std::string reason = abort_reason(); !reason.empty()) {
    pb::RootCause c;
    c.set_rank(-1);
    c.set_node_rank(opt_.node_rank);
    c.set_host(host_);
    c.set_reason(reason);
    return c;
  }
  for (const auto& w : sup.workers())
    if (failed(w)) return local_exit_cause(w.rank, opt_.node_rank, host_, w.status, w.output.tail());
  return unknown_cause("");
}

}  // namespace

int run_job(const RunOptions& options) {
  Agent a(options);
  return a.run();
}

}  // namespace tessera::launcher
