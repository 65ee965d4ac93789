#include "launcher/output_relay.h"

#include <limits.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/error.h"

namespace tessera::launcher {

namespace {
constexpr size_t kMaxLineBytes = 1 << 20;
}  // namespace

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

void Destination::queue(const std::string& bytes) {
  if (!gone_) buf_ += bytes;  // (flush_some empties buf_ whenever it wrote all of it)
}

void Destination::flush_some() {
  while (pending() > 0 && !gone_) {
    pollfd p{fd_, POLLOUT, 0};
    int r = ::poll(&p, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || !(p.revents & (POLLOUT | POLLERR | POLLHUP | POLLNVAL))) return;  // not now
    // At most PIPE_BUF: a pipe with room for one more page takes it without blocking.
    const ssize_t n = ::write(fd_, buf_.data() + head_, std::min<size_t>(pending(), PIPE_BUF));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return;
      gone_ = true;  // EPIPE, EBADF, EIO: the reader is gone; the logs keep the lines
      drop();
      return;
    }
    head_ += static_cast<size_t>(n);
  }
  if (head_ == buf_.size()) {
    drop();
  } else if (head_ > (1u << 20)) {  // keep the string from growing behind a slow reader
    buf_.erase(0, head_);
    head_ = 0;
  }
}

Destination& destination(int fd) {
  static Destination out(1), err(2);
  return fd == 2 ? err : out;
}

void OutputRelay::open_log(const std::string& dir, int round, FileOps* ops) {
  const std::string path = (std::filesystem::path(dir) / ("rank_" + std::to_string(rank_) + ".log")).string();
  log_error_.clear();
  try {
    log_ = std::make_unique<OutputStream>(path, OutputStreamOptions{.append = round > 0, .ops = ops});
  } catch (const IoError& e) {
    throw Error(detail::concat("cannot write log file ", e.what()));
  }
  if (round > 0) log_write(detail::concat("---- tessera run: restart ", round, " ----\n"));
}

void OutputRelay::log_write(const std::string& bytes) {  // log_ is open
  try {
    log_->write(bytes);
  } catch (const IoError& e) {
    // Said once, at once; the log ends here (a full disk stays full), the terminal still gets every line.
    log_error_ = e.what();
    log_.reset();
    spdlog::error("tessera run: rank {}'s log {} (the log stops here; its lines still go to the terminal)", rank_,
                  log_error_);
  }
}

void OutputRelay::attach(int out_fd, int err_fd) {
  close_all();
  out_ = Stream{out_fd, 1, {}};
  err_ = Stream{err_fd, 2, {}};
}

void OutputRelay::emit_line(const std::string& line, int out_fd) {
  destination(out_fd).queue(prefix_ ? "[" + std::to_string(rank_) + "] " + line + "\n" : line + "\n");
  if (log_) log_write(line + "\n");
  // What a terminal shows last: after the last '\r' that has text behind it.
  std::string shown = line;
  if (const size_t cr = line.find_last_of('\r'); cr != std::string::npos && cr + 1 < line.size())
    shown = line.substr(cr + 1);
  if (shown.size() > kTailLineBytes)
    shown =
        detail::concat("[", shown.size() - kTailLineBytes, " bytes cut] ", shown.substr(shown.size() - kTailLineBytes));
  tail_.push_back(std::move(shown));
  if (tail_.size() > kTailLines) tail_.pop_front();
  if (out_fd == 2) last_err_line_ = std::chrono::steady_clock::now();
}

void OutputRelay::pump(Stream& s, size_t max_bytes) {
  if (s.fd < 0) return;
  char buf[65536];
  for (size_t got = 0; got < max_bytes;) {
    ssize_t n = read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.partial.append(buf, static_cast<size_t>(n));
      size_t start = 0, nl;
      while ((nl = s.partial.find('\n', start)) != std::string::npos) {
        emit_line(s.partial.substr(start, nl - start), s.out_fd);
        start = nl + 1;
      }
      s.partial.erase(0, start);
      // A line without newline that grows without bound is emitted in pieces.
      if (s.partial.size() > kMaxLineBytes) {
        emit_line(s.partial, s.out_fd);
        s.partial.clear();
      }
      got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    close_stream(s);  // EOF or error
    break;
  }
  destination(s.out_fd).flush_some();
}

void OutputRelay::close_stream(Stream& s) {
  if (!s.partial.empty()) {
    emit_line(s.partial, s.out_fd);
    destination(s.out_fd).flush_some();
  }
  s.partial.clear();
  if (s.fd >= 0) close(s.fd);
  s.fd = -1;
}

void OutputRelay::close_all() {
  close_stream(out_);
  close_stream(err_);
}

}  // namespace tessera::launcher
