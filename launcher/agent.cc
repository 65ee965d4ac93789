#include "launcher/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>

#include "launcher/client.h"
#include "launcher/coordinator.h"
#include "runtime/error.h"

extern char** environ;

namespace tessera::launcher {

namespace pb = tessera::launcher::proto;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

constexpr size_t kTailLines = 10;

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// Splits "host:port" (also "[v6]:port"); throws InvalidArgument.
std::pair<std::string, int> split_host_port(const std::string& hp) {
  auto colon = hp.rfind(':');
  TESSERA_ARG_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < hp.size(), "--coordinator '", hp,
                    "' is not HOST:PORT");
  std::string host = hp.substr(0, colon);
  int port = 0;
  try {
    size_t pos = 0;
    port = std::stoi(hp.substr(colon + 1), &pos);
    if (pos != hp.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  TESSERA_ARG_CHECK(port >= 0 && port <= 65535, "--coordinator '", hp, "': bad port");
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, port};
}

std::string resolve_program(const std::string& prog) {
  auto ok = [](const std::string& p) {
    struct stat st {};
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (prog.find('/') != std::string::npos) {
    TESSERA_ARG_CHECK(ok(prog), "program '", prog, "' does not exist or is not executable");
    return prog;
  }
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string dir = p.substr(start, end - start);
    std::string cand = (dir.empty() ? "." : dir) + "/" + prog;
    if (ok(cand)) return cand;
    start = end + 1;
  }
  throw InvalidArgument(detail::concat("program '", prog, "' not found in PATH"));
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // our own stdout is gone (closed pipe): drop, the log files still have it
    }
    off += static_cast<size_t>(n);
  }
}

struct Stream {
  int fd = -1;
  int out_fd = 1;  // where prefixed lines go
  std::string partial;
};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;
  bool after_stop = false;  // exited after this agent began stopping the workers
  int status = 0;
  Stream out, err;
  std::deque<std::string> tail;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log{nullptr, &std::fclose};
};

// What ended a round on this node.
enum class RoundEnd { Success, Failed, Interrupted };

class Agent {
 public:
  explicit Agent(const RunOptions& o) : opt_(o) {}
  int run();

 private:
  void setup_signals();
  bool join(int round, pb::JoinReply& layout);
  void start_coordinator();
  RoundEnd run_round(int round, const pb::JoinReply& layout);
  void spawn(Worker& w, int round, const pb::JoinReply& layout);
  void pump(Worker& w, Stream& s);
  void flush_partial(Worker& w, Stream& s);
  void emit_line(Worker& w, const std::string& line, int out_fd);
  void reap();
  void signal_all(int sig);
  void on_abort(const std::string& reason);
  pb::RootCause root_cause(int round);
  int exit_code_of(const pb::RootCause& c) const;
  void print_summary(int round, const pb::RootCause& c);
  void wait_for_others(bool success);

  const RunOptions opt_;
  std::string host_ = host_name();
  std::string token_;
  std::atomic<bool> coordinator_lost_{false};  // its heartbeats gave up
  std::string program_;
  std::string coord_addr_;   // what workers and clients dial
  std::string master_addr_;  // host part of it
  int master_port_ = 0;
  std::unique_ptr<Coordinator> coordinator_;
  std::shared_ptr<CoordinatorClient> client_;
  std::unique_ptr<Heartbeater> heartbeat_;
  std::unique_ptr<EventWatcher> watcher_;
  int sig_fd_ = -1;
  int abort_fd_ = -1;
  int devnull_ = -1;
  std::mutex abort_mu_;
  std::string abort_reason_;  // from the watch or heartbeat thread
  std::vector<Worker> workers_;
  int interrupted_ = 0;  // signal that interrupted the launcher
  std::string run_id_;
};

