// The Communicator over a Transport: argument checks, dtype widening
// (bf16/f16 reduce in an f32 workspace), Avg, algorithm selection with
// fallback, modeled time, error translation, the async progress thread and
// split().
#include "collectives/comm_impl.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "collectives/algorithms.h"
#include "collectives/coll_cost.h"
#include "collectives/host.h"
#include "collectives/reduce.h"
#include "runtime/device.h"

namespace tessera::collectives {

namespace {

constexpr uint32_t kP2PTagBit = 0x80000000u;

class AsyncWork final : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool done() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
  }
  double modeled_seconds() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return modeled_;
  }
  void finish(std::exception_ptr e, double modeled) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
      error_ = std::move(e);
      modeled_ = modeled;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  double modeled_ = 0;
  std::exception_ptr error_;
};

class TransportCommunicator final : public Communicator {
 public:
  TransportCommunicator(std::shared_ptr<Store> store, std::unique_ptr<Transport> transport, CommOptions options)
      : store_(std::move(store)), transport_(std::move(transport)), options_(std::move(options)) {
    rank_ = transport_->rank();
    size_ = transport_->size();
    std::vector<int> nodes;
    if (options_.net.dims().empty()) {
      for (int i = 0; i < size_; ++i) nodes.push_back(i);
    } else {
      nodes = options_.world_ranks;
      for (int n : nodes)
        TESSERA_ARG_CHECK(n >= 0 && n < options_.net.num_nodes(), "group '", options_.name, "': world rank ", n,
                          " is not a node of the modeled interconnect (", options_.net.num_nodes(), " nodes)");
    }
    // The one link model, as the planner builds it (collectives/coll_cost.h).
    const HostMap* hosts = transport_->hosts();
    group_ = group_cost_model(options_.net, nodes, transport_->shared_memory() != nullptr, hosts, rank_,
                              transport_->host_shared_memory() != nullptr);
    multi_dim_ = group_.torus.valid && group_.torus.extent.size() >= 2;
    hosts_ = host_levels(hosts, rank_);
    // Validate a forced algorithm name now rather than at the first call.
    Algorithm* tmp[kMaxCandidates];
    algorithm_candidates(CollKind::AllReduce, 0, false, false, options_.algo, tmp);
  }

