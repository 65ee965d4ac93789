// BackgroundWriter: buffered appends to FileSinks (runtime/files.h), hashed
// and written by two background threads, so that the SHA-256 of the output
// (one thread) and the write system calls (the other) overlap each other
// and the caller's reading and copying. `tessera ckpt` streams every output
// through it.
//
// Memory is fixed at construction: `buffers` buffers of `buffer_bytes` each
// (4 KiB-aligned and touched once, so an O_DIRECT sink writes them as they
// are). An output holds at most one partly filled buffer; a full one is
// queued and the caller takes a free buffer, waiting while all are queued
// (so the caller never runs more than the pool ahead of the disk).
//
// Threads: one caller thread uses the object (add, write, zeros, drain,
// digest); the hash thread updates each hashed output's SHA-256 and the
// write thread calls FileSink::write, both in the order the caller wrote.
// The sinks must outlive the writer or the last drain(): create the writer
// inside the write_file_atomic callback, so that on an exception its
// destructor stops the threads before the temp file is closed and removed.
//
// Errors: an exception in a background thread (IoError from a sink) is
// rethrown, unchanged, by the caller's next write, zeros or drain; queued
// bytes are dropped then. A wait longer than kStallTimeout (the disk made no
// progress) throws Error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
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
  // hash: the writer computes the SHA-256 of its bytes (digest() after drain()).
  size_t add(FileSink* sink, bool hash = false);
  void write(size_t out, const void* data, size_t bytes);
  void zeros(size_t out, size_t bytes);
  // Queues every partial buffer and waits until the threads have written
  // everything; then the outputs are forgotten (add starts again at 0).
  void drain();
  // After drain(): the SHA-256 (hex) of hashed output `out` of the drained set.
  const std::string& digest(size_t out) const { return digests_.at(out); }

 private:
  struct Buf {
    char* data = nullptr;  // aligned_alloc'd, cap_ bytes
    size_t used = 0;
    ~Buf() { std::free(data); }
  };
  struct Out {
    FileSink* sink;
    std::unique_ptr<Sha256> sha;
    Buf* buf = nullptr;
  };
  struct Job {
    Out* out;
    Buf* buf;
  };
  Buf* take(std::unique_lock<std::mutex>& lock);
  void queue(size_t out, std::unique_lock<std::mutex>& lock);
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred pred);
  void run(bool hasher);
  void fail(const std::exception_ptr& err);

  const size_t cap_;
  std::vector<std::unique_ptr<Buf>> all_;
  std::vector<Buf*> free_;
  std::deque<Job> to_hash_, to_write_;
  std::deque<std::unique_ptr<Out>> outs_;  // stable addresses: jobs point at them
  std::vector<std::string> digests_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  int busy_ = 0;  // background threads inside a job
  std::exception_ptr error_;
  std::thread hash_thread_, write_thread_;
};

}  // namespace tessera::parallel::checkpoint
