#include "parallel/checkpoint/background_writer.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "runtime/error.h"

namespace tessera::parallel::checkpoint {

namespace {
constexpr size_t kAlign = 4096;  // what an O_DIRECT sink needs of a buffer
}

BackgroundWriter::BackgroundWriter(size_t buffers, size_t buffer_bytes)
    : cap_((std::max<size_t>(buffer_bytes, kAlign) + kAlign - 1) / kAlign * kAlign) {
  TESSERA_ARG_CHECK(buffers >= 1, "BackgroundWriter needs at least one buffer");
  for (size_t i = 0; i < buffers; ++i) {
    all_.push_back(std::make_unique<Buf>());
    all_.back()->data = static_cast<char*>(std::aligned_alloc(kAlign, cap_));
    if (!all_.back()->data) throw std::bad_alloc();
    std::memset(all_.back()->data, 0, cap_);  // resident from the start
    free_.push_back(all_.back().get());
  }
  hash_thread_ = std::thread([this] { run(true); });
  write_thread_ = std::thread([this] { run(false); });
}

BackgroundWriter::~BackgroundWriter() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  hash_thread_.join();
  write_thread_.join();
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
  Out& o = *outs_[out];
  to_hash_.push_back({&o, o.buf});
  o.buf = nullptr;
  cv_.notify_all();
}

size_t BackgroundWriter::add(FileSink* sink, bool hash) {
  auto o = std::make_unique<Out>();
  o->sink = sink;
  if (hash) o->sha = std::make_unique<Sha256>();
  outs_.push_back(std::move(o));
  return outs_.size() - 1;
}

void BackgroundWriter::write(size_t out, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    Buf*& b = outs_[out]->buf;
    if (!b) {
      std::unique_lock<std::mutex> lock(m_);
      b = take(lock);
    }
    const size_t n = std::min(bytes, cap_ - b->used);
    std::memcpy(b->data + b->used, p, n);
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
    Buf*& b = outs_[o]->buf;
    if (b && b->used > 0) {
      queue(o, lock);
    } else if (b) {
      free_.push_back(b);
      b = nullptr;
    }
  }
  wait(lock, [&] { return to_hash_.empty() && to_write_.empty() && busy_ == 0; });
  digests_.clear();
  for (auto& o : outs_) digests_.push_back(o->sha ? o->sha->hex_digest() : std::string());
  outs_.clear();
}

void BackgroundWriter::fail(const std::exception_ptr& err) {  // with m_ held
  if (!error_) error_ = err;
  for (const Job& q : to_hash_) free_.push_back(q.buf);
  for (const Job& q : to_write_) free_.push_back(q.buf);
  to_hash_.clear();
  to_write_.clear();
}

// The hash thread takes jobs in order and passes them to the write thread,
// which writes them in order: each output's bytes are hashed and written in
// the order the caller wrote them, the hash of one buffer overlapping the
// write of the one before.
void BackgroundWriter::run(bool hasher) {
  std::deque<Job>& in = hasher ? to_hash_ : to_write_;
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!in.empty() && !error_); });  // woken by the owner; no timeout needed
    if (stop_) return;
    Job j = in.front();
    in.pop_front();
    ++busy_;
    lock.unlock();
    std::exception_ptr err;
    try {
      if (hasher) {
        if (j.out->sha) j.out->sha->update(j.buf->data, j.buf->used);
      } else {
        j.out->sink->write(j.buf->data, j.buf->used);
      }
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    --busy_;
    if (err) {
      free_.push_back(j.buf);
      fail(err);
    } else if (hasher && !error_) {
      to_write_.push_back(j);
    } else if (hasher) {
      free_.push_back(j.buf);
    } else {
      j.buf->used = 0;
      free_.push_back(j.buf);
    }
    cv_.notify_all();
  }
}

}  // namespace tessera::parallel::checkpoint
