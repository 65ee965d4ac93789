// Communicator: a process group and the collectives over it.
//
// One Communicator per group (world, or a TP/PP/DP group from split()). Every
// member must call the same collectives in the same order (NCCL/MPI
// semantics); calls are blocking unless the *_async variant is used, whose
// Work completes in issue order on the communicator's progress thread. The
// buffers of an *_async call belong to the collective until its Work::wait()
// returns (or done() is true): the caller keeps them alive and unchanged.
// Buffers are raw pointers plus a count of elements of `dtype`; recv may
// equal send (in-place). bf16 and f16 reductions accumulate in f32.
//
// Failure: every wait has the communicator's timeout (default 120 s,
// TESSERA_TIMEOUT_S). A dead or stuck peer, a timeout, or a peer's abort
// makes the pending and all later calls throw CollectiveError naming the
// collective, the group, the peer and the kind (Timeout, PeerDead, ...;
// later calls keep the first failure's kind); a peer process that exited is
// noticed within about a second. abort() on this rank makes its own pending
// and later calls throw AbortedError.
//
// Thread-safety: one thread issues calls (as with NCCL); abort() may be
// called from any thread (e.g. the launcher's watch thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/store.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/netmodel.h"
#include "runtime/tensor.h"

namespace tessera {
class Device;
}

namespace tessera::collectives {

enum class ReduceOp { Sum, Prod, Min, Max, Avg };
const char* reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(const std::string& s);

// A collective failed: names the collective, the group, (when known) the
// peer, and what kind of failure it was, so a caller can tell a stuck peer
// (Timeout) from a dead one (PeerDead). The message says the kind too:
// "all_reduce on group 'dp' (rank 0 of 4) failed (peer died): ...".
class CollectiveError : public Error {
 public:
  enum class Kind {
    Timeout,     // a wait on `peer` (or on the group) ran past the communicator's timeout: a stuck peer
    PeerDead,    // `peer`'s process exited or its connection closed
    PeerFailed,  // `peer` failed or was aborted and said so (its own error is in the message)
    Aborted,     // this rank's transport was aborted
    Protocol,    // the ranks did not issue the same operations (tag or size mismatch)
    Backend,     // the MPI library reported an error
  };
  CollectiveError(Kind kind, const std::string& what, std::string collective, std::string group, int peer)
      : Error(what), kind_(kind), collective_(std::move(collective)), group_(std::move(group)), peer_(peer) {}
  Kind kind() const { return kind_; }
  const std::string& collective() const { return collective_; }
  const std::string& group() const { return group_; }
  int peer() const { return peer_; }  // -1 when not one peer

 private:
  Kind kind_;
  std::string collective_, group_;
  int peer_;
};
// "timed out", "peer died", "peer failed", "aborted", "protocol mismatch", "MPI error".
const char* collective_error_kind_name(CollectiveError::Kind kind);

// Auto: shared memory between ranks of one host, TCP between hosts
// (collectives/routed_transport.h). Shm, Tcp: that transport for every link.
// Mpi: whole collectives handed to MPI.
enum class TransportKind { Auto, Shm, Tcp, Mpi };
const char* transport_name(TransportKind t);
TransportKind parse_transport(const std::string& s);

struct CommOptions {
  TransportKind transport = TransportKind::Auto;  // TESSERA_TRANSPORT overrides when set
  std::chrono::milliseconds timeout{120000};      // every wait
  std::string name = "world";                     // group name used in errors
  // Forced algorithm ("ring", "rhd", "torus", ...); empty: selection by size
  // and shape. TESSERA_ALGO overrides when set.
  std::string algo;
  // Interconnect to model; empty dims: a ring over the group with NeuronLink-v2-like figures.
  NetModel net;
  // World ranks of this group's members, in group-rank order (set by split());
  // node ids in `net` are world ranks.
  std::vector<int> world_ranks;
  // Device whose clock is charged with modeled comm time (optional; not
  // owned: it must outlive the communicator and every communicator split from it).
  Device* device = nullptr;
  // Hosts (IPs or names) that every host of the job reaches, e.g. the
  // launcher's coordinator: a group spanning hosts advertises, for TCP, the
  // address of the interface that reaches them (tcp::advertised_address).
  std::vector<std::string> reach;
};

// Handle of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done (bounded by the communicator timeout); rethrows its error.
  virtual void wait() = 0;
  virtual bool done() const = 0;
  // After wait(): the modeled interconnect seconds of this call (what
  // last_modeled_seconds() gives for a blocking one), for timelines.
  virtual double modeled_seconds() const { return 0; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Builds the communicator for `rank` of `size` ranks that rendezvous
  // through `store` (all members pass stores with the same key space).
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              CommOptions options = {});

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const CommOptions& options() const = 0;

