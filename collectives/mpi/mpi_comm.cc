// The MPI backend's implementation: every collective is one call into the
// MPI library (MPI_Allreduce, MPI_Allgather, ...), on a communicator
// duplicated from MPI_COMM_WORLD so tessera's traffic never mixes with a
// caller's. This file and mpi_env.cc are the only code that includes mpi.h
// (library tessera_coll_mpi).
//
// Differences from the transport communicators, all forced by MPI:
// - bf16 and f16 travel as 16-bit words with user-defined MPI ops that
//   accumulate each pairwise step in f32 (MPI has no such types), so a
//   result may be rounded once per step instead of once.
// - avg is a sum followed by a local division.
// - MPI calls cannot time out, so a watchdog thread aborts the whole job
//   (MPI_Abort) with an error naming the collective and the group when a call
//   runs past the communicator's timeout: a hang becomes an error, not a wait.
// - *_async run synchronously and return completed Work.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "collectives/coll_cost.h"
#include "collectives/mpi/mpi_backend.h"
#include "collectives/mpi/mpi_env.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace tessera::collectives::mpi {
namespace {

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw CollectiveError(CollectiveError::Kind::Backend,
                          std::string("mpi ") + what + " failed (MPI error): " + std::string(msg, len), what, "mpi",
                          -1);
  }
}

// ---- 16-bit float reductions ----------------------------------------------------

template <bool kBf16>
float to_f(uint16_t v) {
  return kBf16 ? bf16_bits_to_float(v) : f16_bits_to_float(v);
}
template <bool kBf16>
uint16_t from_f(float f) {
  return kBf16 ? float_to_bf16_bits(f) : float_to_f16_bits(f);
}

template <bool kBf16, int kOp>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = to_f<kBf16>(a[i]), y = to_f<kBf16>(b[i]), r;
    switch (kOp) {
      case 0:
        r = x + y;
        break;
      case 1:
        r = x * y;
        break;
      case 2:
        r = std::min(x, y);
        break;
      default:
        r = std::max(x, y);
        break;
    }
    b[i] = from_f<kBf16>(r);
  }
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::BF16:
    case DType::F16:
      return MPI_UINT16_T;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
  }
  return MPI_BYTE;
}

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return 0;
    case ReduceOp::Prod:
      return 1;
    case ReduceOp::Min:
      return 2;
    case ReduceOp::Max:
      return 3;
  }
  return 0;
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  if (t == DType::BF16 || t == DType::F16) {
    static std::once_flag once;
    static MPI_Op ops[2][4];
    std::call_once(once, [] {
      MPI_Op_create(&half_op<true, 0>, 1, &ops[0][0]);
      MPI_Op_create(&half_op<true, 1>, 1, &ops[0][1]);
      MPI_Op_create(&half_op<true, 2>, 1, &ops[0][2]);
      MPI_Op_create(&half_op<true, 3>, 1, &ops[0][3]);
      MPI_Op_create(&half_op<false, 0>, 1, &ops[1][0]);
      MPI_Op_create(&half_op<false, 1>, 1, &ops[1][1]);
      MPI_Op_create(&half_op<false, 2>, 1, &ops[1][2]);
      MPI_Op_create(&half_op<false, 3>, 1, &ops[1][3]);
    });
    return ops[t == DType::BF16 ? 0 : 1][op_index(op)];
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return MPI_SUM;
    case ReduceOp::Prod:
      return MPI_PROD;
    case ReduceOp::Min:
      return MPI_MIN;
    case ReduceOp::Max:
      return MPI_MAX;
  }
  return MPI_SUM;
}

