// TCP transport over Boost.Asio (docs/threads.md, "TCP transport").
//
// Wiring: two TCP connections per peer pair, one per direction (a socket
// carrying both directions serialises them on its lock in the kernel); the
// higher rank connects to the lower one (whose listener is up before it
// publishes its endpoint), so the mesh forms without a deadlock. TCP_NODELAY
// on every socket.
//
// Wire format: every message is a 16-byte header {kind, tag, bytes} followed
// by `bytes` of payload. Payloads stream straight between the user's buffer
// and the socket (no staging copy); large ones are written and read in
// kChunk pieces so a send and a receive on one connection interleave and
// neither direction starves the other.
//
// Threads: each connection has two io_contexts, each run by its own thread:
// the reading side (header and payload reads) and the writing side (writes
// and the abort message, on the peer pair's second connection), so both directions stream
// at once and each Asio socket object is used by one thread only (each side
// is its own implicit strand). The calling thread hands an operation to the
// connection by filling the connection's send or receive slot and posting a
// handler to that side, then sleeps on a condition variable until it
// completes, with the communicator's timeout. The reading side always has a
// header read outstanding, so a peer that exits (EOF/RST) or aborts is
// noticed at once, even when no receive is posted.
//
// Allocation: none per message. Each connection owns fixed handler-memory
// blocks that every Asio operation of that connection allocates from (the
// custom-allocation pattern from Asio's documentation); the slots are reused.
//
// Errors: Asio reports through error_code only; handlers never throw. The
// first failure is stored and every later call throws it.
#include "collectives/tcp/tcp_transport.h"

// clang-format off
// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
#include <utility>
#include <boost/asio.hpp>
// clang-format on

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/log.h"

namespace tessera::collectives::tcp {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Kind = TransportError::Kind;

constexpr uint32_t kData = 0x7e55d47a;
constexpr uint32_t kAbort = 0x7e55ab07;
constexpr uint32_t kHello = 0x7e55e110;
constexpr size_t kChunk = size_t{1} << 20;
// An abort message carries the sender's reason, up to this many bytes.
constexpr size_t kMaxAbortReason = 2048;
// Sink fragments: the reading thread reads each into the connection's
// staging buffer and hands it to the sink at once, so it is still in this
// core's cache when the sink reads it (docs/threads.md); as large as
// reduce2's streaming threshold, so a large reduction writes its output
// with streaming stores.
constexpr size_t kSinkChunk = size_t{1} << 20;
// Small messages (latency, docs/threads.md): the caller writes them itself
// (no hand-off to the writing thread) and the reading thread reads them
// ahead into an eager buffer, so a recv posted after they arrived takes
// them without waking any thread.
constexpr size_t kEager = size_t{64} << 10;
// The reading thread stays off a connection whose caller read from it
// within this many milliseconds (docs/threads.md): a busy caller then costs
// it no wake-ups, and an idle connection is watched again (EOF, abort
// messages, read-ahead) within one or two of these periods.
constexpr int kParkMs = 10;

enum class ReadStatus { Ok, Eof, Error, Timeout, Stopped };

// TESSERA_TCP_READER_THREAD: 1 hands every receive to the reading thread
// (the path before callers read their small messages themselves; for tests
// and comparisons); 0 or unset: callers read.
// How long (us) a caller polls its socket without sleeping before it sleeps
// in poll(): TESSERA_TCP_SPIN_US when set; else kSpinUs when the group has
// no more ranks than the machine has CPUs (a poller then holds only its
// own core), else 0. 2 ranks on this 2-core VM at load 2.8
// (scripts/bench_tcp_small.sh, 3 runs): 8-byte all-reduce 6.6 us polling
// 50 us against 34-89 us sleeping at once (OpenMPI btl tcp: 7.4 us),
// sendrecv 10.0 against 33-72 (OpenMPI 6.5); docs/bench.md.
constexpr int kSpinUs = 50;
int read_spin_us(int group_size) {
  const char* e = std::getenv("TESSERA_TCP_SPIN_US");
  if (!e || !*e) {
    // The machine's CPUs, not this process's mask: a rank bound to one CPU
    // (tessera bench, mpirun) still has that core to itself.
    const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return group_size <= cpus ? kSpinUs : 0;
  }
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(e, &end, 10);
  if (errno != 0 || *end != '\0' || v < 0 || v > 1000000)
    throw InvalidArgument(std::string("TESSERA_TCP_SPIN_US='") + e +
                          "' is not a count of microseconds from 0 to 1000000");
  return static_cast<int>(v);
}

bool reader_thread_forced() {
  const char* e = std::getenv("TESSERA_TCP_READER_THREAD");
  if (!e || !*e || std::strcmp(e, "0") == 0) return false;
  if (std::strcmp(e, "1") == 0) return true;
  throw InvalidArgument(std::string("TESSERA_TCP_READER_THREAD='") + e +
                        "': expected 1 (every receive through the reading thread) or 0");
}

struct Header {
  uint32_t kind = 0;
  uint32_t tag = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(Header) == 16);

// Fixed storage for one outstanding Asio operation; falls back to the heap
// only if the block is busy or too small (never on the steady-state path).
// Operations are allocated on the posting thread and freed on the io thread,
// and the abort/stop slot can be taken from two threads at once, so the
// in-use flag is atomic (acquire on take, release on give back).
class HandlerMemory {
 public:
  void* allocate(size_t n) {
    bool expected = false;
    if (n <= sizeof(storage_) && in_use_.compare_exchange_strong(expected, true, std::memory_order_acquire))
      return &storage_;
    return ::operator new(n);
  }
  void deallocate(void* p) {
    if (p == &storage_)
      in_use_.store(false, std::memory_order_release);
    else
      ::operator delete(p);
  }

 private:
  alignas(std::max_align_t) unsigned char storage_[512];
  std::atomic<bool> in_use_{false};
};

template <typename T>
class SlotAllocator {
 public:
  using value_type = T;
  explicit SlotAllocator(HandlerMemory& m) : mem_(&m) {}
  template <typename U>
  SlotAllocator(const SlotAllocator<U>& o) noexcept : mem_(o.mem_) {}
  T* allocate(size_t n) { return static_cast<T*>(mem_->allocate(sizeof(T) * n)); }
  void deallocate(T* p, size_t) { mem_->deallocate(p); }
  template <typename U>
  bool operator==(const SlotAllocator<U>& o) const noexcept {
    return mem_ == o.mem_;
  }
  template <typename U>
  bool operator!=(const SlotAllocator<U>& o) const noexcept {
    return mem_ != o.mem_;
  }

  HandlerMemory* mem_;
};

// A handler bound to a memory slot.
template <typename F>
struct SlotHandler {
  using allocator_type = SlotAllocator<F>;
  HandlerMemory* mem;
  F f;
  allocator_type get_allocator() const noexcept { return allocator_type(*mem); }
  template <typename... Args>
  void operator()(Args&&... args) {
    f(std::forward<Args>(args)...);
  }
};
template <typename F>
SlotHandler<F> bind_slot(HandlerMemory& m, F f) {
  return SlotHandler<F>{&m, std::move(f)};
}

// An operation the caller hands to a connection.
struct Op {
  const unsigned char* sbuf = nullptr;  // send
  unsigned char* rbuf = nullptr;        // recv
  size_t bytes = 0;
  size_t done = 0;
  uint32_t tag = 0;
  RecvSink* sink = nullptr;       // sendrecv_sink: the reading thread hands the payload to it
  std::exception_ptr sink_error;  // what the sink threw (it goes on to the caller)
  bool active = false;
  bool for_thread = false;  // recv: the reading thread reads it (the caller does not)
  bool matched = false;     // the io thread paired a header with this op (recv)
  bool complete = false;
  // Set on failure (under the transport mutex).
  bool failed = false;
  Kind kind = Kind::Protocol;
  std::string error;
};

class TcpTransport;

class Connection {
 public:
  Connection(TcpTransport& t, int peer) : t_(t), peer_(peer), socket_(io_), eager_(kEager) {}
  ~Connection() {
    if (evfd_ >= 0) ::close(evfd_);
  }
  void start();
  void stop();