void Agent::setup_signals() {
  // Blocked in this thread before any other thread exists, so gRPC's threads
  // inherit the mask and only the signalfd sees these.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, s);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) throw Error("sigprocmask failed");
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
  co.token = token_;
  co.num_nodes = opt_.nnodes;
  co.heartbeat_timeout = opt_.heartbeat_timeout;
  coordinator_ = std::make_unique<Coordinator>(co);
  if (opt_.coordinator.empty()) {
    master_addr_ = "127.0.0.1";
    master_port_ = coordinator_->port();
    coord_addr_ = "127.0.0.1:" + std::to_string(master_port_);
  }
}

int Agent::run() {
  if (opt_.nproc_per_node < 1) throw InvalidArgument("--nproc-per-node must be at least 1");
  if (opt_.nnodes < 1) throw InvalidArgument("--nnodes must be at least 1");
  if (opt_.node_rank < 0 || opt_.node_rank >= opt_.nnodes)
    throw InvalidArgument(detail::concat("--node-rank ", opt_.node_rank, " must be in [0, ", opt_.nnodes, ")"));
  if (opt_.nnodes > 1 && opt_.coordinator.empty())
    throw InvalidArgument("--nnodes > 1 needs --coordinator HOST:PORT (node 0's address, the same on every node)");
  if (opt_.max_restarts < 0) throw InvalidArgument("--max-restarts must be >= 0");
  if (opt_.command.empty()) throw InvalidArgument("no program given (tessera run [options] -- PROGRAM ARGS...)");
  if (!opt_.coordinator.empty()) {
    auto [h, p] = split_host_port(opt_.coordinator);
    master_addr_ = h;
    master_port_ = p;
    coord_addr_ = opt_.coordinator;
    TESSERA_ARG_CHECK(p != 0, "--coordinator needs a fixed port (not 0) so every node finds it");
  }
  program_ = resolve_program(opt_.command[0]);
  const char* tok = std::getenv("TESSERA_JOB_TOKEN");
  if (tok && *tok) {
    token_ = tok;
  } else if (opt_.nnodes > 1) {
    throw InvalidArgument("--nnodes > 1: set TESSERA_JOB_TOKEN to the same secret on every node");
  } else {
    token_ = make_job_token();
  }
  run_id_ = make_job_token().substr(0, 12);
  if (!opt_.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opt_.log_dir, ec);
    if (ec) throw InvalidArgument(detail::concat("--log-dir '", opt_.log_dir, "': ", ec.message()));
  }

  setup_signals();
  start_coordinator();
  client_ = std::make_shared<CoordinatorClient>(coord_addr_, token_);
  pb::HeartbeatRequest beat;
  beat.set_role(pb::NODE);
  beat.set_id(opt_.node_rank);
  beat.set_node_rank(opt_.node_rank);
  beat.set_host(host_);
  auto interval =
      std::clamp(opt_.heartbeat_timeout / 5, std::chrono::milliseconds(50), std::chrono::milliseconds(2000));
  // Its own client: node beats span rounds, so they carry no round.
  auto beat_client = std::make_shared<CoordinatorClient>(coord_addr_, token_);
  heartbeat_ = std::make_unique<Heartbeater>(beat_client, beat, interval, std::max(opt_.heartbeat_timeout, 2000ms),
                                             /*stop_on_abort=*/false, [this](const std::string& why) {
                                               // Unreachable (its host down, or this one cut off): no
                                               // call to it can succeed any more, so none is tried.
                                               coordinator_lost_ = true;
                                               on_abort("lost the coordinator at " + coord_addr_ + ": " + why);
                                             });

  int code = 1;
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
    RoundEnd end = run_round(round, layout);
    if (end == RoundEnd::Success) {
      try {
        client_->node_done(opt_.node_rank, true);
      } catch (const Error& e) {
        spdlog::warn("tessera run: could not tell the coordinator this node is done: {}", e.what());
      }
      // Wait for the other nodes: the job succeeds when all did, and a late
      // failure elsewhere still restarts (or fails) the whole group.
      bool all_done = opt_.nnodes == 1;
      bool aborted = false;
      while (!all_done && !aborted) {
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
          struct pollfd p {
            abort_fd_, POLLIN, 0
          };
          poll(&p, 1, 50);
        }
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
      std::fprintf(stderr, "tessera run: interrupted by %s; workers stopped\n", strsignal(interrupted_));
      code = 128 + interrupted_;
      break;
    }
    pb::RootCause cause = root_cause(round);
    code = exit_code_of(cause);
    if (round < opt_.max_restarts) {
      std::fprintf(stderr, "tessera run: round %d failed: %s; restarting (%d of %d)\n", round,
                   describe_cause(cause).c_str(), round + 1, opt_.max_restarts);
      continue;
    }
    print_summary(round, cause);
    break;
  }
  heartbeat_->stop(/*leaving=*/true);
  if (coordinator_) {
    wait_for_others(code == 0);
    coordinator_->shutdown();
  }
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
        throw TimeoutError(detail::concat(e.what(), " (--rdzv-timeout ", opt_.rdzv_timeout.count() / 1000.0, " s)"));
    }
  }
}

