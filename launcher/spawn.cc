#include "launcher/spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "runtime/cpu_rotation.h"
#include "runtime/env.h"
#include "runtime/error.h"

extern char** environ;

namespace tessera::launcher {

namespace {

bool set_by_tessera(const char* kv) {
  static const char* names[] = {"TESSERA_RANK=",
                                "TESSERA_WORLD_SIZE=",
                                "TESSERA_LOCAL_RANK=",
                                "TESSERA_LOCAL_SIZE=",
                                "TESSERA_NODE_RANK=",
                                "TESSERA_NUM_NODES=",
                                "TESSERA_COORDINATOR=",
                                "TESSERA_COORDINATOR_LOCAL=",
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
                                "GROUP_WORLD_SIZE=",
                                "ROLE_NAME=",
                                "TESSERA_BOUND_CPUS=",
                                "TORCHELASTIC_USE_AGENT_STORE="};
  for (const char* n : names)
    if (std::strncmp(kv, n, std::strlen(n)) == 0) return true;
  return false;
}

// What the worker's side of keeper_main's clone needs.
struct WorkerExec {
  const char* program;
  char** argv;
  char** envp;
  pid_t keeper;
  int cpu;
};

// The worker's stack until it execs: a keeper's own copy-on-write page of
// the launcher's (only keepers, single-threaded forks, run on it).
alignas(64) char g_exec_stack[64 * 1024];

// Runs in the cloned worker, in the keeper's memory, until execve: only
// async-signal-safe calls, nothing that writes the keeper's data.
int exec_worker(void* arg) {
  const WorkerExec& w = *static_cast<const WorkerExec*>(arg);
  sigset_t none;
  sigemptyset(&none);
  signal(SIGPIPE, SIG_DFL);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != w.keeper) _exit(137);
  if (w.cpu >= 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(w.cpu, &one);
    sched_setaffinity(0, sizeof one, &one);  // best effort: the worker runs unbound otherwise
  }
  pthread_sigmask(SIG_SETMASK, &none, nullptr);
  execve(w.program, w.argv, w.envp);
  // "tessera run: cannot execute './badelf': Exec format error", from
  // write(2) alone (this child of a forked process calls nothing that locks).
  const char* why = strerrordesc_np(errno);  // unlike strerror, no locale (lock, allocation)
  if (!why) why = "unknown error";
  for (const char* part : {"tessera run: cannot execute '", w.program, "': ", why, "\n"}) {
    ssize_t ignored = ::write(2, part, strlen(part));
    (void)ignored;
  }
  _exit(127);
}

// The keeper: the process the launcher forks. It leads the worker's process
// group, forks the worker into that group and waits for it, and exits the way
// the worker did. When the launcher dies (PR_SET_PDEATHSIG=SIGHUP, checked
// against getppid() because PDEATHSIG also fires when just the forking
// thread ends, and a 500 ms poll as a fallback) it SIGKILLs the whole group,
// so nothing the worker started outlives the launcher even when the worker
// is not a tessera program. When the worker exits, the keeper sends SIGTERM
// to what is left in the group. Only async-signal-safe calls: the launcher
// has other threads.
[[noreturn]] void keeper_main(const std::string& program, char** argv, char** envp, pid_t launcher, int stdin_fd,
                              int out_w, int err_w, int cpu) {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, nullptr);
  // No handler of the launcher's (agent.cc's forwarding ones, or any a
  // library installed) is the keeper's, nor may one run in the worker while
  // it shares the keeper's memory before execve: every caught signal goes
  // back to its default, as posix_spawn does; ignored ones stay ignored,
  // as execve keeps them.
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction old {};
    if (sigaction(s, nullptr, &old) == 0 && old.sa_handler != SIG_IGN && old.sa_handler != SIG_DFL) signal(s, SIG_DFL);
  }
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGHUP);
  prctl(PR_SET_DUMPABLE, 0);    // re-raising a worker's SIGSEGV must not dump the keeper's core
  if (getppid() != launcher) {  // the launcher died before prctl took effect
    kill(0, SIGKILL);
    _exit(137);
  }
  if (stdin_fd != 0) dup2(stdin_fd, 0);
  if (out_w >= 0) dup2(out_w, 1);
  if (err_w >= 0) dup2(err_w, 2);
  const pid_t keeper = getpid();
  // The worker shares the keeper's memory until it execs (the keeper waits:
  // CLONE_VFORK), as posix_spawn does, instead of a fork copying the page
  // tables of the launcher's address space a second time (the keeper is a
  // fork of the launcher, which maps ~70 libraries and gRPC's threads'
  // stacks; perf: fork and its teardown at exec were 14% of a 128-worker
  // job's CPU). It runs on a stack of its own; signal dispositions are its
  // own (no CLONE_SIGHAND), so SIG_DFL there leaves the keeper's alone.
  WorkerExec we{program.c_str(), argv, envp, keeper, cpu};
  const pid_t worker = clone(exec_worker, g_exec_stack + sizeof g_exec_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &we);
  if (worker < 0) {
    const char msg[] = "tessera run: fork failed\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(127);
  }
  // The keeper holds no descriptor: the pipes reach EOF when the worker and
  // its children close them, and no launcher socket stays open.
  if (syscall(SYS_close_range, 0U, ~0U, 0) != 0)
    for (int fd = 0; fd < 4096; ++fd) close(fd);
  sigset_t wake;
  sigemptyset(&wake);
  sigaddset(&wake, SIGCHLD);
  sigaddset(&wake, SIGHUP);
  const timespec tick{0, 500L * 1000 * 1000};  // 500 ms
  for (;;) {
    int status = 0;
    pid_t r = waitpid(worker, &status, WNOHANG);
    if (r == worker) {
      kill(0, SIGTERM);  // leftovers of the worker (the keeper has SIGTERM blocked)
      kill(0, SIGCONT);
      if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
      const int sig = WTERMSIG(status);
      signal(sig, SIG_DFL);
      sigset_t only;
      sigemptyset(&only);
      sigaddset(&only, sig);
      kill(keeper, sig);
      pthread_sigmask(SIG_UNBLOCK, &only, nullptr);
      _exit(128 + sig);  // a signal that does not terminate by default
    }
    if (getppid() != launcher) {
      kill(0, SIGKILL);  // the launcher is gone: the whole group goes, the keeper with it
      _exit(137);
    }
    sigtimedwait(&wake, nullptr, &tick);
  }
}

}  // namespace

