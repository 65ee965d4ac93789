// BackgroundWriter: buffered appends to FileSinks (runtime/files.h), written
// by one background thread, so that the sinks' work (SHA-256 and the write
// system calls) overlaps the caller's reading and copying. `tessera ckpt`
// streams every output through it.
//
// Memory is fixed at construction: `buffers` buffers of `buffer_bytes` each.
// An output holds at most one partly filled buffer; a full one is queued and
// the caller takes a free buffer, waiting while all are queued (so the
// caller never runs more than the pool ahead of the disk).
//
// Threads: one caller thread uses the object (add, write, zeros, drain);
// the background thread only calls FileSink::write, in the order the caller
// wrote, one sink at a time. The sinks must outlive the writer or the last
// drain(): create the writer inside the write_file_atomic callback, so that
// on an exception its destructor stops the thread before the temp file is
// closed and removed.
//
// Errors: an exception in the background thread (IoError from a sink) is
// rethrown, unchanged, by the caller's next write, zeros or drain; queued
// bytes are dropped then. A wait longer than kStallTimeout (the disk made no
// progress) throws Error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/files.h"

namespace tessera::parallel::checkpoint {

class BackgroundWriter {
 public:
  static constexpr std::chrono::seconds kStallTimeout{600};

  BackgroundWriter(size_t buffers, size_t buffer_bytes);
  ~BackgroundWriter();  // stops the thread after the write in progress; queued bytes are dropped
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // A new output appending to `sink`; returns its index for write and zeros.
  size_t add(FileSink* sink);
  void write(size_t out, const void* data, size_t bytes);
  void zeros(size_t out, size_t bytes);
  // Queues every partial buffer and waits until the thread has written
  // everything; then the outputs are forgotten (add starts again at 0).
  void drain();

 private:
  struct Buf {
    std::unique_ptr<char[]> data;
    size_t used = 0;
  };
  struct Job {
    FileSink* sink;
    Buf* buf;
  };
  Buf* take(std::unique_lock<std::mutex>& lock);
  void queue(size_t out, std::unique_lock<std::mutex>& lock);
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred pred);
  void run();

  const size_t cap_;
  std::vector<std::unique_ptr<Buf>> all_;
  std::vector<Buf*> free_;
  std::deque<Job> jobs_;
  std::vector<std::pair<FileSink*, Buf*>> outs_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false, busy_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace tessera::parallel::checkpoint