void divide(void* buf, size_t count, DType t, int n) {
  switch (t) {
    case DType::F32:
      for (size_t i = 0; i < count; ++i) static_cast<float*>(buf)[i] /= static_cast<float>(n);
      break;
    case DType::BF16:
      for (size_t i = 0; i < count; ++i) {
        auto& v = static_cast<uint16_t*>(buf)[i];
        v = float_to_bf16_bits(bf16_bits_to_float(v) / static_cast<float>(n));
      }
      break;
    case DType::F16:
      for (size_t i = 0; i < count; ++i) {
        auto& v = static_cast<uint16_t*>(buf)[i];
        v = float_to_f16_bits(f16_bits_to_float(v) / static_cast<float>(n));
      }
      break;
    case DType::I32:
      for (size_t i = 0; i < count; ++i) static_cast<int32_t*>(buf)[i] /= n;
      break;
    case DType::I64:
      for (size_t i = 0; i < count; ++i) static_cast<int64_t*>(buf)[i] /= n;
      break;
  }
}

int as_int(size_t count, const char* what) {
  if (count > static_cast<size_t>(INT_MAX))
    throw InvalidArgument(std::string("mpi ") + what + ": count " + std::to_string(count) +
                          " exceeds MPI's int count limit");
  return static_cast<int>(count);
}

// Aborts the job when an MPI call runs past the timeout (MPI cannot time out
// itself). begin()/end() cost a clock read and two atomic stores: no lock and
// no wake-up per call. The thread sleeps at most a quarter of the timeout (and
// at most 1 s) while no call runs, so it sees each call well before its
// deadline and then sleeps until that deadline exactly.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::milliseconds timeout, std::string group)
      : timeout_(timeout), group_(std::move(group)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void begin(const char* what) {
    what_.store(what, std::memory_order_relaxed);
    started_.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
  }
  void end() { started_.store(0, std::memory_order_release); }

 private:
  using Clock = std::chrono::steady_clock;
  void run() {
    const auto idle = std::clamp<Clock::duration>(timeout_ / 4, std::chrono::milliseconds(1), std::chrono::seconds(1));
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      const int64_t s = started_.load(std::memory_order_acquire);
      const auto now = Clock::now();
      if (s == 0) {
        cv_.wait_for(lk, idle);
        continue;
      }
      const auto deadline = Clock::time_point(Clock::duration(s)) + timeout_;
      if (now < deadline) {
        cv_.wait_until(lk, deadline);
        continue;
      }
      if (started_.load(std::memory_order_acquire) != s) continue;  // that call ended; another began
      spdlog::error("mpi {} on group '{}' did not finish within {} ms; aborting the job",
                    what_.load(std::memory_order_relaxed), group_, timeout_.count());
      mpi::abort(1);  // mpi_env.h: MPI_Abort, safe from this thread at MPI_THREAD_MULTIPLE
    }
  }
  std::chrono::milliseconds timeout_;
  std::string group_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  bool stop_ = false;
  std::atomic<int64_t> started_{0};  // Clock ticks when the running call began; 0: none
  std::atomic<const char*> what_{""};
};

class Completed : public Work {
 public:
  explicit Completed(double modeled = 0) : modeled_(modeled) {}
  void wait() override {}
  bool done() const override { return true; }
  double modeled_seconds() const override { return modeled_; }

 private:
  double modeled_;
};

class MpiCommunicator;

// An MPI_Isend; wait() is MPI_Wait under the communicator's watchdog.
class PendingSend : public Work {
 public:
  PendingSend(MpiCommunicator& c, MPI_Request req) : c_(c), req_(req) {}
  ~PendingSend() override;
  void wait() override;
  bool done() const override;

 private:
  MpiCommunicator& c_;
  mutable MPI_Request req_;
  mutable bool done_ = false;
};

class MpiCommunicator final : public Communicator {
  friend class PendingSend;