  void post_send();
  void post_abort();
  // Under mu_: wakes the reading thread if it is parked (a recv was handed to it).
  void wake_reader_locked();
  int rfd() { return socket_.native_handle(); }

  tcp::socket& socket() { return socket_; }

  TcpTransport& t_;
  int peer_;  // set before start()
  // The reading side: socket_ (an Asio object for setup only; read with
  // plain non-blocking recv() by thread_, or by the caller while it owns it).
  // io_ is never run. evfd_ wakes thread_ when it is parked.
  asio::io_context io_;
  tcp::socket socket_;
  std::thread thread_;
  int evfd_ = -1;
  std::atomic<bool> stop_{false};
  // The writing side: the pair's other connection, on its own io_context and thread,
  // so sending and receiving proceed at once (as two blocking streams would)
  // and each Asio socket object is only ever used by one thread.
  asio::io_context wio_;
  tcp::socket wsocket_{wio_};
  std::thread wthread_;

  // Under TcpTransport::mu_.
  Op send_op_, recv_op_;
  std::atomic<bool> dead_{false};

  // Sink receives: the reading thread reads each fragment into this buffer
  // and calls the sink on it, then reads the next. Allocated (and
  // pre-faulted) by the caller on first use, then reused.
  std::vector<unsigned char> stage_;

  // Eager receive (messages of at most kEager bytes): the reading thread reads
  // the payload here before (or while) a recv is posted; the caller takes it.
  // Under mu_: eager_full_, eager_tag_, eager_bytes_, header_pending_ (a data
  // header was read and waits: for a recv, or for the eager buffer to drain;
  // in_hdr_ then holds it and the reading thread reads nothing more).
  std::vector<unsigned char> eager_;
  bool eager_full_ = false;
  uint32_t eager_tag_ = 0;
  size_t eager_bytes_ = 0;
  bool header_pending_ = false;
  // Who reads the socket (under mu_): the caller, between claiming it (no
  // message partly read by the thread, nothing pending, nothing read ahead)
  // and the end of its message; or the thread, from the first byte of a
  // header to the last of its payload (header_pending_ included). Never both.
  bool caller_reading_ = false;
  bool thread_reading_ = false;
  bool thread_parked_ = false;
  uint64_t caller_epoch_ = 0;  // bumped by every caller read (the thread stays parked while it moves)
  // The writing direction's socket is written by the writing thread or, for a
  // small message while that thread is idle, by the caller (direct_send);
  // wbusy_ (under wmu_) says a message is partly written, so an abort message
  // must not be put in the middle of it.
  std::mutex wmu_;
  bool wbusy_ = false;
  // Reading thread only (while it holds the socket): in_hdr_, abort_in_; writing thread only: out_hdr_
  // (the caller sets it in direct_send, before handing over), abort_out_.
  Header out_hdr_{}, in_hdr_{};
  std::string abort_out_, abort_in_;
  HandlerMemory mem_post_send_, mem_write_, mem_wmisc_;

  // Caller thread: writes the small message of send_op_ (header + payload)
  // without blocking. True: all of it is on the wire. False: the writing
  // thread must write the rest, from `sent` bytes on (wbusy_ is then set).
  bool direct_send(size_t& sent);
  void post_send_rest(size_t sent);

 private:
  void reader_loop();
  void serve_header();
  void park(std::unique_lock<std::mutex>& lk, int ms);
  void write_rest(size_t sent);
  void set_wbusy(bool b) {
    std::lock_guard<std::mutex> lk(wmu_);
    wbusy_ = b;
  }
  void fail_sink(std::exception_ptr e, const std::string& what);
  void write_header();
  void write_payload();
  void fail(Kind kind, const std::string& what, bool writer = false);
};

class TcpTransport final : public Transport {
 public:
  friend class Connection;
  TcpTransport(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options, const TcpOptions& tcp);
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "tcp"; }