std::vector<std::string> worker_environment(const WorkerEnv& w) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (!set_by_tessera(*e)) env.emplace_back(*e);
  auto add = [&env](const std::string& k, const std::string& v) { env.push_back(k + "=" + v); };
  const std::string rank = std::to_string(w.rank), ws = std::to_string(w.world_size);
  const std::string lr = std::to_string(w.local_rank), ls = std::to_string(w.local_size);
  const std::string nr = std::to_string(w.node_rank), rc = std::to_string(w.restart_count);
  add("TESSERA_RANK", rank);
  add("TESSERA_WORLD_SIZE", ws);
  add("TESSERA_LOCAL_RANK", lr);
  add("TESSERA_LOCAL_SIZE", ls);
  add("TESSERA_NODE_RANK", nr);
  add("TESSERA_NUM_NODES", std::to_string(w.num_nodes));
  add("TESSERA_COORDINATOR", w.coordinator);
  if (!w.coordinator_local.empty()) add("TESSERA_COORDINATOR_LOCAL", w.coordinator_local);
  add("TESSERA_JOB_TOKEN", w.token);
  add("TESSERA_HEARTBEAT_MS", std::to_string(w.heartbeat_ms));
  add("TESSERA_HOST", w.host);
  add("TESSERA_RESTART_COUNT", rc);
  add("RANK", rank);
  add("WORLD_SIZE", ws);
  add("LOCAL_RANK", lr);
  add("LOCAL_WORLD_SIZE", ls);
  add("GROUP_RANK", nr);
  add("GROUP_WORLD_SIZE", std::to_string(w.num_nodes));
  add("ROLE_RANK", rank);
  add("ROLE_WORLD_SIZE", ws);
  add("MASTER_ADDR", w.master_addr);
  add("MASTER_PORT", std::to_string(w.master_port));
  add("TORCHELASTIC_RESTART_COUNT", rc);
  add("TORCHELASTIC_MAX_RESTARTS", std::to_string(w.max_restarts));
  add("TORCHELASTIC_RUN_ID", w.run_id);
  // As torchrun's LocalElasticAgent: one role, "default" (ROLE_RANK and
  // ROLE_WORLD_SIZE are then RANK and WORLD_SIZE); False because rank 0
  // hosts the store on MASTER_PORT itself (torch's env:// then makes rank 0
  // start a TCPStore there and the others connect).
  add("ROLE_NAME", "default");
  add("TORCHELASTIC_USE_AGENT_STORE", "False");
  // torchrun's defaults, each kept when the launcher's environment has it.
  if (!std::getenv("NCCL_ASYNC_ERROR_HANDLING")) add("NCCL_ASYNC_ERROR_HANDLING", "1");
  if (!std::getenv("OMP_NUM_THREADS") && w.local_size > 1) add("OMP_NUM_THREADS", "1");
  // The job's id, which every process of the job inherits (tests find them
  // by it in /proc/*/environ): the launcher's own when set, else the run id.
  if (!w.bound_cpus.empty()) add("TESSERA_BOUND_CPUS", w.bound_cpus);
  const char* job = std::getenv("TESSERA_JOB_ID");
  if (!job || !*job) add("TESSERA_JOB_ID", w.run_id);
  return env;
}

std::vector<int> worker_cpus(int nproc) {
  if (env_or("TESSERA_BIND") == "0") return {};
  const std::vector<int> cpus = current_cpu_mask();
  if (nproc < 2 || nproc > static_cast<int>(cpus.size())) return {};
  std::vector<int> out;
  out.reserve(static_cast<size_t>(nproc));
  for (int i = 0; i < nproc; ++i) out.push_back(cpus[static_cast<size_t>(i) % cpus.size()]);
  return out;
}

SpawnedWorker spawn_worker(const std::string& program, const std::vector<std::string>& args,
                           const std::vector<std::string>& env, int stdin_fd, int cpu, bool inherit_output) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  auto close_all = [&] {
    for (int fd : {out[0], out[1], err[0], err[1]})
      if (fd >= 0) close(fd);
  };
  if (!inherit_output && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)) {
    int e = errno;
    close_all();
    throw Error(detail::concat("pipe: ", std::strerror(e)));
  }
  // Everything the child needs is built before fork.
  std::vector<std::string> env_copy = env, args_copy = args;
  std::vector<char*> envp, argv;
  for (auto& s : env_copy) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& s : args_copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close_all();
    throw Error(detail::concat("fork: ", std::strerror(e)));
  }
  if (pid == 0) keeper_main(program, argv.data(), envp.data(), parent, stdin_fd, out[1], err[1], cpu);
  setpgid(pid, pid);  // also here, so a signal sent right after fork finds the group
  for (int* fd : {&out[1], &err[1]})
    if (*fd >= 0) close(*fd), *fd = -1;
  if (!inherit_output) {
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
  }
  return SpawnedWorker{pid, out[0], err[0]};
}

}  // namespace tessera::launcher
