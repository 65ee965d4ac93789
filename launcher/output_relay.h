// Relaying one worker's output (stdout and stderr pipes) for `tessera run`.
//
// Every line is written to the launcher's stdout or stderr (the stream the
// worker used) with the prefix "[<rank>] " (none when constructed without
// it: `tessera bench -r N`, whose table reads as one process's), appended
// without the prefix to the rank's log file when there is one, and kept
// among the last kTailLines lines for the root-cause report, each as a
// terminal last showed it (the text after its last carriage return: a
// progress bar's final state) and cut to its last kTailLineBytes, so the
// report stays far below gRPC's 4 MiB message limit (ten progress-bar lines
// of 1 MiB each exceeded it, and the failure never reached the
// coordinator). A line longer than 1 MiB is
// emitted in pieces; a last line without a newline is emitted at EOF.
//
// Threads: used from the agent's event loop only (one thread); not
// thread-safe. The relay owns the read ends it was given and closes them at
// EOF or in close_all().
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "runtime/files.h"

namespace tessera::launcher {

// Writes all of `s` to fd, retrying on EINTR; drops it if fd is gone (a
// closed pipe: the log files still have the lines). Blocks while fd does not
// take it: for the launcher's own last words, after the workers are gone.
void write_all(int fd, const std::string& s);

// The launcher's stdout or stderr as relayed workers' lines reach them. Lines
// are queued and written only as far as the descriptor takes them without
// blocking (poll for POLLOUT, then writes of at most PIPE_BUF bytes), so a
// reader that stalls (a paused pager, `| sleep 60`) never stops the
// supervisor's loop from reaping, failing the job or handling a signal; a
// descriptor that is gone (EPIPE, EBADF) is no longer written (the log
// files still have the lines). Past kHighWater queued bytes the supervisor
// stops reading the workers' pipes: the workers then wait on their own
// writes, as they would writing to the stalled reader themselves.
// One per descriptor, process-wide (destination(1), destination(2)); used
// from the supervisor's thread only.
class Destination {
 public:
  static constexpr size_t kHighWater = 1 << 20;

  explicit Destination(int fd) : fd_(fd) {}
  int fd() const { return fd_; }
  void queue(const std::string& bytes);
  // Writes what the descriptor takes now, without blocking.
  void flush_some();
  size_t pending() const { return buf_.size() - head_; }
  bool full() const { return pending() >= kHighWater; }
  // Forgets what is queued (the launcher is leaving on a signal).
  void drop() {
    buf_.clear();
    head_ = 0;
  }

 private:
  int fd_;
  bool gone_ = false;
  std::string buf_;
  size_t head_ = 0;  // buf_[head_..] is unwritten
};
Destination& destination(int fd);  // 1 or 2

class OutputRelay {
 public:
  static constexpr size_t kTailLines = 10;
  static constexpr size_t kTailLineBytes = 2048;

  struct Stream {
    int fd = -1;     // read end of the worker's pipe; -1 once closed
    int out_fd = 1;  // where prefixed lines go
    std::string partial;
  };

  explicit OutputRelay(int rank = 0, bool prefix = true) : rank_(rank), prefix_(prefix) {}
  ~OutputRelay() { close_all(); }
  // Moving hands the open streams over (the moved-from relay has none).
  OutputRelay(OutputRelay&& o) noexcept
      : rank_(o.rank_),
        prefix_(o.prefix_),
        out_(std::exchange(o.out_, Stream{-1, 1, {}})),
        err_(std::exchange(o.err_, Stream{-1, 2, {}})),
        tail_(std::move(o.tail_)),
        log_(std::move(o.log_)),
        log_error_(std::move(o.log_error_)),
        last_err_line_(o.last_err_line_) {}
  OutputRelay& operator=(OutputRelay&&) = delete;
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  // DIR/rank_<r>.log: truncated in round 0, appended after a line
  // "---- tessera run: restart <k> ----" in round k > 0; written through
  // OutputStream (runtime/files.h: checked writes; a device or a FIFO is
  // written through, never replaced; `ops` injects faults). Throws Error.
  // A write that fails later (ENOSPC, EIO) is reported at once on stderr,
  // naming the file and the OS error, and the log is closed: the lines
  // still go to the terminal, and log_error() says what failed.
  void open_log(const std::string& dir, int round, FileOps* ops = nullptr);
  // The first failed write to the log ("DIR/rank_0.log: cannot write: No
  // space left on device"); empty when none failed.
  const std::string& log_error() const { return log_error_; }
  // Takes the read ends of a new worker process's pipes.
  void attach(int out_fd, int err_fd);

  Stream& out() { return out_; }
  Stream& err() { return err_; }
  bool closed() const { return out_.fd < 0 && err_.fd < 0; }

  // Reads what `s` has now, up to about max_bytes (non-blocking), and emits
  // complete lines; at EOF emits the partial line and closes the stream. The
  // bound keeps a worker that writes without pause from holding the
  // supervisor's loop (it read until the pipe was empty: `yes` in one rank
  // delayed the job's failure by a minute and a SIGTERM by 22 s).
  static constexpr size_t kPumpBytes = 256 << 10;
  void pump(Stream& s, size_t max_bytes = kPumpBytes);
  // Emits what is left and closes both streams without waiting for EOF.
  void close_all();

  const std::deque<std::string>& tail() const { return tail_; }
  // When the last stderr line was emitted (the epoch when none was).
  std::chrono::steady_clock::time_point last_err_line() const { return last_err_line_; }

 private:
  void emit_line(const std::string& line, int out_fd);
  void close_stream(Stream& s);

  int rank_;
  bool prefix_;
  Stream out_{-1, 1, {}}, err_{-1, 2, {}};
  std::deque<std::string> tail_;
  void log_write(const std::string& bytes);  // to an open log_; the first failure closes it and is reported

  std::unique_ptr<OutputStream> log_;
  std::string log_error_;
  std::chrono::steady_clock::time_point last_err_line_{};
};

}  // namespace tessera::launcher