  void send(int peer, uint32_t tag, const void* buf, size_t bytes) override {
    check_peer(peer);
    Connection& c = *conns_[peer];
    begin_send(c, tag, buf, bytes);
    wait_op(c, c.send_op_, "send to");
  }
  void recv(int peer, uint32_t tag, void* buf, size_t bytes) override {
    check_peer(peer);
    Connection& c = *conns_[peer];
    begin_recv(c, tag, buf, bytes);
    wait_recv(c, c.recv_op_);
  }
  void sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes, uint32_t tag) override {
    check_peer(to);
    check_peer(from);
    Connection& ct = *conns_[to];
    Connection& cf = *conns_[from];
    begin_recv(cf, tag, rbuf, rbytes);
    // Wait for both even if one fails, so no operation still references the
    // caller's buffers when we return or throw: a send that cannot start
    // (the transport failed, the peer closed) still leaves the posted recv
    // to be settled by the io thread (wait_op -> fail_op).
    std::exception_ptr first;
    if (start_send_after_recv(ct, tag, sbuf, sbytes, first)) {
      hand_recv_to_thread_if_sending(ct, cf);
      try {
        wait_op(ct, ct.send_op_, "send to");
      } catch (...) {
        first = std::current_exception();
      }
    }
    try {
      wait_recv(cf, cf.recv_op_);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    if (first) std::rethrow_exception(first);
  }

  void sendrecv_sink(int to, const void* sbuf, size_t sbytes, int from, size_t rbytes, RecvSink& sink,
                     uint32_t tag) override {
    check_peer(to);
    check_peer(from);
    Connection& ct = *conns_[to];
    Connection& cf = *conns_[from];
    if (rbytes == 0) return sendrecv(to, sbuf, sbytes, from, nullptr, 0, tag);
    if (cf.stage_.empty()) cf.stage_.assign(kSinkChunk, 0);  // once per connection, pre-faulted
    begin_recv(cf, tag, nullptr, rbytes, &sink);
    std::exception_ptr first;
    const bool sending = start_send_after_recv(ct, tag, sbuf, sbytes, first);
    if (sending) hand_recv_to_thread_if_sending(ct, cf);
    try {
      finish_sink_recv(cf);
    } catch (const TransportError&) {
      if (!first) first = std::current_exception();
    } catch (...) {
      // The sink's own exception is the root cause, even when the failure
      // it caused already stopped the send from starting.
      first = std::current_exception();
    }
    if (sending) {
      try {
        wait_op(ct, ct.send_op_, "send to");
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  void recv_sink(int from, size_t bytes, RecvSink& sink, uint32_t tag) override {
    check_peer(from);
    Connection& cf = *conns_[from];
    if (bytes == 0) return recv(from, tag, nullptr, 0);
    if (cf.stage_.empty()) cf.stage_.assign(kSinkChunk, 0);  // once per connection, pre-faulted
    begin_recv(cf, tag, nullptr, bytes, &sink);
    finish_sink_recv(cf);
  }

  void abort(const std::string& reason) override {
    bool expected = false;
    if (!aborted_.compare_exchange_strong(expected, true)) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!failed_) set_failed_locked(Kind::Aborted, -1, "tcp transport aborted: " + reason);
    }
    cv_.notify_all();
    shutdown_all();
  }
  bool aborted() const override { return aborted_.load(); }
  // TESSERA_TCP_READER_THREAD=1: every receive goes through the reading
  // thread (the path before callers read small messages themselves).
  bool force_thread() const { return force_thread_; }
  bool peer_alive(int peer) const override {
    if (peer < 0 || peer >= size_ || peer == rank_ || !conns_[peer]) return false;
    return !conns_[peer]->dead_.load();
  }

  // Called by connections (io threads) with mu_ held or not as named.
  std::mutex mu_;
  std::condition_variable cv_;

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_ || !conns_[peer])
      throw InvalidArgument("tcp transport: bad peer " + std::to_string(peer) + " for rank " + std::to_string(rank_) +
                            " of " + std::to_string(size_));
  }
  // The stored failure, naming its peer (fail_what_ alone may not: "peer aborted").
  void throw_failed_locked() {
    throw TransportError(fail_kind_, fail_peer_,
                         fail_peer_ >= 0 ? "tcp: rank " + std::to_string(fail_peer_) + ": " + fail_what_ : fail_what_);
  }
  void set_failed_locked(Kind k, int peer, const std::string& what) {
    failed_ = true;
    failed_flag_.store(true, std::memory_order_relaxed);
    fail_kind_ = k;
    fail_peer_ = peer;
    fail_what_ = what;
  }
  void begin_send(Connection& c, uint32_t tag, const void* buf, size_t bytes) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (failed_) throw_failed_locked();
      if (c.dead_.load())
        throw TransportError(Kind::PeerDead, c.peer_,
                             "tcp send to rank " + std::to_string(c.peer_) + " (group '" + options_.name +
                                 "'): peer has closed its connection (exited?)");
      TESSERA_CHECK(!c.send_op_.active, "tcp: a send to ", c.peer_, " is already in flight");
      c.send_op_ = Op{};
      c.send_op_.sbuf = static_cast<const unsigned char*>(buf);
      c.send_op_.bytes = bytes;
      c.send_op_.tag = tag;
      c.send_op_.active = true;
    }
    if (bytes > kEager) return c.post_send();
    size_t sent = 0;
    if (c.direct_send(sent)) {
      std::lock_guard<std::mutex> lk(mu_);
      c.send_op_.complete = true;
      return;
    }
    c.post_send_rest(sent);
  }
  void begin_recv(Connection& c, uint32_t tag, void* buf, size_t bytes, RecvSink* sink = nullptr) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (failed_) throw_failed_locked();
      // (A peer may exit right after its last message, read ahead here.)
      if (c.dead_.load() && !c.eager_full_)
        throw TransportError(Kind::PeerDead, c.peer_,
                             "tcp recv from rank " + std::to_string(c.peer_) + " (group '" + options_.name +
                                 "'): peer has closed its connection (exited?)");
      TESSERA_CHECK(!c.recv_op_.active, "tcp: a recv from ", c.peer_, " is already in flight");
      c.recv_op_ = Op{};
      c.recv_op_.rbuf = static_cast<unsigned char*>(buf);
      c.recv_op_.bytes = bytes;
      c.recv_op_.tag = tag;
      c.recv_op_.sink = sink;
      c.recv_op_.active = true;
      // Large messages and the forced thread path are the reading thread's;
      // the caller reads small ones itself when it waits (wait_recv).
      c.recv_op_.for_thread = force_thread_ || bytes > kEager;
      // A small message read ahead: taken here (sink receives consume it in
      // finish_sink_recv), no thread involved.
      if (c.eager_full_) {
        if (!sink)
          take_eager_locked(c, c.recv_op_);
        else if (c.eager_tag_ != tag || c.eager_bytes_ != bytes)
          eager_mismatch_locked(c, c.recv_op_);
        return;
      }
      // The reading thread (if this is its receive) starts the payload when
      // the header comes; it needs a nudge only when it is parked.
      if (c.recv_op_.for_thread || c.header_pending_) c.wake_reader_locked();
    }
  }
  // Under mu_: the caller may read `op` (a small recv) from the socket itself.
  bool claimable_locked(Connection& c, const Op& op) const {
    return !force_thread_ && op.bytes <= kEager && !op.for_thread && !op.matched && !op.complete && !op.failed &&
           !failed_ && !c.thread_reading_ && !c.header_pending_ && !c.eager_full_ && !c.caller_reading_ &&
           !c.dead_.load();
  }
  // A send that did not go out at once (large, or the socket buffer full)
  // keeps the caller busy: the recv of the same sendrecv goes to the reading
  // thread, so the two directions still progress together.
  void hand_recv_to_thread_if_sending(Connection& ct, Connection& cf) {
    std::lock_guard<std::mutex> lk(mu_);
    if (ct.send_op_.complete || cf.recv_op_.for_thread || !cf.recv_op_.active) return;
    cf.recv_op_.for_thread = true;
    cf.wake_reader_locked();
  }
  // Under mu_: completes `op` (a recv, not a sink) from the eager buffer, or
  // fails the transport when the message is not the one expected. Nudges the
  // reading thread if a further header waits for the buffer.
  void take_eager_locked(Connection& c, Op& op) {
    if (c.eager_tag_ != op.tag || c.eager_bytes_ != op.bytes) {
      eager_mismatch_locked(c, op);
      return;
    }
    if (op.bytes) std::memcpy(op.rbuf, c.eager_.data(), op.bytes);
    op.done = op.bytes;
    op.complete = true;
    release_eager_locked(c);
  }
  void eager_mismatch_locked(Connection& c, Op& op) {
    const std::string what = "message mismatch: expected tag " + std::to_string(op.tag) + " and " +
                             std::to_string(op.bytes) + " bytes, peer sent tag " + std::to_string(c.eager_tag_) +
                             " and " + std::to_string(c.eager_bytes_) + " bytes";
    op.failed = true;
    op.kind = Kind::Protocol;
    op.error = what;
    if (!failed_) set_failed_locked(Kind::Protocol, c.peer_, what);
  }
  void release_eager_locked(Connection& c) {
    c.eager_full_ = false;
    ++c.caller_epoch_;  // this connection's caller is active: the next message is likely read by it
  }
  // begin_send once a recv is posted: false (with `first` set and the
  // transport failed, so waiting on the recv ends promptly) when the send
  // cannot start.
  bool start_send_after_recv(Connection& c, uint32_t tag, const void* buf, size_t bytes, std::exception_ptr& first) {
    try {
      begin_send(c, tag, buf, bytes);
      return true;
    } catch (const TransportError& e) {
      first = std::current_exception();
      std::lock_guard<std::mutex> lk(mu_);
      if (!failed_) set_failed_locked(e.kind(), e.peer(), e.what());
    }
    cv_.notify_all();
    return false;
  }
  void wait_op(Connection& c, Op& op, const char* what, Clock::time_point deadline = {});
  void wait_recv(Connection& c, Op& op);
  void caller_read(Connection& c, Op& op, Clock::time_point deadline);
  void consume_eager(Connection& c, Op& op);
  [[noreturn]] void fail_op(Connection& c, Op& op, const char* what);
  void finish_sink_recv(Connection& c);
  void shutdown_all();  // tells every peer and closes every connection (any thread, once)

  std::shared_ptr<Store> store_;
  int rank_, size_;
  CommOptions options_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> shut_down_{false};
  std::atomic<bool> failed_flag_{false};  // failed_, for a caller's read loop
  const bool force_thread_ = reader_thread_forced();
  const int spin_us_;  // read_spin_us
  // Under mu_.
  bool failed_ = false;
  Kind fail_kind_ = Kind::Protocol;
  int fail_peer_ = -1;
  std::string fail_what_;
};

// ---- Connection (io thread unless noted) ----------------------------------------

void Connection::start() {
  evfd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (evfd_ < 0) throw TransportError(Kind::PeerDead, peer_, std::string("tcp: eventfd: ") + std::strerror(errno));
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);
  // Nothing may escape the thread: a bug fails the connection.
  thread_ = std::thread([this] {
    try {
      reader_loop();
    } catch (const std::exception& e) {
      fail(Kind::Protocol, std::string("tcp reading thread: ") + e.what());
    }
  });
  // Asio handlers report through error codes; run() only throws on a bug.
  wthread_ = std::thread([this] {
    auto guard = asio::make_work_guard(wio_);
    try {
      wio_.run();
    } catch (const std::exception& e) {
      fail(Kind::Protocol, std::string("tcp writer thread: ") + e.what(), true);
    }
  });
}

void Connection::stop() {
  asio::post(wio_, bind_slot(mem_wmisc_, [this] {
               boost::system::error_code ec;
               wsocket_.shutdown(tcp::socket::shutdown_both, ec);
               wsocket_.close(ec);
               wio_.stop();
             }));
  {
    std::lock_guard<std::mutex> lk(t_.mu_);
    stop_.store(true);
    const uint64_t one = 1;
    if (evfd_ >= 0 && ::write(evfd_, &one, sizeof one) < 0) {
      // a full eventfd still wakes the thread
    }
  }
  ::shutdown(rfd(), SHUT_RDWR);  // ends a read in progress
  if (wthread_.joinable()) wthread_.join();
  if (thread_.joinable()) thread_.join();
  boost::system::error_code ec;
  socket_.close(ec);
}

