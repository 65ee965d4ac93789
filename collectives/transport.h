// Transport: moves bytes between the ranks of one communicator.
//
// The collective algorithms (collectives/algorithms.{h,cc}) are written against
// this interface only; each backend lives in its own folder behind a factory
// (shm/: shared memory on one host, the simulated NeuronLink; tcp/: sockets;
// routed_transport.h puts both behind one Transport, per link by host).
// The MPI backend does not implement a Transport: it hands whole collectives
// to MPI (collectives/mpi/mpi_backend.h).
//
// Contract
// - Ownership and lifetime: a Transport belongs to exactly one Communicator,
//   is created by make_transport() (or a backend factory) after every member
//   of the group reached the store, and lives until the Communicator is
//   destroyed. Buffers passed in are borrowed for the duration of the call.
// - Threads: one thread at a time drives send/recv/sendrecv and the
//   SharedMemoryPeers methods (the communicator's calling thread or its
//   progress thread, never both at once). abort(), aborted() and peer_alive()
//   may be called from any thread.
// - Ordering: between a pair of ranks, messages are received in the order they
//   were sent (NCCL model: all members issue the same operations in the same
//   order). Tags are checked, not matched: a recv whose tag or size differs
//   from the next message from that peer fails with TransportError (a
//   protocol bug in the caller). A message may be of any size, including 0.
// - Progress: send() may return before the peer received (data is buffered or
//   copied out), but may also block until the peer posts the matching recv;
//   callers that exchange in a cycle (ring steps) must use sendrecv(), which
//   never deadlocks when every rank of a cycle calls it at once.
// - Errors: every wait is bounded by the options' timeout. Failures throw
//   TransportError carrying the peer (or -1) and the kind. A peer process that
//   exited is noticed within about a second (liveness is checked while
//   waiting). When a rank fails or is aborted, the transport tells its peers
//   (best effort), so they fail fast with kind PeerFailed instead of timing
//   out. After the first failure every later call fails at once.
// - abort(reason): wakes every waiter of this rank (they throw kind Aborted)
//   and tells the peers. Idempotent; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "runtime/error.h"

namespace tessera::collectives {

struct HostMap;  // collectives/host.h

class TransportError : public Error {
 public:
  enum class Kind {
    Timeout,     // a wait on `peer` ran past the timeout
    PeerDead,    // `peer`'s process exited or its connection closed
    PeerFailed,  // `peer` reported a failure or an abort of its own
    Aborted,     // this rank's transport was aborted (abort())
    Protocol,    // tag/size mismatch: the ranks did not issue the same operations
  };
  TransportError(Kind kind, int peer, const std::string& what) : Error(what), kind_(kind), peer_(peer) {}
  Kind kind() const { return kind_; }
  int peer() const { return peer_; }  // group rank, -1 when not one peer

 private:
  Kind kind_;
  int peer_;
};

// The CollectiveError kind a transport failure becomes.
inline CollectiveError::Kind collective_error_kind(TransportError::Kind k) {
  switch (k) {
    case TransportError::Kind::Timeout:
      return CollectiveError::Kind::Timeout;
    case TransportError::Kind::PeerDead:
      return CollectiveError::Kind::PeerDead;
    case TransportError::Kind::PeerFailed:
      return CollectiveError::Kind::PeerFailed;
    case TransportError::Kind::Aborted:
      return CollectiveError::Kind::Aborted;
    case TransportError::Kind::Protocol:
      return CollectiveError::Kind::Protocol;
  }
  return CollectiveError::Kind::Protocol;
}

class SharedMemoryPeers;

// Consumer of a message received in fragments (see Transport::sendrecv_sink):
// consume() is called in order of offset, covering [0, bytes) exactly once;
// `data` is valid only during the call. Must not throw except to abandon
// the transfer (the transport is then failed).
class RecvSink {
 public:
  virtual void consume(size_t offset, const void* data, size_t bytes) = 0;

 protected:
  ~RecvSink() = default;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "shm", "tcp"

  // Blocking point-to-point transfer of `bytes` bytes to/from group rank `peer`
  // (!= rank()). Returns when `buf` may be reused (send) / holds the data (recv).
  virtual void send(int peer, uint32_t tag, const void* buf, size_t bytes) = 0;
  virtual void recv(int peer, uint32_t tag, void* buf, size_t bytes) = 0;