  // ---- collectives (count = elements) ----
  virtual void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  // recv holds size() * count elements, rank i's contribution at i * count.
  // In place (as NCCL): send == recv + rank() * count.
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // send holds size() * count elements; recv gets this rank's reduced block of count.
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  // recv is written on root only (may be nullptr elsewhere).
  virtual void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) = 0;
  // send and recv hold size() * count elements; block j of send goes to rank j.
  virtual void all_to_all(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual void send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag = 0) = 0;
  virtual void recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag = 0) = 0;
  // Sends send_count elements to `dst` while receiving recv_count from `src`
  // (MPI_Sendrecv; nccl-tests' sendrecv in one call): both directions move at
  // once, and a ring of ranks calling it together never deadlocks. dst and
  // src may be the same peer; the buffers must not overlap.
  virtual void sendrecv(const void* send, size_t send_count, int dst, void* recv, size_t recv_count, int src,
                        DType dtype, uint32_t tag = 0) = 0;
  virtual void barrier() = 0;

  // Asynchronous all-reduce (gradient buckets); completes in issue order.
  virtual std::shared_ptr<Work> all_reduce_async(const void* send, void* recv, size_t count, DType dtype,
                                                 ReduceOp op) = 0;
  virtual std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count, DType dtype,
                                                     ReduceOp op) = 0;
  virtual std::shared_ptr<Work> all_gather_async(const void* send, void* recv, size_t count, DType dtype) = 0;
  // Asynchronous send (pipeline stages): queued behind this communicator's
  // other async calls, and a later blocking call on the same communicator
  // waits for it first. So a peer's matching recv must not depend on what
  // this rank does next on the same communicator: give each direction of a
  // link its own communicator (ParallelState's pipeline links do).
  virtual std::shared_ptr<Work> send_async(const void* buf, size_t count, DType dtype, int peer, uint32_t tag = 0) = 0;

  // Ranks with the same color form a new communicator, ordered by (key, rank).
  // Collective over this communicator. color < 0: not a member (returns nullptr).
  virtual std::shared_ptr<Communicator> split(int color, int key, const std::string& name = "") = 0;

  // Wakes every waiter with AbortedError; later calls fail at once. Any thread.
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const = 0;

  // Modeled interconnect seconds of the most recent collective and in total.
  virtual double last_modeled_seconds() const = 0;
  virtual double total_modeled_seconds() const = 0;
  // The algorithm that served the most recent collective ("ring", "rhd", ...).
  virtual std::string last_algorithm() const = 0;
  // What carries this communicator's data: "shm", "tcp", "shm+tcp" (shared
  // memory inside a host, TCP between hosts) or "mpi".
  virtual std::string transport() const = 0;

  // ---- Tensor conveniences (contiguous tensors) ----
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) {
    all_reduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()), t.dtype(), op);
  }
  void broadcast(Tensor& t, int root) { broadcast(t.raw_data(), static_cast<size_t>(t.numel()), t.dtype(), root); }
};

}  // namespace tessera::collectives