// Called from the calling thread: the slot is filled, the writing thread starts it.
void Connection::post_send() {
  asio::post(wio_, bind_slot(mem_post_send_, [this] {
               out_hdr_ = Header{kData, send_op_.tag, send_op_.bytes};
               write_header();
             }));
}

void Connection::post_abort() {
  asio::post(wio_, bind_slot(mem_wmisc_, [this] {
               // Tell the peer why (best effort) when no write is mid-message, so
               // it fails with PeerFailed naming the root cause; then close, which
               // it sees as EOF anyway.
               boost::system::error_code ec;
               std::lock_guard<std::mutex> wl(wmu_);
               if (!wbusy_) {
                 {
                   std::lock_guard<std::mutex> lk(t_.mu_);
                   abort_out_ = t_.fail_what_.substr(0, kMaxAbortReason);
                 }
                 Header h{kAbort, 0, abort_out_.size()};
                 const std::array<asio::const_buffer, 2> bufs{asio::buffer(&h, sizeof h), asio::buffer(abort_out_)};
                 wsocket_.non_blocking(true, ec);
                 wsocket_.write_some(bufs, ec);
               }
               wsocket_.shutdown(tcp::socket::shutdown_both, ec);
               // And the reading direction, so a read in progress (the
               // reading thread's or the caller's) ends before the caller's
               // buffer is released.
               ::shutdown(rfd(), SHUT_RDWR);
             }));
}

// The header goes out in one gather write with the first piece of the
// payload, so a small message costs one system call.
void Connection::write_header() {
  set_wbusy(true);
  const size_t first = std::min(kChunk, send_op_.bytes);
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(&out_hdr_, sizeof out_hdr_),
                                               asio::buffer(send_op_.sbuf, first)};
  asio::async_write(wsocket_, bufs, bind_slot(mem_write_, [this, first](const boost::system::error_code& ec, size_t) {
                      if (ec) return fail(Kind::PeerDead, "write to peer failed: " + ec.message(), true);
                      send_op_.done += first;
                      write_payload();
                    }));
}

bool Connection::direct_send(size_t& sent) {
  std::lock_guard<std::mutex> lk(wmu_);
  sent = 0;
  const Op& op = send_op_;  // filled by this (the calling) thread
  Header h{kData, op.tag, op.bytes};
  iovec iov[2] = {{&h, sizeof h}, {const_cast<unsigned char*>(op.sbuf), op.bytes}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = op.bytes ? 2 : 1;
  const ssize_t n = ::sendmsg(wsocket_.native_handle(), &m, MSG_DONTWAIT | MSG_NOSIGNAL);
  // An error (the peer closed, ...) is left to the writing thread, which
  // fails the connection as for any write.
  if (n > 0) sent = static_cast<size_t>(n);
  if (sent == sizeof h + op.bytes) return true;
  out_hdr_ = h;  // the writing thread takes over (posted after this, so ordered)
  wbusy_ = true;
  return false;
}

void Connection::post_send_rest(size_t sent) {
  asio::post(wio_, bind_slot(mem_post_send_, [this, sent] { write_rest(sent); }));
}

// The rest of a small message the caller began (direct_send): header bytes
// from out_hdr_, then the payload.
void Connection::write_rest(size_t sent) {
  const size_t hs = sizeof out_hdr_;
  const size_t hoff = std::min(sent, hs), poff = sent > hs ? sent - hs : 0;
  const std::array<asio::const_buffer, 2> bufs{
      asio::buffer(reinterpret_cast<const unsigned char*>(&out_hdr_) + hoff, hs - hoff),
      asio::buffer(send_op_.sbuf + poff, send_op_.bytes - poff)};
  asio::async_write(wsocket_, bufs, bind_slot(mem_write_, [this](const boost::system::error_code& ec, size_t) {
                      if (ec) return fail(Kind::PeerDead, "write to peer failed: " + ec.message(), true);
                      send_op_.done = send_op_.bytes;
                      write_payload();
                    }));
}

void Connection::write_payload() {
  Op& op = send_op_;  // only this thread touches done/sbuf while active
  if (op.done == op.bytes) {
    set_wbusy(false);
    {
      std::lock_guard<std::mutex> lk(t_.mu_);
      op.complete = true;
    }
    t_.cv_.notify_all();
    return;
  }
  size_t n = std::min(kChunk, op.bytes - op.done);
  wsocket_.async_write_some(asio::buffer(op.sbuf + op.done, n),
                            bind_slot(mem_write_, [this](const boost::system::error_code& ec, size_t w) {
                              if (ec) return fail(Kind::PeerDead, "write to peer failed: " + ec.message(), true);
                              send_op_.done += w;
                              write_payload();
                            }));
}

// ---- Reading side (reading thread, or the caller while it owns the socket) ----

// Reads from the non-blocking socket `fd` into `first` (`nfirst` bytes), then
// on into `second` (`nsecond`: one recvmsg fills both), until `need` bytes
// are read (`got` counts them; a read may take more, up to the two buffers'
// size). Until `spin_until` an empty socket is retried at once; after it,
// and until `deadline`, waited for in poll() in slices of at most 100 ms.
// Gives up early (Stopped) once `stop` is set.
ReadStatus read_into(int fd, unsigned char* first, size_t nfirst, unsigned char* second, size_t nsecond, size_t need,
                     size_t& got, Clock::time_point spin_until, Clock::time_point deadline,
                     const std::atomic<bool>& stop, int& err) {
  got = 0;
  bool spinning = spin_until != Clock::time_point{};
  for (unsigned spins = 0; got < need;) {
    iovec iov[2] = {{first + got, nfirst - got}, {second, nsecond}};
    if (got >= nfirst) iov[0] = {second + (got - nfirst), nsecond - (got - nfirst)};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = got < nfirst && nsecond ? 2 : 1;
    const ssize_t r = ::recvmsg(fd, &m, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return ReadStatus::Eof;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      err = errno;
      return ReadStatus::Error;
    }
    // Polling: the clock is read every 16th empty try (a read costs less).
    if (spinning) {
      if ((++spins & 15) != 0 || Clock::now() < spin_until) continue;
      spinning = false;
    }
    if (stop.load(std::memory_order_relaxed)) return ReadStatus::Stopped;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return ReadStatus::Timeout;
    pollfd pf{fd, POLLIN, 0};
    ::poll(&pf, 1, static_cast<int>(std::min<int64_t>(left, 100)));
  }
  return ReadStatus::Ok;
}

// Reads exactly `n` bytes into `buf` (read_into, sleeping at once).
ReadStatus read_exact(int fd, void* buf, size_t n, size_t& got, Clock::time_point deadline,
                      const std::atomic<bool>& stop, int& err) {
  return read_into(fd, static_cast<unsigned char*>(buf), n, nullptr, 0, n, got, {}, deadline, stop, err);
}

// Reads a message's header into `h` and with it (same recvmsg) up to `n`
// bytes of its payload into `payload`, until the header is complete: `got`
// counts header and payload bytes (read_into, polling until `spin_until`).
ReadStatus read_header(int fd, Header& h, unsigned char* payload, size_t n, size_t& got, Clock::time_point spin_until,
                       Clock::time_point deadline, const std::atomic<bool>& stop, int& err) {
  return read_into(fd, reinterpret_cast<unsigned char*>(&h), sizeof h, payload, n, sizeof h, got, spin_until, deadline,
                   stop, err);
}

std::string read_failure_text(ReadStatus s, size_t got, int err) {
  if (s == ReadStatus::Eof)
    return got == 0 ? "connection closed by peer (process exited?)" : "connection closed by peer mid-message";
  return std::string("read from peer failed: ") + std::strerror(err);
}

void Connection::wake_reader_locked() {
  if (!thread_parked_) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(evfd_, &one, sizeof one);
}

// Under mu_ (held by `lk`): sleeps on the eventfd for at most `ms`.
void Connection::park(std::unique_lock<std::mutex>& lk, int ms) {
  thread_parked_ = true;
  lk.unlock();
  pollfd p{evfd_, POLLIN, 0};
  if (::poll(&p, 1, ms) > 0) {
    uint64_t v;
    [[maybe_unused]] ssize_t r = ::read(evfd_, &v, sizeof v);
  }
  lk.lock();
  thread_parked_ = false;
}

// The reading thread. It reads the socket only when no caller does
// (caller_reading_), and holds it (thread_reading_) from the first byte of a
// header to the last of its payload. It stays off the socket (parked on its
// eventfd) while a caller read from this connection during the last park
// period, so a caller exchanging small messages costs it no wake-up; it
// reads when a receive is handed to it (for_thread: large messages, sinks of
// large messages, the forced thread path) and otherwise keeps a header read
// going, so EOF and abort messages are seen while nobody waits and one small
// message is read ahead.
void Connection::reader_loop() {
  const int fd = rfd();
  uint64_t seen = ~uint64_t{0};
  const auto forever = Clock::time_point::max();
  std::unique_lock<std::mutex> lk(t_.mu_);
  while (!stop_.load()) {
    const Op& op = recv_op_;
    const bool posted = op.active && !op.matched && !op.complete && !op.failed;
    if (header_pending_) {
      if (!posted) {
        park(lk, 100);
        continue;
      }
      header_pending_ = false;
      lk.unlock();
      serve_header();
      lk.lock();
      continue;
    }
    if (dead_.load() || caller_reading_ || eager_full_) {
      park(lk, dead_.load() ? 100 : kParkMs);
      continue;
    }
    if (!(posted && op.for_thread) && caller_epoch_ != seen) {
      seen = caller_epoch_;
      park(lk, kParkMs);
      continue;
    }
    lk.unlock();
    pollfd p[2] = {{fd, POLLIN, 0}, {evfd_, POLLIN, 0}};
    ::poll(p, 2, 1000);
    if (p[1].revents) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(evfd_, &v, sizeof v);
    }
    lk.lock();
    if (!p[0].revents || caller_reading_ || eager_full_ || dead_.load() || header_pending_) continue;
    thread_reading_ = true;
    lk.unlock();
    // A caller may have taken the bytes that woke us: nothing to read then.
    const ssize_t r = ::recv(fd, &in_hdr_, sizeof in_hdr_, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      lk.lock();
      thread_reading_ = false;
      continue;
    }
    size_t got = r > 0 ? static_cast<size_t>(r) : 0;
    int err = r < 0 ? errno : 0;
    ReadStatus s = r == 0 ? ReadStatus::Eof : r < 0 ? ReadStatus::Error : ReadStatus::Ok;
    if (s == ReadStatus::Ok && got < sizeof in_hdr_) {
      size_t more = 0;
      s = read_exact(fd, reinterpret_cast<unsigned char*>(&in_hdr_) + got, sizeof in_hdr_ - got, more, forever, stop_,
                     err);
      got += more;
    }
    if (s != ReadStatus::Ok) {
      if (s != ReadStatus::Stopped) fail(Kind::PeerDead, read_failure_text(s, got, err));
    } else if (in_hdr_.kind == kAbort) {
      std::string reason;
      if (in_hdr_.bytes > 0 && in_hdr_.bytes <= kMaxAbortReason) {
        abort_in_.assign(in_hdr_.bytes, '\0');
        size_t n = 0;
        if (read_exact(fd, abort_in_.data(), abort_in_.size(), n, Clock::now() + std::chrono::seconds(1), stop_, err) ==
            ReadStatus::Ok)
          reason = ": " + abort_in_;
      }
      fail(Kind::PeerFailed, "peer aborted" + reason);
    } else if (in_hdr_.kind != kData) {
      fail(Kind::Protocol, "bad message header from peer");
    } else {
      serve_header();
    }
    lk.lock();
  }
}

