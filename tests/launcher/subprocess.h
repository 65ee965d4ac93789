// Test helper: run a command with stdout/stderr captured to files, wait with
// a deadline, and check that processes are gone.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tessera::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A fresh temporary directory, removed with the object.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/tessera_launch_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

class Subprocess {
 public:
  // Starts argv with stdout and stderr going to files in dir.
  Subprocess(const std::vector<std::string>& argv, const std::string& dir, const std::string& tag = "p") {
    out_path_ = dir + "/" + tag + ".out";
    err_path_ = dir + "/" + tag + ".err";
    start_ = std::chrono::steady_clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      int o = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(o, 1);
      dup2(e, 2);
      std::vector<char*> args;
      args.reserve(argv.size() + 1);
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
  }
  ~Subprocess() {
    if (!done_) {
      kill(-pid_, SIGKILL);
      int st;
      waitpid(pid_, &st, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // Exit code (128+signal when killed), or -1 when it did not end in time (then it is killed).
  int wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        done_ = true;
        elapsed_ = std::chrono::steady_clock::now() - start_;
        signaled_ = WIFSIGNALED(st);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(-pid_, SIGKILL);
        waitpid(pid_, &st, 0);
        done_ = true;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  double seconds() const { return std::chrono::duration<double>(elapsed_).count(); }
  // After wait(): killed by a signal (then wait() gave 128 + signal), rather than exit(128 + signal).
  bool signaled() const { return signaled_; }
  std::string out() const { return read_file(out_path_); }
  std::string err() const { return read_file(err_path_); }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  bool signaled_ = false;
  std::string out_path_, err_path_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::duration elapsed_{};
};

// Pids written by tessera_hello --pid-dir.
inline std::vector<pid_t> read_pids(const std::string& dir) {
  std::vector<pid_t> pids;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".pid") continue;
    pids.push_back(static_cast<pid_t>(std::atol(read_file(e.path()).c_str())));
  }
  return pids;
}

// Whether the process blocks `sig` (the SigBlk mask in /proc/<pid>/status):
// `tessera run` blocks its signals first thing, so from then on a signal is
// handled by its own code rather than ending it.
inline bool status_mask_has(pid_t pid, const std::string& field, int sig) {
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field, 0) == 0) return (std::stoull(line.substr(field.size()), nullptr, 16) >> (sig - 1)) & 1;
  return false;
}
// Blocked and handled: `tessera run` has set up its signal handling. (Blocked
// alone is not enough: a library constructor, e.g. OpenBLAS starting its
// threads, may block signals for a moment at start-up.)
inline bool handles_signal(pid_t pid, int sig) {
  return status_mask_has(pid, "SigBlk:", sig) && status_mask_has(pid, "SigCgt:", sig);
}

// A zombie (dead, waiting for a parent that does not reap, as PID 1 in some
// containers) counts as gone.
inline bool alive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat.rfind(')');
  return close_paren == std::string::npos || close_paren + 2 >= stat.size() || stat[close_paren + 2] != 'Z';
}

}  // namespace tessera::testing
