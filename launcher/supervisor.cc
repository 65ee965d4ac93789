#include "launcher/supervisor.h"

#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "launcher/client.h"
#include "launcher/output_relay.h"
#include "launcher/root_cause.h"
#include "runtime/cpu_rotation.h"
#include "runtime/error.h"

namespace tessera::launcher {

namespace pb = tessera::launcher::proto;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A worker's failure is held back for up to kHold while another worker that
// wrote to stderr within kSuspectWindow before it (and no later than it) is
// still running (see the reaping in run()).
constexpr auto kSuspectWindow = 2s;
constexpr auto kHold = 1500ms;
constexpr size_t kExitPumpBytes = 4 << 20;

namespace {

// Our stdout and stderr, for POLLOUT, where relayed lines wait for them;
// then the writes of those that became ready (from fds[from] on).
void poll_pending_destinations(std::vector<pollfd>& fds) {
  for (int d : {1, 2})
    if (destination(d).pending() > 0) fds.push_back({d, POLLOUT, 0});
}
void flush_ready_destinations(const std::vector<pollfd>& fds, size_t from) {
  for (size_t i = from; i < fds.size(); ++i)
    if (fds[i].revents) destination(fds[i].fd).flush_some();
}

}  // namespace

void RoundSupervisor::signal_all(int sig) {
  for (auto& w : workers_) {
    if (w.exited || w.pid <= 0) continue;
    kill(-w.pid, sig);
    if (sig == SIGTERM) kill(-w.pid, SIGCONT);  // a stopped worker must run to see SIGTERM
  }
}

RoundEnd RoundSupervisor::run(int round, const pb::JoinReply& layout) {
  const RunOptions& opt = *s_.options;
  workers_.clear();
  workers_.reserve(static_cast<size_t>(opt.nproc_per_node));
  for (int i = 0; i < opt.nproc_per_node; ++i) {
    const int rank = layout.first_rank() + i;
    WorkerProcess w{i, rank, -1, false, 0, OutputRelay(rank, opt.prefix_output)};
    if (!opt.log_dir.empty()) w.output.open_log(opt.log_dir, round);
    workers_.push_back(std::move(w));
  }
  const long oom_before = oom_kill_count();
  // Ranks <= CPUs: one CPU each (spawn.h), which the rotation may then rotate over.
  const std::vector<int> cpus = worker_cpus(opt.nproc_per_node);
  std::string cpu_list;
  if (!cpus.empty())
    for (int c : current_cpu_mask()) cpu_list += (cpu_list.empty() ? "" : ",") + std::to_string(c);
  for (auto& w : workers_) {
    WorkerEnv env = s_.job_env;
    env.bound_cpus = cpu_list;
    env.rank = w.rank;
    env.world_size = layout.world_size();
    env.local_rank = w.local_rank;
    env.restart_count = round;
    SpawnedWorker p = spawn_worker(s_.program, opt.command, worker_environment(env), s_.stdin_fd,
                                   cpus.empty() ? -1 : cpus[static_cast<size_t>(w.local_rank)]);
    w.pid = p.pid;
    w.exited = false;
    w.output.attach(p.out_fd, p.err_fd);
  }

  bool stopping = false;  // workers are being terminated (failure, abort or signal)
  bool failed = false;
  std::optional<Clock::time_point> kill_at;
  std::optional<Clock::time_point> drain_until;
  // A failure held back while a worker that complained first may still exit.
  struct Held {
    WorkerProcess* w;
    pb::ExitReport rep;
    Clock::time_point until;
  };
  std::optional<Held> held;
  auto report = [&](const pb::ExitReport& rep) {
    if (interrupted_ || (s_.coordinator_lost && s_.coordinator_lost->load())) return;
    try {
      s_.client->report_exit(rep);
    } catch (const Error& e) {
      // Without its log tail, so that the coordinator still learns of the
      // exit (the other nodes would wait for ever) when the tail was the trouble.
      pb::ExitReport bare = rep;
      bare.clear_log_tail();
      try {
        s_.client->report_exit(bare);
        spdlog::warn("tessera run: rank {}'s exit reported without its last lines: {}", rep.rank(), e.what());
        return;
      } catch (const Error&) {
      }
      spdlog::warn("tessera run: could not report rank {}'s exit: {}", rep.rank(), e.what());
    }
  };
  auto flush_held = [&] {
    if (!held) return;
    report(held->rep);
    held.reset();
  };
  auto begin_stop = [&] {
    flush_held();
    if (stopping) return;
    stopping = true;
    signal_all(SIGTERM);
    kill_at = Clock::now() + opt.kill_grace;
  };

  for (;;) {
    bool all_exited = true, all_closed = true;
    std::vector<pollfd> fds;
    std::vector<std::pair<WorkerProcess*, OutputRelay::Stream*>> owners;
    fds.push_back({s_.sig_fd, POLLIN, 0});
    fds.push_back({s_.abort_fd, POLLIN, 0});
    for (auto& w : workers_) {
      all_exited = all_exited && w.exited;
      for (OutputRelay::Stream* s : {&w.output.out(), &w.output.err()}) {
        if (s->fd < 0) continue;
        all_closed = false;
        // Behind a stalled reader of ours, leave the worker's pipe unread
        // (it waits on its writes); the loop goes on reaping and signalling.
        fds.push_back({s->fd, static_cast<short>(destination(s->out_fd).full() ? 0 : POLLIN), 0});
        owners.emplace_back(&w, s);
      }
    }
    const size_t first_dest = fds.size();
    poll_pending_destinations(fds);
    if (all_exited && all_closed) break;
    if (all_exited && !all_closed) {
      // Workers are gone but something they spawned holds a pipe: read what
      // comes within half a second, then stop waiting for it.
      if (!drain_until) drain_until = Clock::now() + 500ms;
      if (Clock::now() > *drain_until) {
        for (auto& w : workers_) {
          w.output.pump(w.output.out());
          w.output.pump(w.output.err());
          w.output.close_all();
        }
        break;
      }
    }
    int wait_ms = 200;
    if (kill_at) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at - Clock::now()).count();
      wait_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 200));
    }
    if (drain_until) wait_ms = 50;
    if (held)
      wait_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(held->until - Clock::now()).count(), 0, wait_ms));
    int n = poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno != EINTR) throw Error(detail::concat("poll: ", std::strerror(errno)));
    for (size_t i = 2; i < first_dest; ++i)
      if (fds[i].revents) owners[i - 2].first->output.pump(*owners[i - 2].second);
    flush_ready_destinations(fds, first_dest);
    if (fds[0].revents) {
      signalfd_siginfo si;
      while (read(s_.sig_fd, &si, sizeof si) == sizeof si) {
        int sig = static_cast<int>(si.ssi_signo);
        if (sig == SIGCHLD) continue;  // reaped below
        if (!interrupted_) {
          interrupted_ = sig;
          spdlog::warn("tessera run: got {}; stopping workers", strsignal(sig));
          // Forward the signal itself first so workers see what the user sent.
          for (auto& w : workers_)
            if (!w.exited) kill(-w.pid, sig);
          // The other nodes hear of it after the local workers had their
          // chance to handle the signal itself (see the end of run()).
          stopping = true;
          kill_at = Clock::now() + opt.kill_grace;
        } else if (kill_at) {
          kill_at = Clock::now();  // a second signal: no more grace
        }
      }
    }
    if (fds[1].revents) {
      uint64_t v;
      while (read(s_.abort_fd, &v, sizeof v) > 0) {
      }
      if (!stopping) {
        spdlog::debug("tessera run: job aborted: {}", s_.abort_reason ? s_.abort_reason() : std::string());
        failed = true;
        begin_stop();
      }
    }
    // Reap.
    for (;;) {
      int status = 0;
      pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (auto& w : workers_) {
        if (w.pid != pid || w.exited) continue;
        w.exited = true;
        w.after_stop = stopping;
        w.status = status;
        // What the pipes still hold (at most their capacity, unless a child
        // of the worker still writes), for the exit report's last lines.
        w.output.pump(w.output.out(), kExitPumpBytes);
        w.output.pump(w.output.err(), kExitPumpBytes);
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!stopping && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
          spdlog::error("tessera run: rank {} {}", w.rank, explain_sigkill(oom_before));
        pb::ExitReport rep = exit_report(w.rank, opt.node_rank, s_.host, status, w.output.tail(), stopping);
        if (!ok && !stopping) {
          if (held) {
            // Two failures: the one that complained on stderr first is reported first.
            const bool first = w.output.last_err_line() < held->w->output.last_err_line();
            if (first) report(rep);
            flush_held();
            if (!first) report(rep);
            failed = true;
            begin_stop();
            continue;
          }
          // Another worker that wrote to stderr shortly before this one failed
          // may be the cause, still exiting (a Python rank prints its
          // traceback, then takes a second to tear down, while its peers
          // fail at once on the closed connection): hold this failure back
          // for up to kHold while that worker lives. (A worker killed by a
          // signal is its own cause: never held.)
          const auto now = Clock::now();
          for (const auto& o : workers_)
            if (WIFEXITED(status) && &o != &w && !o.exited && o.output.last_err_line() + kSuspectWindow > now &&
                o.output.last_err_line() <= w.output.last_err_line()) {
              held = Held{&w, rep, now + kHold};
              break;
            }
          if (held) continue;
          failed = true;
          begin_stop();
        }
        report(rep);
      }
    }
    if (held && (Clock::now() >= held->until || stopping)) {
      flush_held();
      failed = true;
      begin_stop();
    }
    if (kill_at && Clock::now() >= *kill_at) {
      signal_all(SIGKILL);
      kill_at = Clock::now() + 1s;  // and again if somehow still alive
    }
  }
  if (held) {  // every worker exited while one failure was held back
    flush_held();
    failed = true;
  }
  // The workers' last lines, as fast as our reader takes them (a paused
  // pager is waited for, as `cat` would wait); a signal stops the wait.
  while (!interrupted_ && destination(1).pending() + destination(2).pending() > 0) {
    std::vector<pollfd> fds{{s_.sig_fd, POLLIN, 0}};
    poll_pending_destinations(fds);
    if (poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR)
      throw Error(detail::concat("poll: ", std::strerror(errno)));
    flush_ready_destinations(fds, 1);
    signalfd_siginfo si;
    while (read(s_.sig_fd, &si, sizeof si) == sizeof si)
      if (si.ssi_signo != SIGCHLD && !interrupted_) {
        interrupted_ = static_cast<int>(si.ssi_signo);
        spdlog::warn("tessera run: got {} while writing the workers' last output; leaving", strsignal(interrupted_));
      }
  }
  if (interrupted_) {
    for (int d : {1, 2}) destination(d).drop();
    try {
      s_.client->abort(interrupt_cause(opt.node_rank, s_.host, interrupted_));
    } catch (const Error& e) {
      spdlog::debug("abort not delivered: {}", e.what());
    }
    return RoundEnd::Interrupted;
  }
  if (failed) return RoundEnd::Failed;
  for (auto& w : workers_)
    if (!(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0)) return RoundEnd::Failed;
  return RoundEnd::Success;
}

}  // namespace tessera::launcher
