#include "parallel/checkpoint/background_writer.h"

#include <algorithm>
#include <cstring>

#include "runtime/error.h"

namespace tessera::parallel::checkpoint {

BackgroundWriter::BackgroundWriter(size_t buffers, size_t buffer_bytes) : cap_(std::max<size_t>(buffer_bytes, 4096)) {
  TESSERA_ARG_CHECK(buffers >= 1, "BackgroundWriter needs at least one buffer");
  for (size_t i = 0; i < buffers; ++i) {
    all_.push_back(std::make_unique<Buf>());
    all_.back()->data = std::make_unique<char[]>(cap_);  // zeroed: the memory is resident from the start
    free_.push_back(all_.back().get());
  }
  thread_ = std::thread([this] { run(); });
}

BackgroundWriter::~BackgroundWriter() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

template <typename Pred>
void BackgroundWriter::wait(std::unique_lock<std::mutex>& lock, Pred pred) {
  if (!cv_.wait_for(lock, kStallTimeout, [&] { return error_ || pred(); }))
    throw Error(
        detail::concat("tessera ckpt: the output made no progress for ", kStallTimeout.count(), " s (disk stalled?)"));
  if (error_) std::rethrow_exception(error_);
}

BackgroundWriter::Buf* BackgroundWriter::take(std::unique_lock<std::mutex>& lock) {
  wait(lock, [&] { return !free_.empty(); });
  Buf* b = free_.back();
  free_.pop_back();
  b->used = 0;
  return b;
}

void BackgroundWriter::queue(size_t out, std::unique_lock<std::mutex>&) {
  auto& o = outs_[out];
  jobs_.push_back({o.first, o.second});
  o.second = nullptr;
  cv_.notify_all();
}

size_t BackgroundWriter::add(FileSink* sink) {
  outs_.emplace_back(sink, nullptr);
  return outs_.size() - 1;
}

void BackgroundWriter::write(size_t out, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    Buf*& b = outs_[out].second;
    if (!b) {
      std::unique_lock<std::mutex> lock(m_);
      b = take(lock);
    }
    const size_t n = std::min(bytes, cap_ - b->used);
    std::memcpy(b->data.get() + b->used, p, n);
    b->used += n;
    p += n;
    bytes -= n;
    if (b->used == cap_) {
      std::unique_lock<std::mutex> lock(m_);
      queue(out, lock);
    }
  }
}

void BackgroundWriter::zeros(size_t out, size_t bytes) {
  static const char kZeros[4096] = {};
  while (bytes > 0) {
    const size_t n = std::min(bytes, sizeof kZeros);
    write(out, kZeros, n);
    bytes -= n;
  }
}

void BackgroundWriter::drain() {
  std::unique_lock<std::mutex> lock(m_);
  for (size_t o = 0; o < outs_.size(); ++o) {
    if (outs_[o].second && outs_[o].second->used > 0) {
      queue(o, lock);
    } else if (outs_[o].second) {
      free_.push_back(outs_[o].second);
      outs_[o].second = nullptr;
    }
  }
  wait(lock, [&] { return jobs_.empty() && !busy_; });
  outs_.clear();
}

void BackgroundWriter::run() {
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!jobs_.empty() && !error_); });  // woken by the owner; no timeout needed
    if (stop_) return;
    Job j = jobs_.front();
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr err;
    try {
      j.sink->write(j.buf->data.get(), j.buf->used);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    j.buf->used = 0;
    free_.push_back(j.buf);
    if (err && !error_) {
      error_ = err;
      for (const Job& q : jobs_) free_.push_back(q.buf);
      jobs_.clear();
    }
    cv_.notify_all();
  }
}

}  // namespace tessera::parallel::checkpoint