  ~TransportCommunicator() override {
    {
      std::lock_guard<std::mutex> lk(q_mu_);
      stop_ = true;
    }
    q_cv_.notify_all();
    if (progress_.joinable()) progress_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const CommOptions& options() const override { return options_; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    check_buf(send, count, "all_reduce send");
    check_buf(recv, count, "all_reduce recv");
    blocking(CollKind::AllReduce, send, recv, count, dtype, op, 0);
  }
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    check_buf(send, count, "all_gather send");
    check_buf(recv, count, "all_gather recv");
    blocking(CollKind::AllGather, send, recv, count, dtype, ReduceOp::Sum, 0);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    check_buf(send, count, "reduce_scatter send");
    check_buf(recv, count, "reduce_scatter recv");
    blocking(CollKind::ReduceScatter, send, recv, count, dtype, op, 0);
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    check_root(root, "broadcast");
    check_buf(buf, count, "broadcast buffer");
    blocking(CollKind::Broadcast, buf, buf, count, dtype, ReduceOp::Sum, root);
  }
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) override {
    check_root(root, "reduce");
    check_buf(send, count, "reduce send");
    if (rank_ == root) check_buf(recv, count, "reduce recv (on root)");
    blocking(CollKind::Reduce, send, recv, count, dtype, op, root);
  }
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    check_buf(send, count, "all_to_all send");
    check_buf(recv, count, "all_to_all recv");
    blocking(CollKind::AllToAll, send, recv, count, dtype, ReduceOp::Sum, 0);
  }
  void barrier() override { blocking(CollKind::Barrier, nullptr, nullptr, 0, DType::F32, ReduceOp::Sum, 0); }

  void send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) override {
    p2p(true, const_cast<void*>(buf), count, dtype, peer, tag);
  }
  void recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) override {
    p2p(false, buf, count, dtype, peer, tag);
  }
  void sendrecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count, int src, DType dtype,
                uint32_t tag) override {
    check_peer(dst, "sendrecv", tag);
    check_peer(src, "sendrecv", tag);
    check_buf(send, send_count, "sendrecv send");
    check_buf(recv, recv_count, "sendrecv recv");
    drain();
    guarded("sendrecv", [&] {
      const size_t es = dtype_size(dtype), sb = send_count * es, rb = recv_count * es;
      transport_->sendrecv(dst, send, sb, src, recv, rb, tag | kP2PTagBit);
      record("p2p", std::max(p2p_seconds(group_, rank_, dst, static_cast<double>(sb)),
                             p2p_seconds(group_, src, rank_, static_cast<double>(rb))));
    });
  }
  std::shared_ptr<Work> all_reduce_async(const void* send, void* recv, size_t count, DType dtype,
                                         ReduceOp op) override {
    check_buf(send, count, "all_reduce send");
    check_buf(recv, count, "all_reduce recv");
    return submit(CollKind::AllReduce, send, recv, count, dtype, op);
  }
  std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count, DType dtype,
                                             ReduceOp op) override {
    check_buf(send, count, "reduce_scatter send");
    check_buf(recv, count, "reduce_scatter recv");
    return submit(CollKind::ReduceScatter, send, recv, count, dtype, op);
  }
  std::shared_ptr<Work> all_gather_async(const void* send, void* recv, size_t count, DType dtype) override {
    check_buf(send, count, "all_gather send");
    check_buf(recv, count, "all_gather recv");
    return submit(CollKind::AllGather, send, recv, count, dtype, ReduceOp::Sum);
  }

  std::shared_ptr<Work> send_async(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) override {
    check_peer(peer, "send", tag);
    check_buf(buf, count, "send");
    return submit(CollKind::Barrier, buf, nullptr, count, dtype, ReduceOp::Sum, peer, tag);
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    std::vector<int64_t> mine = {color, key}, all(2 * static_cast<size_t>(size_));
    blocking(CollKind::AllGather, mine.data(), all.data(), 2, DType::I64, ReduceOp::Sum, 0);
    const int seq = split_seq_++;
    if (color < 0) return nullptr;
    std::vector<std::pair<int64_t, int>> members;
    for (int r = 0; r < size_; ++r) {
      const size_t i = 2 * static_cast<size_t>(r);
      if (all[i] == color) members.emplace_back(all[i + 1], r);
    }
    std::sort(members.begin(), members.end());
    CommOptions sub = options_;
    sub.name = name.empty() ? options_.name + "/" + std::to_string(color) : name;
    sub.world_ranks.clear();
    int new_rank = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      sub.world_ranks.push_back(options_.world_ranks[members[i].second]);
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
    }
    auto store =
        std::make_shared<PrefixStore>(store_, "split/" + std::to_string(seq) + "/" + std::to_string(color) + "/");
    const int new_size = static_cast<int>(members.size());
    std::unique_ptr<Transport> t;
    try {
      t = make_transport(options_.transport, store, new_rank, new_size, sub);
    } catch (const TransportError& e) {
      const auto kind = collective_error_kind(e.kind());
      throw CollectiveError(kind,
                            "split of group '" + options_.name + "' into '" + sub.name + "' failed (" +
                                collective_error_kind_name(kind) + "): " + e.what(),
                            "split", sub.name, e.peer());
    }
    return make_transport_communicator(store, std::move(t), std::move(sub));
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lk(abort_mu_);
      if (aborted_.load()) return;
      abort_reason_ = reason;
      aborted_.store(true);
    }
    transport_->abort(reason);
    q_cv_.notify_all();
  }
  bool aborted() const override { return aborted_.load(); }

  double last_modeled_seconds() const override { return last_model_.load(); }
  double total_modeled_seconds() const override { return total_model_.load(); }
  std::string last_algorithm() const override { return last_algo_.load(); }
  std::string transport() const override { return transport_->name(); }

 private:
  void check_buf(const void* p, size_t count, const char* what) const {
    TESSERA_ARG_CHECK(p != nullptr || count == 0, what, " buffer is null on rank ", rank_, " of group '", options_.name,
                      "'");
  }
  void check_root(int root, const char* what) const {
    TESSERA_ARG_CHECK(root >= 0 && root < size_, what, ": root ", root, " out of range for group '", options_.name,
                      "' of size ", size_);
  }

  std::string where(const char* coll) const {
    return detail::concat(coll, " on group '", options_.name, "' (rank ", rank_, " of ", size_, ")");
  }

  [[noreturn]] void throw_aborted(const char* coll) const {
    std::lock_guard<std::mutex> lk(abort_mu_);
    throw AbortedError(where(coll) + " aborted: " + abort_reason_);
  }

  // Runs `fn` with transport errors translated; later calls fail at once.
  template <typename Fn>
  void guarded(const char* coll, const Fn& fn) {
    if (aborted_.load()) throw_aborted(coll);
    if (failed_)
      throw CollectiveError(fail_kind_,
                            where(coll) + " failed (" + collective_error_kind_name(fail_kind_) +
                                "): communicator already failed: " + fail_what_,
                            coll, options_.name, fail_peer_);
    try {
      fn();
    } catch (const TransportError& e) {
      if (e.kind() == TransportError::Kind::Aborted && aborted_.load()) throw_aborted(coll);
      failed_ = true;
      fail_kind_ = collective_error_kind(e.kind());
      fail_what_ = e.what();
      fail_peer_ = e.peer();
      throw CollectiveError(fail_kind_,
                            where(coll) + " failed (" + collective_error_kind_name(fail_kind_) + "): " + e.what(), coll,
                            options_.name, e.peer());
    }
  }

  void blocking(CollKind kind, const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) {
    drain();
    execute(kind, send, recv, count, dtype, op, root);
  }

  void execute(CollKind kind, const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) {
    const char* coll = coll_kind_name(kind);
    guarded(coll, [&] {
      AlgoContext ctx;
      ctx.transport = transport_.get();
      ctx.rank = rank_;
      ctx.size = size_;
      ctx.tag = (++seq_) & ~kP2PTagBit;
      ctx.torus = &group_.torus;
      ctx.ws = &ws_;
      ctx.hosts = &hosts_;
      ctx.group = &group_;
      const bool reducing = kind == CollKind::AllReduce || kind == CollKind::ReduceScatter || kind == CollKind::Reduce;
      const ReduceOp kop = op == ReduceOp::Avg ? ReduceOp::Sum : op;
      CollCall call{kind, send, recv, count, dtype, kop, root};
      const bool widen = reducing && !kernel_dtype(dtype);
      // Output elements this rank receives (0 for non-roots of reduce).
      const size_t out_n = (kind == CollKind::Reduce && rank_ != root) ? 0 : count;
      if (widen) {
        const size_t in_n = kind == CollKind::ReduceScatter ? count * static_cast<size_t>(size_) : count;
        auto* a = static_cast<float*>(wide_in_.get(in_n * 4));
        if (in_n) convert(send, dtype, a, DType::F32, in_n);
        call.send = a;
        call.recv = kind == CollKind::AllReduce ? a : wide_out_.get(count * 4);
        call.dtype = DType::F32;
      }
      const size_t bytes = count * dtype_size(call.dtype);
      Algorithm* cands[kMaxCandidates];
      const int n = algorithm_candidates(kind, bytes, multi_dim_, hosts_.valid, options_.algo, cands, &group_,
                                         dtype_size(call.dtype));
      const char* served = nullptr;
      for (int i = 0; i < n && !served; ++i)
        if (cands[i]->run(ctx, call)) served = cands[i]->name();
      TESSERA_CHECK(served != nullptr, "no algorithm served ", coll);
      if (op == ReduceOp::Avg && out_n) divide(call.recv, out_n, call.dtype, size_);
      if (widen && out_n) convert(call.recv, DType::F32, recv, dtype, out_n);
      record(served, ctx.model);
    });
  }

  void record(const char* algo, double model) {
    // Relaxed: statistics, and seq_cst stores would drain the store buffer.
    last_algo_.store(algo, std::memory_order_relaxed);
    last_model_.store(model, std::memory_order_relaxed);
    total_model_.store(total_model_.load(std::memory_order_relaxed) + model, std::memory_order_relaxed);
    if (options_.device) options_.device->clock().charge_comm(model);
  }

  void check_peer(int peer, const char* coll, uint32_t tag) const {
    TESSERA_ARG_CHECK(peer >= 0 && peer < size_ && peer != rank_, coll, ": peer ", peer, " invalid for rank ", rank_,
                      " of group '", options_.name, "' (size ", size_, ")");
    TESSERA_ARG_CHECK((tag & kP2PTagBit) == 0, coll, ": tag ", tag, " must be below 2^31");
  }

  void p2p(bool is_send, void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
    const char* coll = is_send ? "send" : "recv";
    check_peer(peer, coll, tag);
    check_buf(buf, count, coll);
    drain();
    p2p_run(is_send, buf, count, dtype, peer, tag);
  }

  // On the calling thread once drained, or on the progress thread (send_async).
  void p2p_run(bool is_send, void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
    const char* coll = is_send ? "send" : "recv";
    guarded(coll, [&] {
      const size_t bytes = count * dtype_size(dtype);
      if (is_send)
        transport_->send(peer, tag | kP2PTagBit, buf, bytes);
      else
        transport_->recv(peer, tag | kP2PTagBit, buf, bytes);
      record("p2p", p2p_seconds(group_, is_send ? rank_ : peer, is_send ? peer : rank_, static_cast<double>(bytes)));
    });
  }

  // ---- async: one progress thread per communicator, FIFO ----
  struct Task {
    CollKind kind;
    const void* send;
    void* recv;
    size_t count;
    DType dtype;
    ReduceOp op;
    std::shared_ptr<AsyncWork> work;
    int peer = -1;  // >= 0: a send_async to this peer (kind unused)
    uint32_t tag = 0;
  };

  std::shared_ptr<Work> submit(CollKind kind, const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                               int peer = -1, uint32_t tag = 0) {
    auto w = std::make_shared<AsyncWork>();
    {
      std::lock_guard<std::mutex> lk(q_mu_);
      if (!progress_.joinable()) progress_ = std::thread([this] { progress_loop(); });
      queue_.push_back(Task{kind, send, recv, count, dtype, op, w, peer, tag});
      pending_.fetch_add(1, std::memory_order_relaxed);
    }
    q_cv_.notify_all();
    return w;
  }

  void progress_loop() {
    for (;;) {
      Task t;
      bool stopping;
      {
        std::unique_lock<std::mutex> lk(q_mu_);
        q_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        t = std::move(queue_.front());
        queue_.pop_front();
        stopping = stop_;
      }
      std::exception_ptr err;
      double modeled = 0;
      if (stopping) {
        err = std::make_exception_ptr(
            AbortedError(where(t.peer >= 0 ? "send" : coll_kind_name(t.kind)) + ": communicator destroyed"));
      } else {
        try {
          if (t.peer >= 0)
            p2p_run(true, const_cast<void*>(t.send), t.count, t.dtype, t.peer, t.tag);
          else
            execute(t.kind, t.send, t.recv, t.count, t.dtype, t.op, 0);
          modeled = last_model_.load(std::memory_order_relaxed);  // this call's (this thread recorded it)
        } catch (...) {
          err = std::current_exception();
        }
      }
      t.work->finish(err, modeled);
      {
        std::lock_guard<std::mutex> lk(q_mu_);
        pending_.fetch_sub(1, std::memory_order_release);
      }
      q_cv_.notify_all();
    }
  }

  // Blocking calls run after every async call issued before them.
  void drain() {
    if (pending_.load(std::memory_order_acquire) == 0) return;  // no lock: the common case
    std::unique_lock<std::mutex> lk(q_mu_);
    q_cv_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }

  std::shared_ptr<Store> store_;
  std::unique_ptr<Transport> transport_;
  CommOptions options_;
  int rank_ = 0, size_ = 1;
  GroupCostModel group_;  // the group as its algorithms' costs see it
  bool multi_dim_ = false;
  HostLevels hosts_;

  uint32_t seq_ = 0;
  int split_seq_ = 0;
  Workspace ws_, wide_in_, wide_out_;
  bool failed_ = false;
  std::string fail_what_;
  CollectiveError::Kind fail_kind_ = CollectiveError::Kind::Protocol;
  int fail_peer_ = -1;

  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mu_;
  std::string abort_reason_;

  std::atomic<const char*> last_algo_{""};
  std::atomic<double> last_model_{0}, total_model_{0};

  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::deque<Task> queue_;
  // Async calls submitted and not finished. Only the calling thread submits
  // (docs/threads.md), so once it reads 0 here the progress thread is idle
  // until its next submit: calls on the transport never overlap, with no
  // lock per call (a locked instruction would wait for the stores of the
  // previous call's messages to leave the store buffer).
  std::atomic<int> pending_{0};
  bool stop_ = false;
  std::thread progress_;
};

}  // namespace

std::shared_ptr<Communicator> make_transport_communicator(std::shared_ptr<Store> store,
                                                          std::unique_ptr<Transport> transport, CommOptions options) {
  return std::make_shared<TransportCommunicator>(std::move(store), std::move(transport), std::move(options));
}

}  // namespace tessera::collectives
