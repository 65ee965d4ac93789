// Runs a function as N ranks in forked processes that rendezvous through a
// FileStore in a fresh temporary directory. A rank fails by throwing; its
// message comes back to the parent, which reports every failed rank.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/store.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace tessera::collectives::test {

struct RankResult {
  int exit_code = -1;  // -signal when killed
  std::string message;
};

inline std::string make_temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-coll-XXXXXX").string();
  char* d = ::mkdtemp(tmpl.data());
  if (!d) throw std::runtime_error("mkdtemp failed");
  return d;
}

// Forks `size` ranks running fn(rank, size, store); waits at most timeout_s
// (then kills the rest). Returns each rank's result.
inline std::vector<RankResult> run_ranks(int size, const std::function<void(int, int, std::shared_ptr<Store>)>& fn,
                                         int timeout_s = 90) {
  const std::string dir = make_temp_dir();
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      std::string msg;
      try {
        fn(r, size, make_file_store(dir + "/store"));
      } catch (const std::exception& e) {
        code = 1;
        msg = e.what();
      } catch (...) {
        code = 1;
        msg = "unknown exception";
      }
      if (code) {
        std::ofstream(dir + "/err." + std::to_string(r)) << msg;
      }
      std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__)
      // _exit skips the exit-time leak check: run it here (a leak fails the rank).
      if (code == 0) __lsan_do_leak_check();
#endif
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankResult> res(static_cast<size_t>(size));
  std::vector<bool> done(static_cast<size_t>(size), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int left = size;
  while (left > 0) {
    for (int r = 0; r < size; ++r) {
      if (done[r]) continue;
      int st = 0;
      pid_t w = ::waitpid(pids[r], &st, WNOHANG);
      if (w == pids[r]) {
        done[r] = true;
        --left;
        res[r].exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        std::ifstream f(dir + "/err." + std::to_string(r));
        std::stringstream ss;
        ss << f.rdbuf();
        res[r].message = ss.str();
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < size; ++r)
        if (!done[r]) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          res[r].exit_code = -SIGKILL;
          res[r].message = "harness: rank hung, killed after " + std::to_string(timeout_s) + " s";
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return res;
}

// "" when every rank exited 0, else a report of the failures.
inline std::string failures(const std::vector<RankResult>& res) {
  std::string s;
  for (size_t r = 0; r < res.size(); ++r)
    if (res[r].exit_code != 0)
      s += "rank " + std::to_string(r) + " exit " + std::to_string(res[r].exit_code) + ": " + res[r].message + "\n";
  return s;
}

// Throws std::runtime_error with the message when cond is false (inside ranks).
#define COLL_REQUIRE(cond, ...)                                                                                    \
  do {                                                                                                             \
    if (!(cond))                                                                                                   \
      throw std::runtime_error(::tessera::detail::concat(__FILE__, ":", __LINE__, ": " #cond " ", ##__VA_ARGS__)); \
  } while (0)

}  // namespace tessera::collectives::test
