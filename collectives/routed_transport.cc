#include "collectives/routed_transport.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "collectives/host.h"
#include "collectives/shm/shm_transport.h"
#include "collectives/tcp/tcp_transport.h"
#include "runtime/log.h"

namespace tessera::collectives {

namespace {

using Kind = TransportError::Kind;

// One half of a split sendrecv, run on the helper thread.
struct HalfOp {
  bool is_send = false;
  int peer = -1;
  uint32_t tag = 0;
  const void* sbuf = nullptr;
  void* rbuf = nullptr;
  size_t bytes = 0;
  RecvSink* sink = nullptr;
};

class RoutedTransport;

// The shm half's SharedMemoryPeers as the group sees it: a failed publish
// round is recorded and translated like every other call (the TCP half is
// aborted, the peer named as a group rank on its host).
class HostPeers final : public SharedMemoryPeers {
 public:
  HostPeers(RoutedTransport& owner, SharedMemoryPeers& shm) : owner_(owner), shm_(shm) {}
  bool is_shared(const void* p, size_t bytes) const override { return shm_.is_shared(p, bytes); }
  void publish(const void* const* buffers, const size_t* sizes, int num_buffers, const void* inline_data,
               size_t inline_bytes) override;
  void* peer_buffer(int peer, int index) const override { return shm_.peer_buffer(peer, index); }
  const void* peer_inline(int peer) const override { return shm_.peer_inline(peer); }

 private:
  RoutedTransport& owner_;
  SharedMemoryPeers& shm_;
};

class RoutedTransport final : public Transport {
 public:
  friend class HostPeers;
  RoutedTransport(HostMap hosts, int rank, int size, std::string group, std::vector<int> local,
                  std::unique_ptr<Transport> shm, std::unique_ptr<Transport> tcp)
      : hosts_(std::move(hosts)),
        rank_(rank),
        size_(size),
        group_(std::move(group)),
        local_(std::move(local)),
        shm_(std::move(shm)),
        tcp_(std::move(tcp)) {
    local_index_.assign(size_, -1);
    if (shm_)
      for (size_t i = 0; i < local_.size(); ++i) local_index_[local_[i]] = static_cast<int>(i);
    name_ = shm_ ? "shm+tcp" : "tcp";
    if (shm_ && shm_->shared_memory()) host_peers_ = std::make_unique<HostPeers>(*this, *shm_->shared_memory());
  }

  ~RoutedTransport() override {
    if (helper_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(h_mu_);
        h_stop_ = true;
      }
      h_cv_.notify_all();
      helper_.join();
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return name_.c_str(); }

  void send(int peer, uint32_t tag, const void* buf, size_t bytes) override {
    check_peer(peer);
    run(
        on_shm(peer), [&](Transport& t, int p) { t.send(p, tag, buf, bytes); }, peer);
  }
  void recv(int peer, uint32_t tag, void* buf, size_t bytes) override {
    check_peer(peer);
    run(
        on_shm(peer), [&](Transport& t, int p) { t.recv(p, tag, buf, bytes); }, peer);
  }
  void recv_sink(int from, size_t bytes, RecvSink& sink, uint32_t tag) override {
    check_peer(from);
    run(
        on_shm(from), [&](Transport& t, int p) { t.recv_sink(p, bytes, sink, tag); }, from);
  }

  void sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes, uint32_t tag) override {
    check_peer(to);
    check_peer(from);
    if (on_shm(to) == on_shm(from)) {
      const bool s = on_shm(to);
      run(
          s, [&](Transport& t, int) { t.sendrecv(sub(s, to), sbuf, sbytes, sub(s, from), rbuf, rbytes, tag); }, from);
      return;
    }
    split(to, sbuf, sbytes, from, rbuf, rbytes, nullptr, tag);
  }