 public:
  MpiCommunicator(MPI_Comm comm, CommOptions options) : comm_(comm), options_(std::move(options)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // The modeled seconds of a call are those tessera's own communicator
    // would charge for it over this group without shared memory (the one
    // cost model, collectives/coll_cost.h): the group's world ranks on the
    // given interconnect, or (none given, or ranks outside it) a ring with
    // its first dimension's figures (the communicators' defaults without one).
    std::vector<int> nodes;
    bool on_net = !options_.net.dims().empty();
    for (int r = 0; r < size_; ++r) {
      nodes.push_back(world(r));
      on_net = on_net && nodes.back() >= 0 && nodes.back() < options_.net.num_nodes();
    }
    NetModel net = options_.net;
    if (!on_net && !net.dims().empty()) {
      net = NetModel::ring(size_, net.dims()[0].bandwidth, net.dims()[0].latency);
      for (int r = 0; r < size_; ++r) nodes[static_cast<size_t>(r)] = r;
    }
    group_ = group_cost_model(net, nodes, /*shared_memory=*/false);
    watchdog_ = std::make_unique<Watchdog>(options_.timeout, options_.name);
  }
  ~MpiCommunicator() override {
    watchdog_.reset();
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const CommOptions& options() const override { return options_; }

  void all_reduce(const void* send, void* recv, size_t count, DType dt, ReduceOp op) override {
    Guard g(*this, "all_reduce");
    const void* s = send == recv ? MPI_IN_PLACE : send;
    check_mpi(MPI_Allreduce(s, recv, as_int(count, "all_reduce"), mpi_type(dt), mpi_op(dt, op), comm_), "all_reduce");
    if (op == ReduceOp::Avg) divide(recv, count, dt, size_);
    model(predicted(CollKind::AllReduce, count, dt), "all_reduce");
  }
  void all_gather(const void* send, void* recv, size_t count, DType dt) override {
    Guard g(*this, "all_gather");
    const void* s =
        send == static_cast<char*>(recv) + static_cast<size_t>(rank_) * count * dtype_size(dt) ? MPI_IN_PLACE : send;
    int n = as_int(count, "all_gather");
    check_mpi(MPI_Allgather(s, n, mpi_type(dt), recv, n, mpi_type(dt), comm_), "all_gather");
    model(predicted(CollKind::AllGather, count, dt), "all_gather");
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dt, ReduceOp op) override {
    Guard g(*this, "reduce_scatter");
    int n = as_int(count, "reduce_scatter");
    const size_t blk = count * dtype_size(dt);
    if (send == recv) {
      check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, recv, n, mpi_type(dt), mpi_op(dt, op), comm_), "reduce_scatter");
    } else if (static_cast<const char*>(send) + rank_ * blk == recv) {
      // nccl-style in place (result in this rank's own block): MPI puts it first.
      void* buf = const_cast<void*>(send);
      check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, n, mpi_type(dt), mpi_op(dt, op), comm_), "reduce_scatter");
      std::memmove(recv, buf, blk);
    } else {
      check_mpi(MPI_Reduce_scatter_block(send, recv, n, mpi_type(dt), mpi_op(dt, op), comm_), "reduce_scatter");
    }
    if (op == ReduceOp::Avg) divide(recv, count, dt, size_);
    model(predicted(CollKind::ReduceScatter, count, dt), "reduce_scatter");
  }
  void broadcast(void* buf, size_t count, DType dt, int root) override {
    Guard g(*this, "broadcast");
    check_root(root, "broadcast");
    check_mpi(MPI_Bcast(buf, as_int(count, "broadcast"), mpi_type(dt), root, comm_), "broadcast");
    model(predicted(CollKind::Broadcast, count, dt), "broadcast");
  }
  void reduce(const void* send, void* recv, size_t count, DType dt, ReduceOp op, int root) override {
    Guard g(*this, "reduce");
    check_root(root, "reduce");
    const void* s = (rank_ == root && send == recv) ? MPI_IN_PLACE : send;
    check_mpi(MPI_Reduce(s, rank_ == root ? recv : nullptr, as_int(count, "reduce"), mpi_type(dt), mpi_op(dt, op), root,
                         comm_),
              "reduce");
    if (op == ReduceOp::Avg && rank_ == root) divide(recv, count, dt, size_);
    model(predicted(CollKind::Reduce, count, dt), "reduce");
  }
  void all_to_all(const void* send, void* recv, size_t count, DType dt) override {
    Guard g(*this, "all_to_all");
    const void* s = send == recv ? MPI_IN_PLACE : send;
    int n = as_int(count, "all_to_all");
    check_mpi(MPI_Alltoall(s, n, mpi_type(dt), recv, n, mpi_type(dt), comm_), "all_to_all");
    model(predicted(CollKind::AllToAll, count, dt), "all_to_all");
  }
  void send(const void* buf, size_t count, DType dt, int peer, uint32_t tag) override {
    Guard g(*this, "send");
    check_root(peer, "send");
    check_mpi(MPI_Send(buf, as_int(count, "send"), mpi_type(dt), peer, static_cast<int>(tag & 0x7fff), comm_), "send");
    model(p2p_seconds(group_, rank_, peer, bytes(count, dt)), "send");
  }
  void recv(void* buf, size_t count, DType dt, int peer, uint32_t tag) override {
    Guard g(*this, "recv");
    check_root(peer, "recv");
    check_mpi(MPI_Recv(buf, as_int(count, "recv"), mpi_type(dt), peer, static_cast<int>(tag & 0x7fff), comm_,
                       MPI_STATUS_IGNORE),
              "recv");
    model(p2p_seconds(group_, peer, rank_, bytes(count, dt)), "recv");
  }
  void sendrecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count, int src, DType dt,
                uint32_t tag) override {
    Guard g(*this, "sendrecv");
    check_root(dst, "sendrecv");
    check_root(src, "sendrecv");
    const int t = static_cast<int>(tag & 0x7fff);
    check_mpi(MPI_Sendrecv(send, as_int(send_count, "sendrecv"), mpi_type(dt), dst, t, recv,
                           as_int(recv_count, "sendrecv"), mpi_type(dt), src, t, comm_, MPI_STATUS_IGNORE),
              "sendrecv");
    model(std::max(p2p_seconds(group_, rank_, dst, bytes(send_count, dt)),
                   p2p_seconds(group_, src, rank_, bytes(recv_count, dt))),
          "sendrecv");
  }
  std::shared_ptr<Work> send_async(const void* buf, size_t count, DType dt, int peer, uint32_t tag) override {
    Guard g(*this, "send");
    check_root(peer, "send");
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Isend(buf, as_int(count, "send"), mpi_type(dt), peer, static_cast<int>(tag & 0x7fff), comm_, &req),
              "send");
    model(p2p_seconds(group_, rank_, peer, bytes(count, dt)), "send");
    return std::make_shared<PendingSend>(*this, req);
  }
  void barrier() override {
    Guard g(*this, "barrier");
    check_mpi(MPI_Barrier(comm_), "barrier");
  }

  std::shared_ptr<Work> all_reduce_async(const void* s, void* r, size_t c, DType dt, ReduceOp op) override {
    all_reduce(s, r, c, dt, op);
    return std::make_shared<Completed>(last_modeled_);
  }
  std::shared_ptr<Work> reduce_scatter_async(const void* s, void* r, size_t c, DType dt, ReduceOp op) override {
    reduce_scatter(s, r, c, dt, op);
    return std::make_shared<Completed>(last_modeled_);
  }
  std::shared_ptr<Work> all_gather_async(const void* s, void* r, size_t c, DType dt) override {
    all_gather(s, r, c, dt);
    return std::make_shared<Completed>(last_modeled_);
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    Guard g(*this, "split");
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "split");
    // Every member learns the world ranks of its new group.
    int me = world(rank_);
    std::vector<int> all(size_);
    check_mpi(MPI_Allgather(&me, 1, MPI_INT, all.data(), 1, MPI_INT, comm_), "split");
    if (sub == MPI_COMM_NULL) return nullptr;
    int sub_size = 0;
    MPI_Comm_size(sub, &sub_size);
    std::vector<int> ranks(sub_size);
    check_mpi(MPI_Allgather(&me, 1, MPI_INT, ranks.data(), 1, MPI_INT, sub), "split");
    CommOptions o = options_;
    o.name = name.empty() ? options_.name + "/" + std::to_string(color) : name;
    o.world_ranks = ranks;
    return std::make_shared<MpiCommunicator>(sub, std::move(o));
  }

  // Only flags the communicator: a call blocked inside MPI cannot be woken
  // (the watchdog or the caller's mpi::abort() ends the job instead).
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lk(abort_mu_);
    if (aborted_.load()) return;
    abort_reason_ = reason;
    aborted_.store(true);
  }
  bool aborted() const override { return aborted_.load(); }
  double last_modeled_seconds() const override { return last_modeled_; }
  double total_modeled_seconds() const override { return total_modeled_; }
  std::string last_algorithm() const override { return "mpi"; }
  std::string transport() const override { return "mpi"; }

 private:
  struct Guard {
    Guard(MpiCommunicator& c, const char* what) : c_(c) {
      if (c.aborted_.load()) {
        std::lock_guard<std::mutex> lk(c.abort_mu_);
        throw AbortedError("mpi " + std::string(what) + " on group '" + c.options_.name +
                           "' aborted: " + c.abort_reason_);
      }
      c.watchdog_->begin(what);
    }
    ~Guard() { c_.watchdog_->end(); }
    MpiCommunicator& c_;
  };
  static double bytes(size_t count, DType dt) { return static_cast<double>(count * dtype_size(dt)); }
  int world(int r) const {
    return options_.world_ranks.size() == static_cast<size_t>(size_) ? options_.world_ranks[r] : r;
  }
  void check_root(int r, const char* what) const {
    if (r < 0 || r >= size_)
      throw InvalidArgument(std::string("mpi ") + what + ": rank " + std::to_string(r) + " out of range for group '" +
                            options_.name + "' of " + std::to_string(size_));
  }
  double predicted(CollKind kind, size_t count, DType dt) const {
    return size_ > 1 ? predict(kind, count, dt, group_).seconds : 0.0;
  }
  void model(double seconds, const char* /*what*/) {
    last_modeled_ = seconds;
    total_modeled_ += seconds;
  }

  MPI_Comm comm_;
  CommOptions options_;
  GroupCostModel group_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<Watchdog> watchdog_;
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;  // under abort_mu_
  double last_modeled_ = 0, total_modeled_ = 0;
};