  // Sends `sbytes` to `to` while receiving `rbytes` from `from` (both with
  // `tag`); returns when both are done. Deadlock-free when all ranks of a ring
  // call it together. `to`/`from` may be the same peer (pairwise exchange);
  // sbuf and rbuf must not overlap.
  virtual void sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes, uint32_t tag) = 0;

  // As sendrecv, but the received bytes go to `sink` fragment by fragment as
  // they arrive, so a ring can reduce fragment k (straight out of the
  // transport's buffer) while fragment k+1 is in flight. The default receives
  // the whole message into a scratch buffer first (correct, not pipelined).
  virtual void sendrecv_sink(int to, const void* sbuf, size_t sbytes, int from, size_t rbytes, RecvSink& sink,
                             uint32_t tag) {
    if (scratch_.size() < rbytes) scratch_.resize(rbytes);
    sendrecv(to, sbuf, sbytes, from, scratch_.data(), rbytes, tag);
    sink.consume(0, scratch_.data(), rbytes);
  }

  // recv() whose bytes go to `sink` fragment by fragment (reduce on arrival).
  virtual void recv_sink(int from, size_t bytes, RecvSink& sink, uint32_t tag) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    recv(from, tag, scratch_.data(), bytes);
    sink.consume(0, scratch_.data(), bytes);
  }

  // Wakes every waiter with TransportError(Aborted) and tells the peers. Any thread.
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const = 0;
  // False once `peer` is known to have exited or failed. Any thread; cheap.
  virtual bool peer_alive(int peer) const = 0;

  // Optional zero-copy capability: non-null when the ranks share memory, so
  // algorithms may read their peers' buffers in place. Owned by the transport.
  virtual SharedMemoryPeers* shared_memory() { return nullptr; }

  // Which host every group rank is on, and the hosts' CPUs
  // (collectives/host.h), when the group spans hosts; nullptr when it is on
  // one host. Hierarchical algorithms follow it. Owned by the transport; any thread.
  virtual const HostMap* hosts() const { return nullptr; }

  // When the group spans hosts: the SharedMemoryPeers of this rank's
  // host-mates (its peer indices are the host-mates in ascending group-rank
  // order), so hierarchical algorithms can read them in place; nullptr when
  // there is none. Owned by the transport; same thread rules.
  virtual SharedMemoryPeers* host_shared_memory() { return nullptr; }

 private:
  std::vector<char> scratch_;  // grows to the largest message, then reused
};

// Zero-copy capability of transports whose ranks can map each other's memory
// (shm: device memory that is a shared arena, runtime/shm_memory.h).
// Same thread rules as Transport; the rounds below are collective over the
// group (every rank calls them in the same order).
class SharedMemoryPeers {
 public:
  virtual ~SharedMemoryPeers() = default;

  // True if [p, p + bytes) lies in memory every peer can map (bytes == 0: always).
  virtual bool is_shared(const void* p, size_t bytes) const = 0;

  // One synchronising round: publishes up to kMaxBuffers of this rank's
  // buffers (each must satisfy is_shared, may be nullptr with size 0) plus up
  // to kInlineBytes of small data copied into this rank's slot, then waits
  // until every peer has published the same round. Afterwards, until this
  // rank's next publish(), peer_buffer(j, i) is peer j's i-th buffer mapped
  // into this process and peer_inline(j) its inline data (j == rank() gives
  // this rank's own). Peers' buffers may be read and (where the algorithm owns
  // that region) written; a publish() with no buffers is a barrier.
  static constexpr int kMaxBuffers = 2;
  static constexpr size_t kInlineBytes = 4096;
  virtual void publish(const void* const* buffers, const size_t* sizes, int num_buffers, const void* inline_data,
                       size_t inline_bytes) = 0;
  virtual void* peer_buffer(int peer, int index) const = 0;
  virtual const void* peer_inline(int peer) const = 0;
};

// Builds the transport of `kind` for `rank` of `size` (Auto: shm inside a
// host and tcp between hosts, see routed_transport.h; Shm or Tcp: that one
// for every link; Mpi has no Transport and throws InvalidArgument). `store` should already be prefixed
// for this communicator. Collective: every member must call it.
std::unique_ptr<Transport> make_transport(TransportKind kind, std::shared_ptr<Store> store, int rank, int size,
                                          const CommOptions& options);

}  // namespace tessera::collectives