// Node 0 serves until the other agents had a chance to read the outcome.
void Agent::wait_for_others(bool /*success*/) {
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

void Agent::spawn(Worker& w, int round, const pb::JoinReply& layout) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    throw Error(detail::concat("pipe: ", std::strerror(errno)));
  // Everything the child needs is built before fork: after fork only
  // async-signal-safe calls are allowed (gRPC threads exist).
  std::vector<std::string> env;
  auto ours = [](const char* kv) {
    static const char* names[] = {"TESSERA_RANK=",
                                  "TESSERA_WORLD_SIZE=",
                                  "TESSERA_LOCAL_RANK=",
                                  "TESSERA_LOCAL_SIZE=",
                                  "TESSERA_NODE_RANK=",
                                  "TESSERA_NUM_NODES=",
                                  "TESSERA_COORDINATOR=",
                                  "TESSERA_JOB_TOKEN=",
                                  "TESSERA_HEARTBEAT_MS=",
                                  "TESSERA_HOST=",
                                  "TESSERA_RESTART_COUNT=",
                                  "RANK=",
                                  "WORLD_SIZE=",
                                  "LOCAL_RANK=",
                                  "LOCAL_WORLD_SIZE=",
                                  "GROUP_RANK=",
                                  "MASTER_ADDR=",
                                  "MASTER_PORT=",
                                  "TORCHELASTIC_RESTART_COUNT=",
                                  "TORCHELASTIC_MAX_RESTARTS=",
                                  "TORCHELASTIC_RUN_ID=",
                                  "ROLE_RANK=",
                                  "ROLE_WORLD_SIZE=",
                                  "GROUP_WORLD_SIZE="};
    for (const char* n : names)
      if (std::strncmp(kv, n, std::strlen(n)) == 0) return true;
    return false;
  };
  for (char** e = environ; *e; ++e)
    if (!ours(*e)) env.emplace_back(*e);
  auto add = [&env](const std::string& k, const std::string& v) { env.push_back(k + "=" + v); };
  const std::string rank = std::to_string(w.rank), ws = std::to_string(layout.world_size());
  const std::string lr = std::to_string(w.local_rank), ls = std::to_string(opt_.nproc_per_node);
  const std::string nr = std::to_string(opt_.node_rank), rc = std::to_string(round);
  auto interval =
      std::clamp(opt_.heartbeat_timeout / 5, std::chrono::milliseconds(50), std::chrono::milliseconds(2000));
  add("TESSERA_RANK", rank);
  add("TESSERA_WORLD_SIZE", ws);
  add("TESSERA_LOCAL_RANK", lr);
  add("TESSERA_LOCAL_SIZE", ls);
  add("TESSERA_NODE_RANK", nr);
  add("TESSERA_NUM_NODES", std::to_string(opt_.nnodes));
  add("TESSERA_COORDINATOR", coord_addr_);
  add("TESSERA_JOB_TOKEN", token_);
  add("TESSERA_HEARTBEAT_MS", std::to_string(interval.count()));
  add("TESSERA_HOST", host_);
  add("TESSERA_RESTART_COUNT", rc);
  add("RANK", rank);
  add("WORLD_SIZE", ws);
  add("LOCAL_RANK", lr);
  add("LOCAL_WORLD_SIZE", ls);
  add("GROUP_RANK", nr);
  add("GROUP_WORLD_SIZE", std::to_string(opt_.nnodes));
  add("ROLE_RANK", rank);
  add("ROLE_WORLD_SIZE", ws);
  add("MASTER_ADDR", master_addr_);
  add("MASTER_PORT", std::to_string(master_port_));
  add("TORCHELASTIC_RESTART_COUNT", rc);
  add("TORCHELASTIC_MAX_RESTARTS", std::to_string(opt_.max_restarts));
  add("TORCHELASTIC_RUN_ID", run_id_);
  std::vector<char*> envp, argv;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = opt_.command;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) throw Error(detail::concat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);  // the launcher died before prctl took effect
    dup2(devnull_, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(program_.c_str(), argv.data(), envp.data());
    const char msg[] = "tessera run: exec failed\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so a signal sent right after fork finds the group
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  w.pid = pid;
  w.exited = false;
  w.out = Stream{out[0], 1, {}};
  w.err = Stream{err[0], 2, {}};
}