// Reading thread, holding the socket, with a data header in in_hdr_: reads
// its payload straight into a posted (plain) recv; else a small one into the
// eager buffer (sink receives of small messages consume it from there); else
// leaves the header pending until a recv is posted.
void Connection::serve_header() {
  const int fd = rfd();
  const auto forever = Clock::time_point::max();
  bool eager;
  {
    std::lock_guard<std::mutex> lk(t_.mu_);
    const Op& op = recv_op_;
    const bool posted = op.active && !op.matched && !op.complete && !op.failed;
    // A posted recv that does not fit the header is matched to report the mismatch.
    eager = in_hdr_.bytes <= kEager && (!posted || (op.sink && op.bytes == in_hdr_.bytes));
    if (!eager && !posted) {
      header_pending_ = true;  // thread_reading_ stays set: the payload is next on the socket
      return;
    }
    if (!eager) recv_op_.matched = true;
  }
  size_t got = 0;
  int err = 0;
  if (eager) {
    const ReadStatus s = read_exact(fd, eager_.data(), in_hdr_.bytes, got, forever, stop_, err);
    if (s != ReadStatus::Ok) {
      if (s != ReadStatus::Stopped) fail(Kind::PeerDead, read_failure_text(s, got == 0 ? 1 : got, err));
      return;
    }
    {
      std::lock_guard<std::mutex> lk(t_.mu_);
      eager_full_ = true;
      eager_tag_ = in_hdr_.tag;
      eager_bytes_ = in_hdr_.bytes;
      thread_reading_ = false;
    }
    t_.cv_.notify_all();
    return;
  }
  Op& op = recv_op_;  // matched: only this thread touches done/rbuf now
  if (in_hdr_.tag != op.tag || in_hdr_.bytes != op.bytes)
    return fail(Kind::Protocol, "message mismatch: expected tag " + std::to_string(op.tag) + " and " +
                                    std::to_string(op.bytes) + " bytes, peer sent tag " + std::to_string(in_hdr_.tag) +
                                    " and " + std::to_string(in_hdr_.bytes) + " bytes");
  while (op.done < op.bytes) {
    // A sink gets each fragment while it is still in this core's cache.
    const size_t n = op.sink ? std::min(stage_.size(), op.bytes - op.done) : op.bytes - op.done;
    unsigned char* dst = op.sink ? stage_.data() : op.rbuf + op.done;
    const ReadStatus s = read_exact(fd, dst, n, got, forever, stop_, err);
    if (s != ReadStatus::Ok) {
      if (s != ReadStatus::Stopped) fail(Kind::PeerDead, read_failure_text(s, 1, err));
      return;
    }
    if (op.sink) {
      try {
        op.sink->consume(op.done, stage_.data(), n);
      } catch (const std::exception& e) {
        return fail_sink(std::current_exception(), e.what());
      } catch (...) {
        return fail_sink(std::current_exception(), "unknown exception");
      }
    }
    op.done += n;
  }
  {
    std::lock_guard<std::mutex> lk(t_.mu_);
    op.complete = true;
    thread_reading_ = false;
  }
  t_.cv_.notify_all();
}

void Connection::fail_sink(std::exception_ptr e, const std::string& what) {
  {
    std::lock_guard<std::mutex> lk(t_.mu_);
    recv_op_.sink_error = std::move(e);
    if (!t_.failed_) t_.set_failed_locked(Kind::Aborted, peer_, "receive sink failed: " + what);
  }
  fail(Kind::Aborted, "receive sink failed: " + what);
}

// Marks the connection dead (reading thread, or the writing thread with
// `writer`). A peer that closes while nothing is pending here has simply
// finished (or will be noticed by the next call to it); with an operation
// pending, that operation and the transport fail.
void Connection::fail(Kind kind, const std::string& what, bool writer) {
  dead_.store(true);
  if (writer) set_wbusy(false);
  bool had_op = false, send_pending = false;
  {
    std::lock_guard<std::mutex> lk(t_.mu_);
    // A recv whose message is in the eager buffer, or whose payload has all
    // been read (a sink receive whose last fragments the caller is still
    // consuming), is served whatever happens to the connection now.
    auto pending = [this](const Op& op) {
      const bool served = &op == &recv_op_ && ((eager_full_ && !op.matched) || (op.matched && op.done == op.bytes));
      return op.active && !op.complete && !op.failed && !served;
    };
    send_pending = pending(send_op_);
    // The reading side seeing the peer close while only a send is in flight
    // is not a failure yet: the peer may have read all of it and finished
    // (the writing thread completes it), or the write fails by itself.
    had_op = writer ? send_pending : (pending(recv_op_) || (send_pending && kind != Kind::PeerDead));
    // Each side settles only its own operation: a write may still be in a
    // system call reading the caller's buffer until the writing thread sees
    // the shutdown below fail it (the caller waits for that, fail_op).
    Op& mine = writer ? send_op_ : recv_op_;
    if (pending(mine)) {
      mine.failed = true;
      mine.kind = kind;
      mine.error = what;
    }
    if (had_op && !t_.failed_) t_.set_failed_locked(kind, peer_, what);
  }
  boost::system::error_code ec;
  if (writer)
    wsocket_.shutdown(tcp::socket::shutdown_both, ec);
  else if (had_op || !send_pending)
    ::shutdown(rfd(), SHUT_RDWR);
  t_.cv_.notify_all();
  if (had_op) t_.shutdown_all();
}

}  // namespace

