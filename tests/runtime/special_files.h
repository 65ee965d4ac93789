// Device nodes and FIFOs for the output tests (outputs_inputs_test.cc,
// hardening_cli_test.cc).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace tessera::testing {

// A character device with /dev/null's numbers (1, 3), as `mknod p c 1 3`
// makes; false when this user may not make device nodes.
inline bool make_null_device(const std::string& p) { return ::mknod(p.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0; }

// A full device for ENOSPC tests: `dir`/full made with /dev/full's numbers
// (1, 7), so that a writer that wrongly replaces its output replaces this
// node and never the system's /dev/full; /dev/full itself where this user
// may not make device nodes (and then cannot replace anything in /dev).
inline std::string full_device(const std::string& dir) {
  const std::string p = dir + "/full";
  return ::mknod(p.c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0 ? p : "/dev/full";
}

inline bool is_null_device(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
}
inline bool is_fifo(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

// Reads a FIFO until its writer has come and gone (or 60 s), on another
// thread: opened before the command starts, as `cat FIFO &` would be.
class FifoReader {
 public:
  explicit FifoReader(const std::string& p) : fd_(::open(p.c_str(), O_RDONLY | O_NONBLOCK)) {
    thread_ = std::thread([this] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      char buf[65536];
      bool writer_seen = false;
      while (std::chrono::steady_clock::now() < until && !stop_) {
        const ssize_t n = ::read(fd_, buf, sizeof buf);
        if (n > 0) {
          got_.append(buf, static_cast<size_t>(n));
          writer_seen = true;
        } else if (n == 0 && writer_seen) {
          return;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
    });
  }
  ~FifoReader() {
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }
  std::string take() {  // after the writer closed
    thread_.join();
    return got_;
  }
  void stop() {  // no writer came
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  int fd_;
  std::thread thread_;
  std::string got_;
};

// The inputs every reader must refuse at once (besides /dev/zero): a FIFO,
// a directory and a 1 GiB sparse file, made under `dir`; false on failure.
struct BadInputs {
  std::string fifo, dir, big;
};
inline bool make_bad_inputs(const std::string& under, BadInputs* b) {
  b->fifo = under + "/fifo.json";
  b->dir = under + "/dir.json";
  b->big = under + "/big.json";
  if (::mkfifo(b->fifo.c_str(), 0600) != 0 || ::mkdir(b->dir.c_str(), 0700) != 0) return false;
  const int fd = ::open(b->big.c_str(), O_WRONLY | O_CREAT, 0600);
  const bool ok = fd >= 0 && ::ftruncate(fd, off_t{1} << 30) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

}  // namespace tessera::testing