void Agent::emit_line(Worker& w, const std::string& line, int out_fd) {
  write_all(out_fd, "[" + std::to_string(w.rank) + "] " + line + "\n");
  if (w.log) {
    std::fwrite(line.data(), 1, line.size(), w.log.get());
    std::fputc('\n', w.log.get());
    std::fflush(w.log.get());
  }
  w.tail.push_back(line);
  if (w.tail.size() > kTailLines) w.tail.pop_front();
}

void Agent::pump(Worker& w, Stream& s) {
  char buf[65536];
  for (;;) {
    ssize_t n = read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.partial.append(buf, static_cast<size_t>(n));
      size_t start = 0, nl;
      while ((nl = s.partial.find('\n', start)) != std::string::npos) {
        emit_line(w, s.partial.substr(start, nl - start), s.out_fd);
        start = nl + 1;
      }
      s.partial.erase(0, start);
      // A line without newline that grows without bound is emitted in pieces.
      if (s.partial.size() > 1 << 20) {
        emit_line(w, s.partial, s.out_fd);
        s.partial.clear();
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    flush_partial(w, s);  // EOF or error
    close(s.fd);
    s.fd = -1;
    return;
  }
}

void Agent::flush_partial(Worker& w, Stream& s) {
  if (!s.partial.empty()) emit_line(w, s.partial, s.out_fd);
  s.partial.clear();
}

void Agent::signal_all(int sig) {
  for (auto& w : workers_) {
    if (w.exited || w.pid <= 0) continue;
    kill(-w.pid, sig);
    if (sig == SIGTERM) kill(-w.pid, SIGCONT);  // a stopped worker must run to see SIGTERM
  }
}

RoundEnd Agent::run_round(int round, const pb::JoinReply& layout) {
  workers_.clear();
  workers_.resize(static_cast<size_t>(opt_.nproc_per_node));
  for (int i = 0; i < opt_.nproc_per_node; ++i) {
    Worker& w = workers_[static_cast<size_t>(i)];
    w.local_rank = i;
    w.rank = layout.first_rank() + i;
    if (!opt_.log_dir.empty()) {
      auto path = std::filesystem::path(opt_.log_dir) / ("rank_" + std::to_string(w.rank) + ".log");
      w.log.reset(std::fopen(path.c_str(), round == 0 ? "w" : "a"));
      if (!w.log) throw Error(detail::concat("cannot write log file ", path.string(), ": ", std::strerror(errno)));
      if (round > 0) std::fprintf(w.log.get(), "---- tessera run: restart %d ----\n", round);
    }
  }
  for (auto& w : workers_) spawn(w, round, layout);

  bool stopping = false;  // workers are being terminated (failure, abort or signal)
  bool failed = false;
  std::optional<Clock::time_point> kill_at;
  std::optional<Clock::time_point> drain_until;
  auto begin_stop = [&] {
    if (stopping) return;
    stopping = true;
    signal_all(SIGTERM);
    kill_at = Clock::now() + opt_.kill_grace;
  };

  for (;;) {
    bool all_exited = true, all_closed = true;
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, Stream*>> owners;
    fds.push_back({sig_fd_, POLLIN, 0});
    fds.push_back({abort_fd_, POLLIN, 0});
    for (auto& w : workers_) {
      all_exited = all_exited && w.exited;
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd < 0) continue;
        all_closed = false;
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&w, s);
      }
    }
    if (all_exited && all_closed) break;
    if (all_exited && !all_closed) {
      // Workers are gone but something they spawned holds a pipe: read what
      // comes within half a second, then stop waiting for it.
      if (!drain_until) drain_until = Clock::now() + 500ms;
      if (Clock::now() > *drain_until) {
        for (auto& w : workers_)
          for (Stream* s : {&w.out, &w.err})
            if (s->fd >= 0) {
              pump(w, *s);
              if (s->fd >= 0) {
                flush_partial(w, *s);
                close(s->fd);
                s->fd = -1;
              }
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
    int n = poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno != EINTR) throw Error(detail::concat("poll: ", std::strerror(errno)));
    for (size_t i = 2; i < fds.size(); ++i)
      if (fds[i].revents) pump(*owners[i - 2].first, *owners[i - 2].second);
    if (fds[0].revents) {
      signalfd_siginfo si;
      while (read(sig_fd_, &si, sizeof si) == sizeof si) {
        int sig = static_cast<int>(si.ssi_signo);
        if (sig == SIGCHLD) continue;  // reaped below
        if (!interrupted_) {
          interrupted_ = sig;
          spdlog::warn("tessera run: got {}; stopping workers", strsignal(sig));
          // Forward the signal itself first so workers see what the user sent.
          for (auto& w : workers_)
            if (!w.exited) kill(-w.pid, sig);
          // The other nodes hear of it after the local workers had their
          // chance to handle the signal itself (see the end of the loop).
          stopping = true;
          kill_at = Clock::now() + opt_.kill_grace;
        } else if (kill_at) {
          kill_at = Clock::now();  // a second signal: no more grace
        }
      }
    }
    if (fds[1].revents) {
      uint64_t v;
      while (read(abort_fd_, &v, sizeof v) > 0) {
      }
      if (!stopping) {
        std::string why;
        {
          std::lock_guard<std::mutex> l(abort_mu_);
          why = abort_reason_;
        }
        spdlog::debug("tessera run: job aborted: {}", why);
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
        pump(w, w.out);
        pump(w, w.err);
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        pb::ExitReport rep;
        rep.set_rank(w.rank);
        rep.set_node_rank(opt_.node_rank);
        rep.set_host(host_);
        rep.set_exit_code(WIFEXITED(status) ? WEXITSTATUS(status) : 0);
        rep.set_signal(WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        for (const auto& line : w.tail) rep.add_log_tail(line);
        rep.set_after_stop(stopping);
        if (!ok && !stopping) {
          failed = true;
          begin_stop();
        }
        if (!interrupted_ && !coordinator_lost_) {
          try {
            client_->report_exit(rep);
          } catch (const Error& e) {
            spdlog::warn("tessera run: could not report rank {}'s exit: {}", w.rank, e.what());
          }
        }
      }
    }
    if (kill_at && Clock::now() >= *kill_at) {
      signal_all(SIGKILL);
      kill_at = Clock::now() + 1s;  // and again if somehow still alive
    }
  }
  if (interrupted_) {
    try {
      pb::RootCause c;
      c.set_rank(-1);
      c.set_node_rank(opt_.node_rank);
      c.set_host(host_);
      c.set_reason(detail::concat("the launcher got ", strsignal(interrupted_)));
      client_->abort(c);
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

pb::RootCause Agent::root_cause(int round) {
  pb::RootCause c;
  bool have = false;
  if (!coordinator_lost_) {
    try {
      auto st = client_->job_state();
      if (st.has_cause() && (st.round() == round || st.aborted())) {
        c = st.cause();
        have = true;
      }
    } catch (const Error& e) {
      spdlog::debug("job state: {}", e.what());
    }
  }
  if (!have) {
    // The coordinator is gone: fall back to what this node saw. A worker
    // that failed on its own comes first, then why this agent stopped the
    // rest (e.g. it lost the coordinator), then a worker it stopped.
    auto from_worker = [&](const Worker& w) {
      c.set_rank(w.rank);
      c.set_node_rank(opt_.node_rank);
      c.set_host(host_);
      c.set_has_exit(true);
      c.set_exit_code(WIFEXITED(w.status) ? WEXITSTATUS(w.status) : 0);
      c.set_signal(WIFSIGNALED(w.status) ? WTERMSIG(w.status) : 0);
      c.set_reason("exited abnormally");
      for (const auto& line : w.tail) c.add_log_tail(line);
    };
    auto failed = [](const Worker& w) { return !(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0); };
    for (auto& w : workers_)
      if (failed(w) && !w.after_stop) {
        from_worker(w);
        return c;
      }
    std::string reason;
    {
      std::lock_guard<std::mutex> l(abort_mu_);
      reason = abort_reason_;
    }
    if (!reason.empty()) {
      c.set_rank(-1);
      c.set_node_rank(opt_.node_rank);
      c.set_host(host_);
      c.set_reason(reason);
      return c;
    }
    for (auto& w : workers_)
      if (failed(w)) {
        from_worker(w);
        return c;
      }
    c.set_rank(-1);
    c.set_node_rank(-1);
    c.set_reason("unknown");
  }
  return c;
}

int Agent::exit_code_of(const pb::RootCause& c) const {
  if (!c.has_exit()) return 1;
  if (c.signal()) return 128 + c.signal();
  return c.exit_code() ? c.exit_code() : 1;
}

void Agent::print_summary(int round, const pb::RootCause& c) {
  std::string s = "tessera run: job failed";
  if (round > 0) s += detail::concat(" after ", round, " restart(s)");
  s += "\n  root cause: " + describe_cause(c) + "\n";
  s += detail::concat("    rank:      ", c.rank() >= 0 ? std::to_string(c.rank()) : std::string("-"), "\n");
  s += detail::concat("    node:      ", c.node_rank(), "\n");
  s += detail::concat("    host:      ", c.host(), "\n");
  if (c.has_exit()) {
    if (c.signal())
      s += detail::concat("    signal:    ", c.signal(), " (", strsignal(c.signal()), ")\n");
    else
      s += detail::concat("    exit code: ", c.exit_code(), "\n");
  }
  if (c.log_tail_size() > 0) {
    s += detail::concat("    last ", c.log_tail_size(), " line(s) of rank ", c.rank(), "'s output:\n");
    for (const auto& line : c.log_tail()) s += "      " + line + "\n";
  }
  if (!opt_.log_dir.empty() && c.rank() >= 0 && c.node_rank() == opt_.node_rank)
    s += detail::concat("    full log:  ",
                        (std::filesystem::path(opt_.log_dir) / ("rank_" + std::to_string(c.rank()) + ".log")).string(),
                        "\n");
  write_all(2, s);
}

}  // namespace

int run_job(const RunOptions& options) {
  Agent a(options);
  return a.run();
}

}  // namespace tessera::launcher