// ---- TcpTransport ------------------------------------------------------------------

// The address peers connect to: TESSERA_TCP_ADDR; else loopback when the
// group does not span hosts (collectives/host.h decides, not the launcher's
// LOCAL_WORLD_SIZE); else this host name's first non-loopback IPv4 address
// (never loopback silently for a multi-host group).
namespace {

bool loopback_v4(const in_addr& a) { return (ntohl(a.s_addr) >> 24) == 127; }

std::string ntop_v4(const in_addr& a) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

// One entry of a NCCL_SOCKET_IFNAME-style list: `name` matches when it starts
// with the entry (or equals it, with `exact`).
bool interface_listed(const std::string& name, const std::vector<std::string>& entries, bool exact) {
  for (const auto& e : entries)
    if (exact ? name == e : name.compare(0, e.size(), e) == 0) return true;
  return false;
}

}  // namespace

std::string interface_address(const std::string& spec, std::string* seen) {
  std::string list = spec;
  bool exclude = false, exact = false;
  if (!list.empty() && list[0] == '^') exclude = true, list.erase(0, 1);
  if (!list.empty() && list[0] == '=') exact = true, list.erase(0, 1);
  std::vector<std::string> entries;
  for (size_t b = 0; b <= list.size();) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    if (e > b) entries.push_back(list.substr(b, e - b));
    b = e + 1;
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) {
    if (seen) *seen = std::string("getifaddrs: ") + std::strerror(errno);
    return "";
  }
  std::string found, names;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    const auto& a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    names += detail::concat(names.empty() ? "" : ", ", i->ifa_name, " ", ntop_v4(a));
    const bool listed = interface_listed(i->ifa_name, entries, exact);
    // Excluding: loopback is never a candidate (as NCCL skips it by default).
    if (found.empty() && (exclude ? !listed && !(i->ifa_flags & IFF_LOOPBACK) : listed)) found = ntop_v4(a);
  }
  freeifaddrs(ifs);
  if (seen) *seen = names.empty() ? "no IPv4 interface is up" : "IPv4 interfaces up: " + names;
  return found;
}

std::string address_toward(const std::string& host, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0) {
    if (why) *why = detail::concat("cannot resolve '", host, "': ", gai_strerror(rc));
    return "";
  }
  std::string out, err = "no IPv4 address";
  for (addrinfo* r = res; r && out.empty(); r = r->ai_next) {
    sockaddr_in to = *reinterpret_cast<const sockaddr_in*>(r->ai_addr);
    to.sin_port = htons(9);  // any port: a UDP connect only picks the route, nothing is sent
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    sockaddr_in me{};
    socklen_t len = sizeof me;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0)
      err = detail::concat("no route to ", ntop_v4(to.sin_addr), ": ", std::strerror(errno));
    else if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) != 0)
      err = std::string("getsockname: ") + std::strerror(errno);
    else
      out = ntop_v4(me.sin_addr);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (out.empty() && why) *why = err;
  return out;
}

std::vector<std::string> mpirun_oob_addresses() {
  // OMPI_MCA_orte_hnp_uri="JOBID.VPID;tcp://A,B:PORT;tcp6://[...]:PORT"
  // (OpenMPI 4.x; mpirun gives it to every rank): the IPv4 addresses of
  // mpirun's out-of-band listener, on the interfaces --mca
  // oob_tcp_if_include allows.
  std::vector<std::string> out;
  const char* uri = std::getenv("OMPI_MCA_orte_hnp_uri");
  if (!uri) return out;
  const std::string s = uri;
  for (size_t at = s.find("tcp://"); at != std::string::npos; at = s.find("tcp://", at + 6)) {
    if (at >= 1 && s[at - 1] != ';') continue;  // tcp6://
    const size_t b = at + 6, colon = s.find(':', b);
    if (colon == std::string::npos) break;
    const std::string list = s.substr(b, colon - b);
    for (size_t p = 0; p <= list.size();) {
      size_t e = list.find(',', p);
      if (e == std::string::npos) e = list.size();
      if (e > p) out.push_back(list.substr(p, e - p));
      p = e + 1;
    }
  }
  return out;
}

std::string advertised_address(bool spans_hosts, const std::vector<std::string>& toward) {
  if (const char* a = std::getenv("TESSERA_TCP_ADDR"); a && *a) return a;
  if (!spans_hosts) return "127.0.0.1";
  std::vector<std::string> tried;
  if (const char* spec = std::getenv("TESSERA_SOCKET_IFNAME"); spec && *spec) {
    std::string seen;
    std::string a = interface_address(spec, &seen);
    if (!a.empty()) return a;
    throw InvalidArgument(
        detail::concat("tcp transport: no interface matches TESSERA_SOCKET_IFNAME='", spec, "' (", seen, ")"));
  }
  auto route = [&tried](const std::string& peer, const char* what) -> std::string {
    std::string why;
    std::string a = address_toward(peer, &why);
    if (!a.empty() && a.rfind("127.", 0) == 0) why = "the route to it is loopback (" + a + ")", a.clear();
    if (a.empty()) tried.push_back(detail::concat("the interface toward ", what, " ", peer, ": ", why));
    return a;
  };
  for (const auto& peer : toward)
    if (std::string a = route(peer, "the job's coordinator"); !a.empty()) return a;
  for (const auto& peer : mpirun_oob_addresses())
    if (std::string a = route(peer, "mpirun's out-of-band address"); !a.empty()) return a;
  if (toward.empty() && !std::getenv("OMPI_MCA_orte_hnp_uri"))
    tried.push_back("no coordinator address was given and this is not an mpirun job");
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) {
    std::string why = "it resolves to loopback only";
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (int rc = getaddrinfo(host, nullptr, &hints, &res); rc != 0) {
      why = std::string("it does not resolve: ") + gai_strerror(rc);
    } else {
      std::string found;
      for (addrinfo* r = res; r && found.empty(); r = r->ai_next) {
        const auto& a = reinterpret_cast<const sockaddr_in*>(r->ai_addr)->sin_addr;
        if (!loopback_v4(a)) found = ntop_v4(a);
      }
      freeaddrinfo(res);
      if (!found.empty()) return found;
    }
    tried.push_back(detail::concat("the host name '", host, "': ", why));
  }
  std::string msg =
      "tcp transport: ranks span several hosts but no address of this host for its peers was found; tried";
  for (size_t i = 0; i < tried.size(); ++i) msg += detail::concat(i ? "; " : " ", "(", i + 1, ") ", tried[i]);
  msg += ". Set TESSERA_SOCKET_IFNAME to the interface to use (e.g. eth0) or TESSERA_TCP_ADDR to this host's address";
  throw InvalidArgument(msg);
}

int socket_buffer_bytes() {
  const char* e = std::getenv("TESSERA_TCP_SOCKBUF");
  if (!e || !*e) return 0;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(e, &end, 10);
  if (errno != 0 || *end != '\0' || v < 0 || v > (1L << 30))
    throw InvalidArgument(std::string("TESSERA_TCP_SOCKBUF='") + e +
                          "' is not a byte count from 0 to 1073741824 (0: the kernel's buffer autotuning)");
  return static_cast<int>(v);
}

void set_socket_options(tcp::socket& s, int buffer_bytes) {
  s.set_option(tcp::no_delay(true));
  // Setting the buffers turns the kernel's autotuning off for the socket
  // (and the kernel caps them at net.core.{w,r}mem_max).
  if (buffer_bytes <= 0) return;
  boost::system::error_code ec;
  s.set_option(asio::socket_base::send_buffer_size(buffer_bytes), ec);
  s.set_option(asio::socket_base::receive_buffer_size(buffer_bytes), ec);
}

