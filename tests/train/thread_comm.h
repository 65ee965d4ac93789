// A test-only Communicator over threads of one process (fp32 Sum/Max
// all-reduce, all-gather, reduce-scatter, split, barrier), used to run many
// ranks' trainers in one test process. The async variants complete before
// returning. Reductions sum in rank order. Not a transport: no timeouts
// beyond a generous deadline that fails the test instead of hanging.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/communicator.h"

namespace tessera::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), send_(size), colors_(size), keys_(size) {}
  int size() const { return size_; }
  void barrier() {
    std::unique_lock<std::mutex> lk(mu_);
    uint64_t gen = gen_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lk, std::chrono::seconds(120), [&] { return gen_ != gen; }))
      throw TimeoutError("ThreadGroup barrier timed out");
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int size_, arrived_ = 0;
  uint64_t gen_ = 0;
  std::vector<const void*> send_;
  std::vector<int> colors_, keys_;
  std::map<int, std::shared_ptr<ThreadGroup>> children_;
};

class ThreadComm : public coll::Communicator {
 public:
  ThreadComm(std::shared_ptr<ThreadGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  const coll::CommOptions& options() const override { return opts_; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype, coll::ReduceOp op) override {
    TESSERA_CHECK(dtype == DType::F32, "ThreadComm: f32 only");
    exchange(send, [&](const std::vector<const float*>& in) {
      tmp_.assign(count, 0.f);
      for (size_t i = 0; i < count; ++i) {
        float v = in[0][i];
        for (size_t r = 1; r < in.size(); ++r) v = (op == coll::ReduceOp::Max) ? std::max(v, in[r][i]) : v + in[r][i];
        tmp_[i] = v;
      }
    });
    std::memcpy(recv, tmp_.data(), count * 4);
    g_->barrier();
  }
  void all_gather(const void* send, void* recv, size_t count, DType) override {
    exchange(send, [&](const std::vector<const float*>& in) {
      tmp_.resize(count * in.size());
      for (size_t r = 0; r < in.size(); ++r) std::memcpy(tmp_.data() + r * count, in[r], count * 4);
    });
    std::memcpy(recv, tmp_.data(), tmp_.size() * 4);
    g_->barrier();
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType, coll::ReduceOp) override {
    exchange(send, [&](const std::vector<const float*>& in) {
      tmp_.assign(count, 0.f);
      for (size_t i = 0; i < count; ++i) {
        float v = in[0][rank_ * count + i];
        for (size_t r = 1; r < in.size(); ++r) v += in[r][rank_ * count + i];
        tmp_[i] = v;
      }
    });
    std::memcpy(recv, tmp_.data(), count * 4);
    g_->barrier();
  }
  void broadcast(void*, size_t, DType, int) override { unsupported(); }
  void reduce(const void*, void*, size_t, DType, coll::ReduceOp, int) override { unsupported(); }
  void all_to_all(const void*, void*, size_t, DType) override { unsupported(); }
  void send(const void*, size_t, DType, int, uint32_t) override { unsupported(); }
  void recv(void*, size_t, DType, int, uint32_t) override { unsupported(); }
  void barrier() override { g_->barrier(); }

  std::shared_ptr<coll::Work> all_reduce_async(const void* s, void* r, size_t n, DType t, coll::ReduceOp op) override {
    all_reduce(s, r, n, t, op);
    return std::make_shared<Done>();
  }
  std::shared_ptr<coll::Work> reduce_scatter_async(const void* s, void* r, size_t n, DType t,
                                                   coll::ReduceOp op) override {
    reduce_scatter(s, r, n, t, op);
    return std::make_shared<Done>();
  }
  std::shared_ptr<coll::Work> all_gather_async(const void* s, void* r, size_t n, DType t) override {
    all_gather(s, r, n, t);
    return std::make_shared<Done>();
  }
  std::shared_ptr<coll::Communicator> split(int color, int key, const std::string&) override {
    g_->colors_[rank_] = color;
    g_->keys_[rank_] = key;
    g_->barrier();
    std::vector<std::pair<int, int>> members;  // (key, rank)
    for (int r = 0; r < size(); ++r)
      if (g_->colors_[r] == color) members.push_back({g_->keys_[r], r});
    std::sort(members.begin(), members.end());
    int my = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].second == rank_) my = static_cast<int>(i);
    if (my == 0) {
      std::lock_guard<std::mutex> lk(g_->mu_);
      g_->children_[color] = std::make_shared<ThreadGroup>(static_cast<int>(members.size()));
    }
    g_->barrier();
    std::shared_ptr<ThreadGroup> child;
    {
      std::lock_guard<std::mutex> lk(g_->mu_);
      child = g_->children_[color];
    }
    g_->barrier();
    if (rank_ == 0) {
      std::lock_guard<std::mutex> lk(g_->mu_);
      g_->children_.clear();
    }
    g_->barrier();
    return std::make_shared<ThreadComm>(child, my);
  }
  void abort(const std::string&) override {}
  bool aborted() const override { return false; }
  double last_modeled_seconds() const override { return 0; }
  double total_modeled_seconds() const override { return 0; }
  std::string last_algorithm() const override { return "thread"; }

 private:
  struct Done : coll::Work {
    void wait() override {}
    bool done() const override { return true; }
  };
  [[noreturn]] static void unsupported() { throw InternalError("ThreadComm: unsupported collective"); }
  template <typename F>
  void exchange(const void* send, F&& compute) {
    g_->send_[rank_] = send;
    g_->barrier();
    std::vector<const float*> in(size());
    for (int r = 0; r < size(); ++r) in[r] = static_cast<const float*>(g_->send_[r]);
    compute(in);
    g_->barrier();
  }
  std::shared_ptr<ThreadGroup> g_;
  int rank_;
  coll::CommOptions opts_;
  std::vector<float> tmp_;
};

}  // namespace tessera::testing
