// Store: the key-value rendezvous the collectives bootstrap through.
//
// Transports publish their endpoints (shared-memory names, TCP addresses)
// under keys and read their peers'. The collectives only define this
// interface; the launcher's gRPC client implements it for real jobs,
// FileStore serves processes on one host that share a directory (tests,
// `tessera bench -r N`), and an in-memory store serves threads.
//
// All methods are thread-safe. Waits take a timeout and throw TimeoutError
// naming the missing keys; AbortedError when the job was aborted.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::collectives {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists (or timeout), then returns its value.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Blocks until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to the integer stored at key (missing = 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

// A view of a store that prefixes every key, so sub-communicators and
// successive jobs never collide.
class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix) : base_(std::move(base)), prefix_(std::move(prefix)) {}
  void set(const std::string& k, const std::string& v) override { base_->set(prefix_ + k, v); }
  std::string get(const std::string& k, std::chrono::milliseconds t) override { return base_->get(prefix_ + k, t); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    std::vector<std::string> p;
    p.reserve(keys.size());
    for (const auto& k : keys) p.push_back(prefix_ + k);
    base_->wait(p, t);
  }
  int64_t add(const std::string& k, int64_t d) override { return base_->add(prefix_ + k, d); }

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

// Processes on one host sharing a directory: one file per key, written with
// write_file_atomic (runtime/files.h), so a reader sees a whole value or
// none; waits poll with a sleeping backoff.
std::shared_ptr<Store> make_file_store(const std::string& directory);
// Threads of one process.
std::shared_ptr<Store> make_memory_store();

}  // namespace tessera::collectives