namespace {

// Waits for `fd` to become readable, bounded by `deadline`.
bool poll_readable(int fd, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r > 0) return true;
  }
}

TcpTransport::TcpTransport(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options,
                           const TcpOptions& tcp)
    : store_(std::move(store)), rank_(rank), size_(size), options_(options), spin_us_(read_spin_us(size)) {
  TESSERA_ARG_CHECK(size >= 1 && rank >= 0 && rank < size, "tcp transport: rank ", rank, " of ", size);
  TESSERA_ARG_CHECK(tcp.links.empty() || static_cast<int>(tcp.links.size()) == size,
                    "tcp transport: ", tcp.links.size(), " link flags for ", size, " ranks");
  auto linked = [&](int j) { return j != rank && (tcp.links.empty() || tcp.links[j]); };
  conns_.resize(size);
  const auto deadline = Clock::now() + options_.timeout;
  const std::string where = "tcp transport (group '" + options_.name + "', rank " + std::to_string(rank) + ")";
  const int sockbuf = socket_buffer_bytes();

  // Listener first, then publish: a peer that reads our endpoint can connect at once.
  asio::io_context setup;
  tcp::acceptor acceptor(setup);
  const std::string addr = advertised_address(tcp.spans_hosts, tcp.toward);
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(addr, ec);
  if (ec) throw InvalidArgument("TESSERA_TCP_ADDR='" + addr + "' is not an IP address");
  tcp::endpoint listen_ep(ip.is_loopback() ? ip
                                           : (ip.is_v4() ? asio::ip::address(asio::ip::address_v4::any())
                                                         : asio::ip::address(asio::ip::address_v6::any())),
                          0);
  acceptor.open(listen_ep.protocol());
  acceptor.set_option(tcp::acceptor::reuse_address(true));
  acceptor.bind(listen_ep);
  acceptor.listen(std::max(size, 16));
  const int port = acceptor.local_endpoint().port();
  store_->set("tcp/ep/" + std::to_string(rank), addr + " " + std::to_string(port));

  // Connect to every lower rank (retrying until its listener answers).
  for (int j = 0; j < rank; ++j) {
    if (!linked(j)) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    std::string ep;
    try {
      ep = store_->get("tcp/ep/" + std::to_string(j), std::max(left, std::chrono::milliseconds(1)));
    } catch (const TimeoutError&) {
      throw TransportError(Kind::Timeout, j,
                           where + ": rank " + std::to_string(j) + " never published its endpoint within the timeout");
    }
    auto sp = ep.find(' ');
    TESSERA_CHECK(sp != std::string::npos, "bad endpoint '", ep, "'");
    tcp::endpoint peer_ep(asio::ip::make_address(ep.substr(0, sp)),
                          static_cast<uint16_t>(std::stoi(ep.substr(sp + 1))));
    auto conn = std::make_unique<Connection>(*this, j);
    // Two connections per peer, one per direction (channel 0: this, the
    // higher rank, writes; channel 1: it reads), so the two directions do
    // not contend for one socket's lock in the kernel.
    for (uint32_t channel : {0u, 1u}) {
      tcp::socket& sock = channel == 0 ? conn->wsocket_ : conn->socket_;
      for (;;) {
        sock.close(ec);
        sock.connect(peer_ep, ec);
        if (!ec) break;
        if (Clock::now() > deadline)
          throw TransportError(Kind::Timeout, j,
                               detail::concat(where, ": cannot connect to rank ", j, " at ", ep, ": ", ec.message()));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      set_socket_options(sock, sockbuf);
      uint32_t hello[3] = {kHello, static_cast<uint32_t>(rank), channel};
      asio::write(sock, asio::buffer(hello, sizeof hello), ec);
      if (ec) throw TransportError(Kind::PeerDead, j, where + ": handshake with rank " + std::to_string(j) + " failed");
    }
    conns_[j] = std::move(conn);
  }
  // Accept both connections of every higher rank; each says who it is and
  // which direction it carries.
  acceptor.non_blocking(true);
  int expected = 0;
  for (int j = rank + 1; j < size; ++j) expected += linked(j) ? 2 : 0;
  for (int accepted = 0; accepted < expected;) {
    if (!poll_readable(acceptor.native_handle(), deadline)) {
      std::string missing;
      for (int j = rank + 1; j < size; ++j)
        if (linked(j) && (!conns_[j] || !conns_[j]->socket_.is_open() || !conns_[j]->wsocket_.is_open())) {
          if (!missing.empty()) missing += ", ";
          missing += std::to_string(j);
        }
      throw TransportError(Kind::Timeout, -1,
                           detail::concat(where, ": ranks ", missing, " did not connect within the timeout"));
    }
    tcp::socket tmp(setup);
    acceptor.accept(tmp, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
    if (ec) throw TransportError(Kind::PeerDead, -1, where + ": accept failed: " + ec.message());
    uint32_t hello[3] = {0, 0, 0};
    if (!poll_readable(tmp.native_handle(), deadline))
      throw TransportError(Kind::Timeout, -1, where + ": a peer connected but sent no handshake");
    asio::read(tmp, asio::buffer(hello, sizeof hello), ec);
    const int j = static_cast<int>(hello[1]);
    if (ec || hello[0] != kHello || j <= rank || j >= size || !linked(j) || hello[2] > 1)
      throw TransportError(Kind::Protocol, -1, where + ": bad handshake from a connecting peer");
    if (!conns_[j]) conns_[j] = std::make_unique<Connection>(*this, j);
    // Channel 0 is the peer's writing direction: this rank reads it.
    tcp::socket& target = hello[2] == 0 ? conns_[j]->socket_ : conns_[j]->wsocket_;
    if (target.is_open())
      throw TransportError(Kind::Protocol, j, where + ": rank " + std::to_string(j) + " connected twice");
    const int fd = ::dup(tmp.native_handle());
    tmp.close(ec);
    if (fd < 0)
      throw TransportError(
          Kind::PeerDead, j,
          where + ": cannot take over the socket of rank " + std::to_string(j) + ": " + std::strerror(errno));
    target.assign(listen_ep.protocol(), fd, ec);
    if (ec) {
      ::close(fd);
      throw TransportError(Kind::PeerDead, j, where + ": socket of rank " + std::to_string(j) + ": " + ec.message());
    }
    set_socket_options(target, sockbuf);
    ++accepted;
  }
  for (auto& c : conns_)
    if (c) c->start();
}

TcpTransport::~TcpTransport() {
  for (auto& c : conns_)
    if (c) c->stop();
}

// Caller thread, after begin_recv with a sink: a small message is read by
// this thread into the eager buffer (or was read ahead there) and consumed
// here, in place; a large one is consumed by the reading thread fragment by
// fragment (serve_header) while this thread waits for the last. A throwing
// sink fails the transport and ends the receive before its exception goes on.
void TcpTransport::finish_sink_recv(Connection& c) {
  Op& op = c.recv_op_;
  if (op.bytes > kEager) return wait_op(c, op, "recv from");
  std::unique_lock<std::mutex> lk(mu_);
  const auto deadline = Clock::now() + options_.timeout;
  if (!c.eager_full_ && claimable_locked(c, op)) {
    c.caller_reading_ = true;
    lk.unlock();
    return caller_read(c, op, deadline);
  }
  if (!c.eager_full_) {
    op.for_thread = true;
    c.wake_reader_locked();
  }
  while (!c.eager_full_ && !op.failed && !failed_) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) break;
  }
  if (!c.eager_full_ || op.failed) {
    lk.unlock();
    fail_op(c, op, "recv from");
  }
  if (c.eager_tag_ != op.tag || c.eager_bytes_ != op.bytes) {
    eager_mismatch_locked(c, op);
    lk.unlock();
    fail_op(c, op, "recv from");
  }
  lk.unlock();
  consume_eager(c, op);
  lk.lock();
  release_eager_locked(c);
  op.complete = true;
  op.active = false;
}