  void sendrecv_sink(int to, const void* sbuf, size_t sbytes, int from, size_t rbytes, RecvSink& sink,
                     uint32_t tag) override {
    check_peer(to);
    check_peer(from);
    if (on_shm(to) == on_shm(from)) {
      const bool s = on_shm(to);
      run(
          s, [&](Transport& t, int) { t.sendrecv_sink(sub(s, to), sbuf, sbytes, sub(s, from), rbytes, sink, tag); },
          from);
      return;
    }
    split(to, sbuf, sbytes, from, nullptr, rbytes, &sink, tag);
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (aborted_) return;
      aborted_ = true;
      abort_reason_ = reason;
    }
    if (shm_) shm_->abort(reason);
    tcp_->abort(reason);
  }
  bool aborted() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return aborted_;
  }
  const HostMap* hosts() const override { return &hosts_; }
  SharedMemoryPeers* host_shared_memory() override { return host_peers_ ? host_peers_.get() : nullptr; }

  bool peer_alive(int peer) const override {
    if (peer < 0 || peer >= size_ || peer == rank_) return true;
    return on_shm(peer) ? shm_->peer_alive(local_index_[peer]) : tcp_->peer_alive(peer);
  }

 private:
  void check_peer(int peer) const {
    TESSERA_ARG_CHECK(peer >= 0 && peer < size_ && peer != rank_, "transport of group '", group_, "': bad peer ", peer,
                      " for rank ", rank_, " of ", size_);
  }
  bool on_shm(int peer) const { return local_index_[peer] >= 0; }
  int sub(bool shm, int peer) const { return shm ? local_index_[peer] : peer; }
  Transport& via(bool shm) { return shm ? *shm_ : *tcp_; }

  // The error `e` of the shm (local ranks) or tcp half as this group sees it.
  TransportError translate(const TransportError& e, bool shm) const {
    const int peer = e.peer() < 0 ? -1 : (shm ? local_[e.peer()] : e.peer());
    std::string what = e.what();
    if (peer >= 0) what += " [rank " + std::to_string(peer) + " is on " + hosts_.describe(peer) + "]";
    return TransportError(e.kind(), peer, what);
  }

  // Records the first failure and aborts both halves, so the peers behind
  // the half that did not fail learn it at once. Returns the error to throw.
  TransportError record(const TransportError& e) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (aborted_ && !failed_) {
        failed_ = true;
        first_ = std::make_unique<TransportError>(Kind::Aborted, -1, "aborted: " + abort_reason_);
      }
      if (!failed_) {
        failed_ = true;
        first_ = std::make_unique<TransportError>(e);
        reason = detail::concat("rank ", rank_, " failed: ", e.what());
      }
    }
    if (!reason.empty()) {
      if (shm_) shm_->abort(reason);
      tcp_->abort(reason);
    }
    std::lock_guard<std::mutex> lk(mu_);
    return *first_;
  }

  void fail_fast() {
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_) throw *first_;
    if (aborted_) throw TransportError(Kind::Aborted, -1, "aborted: " + abort_reason_);
  }

  template <typename Fn>
  void run(bool shm, Fn fn, int peer) {
    fail_fast();
    try {
      fn(via(shm), sub(shm, peer));
    } catch (const TransportError& e) {
      throw record(translate(e, shm));
    }
  }

  // A sendrecv whose send and receive take different transports: the TCP
  // half runs on the helper thread while this thread does the shm half.
  void split(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes, RecvSink* sink,
             uint32_t tag) {
    fail_fast();
    const bool send_on_tcp = !on_shm(to);
    HalfOp tcp_half;
    tcp_half.tag = tag;
    if (send_on_tcp) {
      tcp_half.is_send = true;
      tcp_half.peer = to;
      tcp_half.sbuf = sbuf;
      tcp_half.bytes = sbytes;
    } else {
      tcp_half.peer = from;
      tcp_half.rbuf = rbuf;
      tcp_half.bytes = rbytes;
      tcp_half.sink = sink;
    }
    start_helper(tcp_half);
    std::exception_ptr mine;
    try {
      try {
        if (send_on_tcp) {
          if (sink)
            shm_->recv_sink(local_index_[from], rbytes, *sink, tag);
          else
            shm_->recv(local_index_[from], tag, rbuf, rbytes);
        } else {
          shm_->send(local_index_[to], tag, sbuf, sbytes);
        }
      } catch (const TransportError& e) {
        throw record(translate(e, true));  // also aborts tcp: the helper returns promptly
      }
    } catch (...) {
      mine = std::current_exception();
    }
    std::exception_ptr theirs = wait_helper();
    if (mine) std::rethrow_exception(mine);
    if (theirs) std::rethrow_exception(theirs);
  }

  void start_helper(const HalfOp& op) {
    std::lock_guard<std::mutex> lk(h_mu_);
    if (!helper_.joinable()) helper_ = std::thread([this] { helper_loop(); });
    h_op_ = op;
    h_has_ = true;
    h_done_ = false;
    h_err_ = nullptr;
    h_cv_.notify_all();
  }

  // Bounded: the TCP half waits at most the transport's timeout.
  std::exception_ptr wait_helper() {
    std::unique_lock<std::mutex> lk(h_mu_);
    h_cv_.wait(lk, [&] { return h_done_; });
    return h_err_;
  }

  void helper_loop() {
    for (;;) {
      HalfOp op;
      {
        std::unique_lock<std::mutex> lk(h_mu_);
        h_cv_.wait(lk, [&] { return h_stop_ || h_has_; });
        if (h_stop_) return;
        op = h_op_;
        h_has_ = false;
      }
      std::exception_ptr err;
      try {
        try {
          if (op.is_send)
            tcp_->send(op.peer, op.tag, op.sbuf, op.bytes);
          else if (op.sink)
            tcp_->recv_sink(op.peer, op.bytes, *op.sink, op.tag);
          else
            tcp_->recv(op.peer, op.tag, op.rbuf, op.bytes);
        } catch (const TransportError& e) {
          throw record(translate(e, false));  // also aborts shm: the caller's half returns promptly
        }
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(h_mu_);
        h_err_ = err;
        h_done_ = true;
      }
      h_cv_.notify_all();
    }
  }

  const HostMap hosts_;
  const int rank_, size_;
  const std::string group_;
  const std::vector<int> local_;  // this host's ranks; shm index -> group rank
  std::vector<int> local_index_;  // group rank -> shm index, -1 when reached over tcp
  std::string name_;
  std::unique_ptr<Transport> shm_;  // null when every link is tcp
  std::unique_ptr<Transport> tcp_;
  std::unique_ptr<HostPeers> host_peers_;

  mutable std::mutex mu_;
  bool aborted_ = false;
  std::string abort_reason_;
  bool failed_ = false;
  std::unique_ptr<TransportError> first_;

  // The helper thread (declared last: stopped before the transports go).
  std::mutex h_mu_;
  std::condition_variable h_cv_;
  HalfOp h_op_;
  bool h_has_ = false, h_done_ = false, h_stop_ = false;
  std::exception_ptr h_err_;
  std::thread helper_;
};

