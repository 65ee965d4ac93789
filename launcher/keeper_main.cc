// tessera_keeper: the process between a launcher and one worker
// (launcher/spawn.h). Not a user command: `tessera run` and `tessera bench -r`
// start it with posix_spawn as
//
//   tessera_keeper LAUNCHER_PID CPU PROGRAM ARGV0 [ARG...]
//
// in the worker's environment, with the worker's stdin, stdout and stderr as
// its own, in a process group of its own and every signal blocked. It starts
// PROGRAM (bound to CPU when CPU >= 0) and exits the way it did.
//
// Its own small, static executable, so that starting it costs the launcher
// no copy of its page tables (a fork of the launcher did: gRPC's threads,
// their stacks and every mapped library), and itself no dynamic loading.
// It links nothing of tessera's and calls only the C library.
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace {

void say(const char* const* parts) {
  for (; *parts; ++parts) {
    ssize_t ignored = ::write(2, *parts, std::strlen(*parts));
    (void)ignored;
  }
}

// A decimal int in [lo, hi], the whole string; false otherwise.
bool parse_int(const char* s, long lo, long hi, long* out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// What the worker's side of the clone needs.
struct WorkerExec {
  const char* program;
  char** argv;
  pid_t keeper;
  int cpu;
};

// The worker's stack until it execs.
alignas(64) char g_exec_stack[64 * 1024];

// Runs in the cloned worker, in the keeper's memory, until execve: nothing
// that writes the keeper's data.
int exec_worker(void* arg) {
  const WorkerExec& w = *static_cast<const WorkerExec*>(arg);
  signal(SIGPIPE, SIG_DFL);  // the launcher ignores it; a worker's pipes behave as a shell's
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != w.keeper) _exit(137);
  if (w.cpu >= 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(w.cpu, &one);
    sched_setaffinity(0, sizeof one, &one);  // best effort: the worker runs unbound otherwise
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(w.program, w.argv, environ);
  // "tessera run: cannot execute './badelf': Exec format error".
  const char* why = strerrordesc_np(errno);
  const char* parts[] = {"tessera run: cannot execute '", w.program, "': ", why ? why : "unknown error", "\n", nullptr};
  say(parts);
  _exit(127);
}

}  // namespace

int main(int argc, char** argv) {
  long launcher = 0, cpu = 0;
  if (argc < 5 || !parse_int(argv[1], 1, INT_MAX, &launcher) || !parse_int(argv[2], -1, CPU_SETSIZE - 1, &cpu)) {
    const char* parts[] = {"tessera_keeper: an internal helper of `tessera run`, not a command\n",
                           "usage: tessera_keeper LAUNCHER_PID CPU PROGRAM ARGV0 [ARG...]\n", nullptr};
    say(parts);
    return 2;
  }
  // Every signal stays blocked (the launcher spawns it so; set again for a
  // keeper started otherwise): a SIGTERM to the group while the worker
  // starts must not end the keeper first.
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  // The launcher's death, however it dies: SIGHUP (checked against getppid(),
  // since PDEATHSIG also fires when only the spawning thread ends), and a
  // 500 ms poll as a fallback.
  prctl(PR_SET_PDEATHSIG, SIGHUP);
  prctl(PR_SET_DUMPABLE, 0);                        // re-raising a worker's SIGSEGV must not dump the keeper's core
  if (getppid() != static_cast<pid_t>(launcher)) {  // the launcher died before prctl took effect
    kill(0, SIGKILL);
    _exit(137);
  }
  const pid_t keeper = getpid();
  // The worker shares the keeper's memory until it execs (CLONE_VFORK: the
  // keeper waits), as posix_spawn does, on a stack of its own; it gets its
  // own signal dispositions (no CLONE_SIGHAND).
  WorkerExec we{argv[3], argv + 4, keeper, static_cast<int>(cpu)};
  const pid_t worker = clone(exec_worker, g_exec_stack + sizeof g_exec_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &we);
  if (worker < 0) {
    const char* parts[] = {"tessera run: cannot start '", argv[3], "': ", strerrordesc_np(errno), "\n", nullptr};
    say(parts);
    _exit(127);
  }
  // The keeper holds no descriptor: the pipes reach EOF when the worker and
  // its children close them.
  if (syscall(SYS_close_range, 0U, ~0U, 0) != 0)
    for (int fd = 0; fd < 4096; ++fd) close(fd);
  sigset_t wake;
  sigemptyset(&wake);
  sigaddset(&wake, SIGCHLD);
  sigaddset(&wake, SIGHUP);
  const timespec tick{0, 500L * 1000 * 1000};  // 500 ms
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(worker, &status, WNOHANG);
    if (r == worker) {
      kill(0, SIGTERM);  // leftovers of the worker (the keeper has SIGTERM blocked)
      kill(0, SIGCONT);
      if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
      // Exit as the worker did: the same signal, unblocked, at default.
      const int sig = WTERMSIG(status);
      signal(sig, SIG_DFL);
      sigset_t only;
      sigemptyset(&only);
      sigaddset(&only, sig);
      kill(keeper, sig);
      sigprocmask(SIG_UNBLOCK, &only, nullptr);
      _exit(128 + sig);  // a signal that does not terminate by default
    }
    if (getppid() != static_cast<pid_t>(launcher)) {
      kill(0, SIGKILL);  // the launcher is gone: the whole group goes, the keeper with it
      _exit(137);
    }
    sigtimedwait(&wake, nullptr, &tick);
  }
}