// Hands the small message in c's eager buffer (owned by this thread: read
// ahead and not yet released, or read by this thread) to op's sink. A sink
// that throws fails the transport; its exception goes on.
void TcpTransport::consume_eager(Connection& c, Op& op) {
  try {
    op.sink->consume(0, c.eager_.data(), op.bytes);
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!failed_) set_failed_locked(Kind::Aborted, c.peer_, std::string("receive sink failed: ") + e.what());
      c.caller_reading_ = false;
    }
    // The reading thread only touches the connection's own eager buffer
    // here, so nothing of the caller's is in use once we return.
    shutdown_all();
    std::lock_guard<std::mutex> g(mu_);
    op.active = false;
    throw;
  }
}

// A plain recv: taken from the eager buffer if read ahead; else read by
// this thread from the socket when it may claim it (no thread hand-off:
// docs/threads.md); else waited for while the reading thread reads it.
void TcpTransport::wait_recv(Connection& c, Op& op) {
  const auto deadline = Clock::now() + options_.timeout;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!op.complete && !op.failed && !op.matched && c.eager_full_) take_eager_locked(c, op);
    if (claimable_locked(c, op)) {
      c.caller_reading_ = true;
      lk.unlock();
      return caller_read(c, op, deadline);
    }
    if (!op.complete && !op.failed && !op.for_thread) {
      op.for_thread = true;
      c.wake_reader_locked();
    }
  }
  wait_op(c, op, "recv from", deadline);
}

// Caller thread, owning c's socket (caller_reading_): reads the small
// message of `op` (header, then payload into op's buffer, or for a sink into
// the eager buffer and on to the sink), bounded by `deadline`. A peer that
// closes, aborts or sends another message fails the receive at once, naming it.
void TcpTransport::caller_read(Connection& c, Op& op, Clock::time_point deadline) {
  const int fd = c.rfd();
  Header h;
  size_t got = 0;
  int err = 0;
  Kind kind = Kind::PeerDead;
  std::string what;
  // Header and payload in one recvmsg (one system call for a message that
  // has arrived), polling without sleeping first for spin_us_: a reply often
  // comes within a few microseconds, sooner than a sleeper is woken and
  // given its CPU. Payload bytes that came with the header are in `dst`.
  unsigned char* dst = op.sink ? c.eager_.data() : op.rbuf;
  const Clock::time_point spin_until =
      spin_us_ > 0 ? Clock::now() + std::chrono::microseconds(spin_us_) : Clock::time_point{};
  ReadStatus s = read_header(fd, h, dst, op.bytes, got, spin_until, deadline, failed_flag_, err);
  const size_t early = got > sizeof h ? got - sizeof h : 0;  // payload bytes read with the header
  if (s == ReadStatus::Ok) {
    if (h.kind == kAbort) {
      kind = Kind::PeerFailed;
      what = "peer aborted";
      std::string reason(std::min<uint64_t>(h.bytes, kMaxAbortReason), '\0');
      const size_t have = std::min(early, reason.size());  // read with the header, into dst
      if (have) std::memcpy(reason.data(), dst, have);
      if (h.bytes > 0 && h.bytes <= kMaxAbortReason &&
          read_exact(fd, reason.data() + have, reason.size() - have, got, Clock::now() + std::chrono::seconds(1),
                     failed_flag_, err) == ReadStatus::Ok)
        what += ": " + reason;
      s = ReadStatus::Error;
    } else if (h.kind != kData) {
      kind = Kind::Protocol;
      what = "bad message header from peer";
      s = ReadStatus::Error;
    } else if (h.tag != op.tag || h.bytes != op.bytes) {
      kind = Kind::Protocol;
      what = "message mismatch: expected tag " + std::to_string(op.tag) + " and " + std::to_string(op.bytes) +
             " bytes, peer sent tag " + std::to_string(h.tag) + " and " + std::to_string(h.bytes) + " bytes";
      s = ReadStatus::Error;
    } else {
      s = read_exact(fd, dst + early, op.bytes - early, got, deadline, failed_flag_, err);
      if (s == ReadStatus::Eof || s == ReadStatus::Error) what = read_failure_text(s, 1, err);
    }
  } else if (s == ReadStatus::Eof || s == ReadStatus::Error) {
    what = read_failure_text(s, got, err);
  }
  if (s == ReadStatus::Ok) {
    if (op.sink) consume_eager(c, op);  // still owning the socket, so the eager buffer too
    std::lock_guard<std::mutex> lk(mu_);
    c.caller_reading_ = false;
    ++c.caller_epoch_;
    op.done = op.bytes;
    op.complete = true;
    op.active = false;
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    c.caller_reading_ = false;
    op.failed = true;
    if (s == ReadStatus::Timeout) {
      op.kind = Kind::Timeout;
      op.error = "timed out after " + std::to_string(options_.timeout.count()) + " ms";
    } else if (s == ReadStatus::Stopped) {
      op.kind = fail_kind_;  // the transport failed meanwhile: fail_op reports that
      op.error = fail_what_;
    } else {
      op.kind = kind;
      op.error = what;
      c.dead_.store(true);
    }
  }
  fail_op(c, op, "recv from");
}

void TcpTransport::wait_op(Connection& c, Op& op, const char* what, Clock::time_point deadline) {
  if (deadline == Clock::time_point{}) deadline = Clock::now() + options_.timeout;
  std::unique_lock<std::mutex> lk(mu_);
  const bool recv = &op == &c.recv_op_;
  for (;;) {
    // A recv whose message the reading thread read ahead (eager) takes it here.
    if (recv && !op.complete && !op.failed && !op.matched && c.eager_full_) take_eager_locked(c, op);
    if (op.complete || op.failed || failed_) break;
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) break;
  }
  if (op.complete) {
    op.active = false;
    return;
  }
  lk.unlock();
  fail_op(c, op, what);
}

// `op` did not complete: it failed, the transport failed, or the wait timed
// out. Records the failure, shuts every connection down (so the peers learn
// and the io thread lets go of the caller's buffer promptly), waits for the
// io thread to settle the op, and throws.
void TcpTransport::fail_op(Connection& c, Op& op, const char* what) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!failed_) {
    // Nothing failed before this wait ran out: a timeout (an op only fails
    // together with the transport, see Connection::fail).
    set_failed_locked(op.failed ? op.kind : Kind::Timeout, c.peer_,
                      op.failed ? op.error : "timed out after " + std::to_string(options_.timeout.count()) + " ms");
  }
  // Report the first failure (the root cause: an abort, the peer that died),
  // not the shutdown it caused on this connection.
  const Kind k = fail_kind_;
  const int peer = fail_peer_ >= 0 ? fail_peer_ : c.peer_;
  std::string msg = fail_what_;
  if (peer != c.peer_) msg += " (rank " + std::to_string(peer) + ")";
  lk.unlock();
  shutdown_all();
  lk.lock();
  // A recv the reading thread has not matched is not in its hands (it may be
  // parked and never look): settle it here.
  if (&op == &c.recv_op_ && !op.matched && !op.complete) op.failed = true;
  // The reading thread may still be in a read into the caller's buffer or in
  // the caller's sink: wait until it lets go (a small sink message is
  // consumed by the caller, so the wait ends at once).
  if (!op.sink || op.bytes > kEager)
    cv_.wait_for(lk, std::chrono::seconds(5), [&] { return op.complete || op.failed; });
  op.active = false;
  if (op.sink_error) std::rethrow_exception(std::exchange(op.sink_error, nullptr));
  throw TransportError(
      k, peer,
      std::string("tcp ") + what + " rank " + std::to_string(c.peer_) + " (group '" + options_.name + "'): " + msg);
}

void TcpTransport::shutdown_all() {
  bool expected = false;
  if (!shut_down_.compare_exchange_strong(expected, true)) return;
  for (auto& conn : conns_)
    if (conn) conn->post_abort();
}

}  // namespace

std::unique_ptr<Transport> create_transport(std::shared_ptr<Store> store, int rank, int size,
                                            const CommOptions& options, const TcpOptions& tcp) {
  return std::make_unique<TcpTransport>(std::move(store), rank, size, options, tcp);
}

}  // namespace tessera::collectives::tcp