void HostPeers::publish(const void* const* buffers, const size_t* sizes, int num_buffers, const void* inline_data,
                        size_t inline_bytes) {
  owner_.fail_fast();
  try {
    shm_.publish(buffers, sizes, num_buffers, inline_data, inline_bytes);
  } catch (const TransportError& e) {
    throw owner_.record(owner_.translate(e, true));
  }
}

}  // namespace

std::unique_ptr<Transport> make_routed_transport(TransportKind kind, std::shared_ptr<Store> store, int rank, int size,
                                                 const CommOptions& options) {
  TESSERA_ARG_CHECK(kind == TransportKind::Auto || kind == TransportKind::Shm || kind == TransportKind::Tcp,
                    "make_routed_transport: transport ", transport_name(kind), " has no Transport");
  if (size == 1) return shm::create_transport(store, rank, size, options);
  HostMap hosts;
  try {
    hosts = exchange_hosts(*store, rank, size, options.timeout);
  } catch (const TimeoutError& e) {
    throw TransportError(Kind::Timeout, -1, "group '" + options.name + "': " + e.what());
  }
  const bool spans = hosts.num_hosts() > 1;
  spdlog::debug("group '{}' rank {} of {}: {} host(s), this rank on host '{}' with {} rank(s); transport {}",
                options.name, rank, size, hosts.num_hosts(), hosts.names[hosts.host_of[rank]],
                hosts.ranks_on(hosts.host_of[rank]).size(), transport_name(kind));
  // One host (a group across hosts, forced to shm, is refused by the shm transport).
  shm::ShmOptions whole;
  whole.oversubscribed = !spans && hosts.crowded(0);
  if (kind == TransportKind::Shm) return shm::create_transport(store, rank, size, options, whole);
  if (!spans) {
    if (kind == TransportKind::Tcp) return tcp::create_transport(std::move(store), rank, size, options);
    return shm::create_transport(store, rank, size, options, whole);
  }
  const int me = hosts.host_of[rank];
  std::vector<int> local = hosts.ranks_on(me);
  std::unique_ptr<Transport> shm;
  if (kind == TransportKind::Auto && local.size() > 1) {
    int index = 0;
    while (local[index] != rank) ++index;
    auto sub = std::make_shared<PrefixStore>(store, "local/" + std::to_string(local.front()) + "/");
    // Waits on a peer of this host get a grace beyond the timeout, so when a
    // remote host is lost the rank blocked on it (over TCP) fails first and
    // names it, rather than a local peer that only waits for that rank.
    CommOptions local_opts = options;
    local_opts.timeout += std::max<std::chrono::milliseconds>(std::chrono::seconds(1), options.timeout / 4);
    try {
      shm::ShmOptions part;
      part.labels = local;
      part.oversubscribed = hosts.crowded(me);
      part.part_of_wider_group = true;
      shm = shm::create_transport(sub, index, static_cast<int>(local.size()), local_opts, std::move(part));
    } catch (const TransportError& e) {
      throw TransportError(e.kind(), e.peer() >= 0 ? local[e.peer()] : -1, e.what());
    }
  }
  tcp::TcpOptions to;
  to.spans_hosts = true;
  to.toward = options.reach;
  to.links.assign(size, false);
  for (int j = 0; j < size; ++j) to.links[j] = j != rank && (!shm || hosts.host_of[j] != me);
  auto tcp = tcp::create_transport(std::move(store), rank, size, options, to);
  return std::make_unique<RoutedTransport>(std::move(hosts), rank, size, options.name, std::move(local), std::move(shm),
                                           std::move(tcp));
}

}  // namespace tessera::collectives
