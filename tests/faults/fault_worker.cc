// tessera_fault_worker: the program the fault-injection suite (fault_test.cc)
// launches under `tessera run` and `mpirun`. Joins the job (run_worker),
// starts a "data loader" child, then all-reduces 1 MiB in a loop for
// --seconds, checking every element against the exact sum. The child is a
// plain forked process that writes a byte to a pipe every 100 ms and ignores
// SIGPIPE (it outlives its worker unless something ends it: the launcher
// must). Between collectives the worker watches the child the way a training
// loop watches its data loader: a dead child, or one silent for 2 s, is a
// fatal error naming it (PyTorch: "DataLoader worker (pid N) is killed by
// signal"). After the first all-reduce it writes DIR/worker.<rank>.pid and
// DIR/child.<rank>.pid (--pid-dir), so the suite knows that the collectives
// run and whom to signal.
//   --seconds S      length of the all-reduce loop (every rank stops after the same iteration)
//   --pid-dir DIR    where the pid files go
//   --no-child       no data loader child
//   --hog-rank R --hog-mib M
//                    rank R, instead of looping, asks to be the OOM killer's first choice
//                    (oom_score_adj 1000) and touches M MiB, 64 MiB at a time; it fails if it survives
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "launcher/worker.h"
#include "runtime/error.h"
#include "runtime/files.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string signal_name(int sig) {
  const char* a = sigabbrev_np(sig);
  return a ? std::string("SIG") + a : "signal " + std::to_string(sig);
}

// The child's state letter from /proc/<pid>/stat ("T" for stopped).
std::string proc_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto p = s.rfind(')');
  return p == std::string::npos || p + 2 >= s.size() ? "?" : s.substr(p + 2, 1);
}

class DataChild {
 public:
  DataChild() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw tessera::Error("data child: pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw tessera::Error("data child: fork failed");
    if (pid_ == 0) {  // only async-signal-safe calls: gRPC threads exist
      signal(SIGPIPE, SIG_IGN);
      sigset_t none;
      sigemptyset(&none);
      pthread_sigmask(SIG_SETMASK, &none, nullptr);
      close(fds[0]);
      const timespec tick{0, 100L * 1000 * 1000};
      for (;;) {
        ssize_t w = write(fds[1], "x", 1);
        (void)w;
        nanosleep(&tick, nullptr);
      }
    }
    close(fds[1]);
    fd_ = fds[0];
    fcntl(fd_, F_SETFL, O_NONBLOCK);
    last_ = Clock::now();
  }
  pid_t pid() const { return pid_; }
  // Throws when the child died or has been silent for 2 s.
  void check() {
    char buf[256];
    while (read(fd_, buf, sizeof buf) > 0) last_ = Clock::now();
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      if (WIFSIGNALED(status))
        throw tessera::Error("data child (pid " + std::to_string(pid_) + ") killed by " +
                             signal_name(WTERMSIG(status)));
      throw tessera::Error("data child (pid " + std::to_string(pid_) + ") exited with code " +
                           std::to_string(WEXITSTATUS(status)));
    }
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_).count();
    if (silent > 2000) {
      const std::string st = proc_state(pid_);
      throw tessera::Error("data child (pid " + std::to_string(pid_) + ") sent nothing for " + std::to_string(silent) +
                           " ms (state " + st + (st == "T" ? ": stopped)" : ")"));
    }
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  Clock::time_point last_;
};

// Whole or not at all: the suite reads these files while they are written.
void write_pid(const std::string& path, pid_t pid) {
  tessera::AtomicWriteOptions o;
  o.sync = false;  // the suite's own scratch file: atomic is what it needs (runtime/files.h renames for us)
  tessera::write_file_atomic(path, std::to_string(pid) + "\n", o);
}

int run(int argc, char** argv) {
  CLI::App app{"tessera fault-injection worker"};
  double seconds = 30;
  std::string pid_dir;
  bool no_child = false;
  int hog_rank = -1;
  long hog_mib = 0;
  app.add_option("--hog-rank", hog_rank);
  app.add_option("--hog-mib", hog_mib);
  app.add_option("--seconds", seconds);
  app.add_option("--pid-dir", pid_dir);
  app.add_flag("--no-child", no_child);
  CLI11_PARSE(app, argc, argv);

  return tessera::launcher::run_worker({}, [&](tessera::launcher::WorkerContext& ctx) -> int {
    const int rank = ctx.world.rank, n = ctx.world.size;
    if (rank == hog_rank) {
      std::ofstream("/proc/self/oom_score_adj") << 1000 << "\n";
      std::vector<std::unique_ptr<char[]>> chunks;
      constexpr size_t kChunk = size_t{64} << 20;
      for (long mib = 0; mib < hog_mib; mib += 64) {
        chunks.emplace_back(new char[kChunk]);
        std::memset(chunks.back().get(), 1, kChunk);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      throw tessera::Error("rank " + std::to_string(rank) + " touched " + std::to_string(hog_mib) +
                           " MiB and was not OOM-killed");
    }
    std::unique_ptr<DataChild> child;
    if (!no_child) child = std::make_unique<DataChild>();
    constexpr size_t kCount = size_t{256} * 1024;  // 1 MiB of f32
    std::vector<float> in(kCount), out(kCount);
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    for (long iter = 0;; ++iter) {
      // Element j of rank r is r + (j % 7) + flag: the sum is exact in f32.
      const float done = Clock::now() >= end ? 1.0F : 0.0F;
      for (size_t j = 0; j < kCount; ++j) in[j] = static_cast<float>(rank + static_cast<int>(j % 7));
      in[0] += done * 1000.0F;
      ctx.world_comm->all_reduce(in.data(), out.data(), kCount, tessera::DType::F32,
                                 tessera::collectives::ReduceOp::Sum);
      const int rank_sum = n * (n - 1) / 2;  // 0 + 1 + ... + (n - 1): n * (n - 1) is even
      const float base = static_cast<float>(rank_sum);
      for (size_t j = 1; j < kCount; ++j)
        if (out[j] != base + static_cast<float>(n * static_cast<int>(j % 7)))
          throw tessera::Error("all_reduce: element " + std::to_string(j) + " is " + std::to_string(out[j]));
      if (iter == 0 && !pid_dir.empty()) {
        write_pid(pid_dir + "/worker." + std::to_string(rank) + ".pid", getpid());
        if (child) write_pid(pid_dir + "/child." + std::to_string(rank) + ".pid", child->pid());
      }
      if (child) child->check();
      if (out[0] >= 1000.0F) break;  // some rank's time is up: all stop after this iteration
    }
    if (child) {
      kill(child->pid(), SIGKILL);
      waitpid(child->pid(), nullptr, 0);
    }
    std::printf("rank %d of %d: loop done\n", rank, n);
    std::fflush(stdout);
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_main("tessera_fault_worker", [&] { return run(argc, argv); });
}