void PendingSend::wait() {
  if (done_) return;
  MpiCommunicator::Guard g(c_, "send");
  check_mpi(MPI_Wait(&req_, MPI_STATUS_IGNORE), "send");
  done_ = true;
}

bool PendingSend::done() const {
  if (done_) return true;
  int flag = 0;
  check_mpi(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), "send");
  done_ = flag != 0;
  return done_;
}

PendingSend::~PendingSend() {
  // The buffer's owner may free it after this: finish the send first.
  if (!done_) MPI_Wait(&req_, MPI_STATUS_IGNORE);
}

std::shared_ptr<Communicator> create(int rank, int size, const CommOptions& options) {
  init();
  if (rank != world_rank() || size != world_size())
    throw InvalidArgument("mpi communicator: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                          " does not match MPI_COMM_WORLD (rank " + std::to_string(world_rank()) + " of " +
                          std::to_string(world_size()) + ")");
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "comm_dup");
  CommOptions o = options;
  if (o.world_ranks.size() != static_cast<size_t>(size)) {
    o.world_ranks.clear();
    for (int i = 0; i < size; ++i) o.world_ranks.push_back(i);
  }
  return std::make_shared<MpiCommunicator>(dup, std::move(o));
}

}  // namespace

void install() { set_factory(&create); }

}  // namespace tessera::collectives::mpi
